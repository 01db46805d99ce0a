#!/bin/bash
# overload with three replicas: flow control's classes with the replicas' exchanges every 10 vs 20 ms
cd /work/main
O=/work/main/reports/i15-s19/overload3
for ms in 10 20; do
  timeout 900 .venv/bin/python -m extproc bench routing --workload overload --strategies default --replicas 3 --loads 0.7,2 --fleet-sync-ms $ms --repeat 2 --duration 20 --warmup 5 --out $O/ms$ms > $O/ms$ms.log 2>&1
  echo "ms=$ms rc=$?"
done
