#!/bin/bash
# Real multi-turn runs, ours only, main (6d2adb7) and the same tree with vt/conversation-pairs.diff, back to back
# under the bench lock: `extproc bench routing --workload multi-turn --strategies default --loads 0.4,0.8 --repeat 3`.
set -e
out=/work/main/reports/i15-s24/conv-pairs
for run in main pairs; do
  tree=/work/main; [ $run = pairs ] && tree=/work/wt/talks
  flock /work/wt/bench.lock bash -c "cd $tree && echo \"$run: \$(date -u +%FT%TZ) \$(uptime)\" >> $out/uptime.txt && \
    PYTHONPATH=$tree /work/main/.venv/bin/python -m extproc bench routing --workload multi-turn --strategies default \
    --loads 0.4,0.8 --repeat 3 --duration 20 --warmup 5 --stream-chunk-tokens 16 --out $out/$run > $out/$run.log 2>&1"
done
