#!/bin/bash
# One locked bench run from the committed tree (archived: edits meanwhile change nothing), (session 13 copy of reports/i15-s13/run.sh)
# for one point: reports/i15-s14/pairs/run.sh NAME ARGS... -> `extproc bench routing ARGS... --out reports/i15-s14/pairs/NAME`,
# with the commit, the uptime and the CPU pressure before and after in reports/i15-s14/pairs/NAME/uptime.txt.
# Run from the worktree's root; give --scheduling an absolute path.
set -e
W=$(pwd); name=$1; shift
T=$(mktemp -d /tmp/s14-pairs-tree.XXXX); git archive HEAD | tar -x -C "$T"; REV=$(git rev-parse --short HEAD)
out=$W/reports/i15-s14/pairs/$name; mkdir -p "$out"
exec flock /work/wt/bench.lock bash -c '
  W=$1; T=$2; REV=$3; out=$4; shift 4
  echo "commit: $REV  command: extproc bench routing $* --out $out" > "$out/uptime.txt"
  echo "before: $(date -u +%FT%TZ) $(uptime) psi-cpu: $(head -1 /proc/pressure/cpu)" >> "$out/uptime.txt"
  (cd "$T" && PYTHONPATH=$T "$W/.venv/bin/python" -m extproc bench routing "$@" --out "$out" > "$out/stdout.txt" 2>&1) \
    || echo "exit $?" >> "$out/uptime.txt"
  echo "after: $(date -u +%FT%TZ) $(uptime) psi-cpu: $(head -1 /proc/pressure/cpu)" >> "$out/uptime.txt"
  rm -rf "$T"
' _ "$W" "$T" "$REV" "$out" "$@"
