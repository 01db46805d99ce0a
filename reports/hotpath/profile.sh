#!/bin/bash
# Where the service's CPU goes at 200 req/s (policy of an `extproc bench overhead --workdir DIR` run, behind its
# Envoy): CPU per thread over SECONDS, then a py-spy profile (top entries, idle excluded).
# usage: profile.sh DIR SECONDS OUT.txt
set -u
D=$1; SECS=$2; OUT=$3; W=$(cd "$(dirname "$0")/../.." && pwd); PY=$W/.venv/bin/python
P=$(ls "$D"/policy-with_extproc*.yaml | head -1); E=$D/envoy-$(basename "$P")  # the first variant's: its Envoy serves the backend
LP=$(grep listen_port "$P" | awk '{print $2}')
threads() {  # CPU ms per thread name of process $1 over $2 seconds, and requests served meanwhile
  "$PY" - "$1" "$2" "$3" <<'PYEOF'
import collections, os, sys, time
pid, secs, label = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
tick = os.sysconf("SC_CLK_TCK")
def sample():
    out = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            name = "python (event loop)" if int(tid) == pid else f"{name} ({tid})" if name == "python" else name
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            out[name] += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return out
a = sample(); time.sleep(secs); b = sample()
total = sum((b - a).values()) * 1000 / tick
print(f"{label}: {total / secs:.0f} ms CPU per s over {secs:g} s (200 req/s: {total / secs / 200 * 1000:.0f} us/request)")
for name, t in (b - a).most_common():
    print(f"    {name:20s} {t * 1000 / tick / secs:6.1f} ms/s")
PYEOF
}
"$PY" -m extproc --log-level WARNING serve --config "$P" > "$D/profile-service.log" 2>&1 & SVC=$!
"$("$PY" -c 'from extproc.xds import find_envoy; print(find_envoy())')" -c "$E" --log-level warn --concurrency 1 \
    --disable-hot-restart > "$D/profile-envoy.log" 2>&1 & ENVOY=$!
"$PY" - "$LP" $((2 * SECS + 8)) <<'PYEOF' & LOAD=$!
import asyncio, sys
from extproc.bench.loadgen import run_open_loop
from extproc.bench.overhead_stack import request_spec
async def main(port: int, seconds: float) -> None:
    await asyncio.sleep(4)
    samples = await run_open_loop("127.0.0.1", port, request_spec(0), rate=200, duration_s=seconds, arrival="fixed")
    print(f"load: {len(samples)} requests, {sum(1 for s in samples if s.error)} errors", file=sys.stderr)
asyncio.run(main(int(sys.argv[1]), float(sys.argv[2])))
PYEOF
sleep 8
{
threads $SVC "$SECS" "service (default policy)"
"$W/.venv/bin/py-spy" record -p $SVC -d "$SECS" -r 250 -o "$D/profile.raw" --format raw > /dev/null 2>&1
"$PY" - "$D/profile.raw" <<'PYEOF'
import collections, sys
own, total, n = collections.Counter(), collections.Counter(), 0
for line in open(sys.argv[1]):
    stack, _, count = line.rstrip().rpartition(" ")
    frames, c = stack.split(";"), int(count)
    n += c; own[frames[-1]] += c
    for f in set(frames): total[f] += c
print(f"py-spy, service: {n} samples (250/s, idle excluded)\n-- self --")
for f, c in own.most_common(20): print(f"{100 * c / n:5.1f}% {f}")
print("-- total --")
for f, c in total.most_common(30): print(f"{100 * c / n:5.1f}% {f}")
PYEOF
} > "$OUT"
wait $LOAD; kill $SVC $ENVOY; wait $SVC $ENVOY 2>/dev/null
cat "$OUT"
