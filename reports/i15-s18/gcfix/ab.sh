#!/bin/bash
# Session 18: before (d0e1432) vs after (the GC fix) on the same machine, back to back, alternating trees, each
# run under the bench lock. Usage: reports/i15-s18/gcfix/ab.sh BEFORE_TREE AFTER_TREE OUT
set -e
before=$1; after=$2; out=$3; PY=/work/main/.venv/bin/python
mkdir -p "$out"
run() {  # tree name args...
  tree=$1; name=$2; shift 2
  flock /work/wt/bench.lock bash -c 'cd "$1" && shift && echo "$(date -u +%T) $(uptime)" && PYTHONPATH=. "$@"' _ "$tree" \
    "$PY" -m extproc bench routing --repeat 3 --duration 20 --warmup 5 --out "$out/$name" "$@" > "$out/$name.log" 2>&1
  tail -4 "$out/$name.log" | head -3
}
for round in 1; do
  run "$before" mt80-before --workload multi-turn --qps 91.38 --strategies default
  run "$after" mt80-after --workload multi-turn --qps 91.38 --strategies default
  run "$before" u80-before --workload shared-prefix --popularity uniform --qps 70.53 --strategies default,default@3
  run "$after" u80-after --workload shared-prefix --popularity uniform --qps 70.53 --strategies default,default@3
  run "$before" mt80x3-before --workload multi-turn --qps 91.38 --strategies default@3
  run "$after" mt80x3-after --workload multi-turn --qps 91.38 --strategies default@3
done
