#!/bin/bash
# Usage (from the worktree root): TREE=DIR bash reports/i13-s12/run.sh NAME ARGS...   (inside flock /work/wt/bench.lock)
# Runs `extproc bench routing ARGS --out reports/i13-s12/NAME` from the clean checkout in $TREE (PYTHONPATH=$TREE, so
# edits in the worktree meanwhile change nothing), logging the command, the commit and `uptime` before and after
# into reports/i13-s12/NAME/run.log. (Same as reports/i13-s11/run.sh, with the workload among ARGS.)
set -u
name=$1; shift
W=$(pwd)
out=$W/reports/i13-s12/$name
mkdir -p "$out"
{
  echo "commit $(cat "$TREE/COMMIT")"
  echo "command: .venv/bin/extproc bench routing $* --out reports/i13-s12/$name"
  echo "uptime before: $(date -u +%T) $(uptime)"
} > "$out/run.log"
(cd "$TREE" && PYTHONPATH=$TREE "$W/.venv/bin/python" -m extproc bench routing "$@" --out "$out") >> "$out/run.log" 2>&1
echo "rc $?" >> "$out/run.log"
echo "uptime after: $(date -u +%T) $(uptime)" >> "$out/run.log"
tail -8 "$out/run.log"
