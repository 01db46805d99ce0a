#!/bin/bash
# The idle service's CPU (the metrics scraper's fixed cost), old (main 3cfdc8d) vs new (HEAD), alternating.
# Run from the worktree: flock /work/wt/bench.lock bash reports/hotpath-s8/run-idle.sh OUT.txt [OLD_COMMIT]
set -u
W=$(pwd); OUT=$1; OLD_COMMIT=${2:-3cfdc8d}; PY=$W/.venv/bin/python
NEW=$(mktemp -d /tmp/s8-idle-new.XXXX); OLD=$(mktemp -d /tmp/s8-idle-old.XXXX)
git archive HEAD | tar -x -C "$NEW"; git archive "$OLD_COMMIT" | tar -x -C "$OLD"
{
echo "new = $(git rev-parse --short HEAD) ($NEW), old = $(git rev-parse --short "$OLD_COMMIT") ($OLD), $(date -u)"
echo "uptime before: $(uptime)"
for n in 1 8; do
  echo "\$ python reports/hotpath-s8/idle_scrape.py 20 3 $n <old tree> <new tree>"
  "$PY" "$W/reports/hotpath-s8/idle_scrape.py" 20 3 "$n" "$OLD" "$NEW" 2>&1
done
echo "uptime after: $(uptime)"
} 2>&1 | tee "$OUT"
rm -rf "$NEW" "$OLD"
