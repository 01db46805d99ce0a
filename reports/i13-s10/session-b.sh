#!/bin/bash
# flock /work/wt/bench.lock bash reports/i13-s10/session-b.sh: 0.9x with 3 replicas; per round main (1518082)
# with flow on/off, then the branch with flow on, flow on + shared scrapes, flow off; two rounds in one locked run.
set -u
for round in a b; do
  git checkout -q 1518082 && bash reports/i13-s10/run.sh B-main-r3-0.9-$round --loads 0.9 --duration 30 --strategies default,default+noflow --replicas 3
  git checkout -q s10-flow && bash reports/i13-s10/run.sh B-final-r3-0.9-$round --loads 0.9 --duration 30 --strategies default,default+share,default+noflow --replicas 3
done
git checkout -q s10-flow
