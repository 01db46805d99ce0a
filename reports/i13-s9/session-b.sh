#!/bin/bash
# Locked session B (one lock hold, < 10 min): flock /work/wt/bench.lock bash reports/i13-s9/session-b.sh
# Later runs are skipped past 03:22 UTC (the session's deadline).
cd "$(dirname "$0")/../.." || exit 1
bash reports/i13-s9/run.sh overload-0.9-r3 --loads 0.9 --duration 30 --strategies default,default+noflow --replicas 3
[ "$(date -u +%H%M)" -lt 0322 ] || exit 0
bash reports/i13-s9/run.sh overload-2x-r3 --loads 0.7,2 --duration 30 --strategies default --replicas 3
[ "$(date -u +%H%M)" -lt 0322 ] || exit 0
bash reports/i13-s9/run.sh overload-below --loads 0.3,0.6 --duration 30 --strategies default,default+noflow
