#!/bin/bash
# alternating old/new runs of bench scheduling --endpoints 256; $1 = rounds, $2 = out dir
set -e
cd /work/wt/tests
out=$2; mkdir -p $out
for r in $(seq 1 $1); do
  for v in old new; do
    if [ $v = old ]; then pp=/tmp/s8-old; else pp=/work/wt/tests; fi
    echo "== round $r $v ($(uptime))"
    PYTHONPATH=$pp .venv/bin/extproc bench scheduling --endpoints 256 --json $out/$v-r$r.json > $out/$v-r$r.txt 2>&1
    cat $out/$v-r$r.txt
  done
done
