#!/bin/bash
cd /work/wt/tests
for r in $(seq 1 $1); do
  for v in old new; do
    if [ $v = old ]; then pp=/tmp/s8-old; else pp=/work/wt/tests; fi
    echo "== round $r $v ($(uptime))"
    PYTHONPATH=$pp .venv/bin/extproc bench routing --workload shared-prefix --strategies default --qps 24 --duration 20 --warmup 5 --out /tmp/s8/routing/$v-r$r 2>&1 | tail -8
  done
done
echo "== end ($(uptime))"
