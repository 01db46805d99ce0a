#!/bin/bash
# Service CPU per request and added latency, main's service vs this branch's, in ONE hold of the bench lock, runs
# alternating (old, new, old, new, old, new). Both run this branch's bench code; "old" runs main's service code
# (BASE, default 121d332: buffered bodies, two round trips), "new" this branch (prebuffered: one round trip).
# `extproc bench overhead` on the lean front end, default policy, a 13,000-character system prompt + 1,200-character
# question (as reports/i15-s11/cpu.txt).
# usage (from the worktree): flock /work/wt/bench.lock bash reports/i15-s13-hop/cpu.sh OUT.txt [BASE]
set -u
W=$(pwd); OUT=$1; BASE=${2:-121d332}; PY=$W/.venv/bin/python
J=$W/reports/i15-s13-hop/json/$(basename "$OUT" .txt); mkdir -p "$J"
NEW=$(mktemp -d /tmp/s13-hop-new.XXXX); OLD=$(mktemp -d /tmp/s13-hop-old.XXXX)
git archive HEAD | tar -x -C "$NEW"; git archive "$BASE" | tar -x -C "$OLD"
cp "$NEW"/extproc/bench/overhead.py "$NEW"/extproc/bench/overhead_stack.py "$OLD"/extproc/bench/
A="--rate 200 --duration 12 --rounds 3 --max-duration 3 --trivial off --front-ends lean --prompt-chars 1200 --system-chars 13000"
{
echo "new = $(git rev-parse --short HEAD), old = $BASE (service code; bench code of new), $(date -u)"
echo "uptime before: $(uptime) psi-cpu: $(head -1 /proc/pressure/cpu)"
for round in 1 2 3; do
  for side in old new; do
    T=$OLD; [ $side = new ] && T=$NEW
    echo "\$ [$side, round $round] python -m extproc bench overhead $A --json $J/$side-$round.json"
    (cd "$T" && PYTHONPATH=$T "$PY" -m extproc bench overhead $A --json "$J/$side-$round.json" 2>&1 \
      | grep -v '^round \|^max throughput:\|^warming\|^report written')
  done
done
echo "uptime after: $(uptime) psi-cpu: $(head -1 /proc/pressure/cpu)"
echo "finished $(date -u)"
} 2>&1 | tee "$OUT"
rm -rf "$NEW" "$OLD"
