#!/bin/bash
# flock /work/wt/bench.lock bash reports/i13-s10/session-c.sh: the other acceptance points on the branch:
# 0.9x with 1 replica, 0.3x/0.6x with 1 replica (flow on/off), 2x against 0.7x with 1 and 3 replicas.
set -u
bash reports/i13-s10/run.sh C-r1-0.9 --loads 0.9 --duration 30 --strategies default,default+noflow
bash reports/i13-s10/run.sh C-r1-below --loads 0.3,0.6 --duration 30 --strategies default,default+noflow
bash reports/i13-s10/run.sh C-r1-2x --loads 0.7,2 --duration 30 --strategies default
bash reports/i13-s10/run.sh C-r3-2x --loads 0.7,2 --duration 30 --strategies default --replicas 3
