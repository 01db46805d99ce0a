#!/bin/sh
# Tiny real `extproc bench routing-suite` run (task 1 smoke): uniform case, ours + sglang-router (+ default@3 added by
# the suite), 2 seeds, 4 s per point. Run from the worktree at a committed state: flock /work/wt/bench.lock sh THIS
cd /work/wt/suite
echo "commit $(git rev-parse --short HEAD) dirty=$(git status --porcelain extproc | wc -l)"; date -u; uptime
.venv/bin/extproc bench routing-suite --cases uniform --strategies default,sglang-cache-aware --loads 0.4 \
  --repeat 2 --duration 4 --warmup 1 --out reports/suite-s13/smoke
rc=$?
date -u; uptime; echo "rc $rc"
