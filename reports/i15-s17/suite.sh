#!/bin/bash
# (session 17 copy; OUT=DIR: write there instead of reports/i15-s17/suite.) The issue-15 suite on one commit, case by case, each case one hold of the machine-wide lock, run from an archived
# copy of the commit (so the checkout may change meanwhile). A strategy `unpaired` is the default profile without second homes
# reports/i15-s15/unpaired.yaml (pair_requests 0, the default before session 15). Usage: reports/i15-s15/suite.sh COMMIT [CASE:STRATEGIES ...] (default: all five cases)
# Strategies per case: ours + the peers that were ever the best peer there (reports/i15-s11/suite: sglang-router
# on uniform, zipf, drift; vllm-router cache_aware also on multi-turn and mixed). default@3 is added by the suite.
set -e
commit=$1; shift; repo=$(pwd); out=${OUT:-$repo/reports/i15-s17/suite}
T=$(mktemp -d /tmp/s17-suite.XXXX); git archive "$commit" | tar -x -C "$T"
specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=(uniform:default,sglang-cache-aware zipf:default,sglang-cache-aware
  multi-turn:default,sglang-cache-aware,vllm-router-cache-aware
  mixed:default,sglang-cache-aware,vllm-router-cache-aware drift:default,sglang-cache-aware)
mkdir -p "$out"
for spec in "${specs[@]}"; do
  case=${spec%%:*}; strategies=${spec#*:}
  flock /work/wt/bench.lock bash -c '
    T=$1; out=$2; case=$3; strategies=$4; commit=$5; PY=$6
    echo "$case: commit $commit; locked $(date -u +%FT%TZ) $(uptime)" >> "$out/uptime.txt"
    (cd "$T" && PYTHONPATH=$T "$PY" -m extproc bench routing-suite --cases "$case" --strategies "$strategies" \
       --repeat 3 --duration 20 --warmup 5 --out "$out" \
       $(case ",$strategies," in *,unpaired,*) echo --scheduling "$T/reports/i15-s15/unpaired.yaml";; esac) > "$out/$case.log" 2>&1) || echo "$case: exit $?" >> "$out/uptime.txt"
    echo "$case: released $(date -u +%FT%TZ) $(uptime)" >> "$out/uptime.txt"
  ' _ "$T" "$out" "$case" "$strategies" "$commit" "$repo/.venv/bin/python"
done
(cd "$T" && PYTHONPATH=$T "$repo/.venv/bin/python" -m extproc bench routing-suite --summary-only \
   --cases uniform,zipf,multi-turn,mixed,drift --out "$out" > "$out/summary.log" 2>&1) || true
rm -rf "$T"
