#!/bin/bash
# Session 20: second round of the three checks for exchanges every 20 ms (vs the default 10) with three replicas.
# uniform 80% and multi-turn 80%: default vs default@3, alternating 10, 20, 10, 20 (each --repeat 3);
# overload with three replicas at 0.7x and 2x: 20 then 10 (each --repeat 2).
cd /work/main
O=/work/main/reports/i15-s20/confirm
for round in 1 2; do
 for ms in 10 20; do
  .venv/bin/python -m extproc bench routing --workload shared-prefix --popularity uniform --qps 70.53 --strategies default,default@3 --fleet-sync-ms $ms --repeat 3 --duration 20 --warmup 5 --out $O/u80-ms$ms-r$round > $O/u80-ms$ms-r$round.log 2>&1
  echo "u80 ms=$ms r=$round rc=$?"
  .venv/bin/python -m extproc bench routing --workload multi-turn --qps 91.38 --strategies default,default@3 --fleet-sync-ms $ms --repeat 3 --duration 20 --warmup 5 --out $O/mt80-ms$ms-r$round > $O/mt80-ms$ms-r$round.log 2>&1
  echo "mt80 ms=$ms r=$round rc=$?"
 done
done
for ms in 20 10; do
  timeout 900 .venv/bin/python -m extproc bench routing --workload overload --strategies default --replicas 3 --loads 0.7,2 --fleet-sync-ms $ms --repeat 2 --duration 20 --warmup 5 --out $O/ov3-ms$ms > $O/ov3-ms$ms.log 2>&1
  echo "ov3 ms=$ms rc=$?"
done
