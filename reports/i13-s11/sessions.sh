#!/bin/bash
# bash reports/i13-s11/sessions.sh COMMIT [SUFFIX]: three locked runs (each takes the lock on its own), from a clean
# checkout of COMMIT, run names ending in -SUFFIX. A: 0.9x, 1 replica; B: 0.9x, 3 replicas (flow control on and off
# interleaved per seed, seeds 0-5, 20 s each, percentiles pooled over the seeds); C: 0.3x/0.6x (1 replica, seeds
# 0-1) and 2x vs 0.7x (1 and 3 replicas, seed 0).
set -u
export TREE=/tmp/s11-flow-tree
S=${2:+-$2}
rm -rf "$TREE"; mkdir -p "$TREE"; git archive "$1" | tar -x -C "$TREE"; echo "$1" > "$TREE/COMMIT"
R=reports/i13-s11/run.sh
flock /work/wt/bench.lock bash -c "echo A locked \$(date -u +%T); bash $R r1-0.9$S --loads 0.9 --duration 20 --repeat 6 --strategies default,default+noflow --replicas 1; echo A released \$(date -u +%T)"
flock /work/wt/bench.lock bash -c "echo B locked \$(date -u +%T); bash $R r3-0.9$S --loads 0.9 --duration 20 --repeat 6 --strategies default,default+noflow --replicas 3; echo B released \$(date -u +%T)"
flock /work/wt/bench.lock bash -c "echo C locked \$(date -u +%T); bash $R r1-below$S --loads 0.3,0.6 --duration 20 --repeat 2 --strategies default,default+noflow --replicas 1; bash $R r1-2x$S --loads 0.7,2 --duration 20 --strategies default --replicas 1; bash $R r3-2x$S --loads 0.7,2 --duration 20 --strategies default --replicas 3; echo C released \$(date -u +%T)"
