#!/bin/bash
# One locked bench run: `reports/routing-s8/run.sh NAME ARGS...` runs `extproc bench routing ARGS... --out
# reports/routing-s8/NAME` under the machine-wide lock, with uptime before and after in reports/routing-s8/NAME/uptime.txt.
set -e
name=$1; shift
out=reports/routing-s8/$name
mkdir -p "$out"
flock /work/wt/bench.lock bash -c '
  out=$1; shift
  { echo "before: $(date -u +%FT%TZ) $(uptime)"; } > "$out/uptime.txt"
  .venv/bin/extproc bench routing "$@" --out "$out" > "$out/stdout.txt" 2>&1 || echo "exit $?" >> "$out/uptime.txt"
  { echo "after: $(date -u +%FT%TZ) $(uptime)"; } >> "$out/uptime.txt"
' _ "$out" "$@"
