#!/bin/bash
cd /work/wt/tests
echo "== start $(date -u +%H:%M:%S) ($(uptime))"
echo "new = $(git rev-parse --short HEAD), old = 3cfdc8d"
/tmp/s8/ab.sh 3 /tmp/s8/final2-sched
echo "== after scheduling $(date -u +%H:%M:%S) ($(uptime))"
for v in old new; do
  if [ $v = old ]; then pp=/tmp/s8-old; else pp=/work/wt/tests; fi
  echo "== routing round 3 $v ($(uptime))"
  PYTHONPATH=$pp .venv/bin/extproc bench routing --workload shared-prefix --strategies default --qps 24 --duration 20 --warmup 5 --out /tmp/s8/routing/$v-r3 2>&1 | grep "ok=" 
done
echo "== end $(date -u +%H:%M:%S) ($(uptime))"
