#!/bin/bash
# Several bench runs under ONE hold of the lock: reports/i15-s12/run-group.sh FILE, FILE holding lines `NAME ARGS...`;
# each runs `extproc bench routing ARGS... --out reports/i15-s12/NAME`, commit and uptime in NAME/uptime.txt.
set -e
exec flock /work/wt/bench.lock bash -c '
  while read -r name args; do
    [ -z "$name" ] && continue
    out=reports/i15-s12/$name; mkdir -p "$out"
    echo "commit: $(git rev-parse --short HEAD)  command: extproc bench routing $args --out $out" > "$out/uptime.txt"
    echo "before: $(date -u +%FT%TZ) $(uptime)" >> "$out/uptime.txt"
    .venv/bin/extproc bench routing $args --out "$out" > "$out/stdout.txt" 2>&1 || echo "exit $?" >> "$out/uptime.txt"
    echo "after: $(date -u +%FT%TZ) $(uptime)" >> "$out/uptime.txt"
  done < "$1"
' _ "$1"
