#!/bin/bash
# flock /work/wt/bench.lock bash reports/i13-s11/session-a.sh: 0.9x, 1 service replica, flow control on and off
# interleaved per seed, seeds 0-5, 20 s per point; percentiles pooled over the seeds (--repeat).
set -u
echo "lock held from $(date -u +%T)"
bash reports/i13-s11/run.sh r1-0.9 --loads 0.9 --duration 20 --repeat 6 --strategies default,default+noflow --replicas 1
echo "lock released at $(date -u +%T)"
