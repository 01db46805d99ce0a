#!/bin/bash
# Issue 18, session 8: before (main 3cfdc8d) vs after (this branch's HEAD) in ONE locked run, alternating
# old/new invocations of `extproc bench overhead` twice per policy. Each side runs from its own source tree
# (PYTHONPATH; the service and the bench's rendered Envoy config both come from that tree), same venv.
# Run from the worktree: flock /work/wt/bench.lock bash reports/hotpath-s8/run.sh OUT.txt [OLD_COMMIT]
set -u
W=$(pwd); OUT=$1; OLD_COMMIT=${2:-3cfdc8d}; PY=$W/.venv/bin/python
NEW=$(mktemp -d /tmp/s8-hp-new.XXXX); OLD=$(mktemp -d /tmp/s8-hp-old.XXXX)
git archive HEAD | tar -x -C "$NEW"; git archive "$OLD_COMMIT" | tar -x -C "$OLD"
J=$W/reports/hotpath-s8/json/$(basename "$OUT" .txt); mkdir -p "$J"
{
echo "new = $(git rev-parse --short HEAD), old = $(git rev-parse --short "$OLD_COMMIT"), $(date -u)"
echo "uptime before: $(uptime)"
run() {  # run SIDE TAG ARGS...
  local side=$1 tag=$2; shift 2; local tree=$NEW; [ "$side" = old ] && tree=$OLD
  echo "\$ (cd $side tree; PYTHONPATH=<$side tree> python -m extproc bench overhead $* --json $J/$tag-$side.json)"
  (cd "$tree" && PYTHONPATH=$tree "$PY" -m extproc bench overhead "$@" --json "$J/$tag-$side.json" 2>&1 \
    | grep -v '^round \|^max throughput:\|^warming\|^report written')
}
A="--rate 200 --duration 20 --rounds 4 --max-duration 4 --trivial off"
for i in 1 2; do
  run old redis-guard-$i $A --store redis --guard email,phone
  run new redis-guard-$i $A --store redis --guard email,phone
done
for i in 1 2; do
  run old default-$i $A
  run new default-$i $A
done
echo "uptime after: $(uptime)"
} 2>&1 | tee "$OUT"
rm -rf "$NEW" "$OLD"
