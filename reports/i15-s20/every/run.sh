#!/bin/bash
# Placements every 10 ms (a94e950: both exchanges on one 10-ms timer) vs every 20 ms riding every second in-flight
# round (798c718), one vs three replicas in each run, alternating A B A B at uniform 80%, then B A at multi-turn 80%.
O=/work/main/reports/i15-s20/every
run() {  # tree label args...
  local tree=$1 label=$2; shift 2
  (cd $tree && PYTHONPATH=. .venv/bin/python -m extproc bench routing "$@" --strategies default,default@3 --repeat 3 --duration 20 --warmup 5 --out $O/$label > $O/$label.log 2>&1)
  echo "$label rc=$?"
}
U="--workload shared-prefix --popularity uniform --qps 70.53"
M="--workload multi-turn --qps 91.38"
run /work/wt/s20A u80-ms10-r1 $U
run /work/main u80-ms20-r1 $U
run /work/wt/s20A u80-ms10-r2 $U
run /work/main u80-ms20-r2 $U
run /work/main mt80-ms20-r1 $M
run /work/wt/s20A mt80-ms10-r1 $M
