#!/bin/bash
# One locked bench run (reports/i15-s12/run.sh, run from an archived copy of HEAD so that the worktree may change):
# reports/i15-s14/hop/run.sh NAME ARGS... -> reports/i15-s14/hop/NAME (uptime before/after in uptime.txt).
set -e
name=$1; shift
out=$(pwd)/reports/i15-s14/hop/$name; mkdir -p "$out"
T=$(mktemp -d /tmp/s14-hop-run.XXXX); git archive HEAD | tar -x -C "$T"
echo "commit: $(git rev-parse --short HEAD)  command: extproc bench routing $* --out $out" > "$out/uptime.txt"
flock /work/wt/bench.lock bash -c '
  out=$1; T=$2; PY=$3; shift 3
  echo "before: $(date -u +%FT%TZ) $(uptime)" >> "$out/uptime.txt"
  (cd "$T" && PYTHONPATH=$T "$PY" -m extproc bench routing "$@" --out "$out" > "$out/stdout.txt" 2>&1) || echo "exit $?" >> "$out/uptime.txt"
  echo "after: $(date -u +%FT%TZ) $(uptime)" >> "$out/uptime.txt"
' _ "$out" "$T" "$(pwd)/.venv/bin/python" "$@"
rm -rf "$T"
