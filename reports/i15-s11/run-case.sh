#!/bin/sh
# One locked run of one routing-suite case (issue 15, session 11). Usage, from the worktree root:
#   reports/i15-s11/run-case.sh CASE [extra routing-suite args]
# Appends the command, the lock's start/end and `uptime` + CPU pressure before/after to reports/i15-s11/uptime.txt.
case="$1"; shift
log=reports/i15-s11/uptime.txt
cmd=".venv/bin/extproc bench routing-suite --cases $case --strategies default,sglang-cache-aware,vllm-router-cache-aware --repeat 2 --duration 20 --warmup 5 --samples --out reports/i15-s11/suite $*"
exec flock /work/wt/bench.lock sh -c "
  echo \"## \$(date -u +%FT%TZ) $case at \$(git rev-parse --short HEAD): $cmd\" >> $log
  echo \"before: \$(uptime) psi-cpu: \$(head -1 /proc/pressure/cpu 2>/dev/null)\" >> $log
  start=\$(date +%s)
  nice -n 0 $cmd > reports/i15-s11/suite-$case.log 2>&1; rc=\$?
  echo \"after: \$(uptime) psi-cpu: \$(head -1 /proc/pressure/cpu 2>/dev/null)\" >> $log
  echo \"rc \$rc; locked \$(( \$(date +%s) - start )) s\" >> $log
"
