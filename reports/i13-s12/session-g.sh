#!/bin/bash
# bash reports/i13-s12/session-g.sh COMMIT: run F's zipf 60 hold again (G) on merged main with the port fix (39f134a: held ports reused), so that pairs.py can show whether on, off and the twin now share placements
# Flow control on (default), off (default+noflow)
# and the A/A twin (twin+noflow: a copy of the default profile, flow control off), 15 s warm-up (every prefix warm
# before measuring), 20 s measured, seeds 0-2: zipf:1.1 at 60 req/s.
set -u
export TREE=/tmp/s12-i13-tree-g
rm -rf "$TREE"; mkdir -p "$TREE"; git archive "$1" | tar -x -C "$TREE"; echo "$1" > "$TREE/COMMIT"
R=reports/i13-s12/run.sh
SHAPE="--workload shared-prefix --groups 48 --prefix-tokens 3000 --question-tokens 300 --output-tokens 100 --stream-chunk-tokens 16 --samples --strategies default,default+noflow,twin+noflow --scheduling $(pwd)/reports/i13-s12/twin.yaml --warmup 15 --duration 20 --seed 0 --repeat 3"
flock /work/wt/bench.lock bash -c "echo G locked \$(date -u +%T); bash $R g-zipf60-w15 $SHAPE --popularity zipf:1.1 --qps 60 --workdir /tmp/s12-i13-workdir-gz; echo G released \$(date -u +%T)"
