"""`extproc bench soak`: the service under steady load for minutes, with clients that give up mid-response.

Real Envoy, the service (Redis limits with a concurrency limit, so every request takes a lease; flow control on)
and a simulated fleet. A share of the requests is cut by the client at a random moment (streamed or not), which
Envoy turns into a reset ext_proc stream. Every `--sample-interval` the service's resident memory and its
in-flight count are recorded; at the end, once the load stops, nothing may be held: no exchange in the service,
none on an endpoint, no lease in Redis. Reports the memory over time (first and last thirds, growth per minute)
and exits 1 on a leak or an unexpected error status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from extproc.bench.httpclient import HttpClient
from extproc.bench.loadgen import RequestSpec, run_open_loop
from extproc.bench.procs import ProcessGroup, metric_sums, start_redis
from extproc.bench.report import format_table, write_json
from extproc.bench.stack import SimPool, Stack, free_ports, launch
from extproc.limits.redis_address import Address
from extproc.limits.resp import RespClient

POOL = SimPool("chat", "org/chat", 2, aliases=("chat",))
# One round trip: every concurrency lease left in Redis (sorted sets named <key>:cc, see limits/redis_store.py).
_COUNT_LEASES = ("local n = 0 for _, k in ipairs(redis.call('KEYS', '*:cc')) do n = n + redis.call('ZCARD', k) end "
                 "return n")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=float, default=200.0, help="requests/s offered (default 200)")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load (default 300)")
    parser.add_argument("--abort", type=float, default=0.3,
                        help="share of requests the client cuts 5-80 ms after sending (default 0.3)")
    parser.add_argument("--front-end", choices=["lean", "grpcio"], default="lean", help="service.front_end")
    parser.add_argument("--sample-interval", type=float, default=10.0, help="seconds between memory samples")
    parser.add_argument("--redis-server", default="redis-server", help="redis-server binary")
    parser.add_argument("--json", metavar="FILE", default="reports/soak.json", help="report path")
    parser.add_argument("--workdir", metavar="DIR", help="where config and logs go (default: temp)")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def _held(http: HttpClient, stack: Stack, redis: RespClient) -> dict[str, int]:
    answer = await http.request("GET", "127.0.0.1", stack.policy.service.admin_port, "/debug/pools")
    pools = json.loads(answer.body)["pools"]
    sums = await metric_sums([stack.admin_url], ["extproc_in_flight"])
    return {"service_in_flight": int(sums["extproc_in_flight"]),
            "endpoint_in_flight": sum(int(e["in_flight"]) for e in pools[POOL.name]),
            "redis_leases": int(await redis.call("EVAL", _COUNT_LEASES, "0"))}


async def run_soak(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="extproc-soak-"))
    (redis_port,) = free_ports(1)
    policy = {
        "service": {"front_end": args.front_end},
        "limits": {"store": "redis", "redis_url": f"redis://127.0.0.1:{redis_port}/0"},
        "tiers": {"default": {"limits": {"requests_per_s": 1e6, "concurrency": 100_000}}},
    }
    rng = random.Random(18)
    report: dict[str, Any] = {"rate": args.rate, "duration_s": args.duration, "abort": args.abort,
                              "front_end": args.front_end, "samples": []}
    async with ProcessGroup(workdir / "logs") as group, HttpClient() as http:
        await start_redis(group, redis_port, args.redis_server)
        stack = await launch(group, workdir, [POOL], extra_policy=policy, sim_args=["--profile", "fast"])
        pid = stack.children["service"].pid
        redis = RespClient(Address("127.0.0.1", redis_port), timeout_s=5.0)

        def spec(index: int) -> RequestSpec:
            stream = rng.random() < 0.5
            body = json.dumps({"model": POOL.model, "stream": stream, "max_tokens": rng.randint(8, 64),
                               "messages": [{"role": "user", "content": f"soak {index} " + "x" * rng.randint(0, 400)}]})
            return RequestSpec("POST", "/v1/chat/completions", (("content-type", "application/json"),),
                               body.encode(), stream=stream,
                               abort_after_s=rng.uniform(0.005, 0.08) if rng.random() < args.abort else None)

        started = time.monotonic()
        load = asyncio.create_task(run_open_loop("127.0.0.1", stack.envoy_port, spec, rate=args.rate,
                                                 duration_s=args.duration, arrival="poisson", timeout_s=30))
        while not load.done():
            await asyncio.wait({load}, timeout=args.sample_interval)
            sums = await metric_sums([stack.admin_url], ["extproc_in_flight"])
            report["samples"].append({"t_s": round(time.monotonic() - started, 1), "rss_kib": rss_kib(pid),
                                      "in_flight": int(sums["extproc_in_flight"])})
            print(f"t={report['samples'][-1]['t_s']:.0f} s rss {report['samples'][-1]['rss_kib']} KiB "
                  f"in flight {report['samples'][-1]['in_flight']}", file=sys.stderr)
        samples = load.result()
        held: dict[str, int] = {}
        for _ in range(300):  # the released leases are posted: let them land (at most 30 s)
            held = await _held(http, stack, redis)
            if not any(held.values()):
                break
            await asyncio.sleep(0.1)
        await redis.close()
    errors: dict[str, int] = {}
    for sample in samples:
        if sample.error is not None and sample.status != 429:
            errors[sample.error] = errors.get(sample.error, 0) + 1
    rss = [s["rss_kib"] for s in report["samples"]]
    third = max(1, len(rss) // 3)
    first, last = sum(rss[:third]) / third, sum(rss[-third:]) / third
    times = [s["t_s"] for s in report["samples"]]
    # Between the first and the last third's means (their middle times): warm-up weighs less than first-to-last.
    minutes = (sum(times[-third:]) / third - sum(times[:third]) / third) / 60 if rss else 0.0
    report.update(requests=len(samples), aborted=sum(s.aborted for s in samples), errors=errors, held_after=held,
                  rss_first_third_kib=round(first), rss_last_third_kib=round(last),
                  rss_growth_kib_per_min=round((last - first) / minutes, 1) if minutes > 0 else 0.0)
    print(format_table([{"requests": report["requests"], "aborted": report["aborted"],
                         "errors": sum(errors.values()), "rss_first_kib": report["rss_first_third_kib"],
                         "rss_last_kib": report["rss_last_third_kib"], "kib_per_min": report["rss_growth_kib_per_min"],
                         **held}],
                       ["requests", "aborted", "errors", "rss_first_kib", "rss_last_kib", "kib_per_min",
                        "service_in_flight", "endpoint_in_flight", "redis_leases"]))
    path = write_json(args.json, report)
    print(f"report written to {path}")
    return 0 if not errors and held and not any(held.values()) else 1
