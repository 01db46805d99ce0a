#!/bin/bash
# Issue 15, session 10: several `extproc bench routing` runs under ONE hold of the machine-wide lock, each from a
# given source tree (default: this worktree). Each line of FILE is `NAME ARGS...`; NAME may be `NAME@TREE-LABEL`.
#   reports/routing-s10-replicas/run-group.sh FILE [LABEL=COMMIT ...]
# With LABEL=COMMIT pairs, each line runs once per label from `git archive COMMIT` (PYTHONPATH; same venv), output
# in reports/routing-s10-replicas/NAME-LABEL; without, once from the work tree, output in .../NAME.
# `uptime` before and after each run goes to its uptime.txt.
set -eu
W=$(pwd); FILE=$1; shift
TREES=""
for pair in "$@"; do
  label=${pair%%=*}; commit=${pair#*=}; dir=$(mktemp -d /tmp/s10-$label.XXXX)
  git archive "$commit" | tar -x -C "$dir"; echo "$label = $(git rev-parse --short "$commit") in $dir"
  TREES="$TREES $label=$dir"
done
[ -z "$TREES" ] && TREES=" -=$W"
exec flock /work/wt/bench.lock bash -c '
  W=$1; FILE=$2; TREES=$3
  while read -r name args; do
    [ -z "$name" ] && continue
    for pair in $TREES; do
      label=${pair%%=*}; tree=${pair#*=}
      out=$W/reports/routing-s10-replicas/$name; [ "$label" != - ] && out=$out-$label
      mkdir -p "$out"
      echo "before: $(date -u +%FT%TZ) $(uptime)" > "$out/uptime.txt"
      (cd "$tree" && PYTHONPATH=$tree "$W/.venv/bin/python" -m extproc bench routing $args --out "$out" \
        > "$out/stdout.txt" 2>&1) || echo "exit $?" >> "$out/uptime.txt"
      echo "after: $(date -u +%FT%TZ) $(uptime)" >> "$out/uptime.txt"
    done
  done < "$FILE"
  for pair in $TREES; do [ "${pair%%=*}" != - ] && rm -rf "${pair#*=}"; done; true
' _ "$W" "$FILE" "$TREES"
