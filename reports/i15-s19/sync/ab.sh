#!/bin/bash
cd /work/wt/sync20
O=/work/wt/s19/sync
mkdir -p $O
for round in 1 2; do
 for ms in 10 20; do
  PYTHONPATH=. .venv/bin/python -m extproc bench routing --workload shared-prefix --popularity uniform --qps 70.53 --strategies default@3 --fleet-sync-ms $ms --repeat 3 --duration 20 --warmup 5 --out $O/ms$ms-r$round > $O/ms$ms-r$round.log 2>&1
  grep "ok=" $O/ms$ms-r$round.log | grep -v "\[" 
 done
done
