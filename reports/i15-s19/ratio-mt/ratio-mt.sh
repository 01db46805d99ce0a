#!/bin/bash
# default vs default@3 at multi-turn 80%, the replicas' exchanges every 10 ms (default) and every 20 ms, alternating
cd /work/main
O=/work/main/reports/i15-s19/ratio-mt
mkdir -p $O
for round in 1; do
 for ms in 10 20; do
  .venv/bin/python -m extproc bench routing --workload multi-turn --qps 91.38 --strategies default,default@3 --fleet-sync-ms $ms --repeat 3 --duration 20 --warmup 5 --out $O/ms$ms-r$round > $O/ms$ms-r$round.log 2>&1
  grep "ok=" $O/ms$ms-r$round.log | grep -v "\[" | sed 's/ cores=.*//'
 done
done
