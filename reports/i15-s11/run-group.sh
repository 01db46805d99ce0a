#!/bin/bash
# Several `extproc bench routing` runs under ONE hold of the machine-wide lock, from the committed tree (archived,
# so that edits meanwhile change nothing): `reports/i15-s11/run-group.sh FILE`, FILE holding lines `NAME ARGS...`;
# each runs `extproc bench routing ARGS... --out reports/i15-s11/NAME` with the commit, the uptime and the kernel's
# CPU pressure before and after it in reports/i15-s11/NAME/uptime.txt. Run from the worktree's root.
set -e
W=$(pwd); T=$(mktemp -d /tmp/s11-hop-tree.XXXX); git archive HEAD | tar -x -C "$T"; REV=$(git rev-parse --short HEAD)
exec flock /work/wt/bench.lock bash -c '
  W=$1; T=$2; REV=$3
  while read -r name args; do
    [ -z "$name" ] && continue
    out=$W/reports/i15-s11/$name; mkdir -p "$out"
    echo "tree: $REV; before: $(date -u +%FT%TZ) $(uptime) psi-cpu: $(head -1 /proc/pressure/cpu)" > "$out/uptime.txt"
    (cd "$T" && PYTHONPATH=$T "$W/.venv/bin/python" -m extproc bench routing $args --out "$out" > "$out/stdout.txt" 2>&1) \
      || echo "exit $?" >> "$out/uptime.txt"
    echo "after: $(date -u +%FT%TZ) $(uptime) psi-cpu: $(head -1 /proc/pressure/cpu)" >> "$out/uptime.txt"
  done < "$4"
  rm -rf "$T"
' _ "$W" "$T" "$REV" "$1"
