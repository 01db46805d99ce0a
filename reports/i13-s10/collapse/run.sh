#!/bin/bash
# Issue 13/15, session 10: do 3 replicas still collapse at 80% load when the CPU is contended (two busy-loop
# processes beside the bench, as when other suites ran in the replicas helper's base run)? Merged main, one hold.
#   flock /work/wt/bench.lock bash reports/i13-s10/collapse/run.sh
set -u
W=$(pwd); OUT=$W/reports/i13-s10/collapse
T=$(mktemp -d /tmp/s10-collapse.XXXX); git archive HEAD | tar -x -C "$T"
echo "tree $(git rev-parse --short HEAD); before: $(date -u +%FT%TZ) $(uptime)" > "$OUT/uptime.txt"
python3 -c "while 1: pass" & B1=$!
python3 -c "while 1: pass" & B2=$!
trap 'kill $B1 $B2 2>/dev/null; rm -rf "$T"' EXIT
(cd "$T" && PYTHONPATH=$T "$W/.venv/bin/python" -m extproc bench routing --workload multi-turn --loads 0.8 \
  --strategies default,default@3 --repeat 3 --duration 20 --warmup 5 --stream-chunk-tokens 16 \
  --out "$OUT/multi-turn80" > "$OUT/stdout.txt" 2>&1) || echo "exit $?" >> "$OUT/uptime.txt"
echo "after: $(date -u +%FT%TZ) $(uptime)" >> "$OUT/uptime.txt"
