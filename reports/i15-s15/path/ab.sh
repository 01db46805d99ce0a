#!/bin/bash
# One locked hold: in-process harness and `extproc bench overhead` alternating A (63bb0fb, main) and B (this
# branch), order A B B A A B B A. Run as: flock /work/wt/bench.lock bash reports/i15-s15/path/ab.sh OUTDIR
set -u
out=$1; mkdir -p "$out"
py=/work/wt/i13/.venv/bin/python
harness=/work/wt/i13/reports/i15-s15/path/harness.py
{ date -u; uptime; } > "$out/lock-start.txt"
n=0
for c in A B B A A B B A; do
  n=$((n+1))
  dir=/tmp/s15-$c
  (cd $dir && PYTHONPATH=$dir $py $harness time 3000) > "$out/harness-$n-$c.txt" 2>&1
  (cd $dir && PYTHONPATH=$dir timeout 240 $py -m extproc bench overhead --rate 200 --duration 20 --rounds 4 \
      --prompt-chars 1000 --system-chars 12000 --max-duration 2 --json "$out/overhead-$n-$c.json" \
      --workdir "$out/work-$n-$c") > "$out/overhead-$n-$c.txt" 2>&1
  echo "$n $c rc=$? $(date -u +%T)" >> "$out/runs.txt"
done
{ date -u; uptime; } > "$out/lock-end.txt"
