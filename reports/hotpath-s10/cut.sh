#!/bin/bash
# Issue 18, session 10: the one cut of this session (header blocks decoded once, extproc/server/h2/blocks.py),
# before vs after, lean front end, default policy, alternating invocations of `extproc bench overhead` from two
# archived trees (same venv). Run from the worktree:
#   flock /work/wt/bench.lock bash reports/hotpath-s10/cut.sh reports/hotpath-s10/cut.txt BEFORE AFTER
set -u
W=$(pwd); OUT=$1; BEFORE=$2; AFTER=$3; PY=$W/.venv/bin/python
J=$W/reports/hotpath-s10/json/$(basename "$OUT" .txt); mkdir -p "$J"
declare -A TREE
for side in before after; do
  TREE[$side]=$(mktemp -d /tmp/s10-cut-$side.XXXX)
done
git archive "$BEFORE" | tar -x -C "${TREE[before]}"; git archive "$AFTER" | tar -x -C "${TREE[after]}"
{
echo "before = $(git rev-parse --short "$BEFORE"), after = $(git rev-parse --short "$AFTER"), $(date -u)"
echo "uptime before: $(uptime)"
A="--rate 200 --duration 16 --rounds 4 --max-duration 3 --trivial off --front-ends lean"
for i in 1 2; do
  for side in before after; do
    tree=${TREE[$side]}
    echo "\$ ($side tree) python -m extproc bench overhead $A --json $J/$side-$i.json"
    (cd "$tree" && PYTHONPATH=$tree "$PY" -m extproc bench overhead $A --json "$J/$side-$i.json" 2>&1 \
      | grep -v '^round \|^max throughput:\|^warming\|^report written')
  done
done
echo "uptime after: $(uptime)"
echo "finished $(date -u)"
} 2>&1 | tee "$OUT"
rm -rf "${TREE[before]}" "${TREE[after]}"
