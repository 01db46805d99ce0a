#!/bin/bash
# Issue 18 acceptance numbers from one locked run on a snapshot of this branch's HEAD (the commit is printed).
# Run from the worktree: flock /work/wt/bench.lock bash reports/hotpath/run-final.sh
set -u
W=$(pwd); OUT=$W/reports/hotpath; SNAP=$(mktemp -d /tmp/hotpath-snap.XXXX)
git archive HEAD | tar -x -C "$SNAP"; cd "$SNAP"; mkdir -p reports/hotpath
PY=$W/.venv/bin/python
echo "commit $(git -C "$W" rev-parse --short HEAD), $(date -u), load $(cut -d' ' -f1-3 /proc/loadavg)"
run() { echo "\$ extproc $*"; "$PY" -m extproc "$@" 2>&1 | grep -v '^round \|^max throughput:\|^warming'; }
run bench overhead --rate 200 --duration 20 --rounds 4 --workers 1,2 --trivial on \
    --workdir "$SNAP/default" --json reports/hotpath/overhead-default.json
run bench overhead --rate 200 --duration 20 --rounds 4 --store redis --guard email,phone --trivial off \
    --json reports/hotpath/overhead-redis-guard.json
run bench overhead --rate 100 --duration 20 --rounds 4 --prompt-chars 200000 --trivial off --max-duration 4 \
    --json reports/hotpath/overhead-200k.json
run bench scheduling --endpoints 256 --json reports/hotpath/scheduling-256.json
echo "\$ reports/hotpath/profile.sh (CPU per thread, then py-spy record (10 s, service at 200 req/s, default policy)"
bash "$W/reports/hotpath/profile.sh" "$SNAP/default" 10 reports/hotpath/profile-default.txt
cp reports/hotpath/* "$OUT"/
