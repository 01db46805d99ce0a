#!/bin/bash
# Three service replicas: in-flight + placement exchanges as two connections' script calls (a = 1f797a5) vs one
# pipelined write per round (b = bf81e0c), alternating: multi-turn 80% and nearly idle (2 req/s).
for round in 1 2; do
for rev in a b; do
  cd /work/wt/$rev
  PYTHONPATH=. .venv/bin/python -m extproc bench routing --workload multi-turn --qps 91.38 --strategies default@3 \
    --repeat 2 --seed $((round*10)) --duration 20 --warmup 5 --out /work/wt/batch/mt80-$rev-r$round \
    > /work/wt/batch/mt80-$rev-r$round.log 2>&1
  PYTHONPATH=. .venv/bin/python -m extproc bench routing --workload multi-turn --qps 2 --strategies default@3 \
    --repeat 1 --seed $((round*10)) --duration 20 --warmup 2 --out /work/wt/batch/idle-$rev-r$round \
    > /work/wt/batch/idle-$rev-r$round.log 2>&1
done; done
