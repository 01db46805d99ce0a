#!/bin/bash
# Where the lean front end's service spends its CPU at 200 req/s (default policy, front_end lean): the policy and
# Envoy files of an `extproc bench overhead` variant written without running any load, then session 7's
# reports/hotpath/profile.sh (CPU per thread over SECONDS, then py-spy's top entries, idle excluded).
# usage (from the worktree): flock /work/wt/bench.lock bash reports/hotpath-s10/profile.sh SECONDS OUT.txt [FRONT_END]
set -u
SECS=$1; OUT=$2; FRONT=${3:-lean}; W=$(pwd); D=$(mktemp -d /tmp/s10-profile.XXXX)
"$W/.venv/bin/python" - "$D" "$FRONT" <<'PYEOF'
import argparse, sys, yaml
from pathlib import Path
from extproc.bench.overhead import _policy, configure
from extproc.bench.overhead_stack import bench_bootstrap
from extproc.bench.stack import free_ports
from extproc.config import parse_policy
workdir, front = Path(sys.argv[1]), sys.argv[2]
parser = argparse.ArgumentParser(); configure(parser); args = parser.parse_args([])
(direct,) = free_ports(1)
path = _policy(workdir, "with_extproc", "none", args, direct, 0, 1, front_end=front)
policy = parse_policy(path.read_text(), str(path))
(workdir / f"envoy-{path.name}").write_text(yaml.safe_dump(bench_bootstrap(policy, direct, None), sort_keys=False))
PYEOF
echo "uptime before: $(uptime)" > "$OUT.uptime"
bash "$W/reports/hotpath/profile.sh" "$D" "$SECS" "$OUT"
echo "uptime after: $(uptime)" >> "$OUT.uptime"
rm -rf "$D"
