#!/bin/bash
# Issue 18, session 10: the lean front end (now the default) vs grpcio, from one tree, in ONE locked run.
# Each `extproc bench overhead` invocation runs every variant on both front ends (--front-ends lean,grpcio:
# service.front_end set in each variant's policy), rounds alternating over all of them.
# Run from the worktree: flock /work/wt/bench.lock bash reports/hotpath-s10/run.sh reports/hotpath-s10/run.txt
set -u
W=$(pwd); OUT=$1; PY=$W/.venv/bin/python
J=$W/reports/hotpath-s10/json/$(basename "$OUT" .txt); mkdir -p "$J"
T=$(mktemp -d /tmp/s10-hp.XXXX); git archive HEAD | tar -x -C "$T"  # the committed tree, whatever is edited meanwhile
{
echo "tree = $(git rev-parse --short HEAD) (archived to $T), $(date -u)"
echo "uptime before: $(uptime)"
run() {  # run TAG ARGS...
  local tag=$1; shift
  echo "\$ python -m extproc bench overhead $* --json $J/$tag.json"
  (cd "$T" && PYTHONPATH=$T "$PY" -m extproc bench overhead "$@" --json "$J/$tag.json" 2>&1 \
    | grep -v '^round \|^max throughput:\|^warming\|^report written')
}
A="--rate 200 --duration 20 --rounds 4 --max-duration 4 --front-ends lean,grpcio"
run default $A --workers 1,2 --trivial on
run limited $A --store redis --guard email,phone --trivial off
run default-again $A --trivial on
echo "uptime after: $(uptime)"
echo "finished $(date -u)"
} 2>&1 | tee "$OUT"
rm -rf "$T"
