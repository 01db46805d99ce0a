"""`extproc bench routing --workload overload`: who is served when demand exceeds the fleet.

Three priority classes and several tenants offer a multiple of the fleet's capacity (streaming chat,
unique prompts so caching plays no part). Strategies: Envoy's least-request alone, our router without
flow control (`default+noflow`), and our router with flow control as a new user gets it (`default`).
Reported per class: TTFT p50/p99 of served requests, rejections, longest time to a rejection; per point: goodput (served
requests whose TTFT met the SLO), Jain's fairness index over the standard class's equal-weight
tenants, and the longest queue wait per class the service saw (/debug/flow).

Jain's index is taken over service / fair share, where service counts a tenant's requests whose first
token came during the measured run (a backlog served afterwards is not service received), and the
fair share is the max-min fair split of the class's service among its tenants' demands
(water-filling): a light tenant that got all it asked for and heavy tenants that split the rest
equally score 1.0.

Each point starts with `--warmup` seconds at 1.5x capacity, not measured, and waits until every
warm-up request has finished: a running gateway has seen its engines full before (that is how flow
control learns their batch capacity), and every strategy starts from an idle fleet.

Capacity is computed from the simulator's timing model (`Profile.capacity_rps`), not measured: every
replica's seats busy, each step carrying the prefill of the requests admitted meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from extproc.bench.cpu_split import CpuSplit, parse_split
from extproc.bench.flowstats import flow_counts
from extproc.bench.gcwatch import GcPauses
from extproc.bench.httpclient import HttpClient, RequestError
from extproc.bench.loadgen import RequestSpec, Sample, run_open_loop
from extproc.bench.looplag import LoopLagCounts, loop_lag
from extproc.bench.overload_mix import CLASSES, MIX, Demand, class_rows, fairness, jain, max_min_shares
from extproc.bench.overload_pool import pooled
from extproc.bench.procs import ProcessGroup, self_cpu_seconds, start_redis
from extproc.bench.report import ProgressPrinter, command_line, format_markdown_table, format_table, write_json
from extproc.bench.routing_envoy import ENVOY_STRATEGIES, POOL_HEADER, start_envoy_only
from extproc.bench.routing_metrics import engine_ttft, scrape_metrics
from extproc.bench.routing_options import (
    NOFLOW,
    NOSHARE,
    SHARE,
    exchange_every,
    shares_scrapes,
    split_strategy,
    strategy_flags,
)
from extproc.bench.stack import SimPool, Stack, free_ports, prepare, start_envoy, start_service, start_sim
from extproc.flow import FlowControlConfig
from extproc.sim.profile import BUILTIN_PROFILES, Profile
from extproc.sim.tokens import Tokenizer, render_chat

__all__ = ["DEFAULT_LOADS", "DEFAULT_STRATEGIES", "MIX", "Demand", "capacity_rps", "flow_stats", "jain",
           "max_min_shares", "prompt_tokens", "run_overload"]

DEFAULT_STRATEGIES = "envoy-least-request,default+noflow,default"
DEFAULT_LOADS = "0.7,2"
SLO_TTFT_S = 2.0  # default TTFT a served request must meet to count as goodput
MODEL = "llama-3.1-8b-instruct"
PROMPT_CHARS = 400  # ~100 tokens
MAX_TOKENS = 128
WARMUP_LOAD = 1.5


def capacity_rps(profile: Profile, replicas: int, prompt_tokens: int, mean_output_tokens: float) -> float:
    """Requests/s the fleet completes with every replica saturated (see `Profile.capacity_rps`)."""
    return replicas * profile.capacity_rps(prompt_tokens, mean_output_tokens)


def prompt_tokens(seed: int, samples: int = 200) -> int:
    """Mean prompt tokens of the workload's requests, as the simulator's tokenizer and chat template count them."""
    specs = _spec_factory(seed, envoy_only=False)
    tokenizer = Tokenizer(BUILTIN_PROFILES["h100-8b"].vocab_size)
    counts = [len(tokenizer.encode(render_chat(json.loads(specs(i).body)["messages"]))) for i in range(samples)]
    return round(sum(counts) / len(counts))


def _policy(flow: bool, redis_url: str | None = None, fleet_sync_ms: int | None = None,
            share: bool | None = None) -> dict[str, Any]:
    policy: dict[str, Any] = {
        "auth": {"mode": "trusted-header"},
        "tiers": {"default": {}, "gold": {"priority": "critical"}, "standard": {"priority": "standard"},
                  "batch": {"priority": "sheddable"}},
        "flow_control": {"enabled": flow},
    }
    if redis_url is not None:  # several replicas: the shared store, through which they sync their in-flight
        policy["limits"] = {"store": "redis", "redis_url": redis_url}
    if fleet_sync_ms is not None:
        exchange_every(policy, fleet_sync_ms)
    if share is not None:  # strategy suffix +share / +noshare: whether the replicas share their endpoint scrapes
        policy.setdefault("scheduling", {})["scrape"] = {"share": share}
    return policy


def _spec_factory(seed: int, envoy_only: bool) -> Callable[[int], RequestSpec]:
    weights = [d.share for d in MIX]

    def spec(index: int) -> RequestSpec:
        rng = random.Random(seed * 1_000_003 + index)
        demand = rng.choices(MIX, weights)[0]
        words = " ".join(f"w{rng.randrange(100_000)}" for _ in range(PROMPT_CHARS // 7))
        body = {"model": MODEL, "stream": True, "max_tokens": MAX_TOKENS,
                "messages": [{"role": "user", "content": f"request {index}: {words}"}]}
        headers: tuple[tuple[str, str], ...] = (
            ("content-type", "application/json"), ("x-tenant-id", demand.tenant), ("x-tenant-tier", demand.tier))
        if envoy_only:
            headers += ((POOL_HEADER, "chat"),)
        return RequestSpec("POST", "/v1/chat/completions", headers, json.dumps(body).encode(), stream=True,
                           labels={"class": demand.klass, "tenant": demand.tenant})

    return spec


def write_markdown(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


async def _start(group: ProcessGroup, workdir: Path, strategy: str, endpoints: int, sim_args: Sequence[str],
                 replicas: int, fleet_sync_ms: int | None = None) -> Stack:
    pools = [SimPool("chat", MODEL, endpoints)]
    envoy_only = strategy in ENVOY_STRATEGIES
    redis_url = None
    if replicas > 1 and not envoy_only:
        port = free_ports(1)[0]
        await start_redis(group, port)
        redis_url = f"redis://127.0.0.1:{port}/0"
    stack = prepare(workdir, pools, extra_policy=_policy(split_strategy(strategy)[1], redis_url, fleet_sync_ms,
                                                      shares_scrapes(strategy)),
                    service_replicas=1 if envoy_only else replicas)
    stack.children["sim"] = await start_sim(group, workdir, pools, stack.sim_ports, sim_args)
    if envoy_only:
        await start_envoy_only(group, stack, strategy)
        return stack
    for index in range(replicas):
        child = await start_service(group, stack, index)
        stack.children[child.name] = child
    stack.children["envoy"] = await start_envoy(group, stack)
    return stack


async def flow_stats(client: HttpClient, stack: Stack, pool: str = "chat") -> list[dict[str, Any]]:
    """/debug/flow of the pool from every service replica (each keeps its own queue)."""
    found: list[dict[str, Any]] = []
    for _, admin_port in stack.service_ports:
        try:
            response = await client.request("GET", "127.0.0.1", admin_port, "/debug/flow", timeout_s=5.0)
        except RequestError:
            continue
        if response.status == 200:
            pools: dict[str, dict[str, Any]] = json.loads(response.body).get("pools", {})
            found.append(pools.get(pool, {}))
    return found


def longest_waits(flows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The longest queue wait per class over the replicas' /debug/flow."""
    waits: dict[str, float] = {}
    for flow in flows:
        for klass, stats in flow.get("classes", {}).items():
            waits[klass] = max(waits.get(klass, 0.0), float(stats.get("max_wait_s", 0.0)))
    return waits


def class_counts(flows: Sequence[Mapping[str, Any]], before: Mapping[str, dict[str, int]] | None = None) -> Any:
    """Per class: went straight on, queued, refused, over the replicas' /debug/flow, less `before` (the warm-up)."""
    counts: dict[str, dict[str, int]] = {}
    for flow in flows:
        for klass, stats in flow.get("classes", {}).items():
            row = counts.setdefault(klass, {"direct": 0, "queued": 0, "rejected": 0})
            row["direct"] += int(stats.get("direct", 0))
            row["queued"] += int(stats.get("queued", 0))
            row["rejected"] += sum(int(v) for v in stats.get("rejected", {}).values())
    for klass, row in counts.items():
        for key, value in (before or {}).get(klass, {}).items():
            row[key] -= value
    return counts


def reserving_counts(flows: Sequence[Mapping[str, Any]], before: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Flow control's decisions taken with the reserves on, by reason, over the replicas, less `before`."""
    counts: dict[str, int] = {}
    for sign, found in ((1, flows), (-1, before)):
        for flow in found:
            for reason, count in flow.get("reserving", {}).items():
                counts[reason] = counts.get(reason, 0) + sign * int(count)
    return counts


async def run_point(strategy: str, load: float, capacity: float, args: argparse.Namespace, endpoints: int,
                    sim_args: Sequence[str], workdir: Path, seed: int | None = None
                    ) -> tuple[dict[str, Any], list[Sample]]:
    """One point (the measured row and its samples), with `seed` (default `--seed`) for workload and arrivals."""
    seed = args.seed if seed is None else seed
    rate = load * capacity
    envoy_only = strategy in ENVOY_STRATEGIES
    async with ProcessGroup(workdir / "logs") as group, HttpClient() as client:
        stack = await _start(group, workdir, strategy, endpoints, sim_args, args.replicas, args.fleet_sync_ms)
        split: CpuSplit | None = getattr(args, "cpu_split", None)
        if split is not None:
            split.pin(group.children)
        specs = _spec_factory(seed, strategy in ENVOY_STRATEGIES)
        warm = await run_open_loop("127.0.0.1", stack.envoy_port, lambda i: specs(1_000_000 + i),
                                   rate=WARMUP_LOAD * capacity, duration_s=args.warmup, seed=seed + 7,
                                   client=client, timeout_s=args.client_timeout) if args.warmup > 0 else []
        printer = ProgressPrinter(prefix=f"{strategy} @ {load:g}x ({rate:.1f} req/s) ")
        admin_ports = [] if envoy_only else [admin for _, admin in stack.service_ports]
        flow_before = await flow_counts(client, admin_ports)
        lag_before = await loop_lag(client, admin_ports)
        flowing = not envoy_only and split_strategy(strategy)[1]
        flows_before = await flow_stats(client, stack) if flowing else []
        classes_before = class_counts(flows_before)
        sims = [f"127.0.0.1:{port}" for ports in stack.sim_ports.values() for port in ports]
        engines_before = await scrape_metrics(client, sims)
        cpu_before, load_before = {**group.cpu_seconds(), "client": self_cpu_seconds()}, os.getloadavg()[0]
        started = time.perf_counter()
        try:
            with GcPauses() as pauses:
                samples = await run_open_loop("127.0.0.1", stack.envoy_port, specs, rate=rate,
                                              duration_s=args.duration, seed=seed, client=client,
                                              progress=printer, timeout_s=args.client_timeout, max_in_flight=4096)
        finally:
            printer.close()
        wall = time.perf_counter() - started
        # Cores per process in the run, and the (shared) machine's load average: a tail may come from starvation.
        cpu_after = {**group.cpu_seconds(), "client": self_cpu_seconds()}
        cores = {k: round((cpu_after[k] - v) / wall, 2) for k, v in cpu_before.items() if k in cpu_after}
        machine = {"loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)], "cpus": os.cpu_count()}
        flow_run = (await flow_counts(client, admin_ports)) - flow_before
        # The service's event loop over the run: a stall there delays every request it holds.
        lag_run: LoopLagCounts = (await loop_lag(client, admin_ports)) - lag_before
        # TTFT as the engines saw it (arrival at the engine to first token, all classes): a tail that is not
        # here came from the path in front of them (service, Envoy, client).
        engines = engine_ttft(engines_before, await scrape_metrics(client, sims))
        flows = await flow_stats(client, stack) if flowing else []
    classes = class_rows(samples, args.slo_ttft)
    within = sum(row["within_slo"] for row in classes.values())
    return {
        "strategy": strategy, "load": load, "seed": seed, "rate_rps": round(rate, 2), "wall_s": round(wall, 1),
        "classes": classes, "fairness": fairness(samples, args.duration),
        "goodput_rps": round(within / args.duration, 2), "warmup_requests": len(warm),
        "client_timeouts": sum(1 for s in samples if s.error == "timeout"),
        "max_queue_wait_s": longest_waits(flows), "flow": flows, "flow_run": flow_run.as_dict(),
        "flow_run_classes": class_counts(flows, classes_before),
        "flow_run_reserving": reserving_counts(flows, flows_before),
        "service_loop_lag": lag_run.summary(),
        "cores": cores, "machine": machine, "engine_ttft_ms": engines, "client_gc_pauses": pauses.longest(),
    }, samples


TABLE = [("strategy", "strategy"), ("load", "load"), ("classes.critical.ttft_p50_ms", "crit50"),
         ("classes.critical.ttft_p99_ms", "crit99"), ("classes.critical.rejected", "crit_rej"),
         ("classes.standard.ttft_p50_ms", "std50"), ("classes.standard.ttft_p99_ms", "std99"),
         ("classes.standard.rejected", "std_rej"), ("classes.sheddable.ttft_p99_ms", "shed99"),
         ("classes.sheddable.rejected", "shed_rej"), ("goodput_rps", "goodput"), ("fairness.jain", "jain"),
         ("engine_ttft_ms.p99", "eng99"), ("service_loop_lag.p99_ms_le", "lag99<="),
         ("service_loop_lag.max_ms", "lagmax"),
         ("flow_run.queued", "fc_q"), ("flow_run.waited_over_1s", "fc_q>1s"), ("flow_run.rejected", "fc_rej"),
         ("flow_run_reserving", "reserving"),
         ("client_timeouts", "timeouts")]


def verdicts(rows: Sequence[Mapping[str, Any]], loads: Sequence[float],
             classes: Mapping[str, float]) -> list[str]:
    """The acceptance figures, per strategy: critical p99 at the highest load vs the lowest, etc."""
    lines = []
    low, high = min(loads), max(loads)
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        by_load = {r["load"]: r for r in rows if r["strategy"] == strategy and "failed" not in r}
        if low not in by_load or high not in by_load or low == high:
            continue
        base = by_load[low]["classes"]["critical"]["ttft_p99_ms"]
        peak = by_load[high]["classes"]["critical"]["ttft_p99_ms"]
        ratio = round(peak / base, 2) if base and peak else None
        rejected = {k: by_load[high]["classes"][k]["rejected"] for k in CLASSES}
        waits = by_load[high]["max_queue_wait_s"]
        over = [k for k, v in waits.items() if v is not None and k in classes and v > classes[k] + 0.05]
        lines.append(
            f"{strategy}: critical TTFT p99 {base} ms at {low:g}x -> {peak} ms at {high:g}x (ratio {ratio}, "
            f"target <= 1.5); rejections at {high:g}x {rejected}; Jain {by_load[high]['fairness']['jain']} "
            f"(target >= 0.9); longest queue wait per class {waits or 'n/a'}"
            + (f"; OVER LIMIT: {over}" if over else ""))
    return lines


async def run_overload(args: argparse.Namespace) -> int:
    if args.slo_ttft is None:
        args.slo_ttft = SLO_TTFT_S
    strategies = [s.strip() for s in (args.strategies or DEFAULT_STRATEGIES).split(",") if s.strip()]
    bad = [s for s in strategies if s not in ENVOY_STRATEGIES
           and (strategy_flags(s)[0] != "default" or "@" in s or not strategy_flags(s)[1] <= {NOFLOW, SHARE, NOSHARE}
                or strategy_flags(s)[1] >= {SHARE, NOSHARE})]
    loads = [float(x) for x in (args.loads or DEFAULT_LOADS).split(",") if x.strip()]
    endpoints = args.endpoints or 4
    if bad or not loads or min(loads) <= 0:
        print(f"error: strategies must be envoy-least-request, envoy-round-robin or default, the latter with "
              f"{NOFLOW} and one of {SHARE} / {NOSHARE} optionally "
              f"(got {bad}); --loads must be positive", file=sys.stderr)
        return 2
    try:
        args.cpu_split = parse_split(getattr(args, "isolate", "off"))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.cpu_split is not None:
        args.cpu_split.pin_harness()
        print(args.cpu_split.describe(), file=sys.stderr)
    profile = BUILTIN_PROFILES["h100-8b"]
    mean_output = MAX_TOKENS * (1 + profile.min_output_fraction) / 2
    capacity = args.capacity or capacity_rps(profile, endpoints, prompt_tokens(args.seed), mean_output)
    workdir = Path(args.workdir) if args.workdir else Path(f"/tmp/extproc-overload-{int(time.time())}")
    seeds = range(args.seed, args.seed + max(1, getattr(args, "repeat", 1)))
    out = Path(args.out or "reports/routing-overload")
    # The service's default classes, which this benchmark runs with.
    classes = {name: spec.max_wait_s for name, spec in FlowControlConfig().classes.items()}
    print(f"overload: {endpoints} replicas of h100-8b, {args.replicas} service process(es), "
          f"capacity ~{capacity:.1f} req/s; loads {loads} x capacity; "
          f"{args.duration:g} s per point; seeds {list(seeds)} (strategies interleaved per seed); strategies "
          f"{strategies}; class waits {classes}; workdir {workdir}", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    points: list[tuple[dict[str, Any], list[Sample]]] = []
    for load in loads:
        for seed in seeds:
            sim_args = ("--profile", "h100-8b", "--stream-chunk-tokens", str(args.stream_chunk_tokens), "--seed",
                        str(seed))
            for strategy in strategies:
                try:
                    row, samples = await run_point(strategy, load, capacity, args, endpoints, sim_args,
                                                   workdir / f"{strategy}-{load:g}x-s{seed}", seed)
                    points.append((row, samples))
                except Exception as exc:  # one broken point must not end the run
                    row = {"strategy": strategy, "load": load, "seed": seed,
                           "failed": f"{type(exc).__name__}: {str(exc)[:300]}"}
                rows.append(row)
                print(f"{strategy} @ {load:g}x seed {seed}: " + json.dumps(row.get("classes", row.get("failed"))),
                      file=sys.stderr)
    good = [r for r in rows if "failed" not in r]
    pool = pooled(points, args.duration, args.slo_ttft) if len(seeds) > 1 else []
    print(format_table(good, TABLE))
    if pool:
        print(f"pooled over seeds {list(seeds)} (percentiles of every seed's requests together):")
        print(format_table(pool, TABLE))
    summary = verdicts(pool or good, loads, classes)
    for line in summary:
        print(line)
    meta = {"endpoints": endpoints, "service_replicas": args.replicas, "capacity_rps": round(capacity, 2),
            "loads": loads, "duration_s": args.duration,
            "slo_ttft_s": args.slo_ttft, "mix": [vars(d) for d in MIX], "class_max_wait_s": classes,
            "seed": args.seed, "seeds": list(seeds), "workdir": str(workdir), "command": command_line(),
            "cpus": args.cpu_split.describe() if args.cpu_split is not None else "shared by every process"}
    paths = [write_json(out / "results.json", {"meta": meta, "rows": rows, "pooled": pool, "verdicts": summary})]
    markdown = (f"## Overload benchmark\n\nCommand: `{meta['command']}`\n\n{json.dumps(meta)}\n\n"
                + (f"Pooled over seeds {list(seeds)} (percentiles of every seed's requests together):\n\n"
                   + format_markdown_table(pool, TABLE) + "\n\nPer seed:\n\n" if pool else "")
                + format_markdown_table(good, TABLE)
                + "\n\n" + "\n".join(f"- {line}" for line in summary) + "\n")
    paths.append(write_markdown(out / "results.md", markdown))
    print(f"reports: {', '.join(str(p) for p in paths)}")
    return 1 if len(good) < len(rows) else 0
