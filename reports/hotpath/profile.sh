#!/bin/bash
# py-spy profile of the service (policy of an `extproc bench overhead --workdir DIR` run) at 200 req/s behind its
# Envoy; prints the top entries (self and total, idle excluded). usage: profile.sh DIR SECONDS OUT.txt
set -u
D=$1; SECS=$2; OUT=$3; W=$(cd "$(dirname "$0")/../.." && pwd); PY=$W/.venv/bin/python
P=$D/policy-with_extproc.yaml; E=$D/envoy-policy-with_extproc.yaml
LP=$(grep listen_port "$P" | awk '{print $2}')
"$PY" -m extproc --log-level WARNING serve --config "$P" > "$D/profile-service.log" 2>&1 & SVC=$!
"$("$PY" -c 'from extproc.xds import find_envoy; print(find_envoy())')" -c "$E" --log-level warn --concurrency 1 \
    --disable-hot-restart > "$D/profile-envoy.log" 2>&1 & ENVOY=$!
"$PY" - "$LP" "$SECS" <<'PYEOF' & LOAD=$!
import asyncio, sys
from extproc.bench.loadgen import run_open_loop
from extproc.bench.overhead_stack import request_spec
from extproc.bench.procs import wait_http_ok
async def main(port: int, seconds: float) -> None:
    await asyncio.sleep(4)
    samples = await run_open_loop("127.0.0.1", port, request_spec(0), rate=200, duration_s=seconds + 6, arrival="fixed")
    print(f"load: {len(samples)} requests, {sum(1 for s in samples if s.error)} errors", file=sys.stderr)
asyncio.run(main(int(sys.argv[1]), float(sys.argv[2])))
PYEOF
sleep 8
"$W/.venv/bin/py-spy" record -p $SVC -d "$SECS" -r 250 -o "$D/profile.raw" --format raw > /dev/null 2>&1
wait $LOAD; kill $SVC $ENVOY; wait $SVC $ENVOY 2>/dev/null
"$PY" - "$D/profile.raw" > "$OUT" <<'PYEOF'
import collections, sys
own, total, n = collections.Counter(), collections.Counter(), 0
for line in open(sys.argv[1]):
    stack, _, count = line.rstrip().rpartition(" ")
    frames, c = stack.split(";"), int(count)
    n += c; own[frames[-1]] += c
    for f in set(frames): total[f] += c
print(f"{n} samples (250/s, idle excluded)\n-- self --")
for f, c in own.most_common(20): print(f"{100 * c / n:5.1f}% {f}")
print("-- total --")
for f, c in total.most_common(30): print(f"{100 * c / n:5.1f}% {f}")
PYEOF
cat "$OUT" | head -60
