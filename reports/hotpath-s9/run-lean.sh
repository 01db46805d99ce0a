#!/bin/bash
# Issue 18, session 9: main (old, grpc.aio) vs this branch with `service.front_end: lean`
# (new: ext_proc, access log and health on extproc/server/h2/) in ONE locked run, alternating old/new
# invocations of `extproc bench overhead`. Each side runs from its own source tree (PYTHONPATH; the service and the
# bench's rendered Envoy config both come from that tree), same venv. The new tree is HEAD with the schema default
# set to lean (the bench has no front-end option), so everything else is identical.
# Run from the worktree: flock /work/wt/bench.lock bash reports/hotpath-s9/run-lean.sh OUT.txt [OLD_COMMIT]
set -u
W=$(pwd); OUT=$1; OLD_COMMIT=${2:-0248929}; PY=$W/.venv/bin/python
NEW=$(mktemp -d /tmp/s9-hp-new.XXXX); OLD=$(mktemp -d /tmp/s9-hp-old.XXXX)
git archive HEAD | tar -x -C "$NEW"; git archive "$OLD_COMMIT" | tar -x -C "$OLD"
sed -i 's|front_end: Literal\["grpcio", "lean"\] = "grpcio"|front_end: Literal["grpcio", "lean"] = "lean"|' \
  "$NEW/extproc/config/schema.py"
grep -q '= "lean"' "$NEW/extproc/config/schema.py" || { echo "could not set lean in the new tree"; exit 1; }
J=$W/reports/hotpath-s9/json/$(basename "$OUT" .txt); mkdir -p "$J"
{
echo "new = $(git rev-parse --short HEAD) (service.front_end lean), old = $(git rev-parse --short "$OLD_COMMIT") (grpc.aio), $(date -u)"
echo "uptime before: $(uptime)"
run() {  # run SIDE TAG ARGS...
  local side=$1 tag=$2; shift 2; local tree=$NEW; [ "$side" = old ] && tree=$OLD
  echo "\$ (cd $side tree; PYTHONPATH=<$side tree> python -m extproc bench overhead $* --json $J/$tag-$side.json)"
  (cd "$tree" && PYTHONPATH=$tree "$PY" -m extproc bench overhead "$@" --json "$J/$tag-$side.json" 2>&1 \
    | grep -v '^round \|^max throughput:\|^warming\|^report written')
}
A="--rate 200 --duration 20 --rounds 4 --max-duration 4 --trivial off"
run old default-1 $A --trivial on  # the trivial grpc.aio processor in each side's first run: the floor, same run
run new default-1 $A --trivial on
run old default-2 $A
run new default-2 $A
for i in 1 2; do
  run old redis-guard-$i $A --store redis --guard email,phone
  run new redis-guard-$i $A --store redis --guard email,phone
done
B="--rate 100 --duration 16 --rounds 4 --max-duration 2 --trivial off --prompt-chars 200000"
run old 200k $B
run new 200k $B
echo "uptime after: $(uptime)"
echo "finished $(date -u)"
} 2>&1 | tee "$OUT"
rm -rf "$NEW" "$OLD"
