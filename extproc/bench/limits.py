"""`extproc bench limits`: token limits shared by several service replicas through one Redis.

One tenant is offered 5x its tokens-per-minute while lighter tenants run as before; the report shows
the tokens the heavy tenant really consumed in each minute of the limiter's windows (from the usage
in the responses it was served), as a share of its limit, and the light tenants' latency with and
without the heavy one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from extproc.bench.loadgen import RequestSpec, Sample, run_open_loop
from extproc.bench.procs import ProcessGroup, metric_sums, start_redis
from extproc.bench.report import format_table, write_json
from extproc.bench.stack import SimPool, free_ports, launch
from extproc.bench.stats import summarize
from extproc.tenants import hash_key

# Service metrics the limits benchmarks report (samples as /metrics exposes them).
DEGRADED = "extproc_limits_degraded_admits"
ADMISSION_PATHS = ('extproc_limits_admissions{path="slice"}', 'extproc_limits_admissions{path="awaited"}')
UNCOVERED = "extproc_limits_slice_uncovered"

POOL = SimPool("chat", "org/chat-8b", 4, aliases=("chat",))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=3, help="service processes sharing Redis (default 3)")
    parser.add_argument("--tokens-per-min", type=int, default=30_000, help="the heavy tenant's limit")
    parser.add_argument("--overload", type=float, default=5.0, help="offered / limit for the heavy tenant")
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of overload (default 180)")
    parser.add_argument("--baseline", type=float, default=30.0, help="seconds of light traffic alone first")
    parser.add_argument("--max-tokens", type=int, default=200, help="max_tokens of the heavy tenant's requests")
    parser.add_argument("--light-rate", type=float, default=4.0, help="req/s of each of the 2 light tenants")
    parser.add_argument("--redis-server", default="redis-server", help="redis-server binary")
    parser.add_argument("--json", metavar="FILE", default="reports/limits.json", help="report path")
    parser.add_argument("--workdir", metavar="DIR", help="where config and logs go (default: temp)")


def _keys_file(limit: int) -> str:
    def tenant(name: str, limits: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "limits": limits, "keys": [{"sha256": hash_key(f"key-{name}")}]}

    return json.dumps({"tenants": [tenant("heavy", {"tokens_per_min": limit}),
                                   tenant("light-1", {"tokens_per_min": 10_000_000}),
                                   tenant("light-2", {"tokens_per_min": 10_000_000})]})


def _spec(tenant: str, max_tokens: int, seed: int) -> RequestSpec:
    rng = random.Random(seed)
    prompt = " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "omega")) for _ in range(rng.randint(20, 60)))
    body = {"model": "chat", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    return RequestSpec("POST", "/v1/chat/completions",
                       (("content-type", "application/json"), ("authorization", f"Bearer key-{tenant}")),
                       json.dumps(body).encode(), labels={"tenant": tenant})


def minute_usage(samples: list[Sample], started_wall: float) -> dict[int, int]:
    """Real tokens (prompt + completion) of served requests, by the epoch minute they were admitted in."""
    usage: dict[int, int] = {}
    for sample in samples:
        if sample.status != 200 or sample.prompt_tokens is None or sample.completion_tokens is None:
            continue
        minute = int((started_wall + sample.start_s) // 60)
        usage[minute] = usage.get(minute, 0) + sample.prompt_tokens + sample.completion_tokens
    return usage


def _light_latency(samples: list[Sample]) -> dict[str, Any]:
    summary = summarize(samples)
    return {"requests": summary["total"], "errors": summary["errors"], "e2e_ms": summary["e2e_ms"]}


async def run_limits(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="extproc-limits-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "keys.yaml").write_text(_keys_file(args.tokens_per_min))
    redis_port = free_ports(1)[0]
    policy = {
        "auth": {"mode": "api-key", "keys_file": str(workdir / "keys.yaml")},
        "limits": {"store": "redis", "redis_url": f"redis://127.0.0.1:{redis_port}/0"},
    }
    heavy_tokens = 40 + 0.75 * args.max_tokens  # prompt + the simulator's mean completion
    heavy_rate = args.overload * args.tokens_per_min / 60.0 / heavy_tokens
    report: dict[str, Any] = {"replicas": args.replicas, "tokens_per_min": args.tokens_per_min,
                              "overload": args.overload, "heavy_rate_rps": round(heavy_rate, 2),
                              "duration_s": args.duration, "workdir": str(workdir)}
    async with ProcessGroup(workdir / "logs") as group:
        await start_redis(group, redis_port, args.redis_server)
        stack = await launch(group, workdir, [POOL], extra_policy=policy, sim_args=["--profile", "fast"],
                             service_replicas=args.replicas)
        port = stack.envoy_port

        def light(seed: int) -> Any:
            return lambda i: _spec(f"light-{1 + i % 2}", 16, seed + i)

        print(f"baseline: light tenants alone for {args.baseline:g} s", file=sys.stderr)
        baseline = await run_open_loop("127.0.0.1", port, light(0), rate=2 * args.light_rate,
                                       duration_s=args.baseline, seed=1, timeout_s=30)
        # Start on a minute boundary of the limiter's windows, so `duration` covers whole minutes.
        await asyncio.sleep(60 - time.time() % 60)
        print(f"overload: heavy tenant at {heavy_rate:.1f} req/s (~{args.overload:g}x its limit) for "
              f"{args.duration:g} s, light tenants unchanged", file=sys.stderr)
        started_wall = time.time()
        heavy, loaded = await asyncio.gather(
            run_open_loop("127.0.0.1", port, lambda i: _spec("heavy", args.max_tokens, 10_000 + i), rate=heavy_rate,
                          duration_s=args.duration, seed=2, timeout_s=60, max_in_flight=4096),
            run_open_loop("127.0.0.1", port, light(500_000), rate=2 * args.light_rate, duration_s=args.duration,
                          seed=3, timeout_s=30),
        )
        report["cpu_seconds"] = group.cpu_seconds()
        counts = await metric_sums(stack.admin_urls, [DEGRADED, *ADMISSION_PATHS, UNCOVERED])
        report["degraded_admits"] = int(counts[DEGRADED])
        report["admissions"] = {path: int(counts[name]) for path, name in zip(("slice", "awaited"),
                                                                               ADMISSION_PATHS, strict=True)}
        report["slice_uncovered"] = int(counts[UNCOVERED])
    usage = minute_usage(heavy, started_wall)
    # The run starts just after a minute boundary: that minute counts as whole if under a second was missed.
    first = int(started_wall // 60) if started_wall % 60 < 1.0 else math.ceil(started_wall / 60)
    last = math.floor((started_wall + args.duration + 1.0) / 60)
    full = {m: usage.get(m, 0) for m in range(first, last)}  # whole minutes inside the run
    shares = {str(m): round(v / args.tokens_per_min, 4) for m, v in full.items()}
    refused = sum(1 for s in heavy if s.status == 429)
    report.update(
        heavy={"sent": len(heavy), "served": sum(1 for s in heavy if s.status == 200), "refused_429": refused,
               "other_errors": sum(1 for s in heavy if s.error is not None and s.status != 429)},
        heavy_tokens_per_minute={str(m): v for m, v in full.items()}, heavy_share_of_limit=shares,
        light_baseline=_light_latency(baseline), light_under_overload=_light_latency(loaded),
    )
    rows = [{"minute": i + 1, "tokens": v, "share of limit": f"{v / args.tokens_per_min:.1%}"}
            for i, v in enumerate(full.values())]
    print(format_table(rows, ["minute", "tokens", "share of limit"]))
    base, load = report["light_baseline"]["e2e_ms"], report["light_under_overload"]["e2e_ms"]
    print(f"admissions decided locally while Redis missed its deadline: {report['degraded_admits']}; "
          f"through Redis: {report['admissions']} (from a slice Redis no longer held: "
          f"{report['slice_uncovered']})")
    print(f"light tenants e2e p50/p99: {base['p50']}/{base['p99']} ms alone, {load['p50']}/{load['p99']} ms "
          f"with the heavy tenant; heavy: {report['heavy']}")
    path = write_json(args.json, report)
    print(f"report written to {path}")
    ok = all(0.95 <= share <= 1.02 for share in shares.values()) and report["heavy"]["other_errors"] == 0
    return 0 if ok else 1
