#!/bin/sh
# One locked run on the merged tree (main 44fa6ad: the bench's `default` is the shipped lean front end, prefix
# chains memoised): multi-turn 80% with 1 vs 3 replicas vs sglang-router, drift 40% lean vs grpcio vs sglang-router.
log=reports/i15-s11/uptime.txt
common="--repeat 2 --duration 20 --warmup 5 --stream-chunk-tokens 16 --samples"
mt=".venv/bin/extproc bench routing --workload multi-turn --strategies default,default@3,sglang-cache-aware --loads 0.8 $common --out reports/i15-s11/merged-multi-turn80"
dr=".venv/bin/extproc bench routing --workload drift --groups 48 --prefix-tokens 3000 --question-tokens 300 --output-tokens 100 --popularity zipf:1.1 --strategies default,default+grpcio,sglang-cache-aware --loads 0.4 $common --out reports/i15-s11/merged-drift40"
exec flock /work/wt/bench.lock sh -c "
  echo \"## \$(date -u +%FT%TZ) merged tree at \$(git rev-parse --short HEAD): $mt ; $dr\" >> $log
  echo \"before: \$(uptime) psi-cpu: \$(head -1 /proc/pressure/cpu 2>/dev/null)\" >> $log
  start=\$(date +%s)
  $mt > reports/i15-s11/merged-multi-turn80.log 2>&1
  echo \"between: \$(uptime) psi-cpu: \$(head -1 /proc/pressure/cpu 2>/dev/null)\" >> $log
  $dr > reports/i15-s11/merged-drift40.log 2>&1; rc=\$?
  echo \"after: \$(uptime) psi-cpu: \$(head -1 /proc/pressure/cpu 2>/dev/null)\" >> $log
  echo \"rc \$rc; locked \$(( \$(date +%s) - start )) s\" >> $log
"
