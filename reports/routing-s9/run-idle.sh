#!/bin/bash
# Idle CPU of a 3-replica fleet, old (0248929) vs new (HEAD) source trees alternating, in one hold of the lock:
#   reports/routing-s9/run-idle.sh OUT.txt
set -eu
W=$(pwd); OUT=$1; mkdir -p /tmp/s9-prof
rm -rf /tmp/s9-prof/old /tmp/s9-prof/new; mkdir -p /tmp/s9-prof/old /tmp/s9-prof/new
git archive 0248929 | tar -x -C /tmp/s9-prof/old; git archive HEAD | tar -x -C /tmp/s9-prof/new
flock /work/wt/bench.lock bash -c "
  echo \"new = \$(git rev-parse --short HEAD), old = 0248929; before: \$(date -u +%FT%TZ) \$(uptime)\"
  for t in old new old new old new; do bash $W/reports/routing-s9/idle.sh /tmp/s9-prof/\$t; done
  echo \"after: \$(date -u +%FT%TZ) \$(uptime)\"" 2>&1 | tee "$OUT"
