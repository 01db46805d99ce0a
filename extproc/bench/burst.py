"""`extproc bench burst`: how far a burst overshoots a token budget before usage settles.

A reservation is the prompt estimate plus the output allowance, and real usage replaces it only when the
access log reports the exchange. A burst of concurrent requests is admitted on reservations alone, so it
overshoots by whatever the reservations under-estimate: output beyond what was reserved (requests without
`max_tokens`), and prompt tokens beyond the character estimate (tokenizer, chat template). Variants:

    raw+cap        tier output cap, raw prompt estimate (limits.calibrate_prompt_tokens: false)
    calibrated+cap tier output cap, prompt estimate calibrated on earlier traffic (the defaults + a cap)
    calibrated     no cap, the burst's requests set no max_tokens

Each variant: a fresh simulated fleet, service (or `--service-replicas` sharing a redis-server) and Envoy;
another tenant's `--warmup` requests first (the calibration's samples), then `--requests` concurrent requests
of one tenant against `--budget` tokens/min. The engines generate to their limit (`ignore_eos`), the worst
case for output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from extproc.bench.limits import ADMISSION_PATHS, DEGRADED, UNCOVERED
from extproc.bench.procs import ProcessGroup, metric_sums, start_redis
from extproc.bench.report import format_table, write_json
from extproc.bench.stack import SimPool, free_ports, launch

VARIANTS = {
    "raw+cap": {"cap": True, "calibrate": False},
    "calibrated+cap": {"cap": True, "calibrate": True},
    "calibrated": {"cap": False, "calibrate": True},
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=150, help="concurrent requests in the burst (default 150)")
    parser.add_argument("--budget", type=int, default=1000, help="the tenant's tokens per minute (default 1000)")
    parser.add_argument("--cap", type=int, default=4, help="tier max_output_tokens in the +cap variants (default 4)")
    parser.add_argument("--warmup", type=int, default=40,
                        help="another tenant's requests before the burst (calibration samples; default 40)")
    parser.add_argument("--replicas", type=int, default=2, help="simulated vLLM replicas (default 2)")
    parser.add_argument("--service-replicas", type=int, default=1,
                        help="service replicas behind Envoy (default 1); more than 1 shares limits and the "
                             "calibration through a redis-server this benchmark starts")
    parser.add_argument("--redis-server", default="redis-server", help="redis-server binary (with replicas > 1)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated subset of {', '.join(VARIANTS)}")
    parser.add_argument("--json", metavar="FILE", default="reports/burst.json", help="report path")


def _body(index: int, max_tokens: int | None) -> dict[str, Any]:
    words = " ".join(["green"] * (index % 7))
    body: dict[str, Any] = {"model": "chat", "ignore_eos": True, "messages": [
        {"role": "user", "content": f"tell me a long story number {index} about the {words} river"}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


async def _variant(args: argparse.Namespace, cap: bool, calibrate: bool) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="extproc-burst-"))
    tier: dict[str, Any] = {"limits": {"tokens_per_min": args.budget}}
    if cap:
        tier["max_output_tokens"] = args.cap
    limits: dict[str, Any] = {"default_output_tokens": args.cap, "calibrate_prompt_tokens": calibrate}
    redis_port = free_ports(1)[0] if args.service_replicas > 1 else 0
    if redis_port:
        limits.update(store="redis", redis_url=f"redis://127.0.0.1:{redis_port}/0")
    policy = {"auth": {"mode": "trusted-header"}, "tiers": {"default": tier, "warm": {}}, "limits": limits,
              "flow_control": {"enabled": False}}
    pool = SimPool("chat", "org/chat", args.replicas, aliases=("chat",))
    async with ProcessGroup(workdir / "logs") as group:
        if redis_port:
            await start_redis(group, redis_port, args.redis_server)
        stack = await launch(group, workdir, [pool], extra_policy=policy, sim_args=["--profile", "fast"],
                             service_replicas=args.service_replicas)
        url = f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            async def send(body: dict[str, Any], tenant: str, tier_name: str) -> tuple[int, dict[str, Any]]:
                headers = {"x-tenant-id": tenant, "x-tenant-tier": tier_name}
                async with http.post(url, json=body, headers=headers) as response:
                    return response.status, json.loads(await response.text())

            for index in range(args.warmup):
                await send(_body(index, args.cap), "warm", "warm")
            # The access log delivers the last usage; with several replicas, their calibration sums meet
            # in Redis every 2 s.
            await asyncio.sleep(0.5 if args.service_replicas == 1 else 4.5)
            replies = await asyncio.gather(*[send(_body(i, args.cap if cap else None), "burst", "default")
                                             for i in range(args.requests)])
        counts = await metric_sums(stack.admin_urls, [DEGRADED, *ADMISSION_PATHS, UNCOVERED])
    admitted = [body for status, body in replies if status == 200]
    used = sum(int(body["usage"]["total_tokens"]) for body in admitted)
    return {"admitted": len(admitted), "refused": sum(1 for status, _ in replies if status == 429),
            "tokens_used": used, "percent_of_budget": round(100 * used / args.budget, 1),
            "slice": int(counts[ADMISSION_PATHS[0]]), "awaited": int(counts[ADMISSION_PATHS[1]]),
            "decided_locally": int(counts[DEGRADED]), "uncovered": int(counts[UNCOVERED]), "workdir": str(workdir)}


async def run_burst(args: argparse.Namespace) -> int:
    names = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        print(f"unknown variants {unknown}; choose from {list(VARIANTS)}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {}
    for name in names:
        print(f"variant {name}: {args.warmup} warm-up requests, then {args.requests} at once", file=sys.stderr)
        results[name] = await _variant(args, **VARIANTS[name])
    rows = [{"variant": name, **{k: v for k, v in r.items() if k != "workdir"}} for name, r in results.items()]
    columns = ["variant", "admitted", "refused", "tokens_used", "percent_of_budget"]
    if args.service_replicas > 1:
        columns += ["slice", "awaited", "decided_locally", "uncovered"]
    print(format_table(rows, columns))
    path = write_json(args.json, {"budget": args.budget, "requests": args.requests, "cap": args.cap,
                                  "warmup": args.warmup, "replicas": args.replicas,
                                  "service_replicas": args.service_replicas, "variants": results})
    print(f"report written to {path}")
    return 0
