"""`extproc bench burst`: tokens really used by one tenant's burst against its token budget, with several
service replicas sharing Redis, over a matrix of burst sizes and budget multiples, and with Redis killed
mid-burst.

Per replica count: one simulated fleet (engines generate to their limit: `ignore_eos`), the service
replicas, Envoy and a redis-server; another tenant's `--warmup` requests first (the prompt calibration's
samples). Then each cell of the matrix is a fresh tenant whose budget is the burst's offered tokens
divided by the multiple, hit by `--burst` requests arriving within `--spread-ms`: mixed prompt sizes, a
share streamed, a share without `max_tokens` (the tier's output cap bounds them). Tokens used are the
usage the engines reported in the responses. Diagnostic per cell: the engines' prompt counts minus the
prompt tokens the service reserved for the admitted requests (the calibrated estimate's upper bound), in
% of the budget, and how many prompts counted more than reserved: an excess with prompts within their
reservations comes from admission (a race), one with prompts over them from the estimates.

The last run of each replica count kills Redis (SIGKILL) half-way through the burst's arrivals, after
pausing its writes (CLIENT PAUSE WRITE: the outage starts there) and reading its counts and every
replica's `/debug/limits`; the report gives the bound of the README's formula next to what was used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from extproc.bench.limits import ADMISSION_PATHS, DEGRADED, UNCOVERED
from extproc.bench.loadgen import RequestSpec, Sample, run_open_loop
from extproc.bench.procs import ProcessGroup, metric_sums, start_redis
from extproc.bench.report import format_table, write_json
from extproc.bench.stack import SimPool, Stack, free_ports, launch
from extproc.limits.resp import Address, RespClient
from extproc.openai import estimate_tokens
from extproc.openai.spec import Api, prompt_text

_WORDS = ("the river", "green", "stone", "tokens", "budget", "replica", "9f2c", "x = f(y) + 1;", "2026-11-30",
          "ok,", "gateway", "unbelievable", "a", "of", "kv-cache", "(see below)", "42", "naïve", "\n- item")


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--service-replicas", default="3,6", help="service replica counts (default 3,6)")
    parser.add_argument("--bursts", default="20,100,500", help="concurrent requests per burst (default 20,100,500)")
    parser.add_argument("--multiples", default="1,3,10",
                        help="offered tokens / budget of each burst (default 1,3,10)")
    parser.add_argument("--streamed", type=float, default=0.5, help="share of streamed requests (default 0.5)")
    parser.add_argument("--no-max-tokens", type=float, default=0.5,
                        help="share of requests without max_tokens: the tier's output cap bounds them (default 0.5)")
    parser.add_argument("--cap", type=int, default=16, help="the tier's max_output_tokens (default 16)")
    parser.add_argument("--estimate", choices=["calibrated", "raw"], default="calibrated",
                        help="prompt estimates: calibrated on the warm-up's usage (default) or characters / 4")
    parser.add_argument("--prompt-reserve-sd", type=float, default=2.0,
                        help="limits.prompt_reserve_sd: reservations add this many standard deviations of the "
                             "calibration's error to the estimate (default 2; 0: the estimate itself)")
    parser.add_argument("--kill-redis", type=int, default=500, metavar="N",
                        help="a last run per replica count with a burst of N at 3x the budget, Redis killed "
                             "half-way through its arrivals (0: none; default 500)")
    parser.add_argument("--spread-ms", type=float, default=50.0, help="a burst's arrivals spread (default 50)")
    parser.add_argument("--warmup", type=int, default=60, help="another tenant's requests first (default 60)")
    parser.add_argument("--replicas", type=int, default=4, help="simulated vLLM replicas (default 4)")
    parser.add_argument("--redis-server", default="redis-server", help="redis-server binary")
    parser.add_argument("--seed", type=int, default=1, help="request generator seed (default 1)")
    parser.add_argument("--json", metavar="FILE", default="reports/burst.json", help="report path")


def _body(rng: random.Random, cap: int, streamed: float, no_max_tokens: float) -> dict[str, Any]:
    size = rng.randint(4, 40) if rng.random() < 0.7 else rng.randint(100, 400)  # mostly short, some long
    body: dict[str, Any] = {"model": "chat", "ignore_eos": True, "stream": rng.random() < streamed,
                            "messages": [{"role": "user", "content": " ".join(rng.choices(_WORDS, k=size))}]}
    if rng.random() >= no_max_tokens:
        body["max_tokens"] = rng.randint(max(1, cap // 2), 2 * cap)
    return body


def _spec(body: dict[str, Any], tenant: str, tier: str) -> RequestSpec:
    headers = (("content-type", "application/json"), ("x-tenant-id", tenant), ("x-tenant-tier", tier))
    return RequestSpec("POST", "/v1/chat/completions", headers, json.dumps(body).encode(), stream=body["stream"],
                       labels={"tenant": tenant})


def _used(samples: list[Sample]) -> int:
    return sum((s.prompt_tokens or 0) + (s.completion_tokens or 0) for s in samples if s.status == 200)


class _Cell:
    """One burst: its requests (generated up front, so the budget can be set from them) and its tier."""

    def __init__(self, index: int, burst: int, multiple: float, args: argparse.Namespace, kill: bool = False) -> None:
        rng = random.Random(args.seed * 1_000_003 + index)
        self.index, self.burst, self.multiple, self.kill = index, burst, multiple, kill
        self.bodies = [_body(rng, args.cap, args.streamed, args.no_max_tokens) for _ in range(burst)]
        self.budget = 0  # set from the warm-up's real tokens per request (`size`)
        self.tier = f"burst-{index}"

    def size(self, tokens_per_request: float) -> None:
        self.budget = max(1, round(self.burst * tokens_per_request / self.multiple))


async def _prompt_fit(stack: Stack) -> tuple[float, float, float]:
    async with aiohttp.ClientSession() as http, http.get(f"{stack.admin_urls[0]}/debug/pools") as response:
        fit = (await response.json()).get("prompt_calibration", {}).get("chat")
    return (float(fit["slope"]), float(fit["intercept"]), float(fit["error_sd"])) if fit else (1.0, 0.0, 0.0)


def _reserved(body: dict[str, Any], cap: int, fit: tuple[float, float, float] | None, sd: float) -> tuple[int, int]:
    """(prompt, output) tokens the service reserved for `body` (PromptCalibration.tokens, `sd` margin)."""
    raw = estimate_tokens(prompt_text(Api.CHAT, body))
    prompt = raw
    if fit is not None:
        prompt = max(1, round(fit[1] + fit[0] * raw), round(0.25 * raw))
        prompt = math.ceil(prompt * (1.0 + sd * fit[2])) if sd > 0 and fit[2] > 0 else prompt
    return prompt, min(cap, body.get("max_tokens", cap))


async def _limits_views(stack: Stack) -> list[list[dict[str, Any]]]:
    async with aiohttp.ClientSession() as http:
        views = []
        for url in stack.admin_urls:
            async with http.get(f"{url}/debug/limits") as response:
                views.append((await response.json())["slices"])
        return views


async def _redis_counts(port: int, tenant: str, pause: bool = False) -> tuple[float, float]:
    """(tokens Redis counts in the tenant's minute window, units claimed as slices) now; `pause`: first stop
    Redis from running any write command (CLIENT PAUSE WRITE) for a minute."""
    redis = RespClient(Address("127.0.0.1", port), timeout_s=5.0)
    try:
        if pause:
            await redis.call("CLIENT", "PAUSE", "60000", "WRITE")
        now = time.time()
        index = math.floor(now / 60)
        key = f"lim:{{{tenant}}}:all:tpm"
        current, previous = await redis.call("GET", f"{key}:tw60:{index}"), await redis.call(
            "GET", f"{key}:tw60:{index - 1}")
        counted = float(previous or 0) * (1 - (now - index * 60) / 60) + float(current or 0)
        claims = await redis.call("HGETALL", f"{key}:sl")  # [field, value, field, value, ...]
        claimed = sum(float(value.split()[0]) for value in claims[1::2] if float(value.split()[1]) > now)
        return counted, claimed
    finally:
        await redis.close()


async def _run_cell(cell: _Cell, stack: Stack, group: ProcessGroup, args: argparse.Namespace, replicas: int,
                    redis_port: int) -> dict[str, Any]:
    tenant = f"t{cell.index}-{replicas}"
    fit = await _prompt_fit(stack) if args.estimate == "calibrated" else None
    before = await metric_sums(stack.admin_urls, [DEGRADED, *ADMISSION_PATHS, UNCOVERED])
    rate = cell.burst / (args.spread_ms / 1000.0)
    load = asyncio.create_task(run_open_loop(
        "127.0.0.1", stack.envoy_port, lambda i: _spec(cell.bodies[i], tenant, cell.tier), rate=rate,
        duration_s=cell.burst / rate, arrival="fixed", timeout_s=60, max_in_flight=4096))
    row: dict[str, Any] = {}
    if cell.kill:
        await asyncio.sleep(args.spread_ms / 2000.0)
        # The outage starts here: Redis runs no more admissions, and what it counted can still be read.
        counted, claimed = await _redis_counts(redis_port, tenant, pause=True)
        views = await _limits_views(stack)
        group.get("redis").send_signal(signal.SIGKILL)
        key = f"{{{tenant}}}:all:tpm"
        held = [next((v for v in view if v["key"] == key), None) for view in views]
        # Each replica alone: its share of what its last decision said was left beyond every slice (all of
        # it since that decision: what it admitted alone before the pause may not be in Redis's count), or,
        # without a view of the budget, its share of the whole budget.
        alone = sum(math.floor(v["unclaimed"] / replicas) if v is not None else math.ceil(cell.budget / replicas)
                    for v in held)
        bound = counted + claimed + alone
        row = {"killed_counted": round(counted), "killed_slices": round(claimed),
               "killed_alone_allowance": round(alone), "bound_pct": round(100 * bound / cell.budget, 1)}
    samples = await load
    after = await metric_sums(stack.admin_urls, [DEGRADED, *ADMISSION_PATHS, UNCOVERED])
    admitted = [(s, cell.bodies[s.index]) for s in samples if s.status == 200]
    reserved = [_reserved(body, args.cap, fit, args.prompt_reserve_sd) for _, body in admitted]
    used = _used(samples)
    prompt_over = sum((s.prompt_tokens or 0) - estimate for (s, _), (estimate, _) in zip(admitted, reserved,
                                                                                             strict=True))
    return {
        "replicas": replicas, "burst": cell.burst, "multiple": cell.multiple, "streamed": args.streamed,
        "no_max_tokens": args.no_max_tokens, "redis_killed": cell.kill, "budget": cell.budget,
        "admitted": len(admitted), "refused": sum(1 for s in samples if s.status == 429),
        "other": sum(1 for s in samples if s.status not in (200, 429)), "used_tokens": used,
        "used_pct": round(100 * used / cell.budget, 1),
        "prompt_over_reserved_pct": round(100 * prompt_over / cell.budget, 1),
        "prompts_over_reserved": sum(1 for (s, _), (estimate, _) in zip(admitted, reserved, strict=True)
                                     if (s.prompt_tokens or 0) > estimate),
        "slice": int(after[ADMISSION_PATHS[0]] - before[ADMISSION_PATHS[0]]),
        "awaited": int(after[ADMISSION_PATHS[1]] - before[ADMISSION_PATHS[1]]),
        "decided_alone": int(after[DEGRADED] - before[DEGRADED]),
        "uncovered": int(after[UNCOVERED] - before[UNCOVERED]), **row,
    }


async def _replica_count(replicas: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    bursts, multiples = _ints(args.bursts), [float(m) for m in args.multiples.split(",") if m.strip()]
    cells = [_Cell(i, burst, multiple, args) for i, (burst, multiple) in
             enumerate((b, m) for b in bursts for m in multiples)]
    if args.kill_redis > 0:
        cells.append(_Cell(len(cells), args.kill_redis, 3.0, args, kill=True))
    workdir = Path(tempfile.mkdtemp(prefix=f"extproc-burst-{replicas}-"))
    redis_port = free_ports(1)[0]
    warm = random.Random(args.seed)
    warm_bodies = [_body(warm, args.cap, args.streamed, args.no_max_tokens) for _ in range(args.warmup)]
    tiers: dict[str, Any] = {"default": {}, "warm": {"max_output_tokens": args.cap}}
    policy = {"auth": {"mode": "trusted-header"}, "tiers": tiers, "flow_control": {"enabled": False},
              "limits": {"store": "redis", "redis_url": f"redis://127.0.0.1:{redis_port}/0",
                         "default_output_tokens": args.cap, "calibrate_prompt_tokens": args.estimate == "calibrated",
                         "prompt_reserve_sd": args.prompt_reserve_sd}}
    async with ProcessGroup(workdir / "logs") as group:
        await start_redis(group, redis_port, args.redis_server)
        # The budgets depend on the real tokens per request, known after the warm-up: the policy is
        # rewritten then, and the replicas reload it.
        for cell in cells:
            tiers[cell.tier] = {"limits": {"tokens_per_min": 1}, "max_output_tokens": args.cap}
        stack = await launch(group, workdir, [SimPool("chat", "org/chat", args.replicas, aliases=("chat",))],
                             extra_policy=policy, sim_args=["--profile", "fast"], service_replicas=replicas)
        print(f"{replicas} service replicas: {args.warmup} warm-up requests", file=sys.stderr)
        samples = await run_open_loop("127.0.0.1", stack.envoy_port, lambda i: _spec(warm_bodies[i], "warm", "warm"),
                                      rate=50, duration_s=args.warmup / 50, arrival="fixed", timeout_s=60)
        per_request = _used(samples) / max(1, sum(1 for s in samples if s.status == 200))
        for cell in cells:
            cell.size(per_request)
            tiers[cell.tier]["limits"]["tokens_per_min"] = cell.budget
        version = await metric_sums(stack.admin_urls, ["extproc_config_version"])
        document = yaml.safe_load(stack.policy_path.read_text())
        stack.policy_path.write_text(yaml.safe_dump({**document, "tiers": tiers}, sort_keys=False))
        await asyncio.sleep(4.5)  # the replicas' calibration sums meet in Redis every 2 s
        reloaded = await metric_sums(stack.admin_urls, ["extproc_config_version"])
        if reloaded["extproc_config_version"] < version["extproc_config_version"] + replicas:
            raise RuntimeError("the service replicas did not reload the policy with the bursts' budgets")
        rows = []
        for cell in cells:
            print(f"{replicas} replicas: burst of {cell.burst} at {cell.multiple:g}x a budget of {cell.budget}"
                  f"{' (Redis killed half-way)' if cell.kill else ''}", file=sys.stderr)
            rows.append(await _run_cell(cell, stack, group, args, replicas, redis_port))
            await asyncio.sleep(0.5)
    return rows


async def run_burst(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    for replicas in _ints(args.service_replicas):
        rows += await _replica_count(replicas, args)
    columns = ["replicas", "burst", "multiple", "streamed", "redis_killed", "budget", "admitted", "refused",
               "used_pct", "prompt_over_reserved_pct", "prompts_over_reserved", "slice", "awaited", "decided_alone"]
    print(format_table(rows, columns))
    for row in rows:
        if row["redis_killed"]:
            print(f"{row['replicas']} replicas, Redis killed: used {row['used_pct']}% of the budget; bound "
                  f"{row['bound_pct']}% = Redis's count {row['killed_counted']} + slices {row['killed_slices']} + "
                  f"fail-open allowance {row['killed_alone_allowance']} (tokens reserved)")
    path = write_json(args.json, {"cap": args.cap, "estimate": args.estimate,
                                  "prompt_reserve_sd": args.prompt_reserve_sd, "streamed": args.streamed,
                                  "no_max_tokens": args.no_max_tokens, "spread_ms": args.spread_ms, "runs": rows})
    print(f"report written to {path}")
    exceeded = [r for r in rows if not r["redis_killed"] and r["used_pct"] > 102.0]
    return 1 if exceeded or any(r["other"] for r in rows if not r["redis_killed"]) else 0
