#!/bin/bash
# bash reports/i13-s12/sessions.sh COMMIT: the three locked holds of session 12 (each takes the lock on its own),
# from a clean checkout of COMMIT. Flow control on (default) and off (default+noflow) interleaved per load and seed.
# A: shared-prefix (issue shape, 8 engines) at 0.3/0.6/0.9x, seeds 0-2, 25 s;
# B: the exact workloads, uniform 40 req/s and zipf:1.1 60 req/s, seeds 0-2, 30 s;
# C: overload 0.3x/0.6x with 3 service replicas sharing Redis, seeds 0-2 pooled, 20 s.
set -u
export TREE=/tmp/s12-i13-tree
rm -rf "$TREE"; mkdir -p "$TREE"; git archive "$1" | tar -x -C "$TREE"; echo "$1" > "$TREE/COMMIT"
R=reports/i13-s12/run.sh
SHAPE="--workload shared-prefix --strategies default,default+noflow --groups 48 --prefix-tokens 3000 --question-tokens 300 --output-tokens 100 --stream-chunk-tokens 16 --samples"
flock /work/wt/bench.lock bash -c "echo A locked \$(date -u +%T); bash $R shared-loads $SHAPE --popularity uniform --loads 0.3,0.6,0.9 --duration 25 --repeat 3; echo A released \$(date -u +%T)"
flock /work/wt/bench.lock bash -c "echo B locked \$(date -u +%T); bash $R exact-uniform40 $SHAPE --popularity uniform --qps 40 --duration 30 --repeat 3; bash $R exact-zipf60 $SHAPE --popularity zipf:1.1 --qps 60 --duration 30 --repeat 3; echo B released \$(date -u +%T)"
flock /work/wt/bench.lock bash -c "echo C locked \$(date -u +%T); bash $R overload-r3-below --workload overload --loads 0.3,0.6 --duration 20 --repeat 3 --strategies default,default+noflow --replicas 3; echo C released \$(date -u +%T)"
