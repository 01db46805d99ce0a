#!/bin/sh
# Before/after under the same contention, one lock hold: main (121d332 = base), the budget fix (58ff172 = fix), the
# budget fix + large bodies one at a time (d1afc33 = fix2), + the 30 ns first guess (302880c = fix3; TREES picks
# them, SUFFIX names the files), fada4fc = final (the same with the turn only on large bodies), each from a
# `git archive` copy (PYTHONPATH), BUSY busy loops, ROUNDS rounds. Usage: flock /work/wt/bench.lock sh ab.sh BUSY ROUNDS
busy=$1; rounds=$2; out=/work/wt/suite/reports/suite-s13
echo "hold start $(date -u +%T) $(uptime)"
for tree in ${TREES:-base fix}; do
  cd /tmp/s13-suite-$tree && PYTHONPATH=/tmp/s13-suite-$tree timeout 400 /work/wt/suite/.venv/bin/python repro_item4.py \
    --busy "$busy" --rounds "$rounds" > "$out/ab-$tree-busy$busy$SUFFIX.jsonl" 2> "$out/ab-$tree-busy$busy$SUFFIX.err"
  echo "$tree rc $? $(date -u +%T) $(uptime)"
done
echo "hold end $(date -u +%T) $(uptime)"
