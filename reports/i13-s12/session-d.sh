#!/bin/bash
# bash reports/i13-s12/session-d.sh: after sessions.sh (same tree, /tmp/s12-i13-tree at 836dbee).
# D: shared-prefix 0.3x again for seeds 2-5 (seed 2 repeated: its flow-on p99 of 190 ms in shared-loads, is it the
#    same run to run?).
# E: the zipf:1.1 60 req/s workload for seeds 3-6, flow on, off, and off again under a copy of the default profile
#    (twin.yaml: an A/A pair, how far two runs of the same code differ), with /debug/pools polled every 0.2 s during each point
#    (reports/i13-s12/poll_pools.py -> zipf60-aa-s3-6/pools.jsonl): does the load model learn a capacity, drop an
#    endpoint, see a queue?
set -u
export TREE=/tmp/s12-i13-tree
R=reports/i13-s12/run.sh
SHAPE="--workload shared-prefix --strategies default,default+noflow --groups 48 --prefix-tokens 3000 --question-tokens 300 --output-tokens 100 --stream-chunk-tokens 16 --samples"
flock /work/wt/bench.lock bash -c "echo D locked \$(date -u +%T); bash $R shared-0.3-s2-5 $SHAPE --popularity uniform --loads 0.3 --duration 25 --seed 2 --repeat 4; echo D released \$(date -u +%T)"
W=/tmp/s12-i13-workdir-e; rm -rf $W; mkdir -p $W reports/i13-s12/zipf60-aa-s3-6
flock /work/wt/bench.lock bash -c "echo E locked \$(date -u +%T); python3 reports/i13-s12/poll_pools.py $W reports/i13-s12/zipf60-aa-s3-6/pools.jsonl 0.2 & P=\$!; bash $R zipf60-aa-s3-6 $SHAPE --strategies default,default+noflow,twin+noflow --scheduling $(pwd)/reports/i13-s12/twin.yaml --popularity zipf:1.1 --qps 60 --duration 30 --seed 3 --repeat 4 --workdir $W; kill \$P; echo E released \$(date -u +%T)"
