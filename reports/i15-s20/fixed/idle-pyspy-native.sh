#!/bin/bash
cd /work/main
OUT=/work/main/reports/i15-s20/fixed/run3
mkdir -p $OUT
.venv/bin/python -m extproc bench routing --workload shared-prefix --popularity uniform --qps 2 --strategies default@3 --repeat 1 --duration 25 --warmup 5 --out $OUT/run > $OUT/run.log 2>&1 &
B=$!
for i in $(seq 1 90); do
  P=$(pgrep -f "extproc serve --config" | head -3 | tr '\n' ' ')
  [ $(echo $P | wc -w) -ge 3 ] && break; sleep 1
done
sleep 12
set -- $P
/tmp/pyspy-inst/bin/py-spy record --native -r 100 -d 12 -p $2 -f raw -o $OUT/replica.raw > $OUT/pyspy.log 2>&1 &
Q=$!
timeout 10 strace -c -f -p $3 -o $OUT/strace.txt > /dev/null 2>&1
wait $Q
wait $B
