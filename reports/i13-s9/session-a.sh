#!/bin/bash
# Locked session A (one lock hold, < 10 min): flock /work/wt/bench.lock bash reports/i13-s9/session-a.sh
cd "$(dirname "$0")/../.." || exit 1
bash reports/i13-s9/run.sh overload-0.9 --loads 0.9 --duration 30 --strategies default,default+noflow
bash reports/i13-s9/run.sh overload-0.9-r3 --loads 0.9 --duration 30 --strategies default,default+noflow --replicas 3
bash reports/i13-s9/run.sh overload-2x --loads 0.7,2 --duration 30 --strategies default
