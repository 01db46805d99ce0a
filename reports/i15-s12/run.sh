#!/bin/bash
# One locked bench run: reports/i15-s12/run.sh NAME ARGS... -> reports/i15-s12/NAME (uptime before/after in uptime.txt).
set -e
name=$1; shift
out=reports/i15-s12/$name; mkdir -p "$out"
exec flock /work/wt/bench.lock bash -c '
  out=$1; shift
  echo "commit: $(git rev-parse --short HEAD)  command: extproc bench routing $* --out $out" > "$out/uptime.txt"
  echo "before: $(date -u +%FT%TZ) $(uptime)" >> "$out/uptime.txt"
  .venv/bin/extproc bench routing "$@" --out "$out" > "$out/stdout.txt" 2>&1 || echo "exit $?" >> "$out/uptime.txt"
  echo "after: $(date -u +%FT%TZ) $(uptime)" >> "$out/uptime.txt"
' _ "$out" "$@"
