#!/bin/bash
# Several bench runs under ONE hold of the machine-wide lock: `reports/routing-s10/run-group.sh FILE`, FILE holding
# lines `NAME ARGS...`; each runs `extproc bench routing ARGS... --out reports/routing-s10/NAME` with the uptime
# before and after it in reports/routing-s10/NAME/uptime.txt. Run from the worktree's root.
set -e
exec flock /work/wt/bench.lock bash -c '
  while read -r name args; do
    [ -z "$name" ] && continue
    out=reports/routing-s10/$name; mkdir -p "$out"
    echo "before: $(date -u +%FT%TZ) $(uptime) psi-cpu: $(head -1 /proc/pressure/cpu)" > "$out/uptime.txt"
    .venv/bin/extproc bench routing $args --out "$out" > "$out/stdout.txt" 2>&1 || echo "exit $?" >> "$out/uptime.txt"
    echo "after: $(date -u +%FT%TZ) $(uptime) psi-cpu: $(head -1 /proc/pressure/cpu)" >> "$out/uptime.txt"
  done < "$1"
' _ "$1"
