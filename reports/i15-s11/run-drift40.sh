#!/bin/sh
# Drift 40%, seeds 2-5, ours vs sglang-router: is the suite's drift 40% gap outside the seed spread? (locked run)
log=reports/i15-s11/uptime.txt
cmd=".venv/bin/extproc bench routing --workload drift --groups 48 --prefix-tokens 3000 --question-tokens 300 --output-tokens 100 --popularity zipf:1.1 --strategies default,sglang-cache-aware --loads 0.4 --seed 2 --repeat 4 --duration 20 --warmup 5 --stream-chunk-tokens 16 --samples --out reports/i15-s11/drift40-seeds2-5"
exec flock /work/wt/bench.lock sh -c "
  echo \"## \$(date -u +%FT%TZ) drift40 seeds 2-5 at \$(git rev-parse --short HEAD): $cmd\" >> $log
  echo \"before: \$(uptime) psi-cpu: \$(head -1 /proc/pressure/cpu 2>/dev/null)\" >> $log
  start=\$(date +%s)
  $cmd > reports/i15-s11/drift40-seeds2-5.log 2>&1; rc=\$?
  echo \"after: \$(uptime) psi-cpu: \$(head -1 /proc/pressure/cpu 2>/dev/null)\" >> $log
  echo \"rc \$rc; locked \$(( \$(date +%s) - start )) s\" >> $log
"
