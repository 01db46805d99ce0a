"""`extproc bench limits`: a token budget shared by several service replicas through one Redis, under steady
overload, next to a tenant without limits.

One tenant is offered `--overload` times its tokens-per-minute for `--duration` seconds: mixed prompt
sizes, 70% streamed and 30% JSON, 40% without `max_tokens` (its tier caps their output). The report gives
the tokens it really consumed (the usage in the responses it was served) in each whole minute of the
limiter's windows, as a share of its limit; and the time to first token of an unlimited tenant's streamed
requests, alone first and then with the heavy tenant (target: p99 within 10%).
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
from extproc.openai import estimate_tokens
from extproc.tenants import hash_key

# Service metrics the limits benchmarks report (samples as /metrics exposes them).
DEGRADED = "extproc_limits_degraded_admits"
ADMISSION_PATHS = ('extproc_limits_admissions{path="slice"}', 'extproc_limits_admissions{path="awaited"}')
UNCOVERED = "extproc_limits_slice_uncovered"

POOL = SimPool("chat", "org/chat-8b", 4, aliases=("chat",))
_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "river", "x=1;", "2026", "tokens", "naïve", "(ok)")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=3, help="service processes sharing Redis (default 3)")
    parser.add_argument("--tokens-per-min", type=int, default=30_000, help="the heavy tenant's limit")
    parser.add_argument("--overload", type=float, default=5.0, help="offered / limit for the heavy tenant")
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of overload (default 180)")
    parser.add_argument("--baseline", type=float, default=180.0,
                        help="seconds of the unlimited tenant alone first (default 180: its TTFT p99 needs thousands "
                             "of samples on a busy machine)")
    parser.add_argument("--cap", type=int, default=200, help="the heavy tenant's tier max_output_tokens (default 200)")
    parser.add_argument("--light-rate", type=float, default=20.0, help="req/s of the unlimited tenant (default 20)")
    parser.add_argument("--redis-server", default="redis-server", help="redis-server binary")
    parser.add_argument("--json", metavar="FILE", default="reports/limits.json", help="report path")
    parser.add_argument("--workdir", metavar="DIR", help="where config and logs go (default: temp)")


def _keys_file(limit: int) -> str:
    def tenant(name: str, tier: str, limits: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "tier": tier, "limits": limits, "keys": [{"sha256": hash_key(f"key-{name}")}]}

    return json.dumps({"tenants": [tenant("heavy", "capped", {"tokens_per_min": limit}),
                                   tenant("unlimited", "default", {})]})


def _heavy_body(seed: int, cap: int) -> dict[str, Any]:
    rng = random.Random(seed)
    size = rng.randint(10, 60) if rng.random() < 0.8 else rng.randint(200, 600)
    body: dict[str, Any] = {"model": "chat", "stream": rng.random() < 0.7,
                            "messages": [{"role": "user", "content": " ".join(rng.choices(_WORDS, k=size))}]}
    if rng.random() < 0.6:
        body["max_tokens"] = rng.randint(cap // 4, cap)
    return body


def _spec(tenant: str, body: dict[str, Any]) -> RequestSpec:
    return RequestSpec("POST", "/v1/chat/completions",
                       (("content-type", "application/json"), ("authorization", f"Bearer key-{tenant}")),
                       json.dumps(body).encode(), stream=body["stream"], labels={"tenant": tenant})


def _light(seed: int) -> Any:
    def spec(index: int) -> RequestSpec:
        body = {"model": "chat", "stream": True, "max_tokens": 16,
                "messages": [{"role": "user", "content": f"question {seed + index} about the river"}]}
        return _spec("unlimited", body)
    return spec


def minute_usage(samples: list[Sample], started_wall: float) -> dict[int, int]:
    """Real tokens (prompt + completion) of served requests, by the epoch minute they were admitted in."""
    usage: dict[int, int] = {}
    for sample in samples:
        if sample.status != 200 or sample.prompt_tokens is None or sample.completion_tokens is None:
            continue
        minute = int((started_wall + sample.start_s) // 60)
        usage[minute] = usage.get(minute, 0) + sample.prompt_tokens + sample.completion_tokens
    return usage


def _latency(samples: list[Sample]) -> dict[str, Any]:
    summary = summarize(samples)
    return {"requests": summary["total"], "errors": summary["errors"], "ttft_ms": summary["ttft_ms"],
            "e2e_ms": summary["e2e_ms"]}


async def run_limits(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="extproc-limits-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "keys.yaml").write_text(_keys_file(args.tokens_per_min))
    redis_port = free_ports(1)[0]
    policy = {
        "auth": {"mode": "api-key", "keys_file": str(workdir / "keys.yaml")},
        "tiers": {"default": {}, "capped": {"max_output_tokens": args.cap}},
        "limits": {"store": "redis", "redis_url": f"redis://127.0.0.1:{redis_port}/0",
                   "default_output_tokens": args.cap},
    }
    # Offered tokens per request: the estimate of the prompt + 3/4 of the output allowance (what the
    # simulator generates on average); the limiter counts the engines' real numbers.
    sample = [_heavy_body(10_000 + i, args.cap) for i in range(2000)]
    heavy_tokens = sum(estimate_tokens(b["messages"][0]["content"]) + 0.75 * b.get("max_tokens", args.cap)
                       for b in sample) / len(sample)
    heavy_rate = args.overload * args.tokens_per_min / 60.0 / heavy_tokens
    report: dict[str, Any] = {"replicas": args.replicas, "tokens_per_min": args.tokens_per_min,
                              "overload": args.overload, "heavy_rate_rps": round(heavy_rate, 2),
                              "duration_s": args.duration, "workdir": str(workdir)}
    async with ProcessGroup(workdir / "logs") as group:
        await start_redis(group, redis_port, args.redis_server)
        stack = await launch(group, workdir, [POOL], extra_policy=policy, sim_args=["--profile", "fast"],
                             service_replicas=args.replicas)
        port = stack.envoy_port
        print(f"baseline: the unlimited tenant alone for {args.baseline:g} s", file=sys.stderr)
        baseline = await run_open_loop("127.0.0.1", port, _light(0), rate=args.light_rate,
                                       duration_s=args.baseline, seed=1, timeout_s=30)
        # Start on a minute boundary of the limiter's windows, so `duration` covers whole minutes.
        await asyncio.sleep(60 - time.time() % 60)
        print(f"overload: heavy tenant at {heavy_rate:.1f} req/s (~{args.overload:g}x its limit) for "
              f"{args.duration:g} s, the unlimited tenant unchanged", file=sys.stderr)
        started_wall = time.time()
        heavy, loaded = await asyncio.gather(
            run_open_loop("127.0.0.1", port, lambda i: _spec("heavy", _heavy_body(10_000 + i, args.cap)),
                          rate=heavy_rate, duration_s=args.duration, seed=2, timeout_s=60, max_in_flight=4096),
            run_open_loop("127.0.0.1", port, _light(500_000), rate=args.light_rate, duration_s=args.duration,
                          seed=3, timeout_s=30),
        )
        report["cpu_seconds"] = group.cpu_seconds()
        counts = await metric_sums(stack.admin_urls, [DEGRADED, *ADMISSION_PATHS, UNCOVERED])
        report["decided_alone"] = int(counts[DEGRADED])
        report["admissions"] = {path: int(counts[name]) for path, name in zip(("slice", "awaited"),
                                                                               ADMISSION_PATHS, strict=True)}
        report["slice_uncovered"] = int(counts[UNCOVERED])
    usage = minute_usage(heavy, started_wall)
    # The run starts just after a minute boundary: that minute counts as whole if under a second was missed.
    first = int(started_wall // 60) if started_wall % 60 < 1.0 else math.ceil(started_wall / 60)
    last = math.floor((started_wall + args.duration + 1.0) / 60)
    full = {m: usage.get(m, 0) for m in range(first, last)}  # whole minutes inside the run
    shares = {str(m): round(v / args.tokens_per_min, 4) for m, v in full.items()}
    report.update(
        heavy={"sent": len(heavy), "served": sum(1 for s in heavy if s.status == 200),
               "refused_429": sum(1 for s in heavy if s.status == 429),
               "other_errors": sum(1 for s in heavy if s.error is not None and s.status != 429)},
        heavy_tokens_per_minute={str(m): v for m, v in full.items()}, heavy_share_of_limit=shares,
        unlimited_alone=_latency(baseline), unlimited_with_heavy=_latency(loaded),
    )
    rows = [{"minute": i + 1, "tokens": v, "share of limit": f"{v / args.tokens_per_min:.1%}"}
            for i, v in enumerate(full.values())]
    print(format_table(rows, ["minute", "tokens", "share of limit"]))
    alone, loaded_ttft = report["unlimited_alone"]["ttft_ms"], report["unlimited_with_heavy"]["ttft_ms"]
    ratio = loaded_ttft["p99"] / alone["p99"] if alone["p99"] else math.inf
    report["unlimited_ttft_p99_ratio"] = round(ratio, 3)
    print(f"admissions: {report['admissions']}; decided alone (Redis late or down): {report['decided_alone']}; "
          f"from a slice Redis no longer held: {report['slice_uncovered']}")
    print(f"unlimited tenant TTFT p50/p99: {alone['p50']}/{alone['p99']} ms alone, "
          f"{loaded_ttft['p50']}/{loaded_ttft['p99']} ms with the heavy tenant (p99 x{ratio:.3f}); "
          f"heavy: {report['heavy']}")
    path = write_json(args.json, report)
    print(f"report written to {path}")
    ok = (all(0.95 <= share <= 1.02 for share in shares.values()) and report["heavy"]["other_errors"] == 0
          and ratio <= 1.10)
    return 0 if ok else 1
