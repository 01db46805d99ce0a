#!/bin/bash
# uniform 40%: default vs sglang-cache-aware, harness (sim + load generator) pinned to core 1 and the system under test
# (Envoy + service / peer router) to core 0, vs unpinned; alternating.
cd /work/wt/pin
for round in 1 2; do
for mode in pin free; do
  if [ $mode = pin ]; then export EXTPROC_BENCH_PIN=0/1; else unset EXTPROC_BENCH_PIN; fi
  PYTHONPATH=. .venv/bin/python -m extproc bench routing --workload shared-prefix --popularity uniform --qps 35.26 \
    --strategies default,sglang-cache-aware --repeat 2 --seed $((round*10)) --duration 20 --warmup 5 \
    --out /work/wt/pinrun/u40-$mode-r$round > /work/wt/pinrun/u40-$mode-r$round.log 2>&1
done; done
