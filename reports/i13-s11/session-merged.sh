#!/bin/bash
# flock /work/wt/bench.lock bash reports/i13-s11/session-merged.sh (from /work/main at the merge of s11-flow):
# the acceptance points the helper had no lock time for, on merged main: 2x against 0.7x with 1 and 3 replicas,
# and 0.3x/0.6x flow on/off with 1 replica.
set -u
export TREE=$(pwd)
bash reports/i13-s11/run.sh M-r1-2x --loads 0.7,2 --duration 30 --strategies default
bash reports/i13-s11/run.sh M-r3-2x --loads 0.7,2 --duration 30 --strategies default --replicas 3
bash reports/i13-s11/run.sh M-r1-below --loads 0.3,0.6 --duration 30 --strategies default,default+noflow
TREE=$(pwd) bash reports/i13-s11/run.sh M-r1-below-pooled --loads 0.3,0.6 --duration 20 --repeat 3 --strategies default,default+noflow
