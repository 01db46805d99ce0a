#!/bin/bash
# Issue 18, session 9: the ext_proc front end. One locked run of `extproc bench overhead` from an EXPERIMENT tree
# (HEAD + reports/hotpath-s9/experiment-frontends.patch, uncommitted to the package): variants alternate in rounds.
#   trivial                 the shipped CONTINUE-only processor on grpc.aio (the floor we compare against)
#   trivial{EXP_SYNC=1}     the same on grpc's threaded server (session 7's patch)
#   trivial{EXP_GRPCLIB=1}  the same on grpclib 0.4.9 (h2, pure Python; session 7's patch)
#   trivial{EXP_H2=1}       the same on a minimal HTTP/2 + gRPC server on asyncio Protocol callbacks
#                           (reports/hotpath-s9/h2_trivial.py): one thread, no grpc core
#   with_extproc            our service (grpc.aio)
#   with_extproc{EXP_H2=1}  our service with ext_proc + access log served by that minimal front end (our
#                           ExternalProcessorService.Process / AccessLogService unchanged, behind a small
#                           ServicerContext stand-in; grpc.aio keeps health/other services on another port)
#   with_extproc{EXP_SYNC=1}, {EXP_GRPCLIB=1}: the service ignores these: copies of with_extproc (the run's noise)
# Then the limited path (Redis limits + flow + guard) and a 200 KB prompt, grpc.aio vs the minimal front end.
# Run from the worktree: flock /work/wt/bench.lock bash reports/hotpath-s9/run-frontends.sh OUT.txt
set -u
W=$(pwd); OUT=$1; PY=$W/.venv/bin/python
T=$(mktemp -d /tmp/s9-fe-run.XXXX)
git archive HEAD | tar -x -C "$T"; (cd "$T" && patch -p1 -s < "$W/reports/hotpath-s9/experiment-frontends.patch") || exit 1
J=$W/reports/hotpath-s9/json/$(basename "$OUT" .txt); mkdir -p "$J"
{
echo "tree = $(git rev-parse --short HEAD) + experiment-frontends.patch, $(date -u)"
echo "uptime before: $(uptime)"
run() {  # run TAG ARGS...
  local tag=$1; shift
  echo "\$ (cd experiment tree; PYTHONPATH=<tree> python -m extproc bench overhead $* --json $J/$tag.json)"
  (cd "$T" && PYTHONPATH=$T "$PY" -m extproc bench overhead "$@" --json "$J/$tag.json" 2>&1 \
    | grep -v '^round \|^max throughput:\|^warming\|^report written')
}
run floors --rate 200 --duration 16 --rounds 4 --max-duration 4 \
  --service-env EXP_SYNC=1 --service-env EXP_GRPCLIB=1 --service-env EXP_H2=1
run redis-guard --rate 200 --duration 16 --rounds 4 --max-duration 4 --trivial off \
  --store redis --guard email,phone --service-env EXP_H2=1
run 200k --rate 100 --duration 12 --rounds 4 --max-duration 2 --trivial off --prompt-chars 200000 \
  --service-env EXP_H2=1
echo "uptime after: $(uptime)"
echo "finished $(date -u)"
} 2>&1 | tee "$OUT"
rm -rf "$T"
