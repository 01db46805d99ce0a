#!/bin/bash
# bash reports/i13-s12/session-f.sh COMMIT: one locked hold (F) from a clean checkout of COMMIT (8b4ebe0: main 836dbee
# plus the bench's same engine ports for every strategy of a seed). Flow control on (default), off (default+noflow)
# and the A/A twin (twin+noflow: a copy of the default profile, flow control off), 15 s warm-up (every prefix warm
# before measuring), 20 s measured, seeds 0-2: zipf:1.1 at 60 req/s, then uniform at 0.3x.
set -u
export TREE=/tmp/s12-i13-tree-f
rm -rf "$TREE"; mkdir -p "$TREE"; git archive "$1" | tar -x -C "$TREE"; echo "$1" > "$TREE/COMMIT"
R=reports/i13-s12/run.sh
SHAPE="--workload shared-prefix --groups 48 --prefix-tokens 3000 --question-tokens 300 --output-tokens 100 --stream-chunk-tokens 16 --samples --strategies default,default+noflow,twin+noflow --scheduling $(pwd)/reports/i13-s12/twin.yaml --warmup 15 --duration 20 --seed 0 --repeat 3"
flock /work/wt/bench.lock bash -c "echo F locked \$(date -u +%T); bash $R f-zipf60-w15 $SHAPE --popularity zipf:1.1 --qps 60 --workdir /tmp/s12-i13-workdir-fz; bash $R f-uniform0.3-w15 $SHAPE --popularity uniform --loads 0.3 --workdir /tmp/s12-i13-workdir-fu; echo F released \$(date -u +%T)"
