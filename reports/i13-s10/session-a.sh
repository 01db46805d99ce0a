#!/bin/bash
# flock /work/wt/bench.lock bash reports/i13-s10/session-a.sh: 0.9x with 3 replicas, main (1518082) and the fix
# alternated, twice each, in one locked run (the worktree is checked out at each commit in turn).
set -u
for round in a b; do
  git checkout -q 1518082 && bash reports/i13-s10/run.sh main-r3-0.9-$round --loads 0.9 --duration 30 --strategies default,default+noflow --replicas 3
  git checkout -q s10-flow && bash reports/i13-s10/run.sh fix-r3-0.9-$round --loads 0.9 --duration 30 --strategies default,default+noflow --replicas 3
done
git checkout -q s10-flow
