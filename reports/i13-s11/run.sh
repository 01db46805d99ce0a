#!/bin/bash
# Usage (from the worktree root): flock /work/wt/bench.lock bash reports/i13-s11/run.sh NAME ARGS...
# Runs `extproc bench routing --workload overload ARGS --out reports/i13-s11/NAME` from a clean checkout of the
# commit in $TREE (PYTHONPATH=$TREE, so edits in the worktree meanwhile change nothing), logging the command, the
# commit and `uptime` before and after into reports/i13-s11/NAME/run.log.
set -u
name=$1; shift
W=$(pwd)
out=$W/reports/i13-s11/$name
mkdir -p "$out"
{
  echo "commit $(git -C "$TREE" rev-parse --short HEAD 2>/dev/null || cat "$TREE/COMMIT")"
  echo "command: .venv/bin/extproc bench routing --workload overload $* --out reports/i13-s11/$name"
  echo "uptime before: $(date -u +%T) $(uptime)"
} > "$out/run.log"
(cd "$TREE" && PYTHONPATH=$TREE "$W/.venv/bin/python" -m extproc bench routing --workload overload "$@" --out "$out") >> "$out/run.log" 2>&1
echo "rc $?" >> "$out/run.log"
echo "uptime after: $(date -u +%T) $(uptime)" >> "$out/run.log"
tail -12 "$out/run.log"
