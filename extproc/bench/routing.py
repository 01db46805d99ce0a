"""`extproc bench routing`: endpoint-picking strategies compared on cache-sensitive workloads.

For every (seed, offered rate, strategy) point a fresh stack starts: simulated vLLM fleet, then (for our
scheduling profiles) the service replicas (sharing a redis-server when there are several) and Envoy with our
filter, or (for `envoy-*` baselines) Envoy alone with a router-only listener whose pool clusters use Envoy's
own lb_policy, or a peer router in place of Envoy. A fresh stack rather than `POST /sim/reset` between points
because a reset clears only the simulator: the service's per-endpoint state (in-flight counts, scraped
metrics, the prefix directory) and Envoy's least-request counters and connection pools would carry over from
the previous point, and a stack is up in a few seconds. Each point runs a short warm-up (not measured), then
the measured open-loop run. Strategies run one after another at each rate and seed, so that the machine's
other work affects them alike, in an order rotated from seed to seed, on the same engine ports (`Plan.engine_ports`:
where a new prompt goes on an idle fleet hangs on the endpoints' addresses).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from extproc.bench.envoy_timings import (
    TIMINGS_LOG,
    add_timings_log,
    keep_timings,
    stack_run_delays,
    write_run_delays,
)
from extproc.bench.flowstats import FlowCounts, flow_counts
from extproc.bench.httpclient import HttpClient
from extproc.bench.loadgen import RequestSpec, Sample, run_open_loop
from extproc.bench.looplag import loop_lag
from extproc.bench.overload import run_overload
from extproc.bench.peers import PEERS, Peer, peer_summary, scrape_peer, start_peer, stop_peer
from extproc.bench.procs import ProcessGroup, self_cpu_seconds, start_redis
from extproc.bench.report import ProgressPrinter, command_line, format_table
from extproc.bench.routing_envoy import AFFINITY_HEADER, ENVOY_STRATEGIES, POOL_HEADER, start_envoy_only
from extproc.bench.routing_metrics import (
    SATURATED_CORES,
    cores_used,
    endpoint_counts,
    engine_ttft,
    hit_rate,
    point_row,
    scrape_metrics,
)
from extproc.bench.routing_options import (
    NOPUSH,
    body_mode,
    envoy_workers,
    exchange_every,
    front_end,
    shares_scrapes,
    split_strategy,
    staggers_scrapes,
    strategy_flags,
)
from extproc.bench.routing_plan import Plan, configure, make_plan, sim_profile
from extproc.bench.routing_pool import TTFTS, ttfts_ms
from extproc.bench.routing_report import aggregate, latency_by, table_for, write_reports
from extproc.bench.routing_samples import dump_point
from extproc.bench.stack import SimPool, Stack, free_ports, prepare, start_envoy, start_service, start_sim
from extproc.bench.stats import summarize
from extproc.config import parse_policy
from extproc.xds import write_config

__all__ = ["configure", "run_routing"]


def _use_profile(stack: Stack, pools: Sequence[SimPool], strategy: str) -> None:
    """Point every pool at the strategy's scheduling profile, set its flow control, front end, request body mode and
    scrape sharing, and declare the pools' LoRA adapters (not part of stack.prepare)."""
    profile, flow = split_strategy(strategy)
    document = yaml.safe_load(stack.policy_path.read_text())
    document.setdefault("flow_control", {})["enabled"] = flow
    if (front := front_end(strategy)) is not None:
        document.setdefault("service", {})["front_end"] = front
    if (mode := body_mode(strategy)) is not None:
        document.setdefault("envoy", {})["request_body_mode"] = mode
    scheduling = document.setdefault("scheduling", {})
    scheduling["push_requests"] = NOPUSH not in strategy_flags(strategy)[1]
    scrape = scheduling.setdefault("scrape", {})
    scrape["stagger"] = staggers_scrapes(strategy)
    if (share := shares_scrapes(strategy)) is not None:
        scrape["share"] = share
    else:  # the policy's default, whatever the previous strategy set
        scrape.pop("share", None)
    for entry, pool in zip(document["pools"], pools, strict=True):
        entry["profile"] = profile
        if pool.lora:
            entry["lora_adapters"] = list(pool.lora)
    stack.policy_path.write_text(yaml.safe_dump(document, sort_keys=False))
    stack.policy = parse_policy(stack.policy_path.read_text(), str(stack.policy_path))
    write_config(stack.policy, stack.envoy_dir)


async def _start(group: ProcessGroup, workdir: Path, plan: Plan, strategy: str, seed: int) -> tuple[Stack, Peer | None]:
    pools = plan.layout.pools
    envoy_only = strategy in ENVOY_STRATEGIES
    alone = envoy_only or strategy in PEERS  # no service of ours in the stack
    replicas = plan.service_replicas(strategy)
    shared: dict[str, Any] = {"scheduling": dict(plan.scheduling)} if plan.scheduling and not alone else {}
    if plan.scrape_ms is not None and not alone:
        shared.setdefault("scheduling", {})["scrape"] = {"interval_ms": plan.scrape_ms}
    if not alone and replicas > 1:  # the replicas' shared store: limits, in-flight counts, placements
        port = free_ports(1)[0]
        await start_redis(group, port)
        shared["limits"] = {"store": "redis", "redis_url": f"redis://127.0.0.1:{port}/0"}
        if plan.fleet_sync_ms is not None:
            exchange_every(shared, plan.fleet_sync_ms)
    stack = prepare(workdir, pools, service_replicas=1 if alone else replicas, extra_policy=shared,
                    engine_ports=plan.engine_ports(seed))
    if not alone:
        _use_profile(stack, pools, strategy)
        if plan.samples:  # Envoy's own timing of each request, next to the point's samples
            add_timings_log(stack.envoy_dir, (workdir / TIMINGS_LOG).resolve())
    stack.children["sim"] = await start_sim(group, workdir, pools, stack.sim_ports, plan.sim_args(seed))
    if strategy in PEERS:  # the peer is the front door, in place of Envoy (one pool, checked by the plan)
        workers = [f"http://127.0.0.1:{port}" for port in stack.sim_ports[pools[0].name]]
        peer = await start_peer(group, strategy, workers)
        stack.children[peer.router.binary] = peer.child
        return stack, peer
    if not envoy_only:
        for index in range(replicas):
            child = await start_service(group, stack, index)
            stack.children[child.name] = child
        stack.children["envoy"] = await start_envoy(group, stack, envoy_workers(strategy))
        return stack, None
    # The gateway listener's port is free here (no gateway listener), so the baseline takes it.
    await start_envoy_only(group, stack, strategy)
    return stack, None


def _with_pool_header(next_spec: Callable[[int], RequestSpec]) -> Callable[[int], RequestSpec]:
    """For Envoy alone: the pool, and the prompt group a hashing balancer keeps together (shared prefix or
    conversation; a one-off prompt hashes alone)."""
    def spec(index: int) -> RequestSpec:
        original = next_spec(index)
        labels = original.labels
        group = labels.get("conversation") or labels.get("group")
        affinity = f"{labels.get('model', '')}/{group}" if group and group != "-" else f"request-{index}"
        return dataclasses.replace(original, headers=(*original.headers, (POOL_HEADER, labels["pool"]),
                                                      (AFFINITY_HEADER, affinity)))

    return spec


def _goodput(samples: Sequence[Sample], slo_ttft_s: float, duration_s: float) -> float:
    good = sum(1 for s in samples if s.error is None and not s.aborted and s.ttft_s is not None
               and s.ttft_s <= slo_ttft_s)
    return round(good / duration_s, 2)


async def _run_point(plan: Plan, strategy: str, rate: float, load: float | None, seed: int) -> dict[str, Any]:
    workdir = plan.workdir / f"s{seed}-{strategy}-q{rate:g}"
    async with ProcessGroup(workdir / "logs") as group, HttpClient() as client:
        stack, peer = await _start(group, workdir, plan, strategy, seed)
        if plan.isolate is not None:
            plan.isolate.pin(group.children)
        next_spec = plan.workload_for(seed, rate).next_spec
        if strategy in ENVOY_STRATEGIES:
            next_spec = _with_pool_header(next_spec)
        port = stack.envoy_port if peer is None else peer.port
        warm = await run_open_loop("127.0.0.1", port, next_spec, rate=rate, duration_s=plan.warmup_s,
                                   seed=seed, client=client, timeout_s=plan.client_timeout_s) if plan.warmup_s else []
        offset = len(warm)
        endpoints = {pool: [f"127.0.0.1:{p}" for p in ports] for pool, ports in stack.sim_ports.items()}
        addresses = [a for pool in endpoints.values() for a in pool]
        metrics_before = await scrape_metrics(client, addresses)
        ours = peer is None and strategy not in ENVOY_STRATEGIES
        admin_ports = [admin for _, admin in stack.service_ports] if ours else []
        flow_before = await flow_counts(client, admin_ports)
        lag_before = await loop_lag(client, admin_ports) if ours else None
        peer_before = await scrape_peer(client, peer) if peer is not None else {}
        delays_before = stack_run_delays(group) if plan.samples else {}
        cpu_before, self_before, t0 = group.cpu_seconds(), self_cpu_seconds(), time.perf_counter()
        printer = ProgressPrinter(prefix=f"{strategy} @ {rate:g} qps, seed {seed} ")
        try:
            samples = await run_open_loop("127.0.0.1", port, lambda i: next_spec(i + offset), rate=rate,
                                          duration_s=plan.duration_s, seed=seed + 1, client=client,
                                          progress=printer, timeout_s=plan.client_timeout_s)
        finally:
            printer.close()
        wall = time.perf_counter() - t0
        cpu_after, self_after = group.cpu_seconds(), self_cpu_seconds()
        delays_after = stack_run_delays(group) if plan.samples else {}
        metrics_after = await scrape_metrics(client, addresses)
        flow: FlowCounts | None = (await flow_counts(client, admin_ports)) - flow_before if ours else None
        lag = (await loop_lag(client, admin_ports)) - lag_before if lag_before is not None else None
        if plan.samples:
            where = plan.out / "samples" / f"{strategy}-q{rate:g}-s{seed}"
            write_run_delays(where, delays_before, delays_after, wall)
            await dump_point(client, where, samples, admin_ports, addresses)
            if ours:
                await keep_timings(client, stack.policy.envoy.admin_port, workdir / TIMINGS_LOG, where,
                                   offset + len(samples))
        peer_report: dict[str, Any] | None = None
        if peer is not None:
            peer_after = await scrape_peer(client, peer)
            await stop_peer(group, peer)
            served = sum(1 for s in samples if s.error is None and not s.aborted)
            peer_report = peer_summary(peer, peer_before, peer_after, served,
                                       plan.out / "peer-logs" / f"{strategy}-q{rate:g}-s{seed}.log")
    cores = cores_used({**cpu_before, "client": self_before}, {**cpu_after, "client": self_after}, wall)
    by_pool: dict[str, list[Sample]] = {}
    for sample in samples:
        by_pool.setdefault(sample.labels.get("pool", "-"), []).append(sample)
    pool_counts = {pool: endpoint_counts(by_pool.get(pool, []), hosts) for pool, hosts in endpoints.items()}
    summary = summarize(samples)
    row = point_row(strategy, rate, samples, summary, hit_rate(metrics_before, metrics_after), pool_counts, cores)
    row.update(load=load, seed=seed, wall_s=round(wall, 2), warmup_requests=offset,
               goodput_rps=_goodput(samples, plan.slo_ttft_s, plan.duration_s),
               tpot_p99_ms=summary["tpot_ms"]["p99"], engine_ttft_ms=engine_ttft(metrics_before, metrics_after),
               by_phase=latency_by(samples, "phase"),
               by_kind=latency_by(samples, "kind"))
    row[TTFTS] = ttfts_ms(samples)  # for percentiles pooled over the seeds (routing_pool.py)
    if flow is not None:
        row["flow"] = flow.as_dict()
    if lag is not None:  # a tail the engines did not cause may be a stalled service loop (a collection, a CPU)
        row["service_loop_lag"] = lag.summary()
    if peer_report is not None:
        row["peer"] = peer_report
    return row


def _point_line(row: dict[str, Any]) -> str:
    where = f"{row['strategy']} @ {row['qps']:g} qps, seed {row.get('seed', '-')}"
    if "failed" in row:
        return f"{where} FAILED: {row['failed']}"
    flag = f" SATURATED: {','.join(row['saturated'])}" if row["saturated"] else ""
    if "peer" in row:
        check = row["peer"]["policy_check"]
        flag += (f" peer {check['policy']}: {check['decisions']} decisions for {check['served']} served, "
                 f"fallbacks {check['fallbacks'] or 0}{'' if check['ok'] else ' POLICY NOT IN EFFECT'}")
    return (f"{where}: ok={row['ok']} err={row['errors']} ttft p50/p90/p99={row['ttft_p50_ms']}/"
            f"{row['ttft_p90_ms']}/{row['ttft_p99_ms']} ms hit={row['hit_rate']} {row.get('hit_by_workload') or ''} "
            f"cv={row['spread_cv']} "
            f"cores={row['cores']}{flag}")


def _command(args: argparse.Namespace) -> str | None:
    """The command line: the suite's (it sets one), else this process's (the CLI's `command` is only the
    subcommand's name)."""
    given = getattr(args, "command", None)
    if isinstance(given, str) and given.startswith("extproc "):
        return given
    return command_line() if sys.argv[1:3] == ["bench", "routing"] else None


def _meta(plan: Plan, args: argparse.Namespace, wall: float) -> dict[str, Any]:
    return {
        "workload": plan.workload, "strategies": list(plan.strategies), "qps": [r for r, _ in plan.rates],
        "loads": [x for _, x in plan.rates], "seeds": list(plan.seeds), "capacity": plan.capacity,
        "duration_s": plan.duration_s, "warmup_s": plan.warmup_s, "endpoints": args.endpoints or 8,
        "service_replicas": plan.replicas, "stream_chunk_tokens": plan.stream_chunk_tokens,
        "slo_ttft_s": plan.slo_ttft_s, "kv_sizing": plan.sizing, "sim_profile": sim_profile(plan.kv_blocks),
        "wall_s": wall, "saturation_limit_cores": SATURATED_CORES,
        "isolation": "fresh stack (simulator, service, Envoy) per point: cold caches, no carried-over state",
        "pools": [dataclasses.asdict(p) for p in plan.layout.pools], "workdir": str(plan.workdir),
        "command": _command(args), "scheduling": plan.scheduling,
        "cpus": plan.isolate.describe() if plan.isolate is not None else "shared by every process",
    }


async def run_routing(args: argparse.Namespace) -> int:
    if args.workload == "overload":
        return await run_overload(args)
    try:
        plan = make_plan(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if plan.isolate is not None:  # the load generator (this process) with the harness; children are pinned per point
        plan.isolate.pin_harness()
        print(plan.isolate.describe(), file=sys.stderr)
    started = time.perf_counter()
    print(f"workload {plan.workload}: {len(plan.strategies)} strategies x {len(plan.rates)} rates x "
          f"{len(plan.seeds)} seeds, {plan.warmup_s:g}+{plan.duration_s:g} s per point; capacity "
          f"{plan.capacity['rps']} req/s; kv_blocks={plan.kv_blocks} per replica (working set / replica capacity = "
          f"{plan.sizing['working_set_per_replica_capacity']}); workdir {plan.workdir}", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    for turn, seed in enumerate(plan.seeds):
        # Each seed starts with the next strategy, so that no strategy always runs first (after a stack change).
        shift = turn % len(plan.strategies)
        order = plan.strategies[shift:] + plan.strategies[:shift]
        for rate, load in plan.rates:
            for strategy in order:
                try:
                    row = await _run_point(plan, strategy, rate, load, seed)
                except Exception as exc:  # one broken point (e.g. a profile the service lacks) must not end the run
                    traceback.print_exc(file=sys.stderr)
                    row = {"strategy": strategy, "qps": rate, "load": load, "seed": seed,
                           "failed": f"{type(exc).__name__}: {str(exc)[:300]}"}
                rows.append(row)
                print(_point_line(row), file=sys.stderr)
    wall = round(time.perf_counter() - started, 1)
    good = [r for r in rows if "failed" not in r]
    merged = aggregate(good)
    print(format_table(merged, table_for(merged)))
    paths = write_reports(plan.out, rows, _meta(plan, args, wall))
    saturated = sorted({f"{r['strategy']}@{r['qps']:g}/s{r['seed']}:{n}" for r in good for n in r["saturated"]})
    if saturated:
        print(f"warning: processes above {SATURATED_CORES} core (results may be CPU-bound): {saturated}")
    print(f"wall time {wall} s; reports: {', '.join(str(p) for p in paths)}")
    not_in_effect = [r for r in good if "peer" in r and not r["peer"]["policy_check"]["ok"]]
    for row in not_in_effect:
        print(f"error: {row['strategy']} @ {row['qps']:g}, seed {row['seed']}: the peer's policy was not in "
              f"effect (see {row['peer']['log']})", file=sys.stderr)
    return 1 if len(good) < len(rows) or not_in_effect or any(r["errors"] for r in good) else 0
