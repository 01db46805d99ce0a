#!/bin/bash
# Issue 15, session 9: before (OLD commit, default main 0248929) vs after (this branch's HEAD) in ONE hold of the
# machine-wide lock. Each line of FILE is `NAME ARGS...`; per line, the old tree then the new tree run
# `extproc bench routing ARGS... --out reports/routing-s9/NAME-{old,new}` (new adds --samples), each side from
# its own source tree (PYTHONPATH; the services, the simulator and the bench all come from that tree), same venv.
# `uptime` before and after each run goes to its uptime.txt.
#   reports/routing-s9/run-ab.sh FILE [OLD_COMMIT]
set -eu
W=$(pwd); FILE=$1; OLD_COMMIT=${2:-0248929}
NEW=$(mktemp -d /tmp/s9-ab-new.XXXX); OLD=$(mktemp -d /tmp/s9-ab-old.XXXX)
git archive HEAD | tar -x -C "$NEW"; git archive "$OLD_COMMIT" | tar -x -C "$OLD"
echo "new = $(git rev-parse --short HEAD), old = $(git rev-parse --short "$OLD_COMMIT")"
exec flock /work/wt/bench.lock bash -c '
  W=$1; FILE=$2; NEW=$3; OLD=$4
  while read -r name args; do
    [ -z "$name" ] && continue
    for side in old new; do
      tree=$NEW; extra=--samples; [ "$side" = old ] && { tree=$OLD; extra=; }
      out=$W/reports/routing-s9/$name-$side; mkdir -p "$out"
      echo "before: $(date -u +%FT%TZ) $(uptime)" > "$out/uptime.txt"
      (cd "$tree" && PYTHONPATH=$tree "$W/.venv/bin/python" -m extproc bench routing $args $extra --out "$out" \
        > "$out/stdout.txt" 2>&1) || echo "exit $?" >> "$out/uptime.txt"
      echo "after: $(date -u +%FT%TZ) $(uptime)" >> "$out/uptime.txt"
    done
  done < "$FILE"
  rm -rf "$NEW" "$OLD"
' _ "$W" "$FILE" "$NEW" "$OLD"
