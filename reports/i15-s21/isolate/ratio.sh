#!/bin/bash
# default vs default@3 at uniform 80% and multi-turn 80%, pinned (system under test on core 0, simulator + load
# generator on core 1) vs free, alternating.
cd /work/wt/pin
for mode in pin free; do
  if [ $mode = pin ]; then export EXTPROC_BENCH_PIN=0/1; else unset EXTPROC_BENCH_PIN; fi
  PYTHONPATH=. .venv/bin/python -m extproc bench routing --workload shared-prefix --popularity uniform --qps 70.53 \
    --strategies default,default@3 --repeat 3 --duration 20 --warmup 5 \
    --out /work/wt/pinrun/u80-$mode-r1 > /work/wt/pinrun/u80-$mode-r1.log 2>&1
  PYTHONPATH=. .venv/bin/python -m extproc bench routing --workload multi-turn --qps 91.38 \
    --strategies default,default@3 --repeat 3 --duration 20 --warmup 5 \
    --out /work/wt/pinrun/mt80-$mode-r1 > /work/wt/pinrun/mt80-$mode-r1.log 2>&1
done
