#!/bin/bash
# Usage (from the worktree root): flock /work/wt/bench.lock bash reports/i13-s11/run.sh NAME ARGS...
# Runs `extproc bench routing --workload overload ARGS --out reports/i13-s11/NAME`, logging the command, the
# commit and `uptime` before and after into reports/i13-s11/NAME/run.log.
set -u
name=$1; shift
out=reports/i13-s11/$name
mkdir -p "$out"
{
  echo "commit $(git rev-parse --short HEAD) $(git diff --quiet || echo '+uncommitted')"
  echo "command: .venv/bin/extproc bench routing --workload overload $* --out $out"
  echo "uptime before: $(uptime)"
} > "$out/run.log"
.venv/bin/extproc bench routing --workload overload "$@" --out "$out" >> "$out/run.log" 2>&1
echo "rc $?" >> "$out/run.log"
echo "uptime after: $(uptime)" >> "$out/run.log"
tail -12 "$out/run.log"
