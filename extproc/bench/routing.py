"""`extproc bench routing`: endpoint-picking strategies compared on cache-sensitive workloads.

For every (strategy, offered QPS) point a fresh stack starts: simulated vLLM fleet, then (for our
scheduling profiles) the service replicas and Envoy with our filter, or (for `envoy-*` baselines) Envoy
alone with a router-only listener whose pool clusters use Envoy's own lb_policy. A fresh stack rather
than `POST /sim/reset` between points because a reset clears only the simulator: the service's
per-endpoint state (in-flight counts, scraped metrics, any learned prefix index) and Envoy's
least-request counters and connection pools would carry over from the previous point, and a stack is up
in a few seconds. Each point runs a short warm-up (not measured), then the measured open-loop run.

KV capacity per simulated replica is sized from the workload's prefix working set (see
`routing_metrics.kv_blocks_for`) so that one replica cannot cache everything but the fleet can.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from extproc.bench.agents import agents_workload
from extproc.bench.flowstats import FlowCounts, flow_counts
from extproc.bench.httpclient import HttpClient, RequestError
from extproc.bench.loadgen import RequestSpec, Sample, run_open_loop
from extproc.bench.overload import DEFAULT_LOADS, run_overload
from extproc.bench.overload import DEFAULT_STRATEGIES as OVERLOAD_STRATEGIES
from extproc.bench.peers import PEERS, Peer, peer_summary, scrape_peer, start_peer, stop_peer
from extproc.bench.procs import ProcessGroup, self_cpu_seconds
from extproc.bench.report import ProgressPrinter, format_table
from extproc.bench.routing_envoy import ENVOY_STRATEGIES, POOL_HEADER, start_envoy_only
from extproc.bench.routing_metrics import (
    FLEET_HEADROOM,
    KV_TARGET_RATIO,
    SATURATED_CORES,
    cores_used,
    endpoint_counts,
    hit_rate,
    kv_blocks_for,
    point_row,
)
from extproc.bench.routing_options import (
    CAPACITY_HIT_RATE,
    NOFLOW,
    PrefixShape,
    add_shape_options,
    fleet_capacity_rps,
    split_strategy,
)
from extproc.bench.routing_report import write_reports
from extproc.bench.stack import SimPool, Stack, prepare, start_envoy, start_service, start_sim
from extproc.bench.stats import summarize
from extproc.bench.workloads import (
    MixedPool,
    RoutingWorkload,
    mixed_workload,
    multi_turn_workload,
    shared_prefix_workload,
)
from extproc.config import parse_policy
from extproc.config.schema import BUILTIN_PROFILES
from extproc.sim.profile import load_profile
from extproc.xds import write_config

__all__ = ["WORKLOADS", "Layout", "configure", "layout_for", "run_routing", "sim_profile"]

DEFAULT_STRATEGIES = "envoy-round-robin,envoy-least-request,least-inflight,default"
WORKLOADS = ("shared-prefix", "multi-turn", "agents", "mixed", "overload")
# Offered load per workload: light, around the knee, and past it for round-robin on 8 replicas.
DEFAULT_QPS = {"shared-prefix": "8,24,48", "multi-turn": "8,24,48", "agents": "8,24,48", "mixed": "8,24,48"}
CHAT_MODEL = "llama-3.1-8b-instruct"
CODE_MODEL = "qwen2.5-coder-7b"
ADAPTERS = ("sql-lora", "summarize-lora", "support-lora")
BASE_PROFILE = "h100-8b"


@dataclass(frozen=True)
class Layout:
    """Pools to simulate and a factory of the workload (a fresh, identical generator per point)."""

    pools: tuple[SimPool, ...]
    workload: Callable[[int], RoutingWorkload]


def layout_for(name: str, endpoints: int, shape: PrefixShape | None = None) -> Layout:
    if name == "agents":
        return Layout((SimPool("chat", CHAT_MODEL, endpoints),), lambda seed: agents_workload(CHAT_MODEL, seed=seed))
    if name in ("shared-prefix", "multi-turn"):
        pool = SimPool("chat", CHAT_MODEL, endpoints)
        if name == "shared-prefix":
            s = shape or PrefixShape()
            return Layout((pool,), lambda seed: shared_prefix_workload(
                CHAT_MODEL, seed=seed, groups=s.groups, prefix_tokens=s.prefix_tokens,
                question_tokens=s.question_tokens, max_tokens=s.output_tokens, popularity=s.popularity))
        return Layout((pool,), lambda seed: multi_turn_workload(CHAT_MODEL, seed=seed))
    if name == "mixed":
        if endpoints < 2:
            raise ValueError("the mixed workload needs --endpoints >= 2 (two pools)")
        chat = SimPool("chat", CHAT_MODEL, math.ceil(endpoints / 2), lora=ADAPTERS)
        code = SimPool("code", CODE_MODEL, endpoints - chat.replicas)
        targets = (MixedPool("chat", CHAT_MODEL, 0.6, ADAPTERS), MixedPool("code", CODE_MODEL, 0.4))
        return Layout((chat, code), lambda seed: mixed_workload(targets, seed=seed))
    raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")


def sim_profile(kv_blocks: int) -> dict[str, Any]:
    return {"base": BASE_PROFILE, "name": f"{BASE_PROFILE}-kv{kv_blocks}", "num_gpu_blocks": kv_blocks}


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=WORKLOADS, default="shared-prefix",
                        help="shared-prefix: 32 long system prompts x many short questions; multi-turn: "
                             "concurrent conversations whose history grows per turn; agents: the same as coding-agent "
                             "sessions over Anthropic Messages (Claude Code) and Responses (Agents SDK): tools, tool "
                             "calls and results, screenshots; mixed: two models, LoRA "
                             "adapters on one, short and long prompts; overload: three priority classes and unequal "
                             "tenants offered multiples of the fleet's capacity (see --loads) (default %(default)s)")
    parser.add_argument("--strategies", default=None,
                        help="comma list: envoy-round-robin / envoy-least-request (Envoy alone, no ext_proc), a peer "
                             f"router ({', '.join(PEERS)}; one-pool workloads, needs the bench extra) or a "
                             "scheduling profile of the service, e.g. default, load-only, least-inflight, random, "
                             f"with flow control on, or off with the suffix {NOFLOW} (default {DEFAULT_STRATEGIES}); "
                             f"overload: envoy-least-request, default, default{NOFLOW} (default {OVERLOAD_STRATEGIES})")
    parser.add_argument("--qps", default=None,
                        help="comma list of offered request rates (Poisson arrivals); default per workload: "
                             + "; ".join(f"{k} {v}" for k, v in DEFAULT_QPS.items() if k != "overload"))
    parser.add_argument("--duration", type=float, default=25.0, help="measured seconds per point (default 25)")
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="seconds of the same load before each measured run, not counted (default 5)")
    parser.add_argument("--replicas", type=int, default=1, help="service processes behind Envoy (default 1)")
    parser.add_argument("--fleet-sync-ms", type=int, default=None,
                        help="overload with --replicas > 1 (they share a redis-server): "
                             "flow_control.fleet_sync_ms (default: the policy's, 20; 0 = off)")
    parser.add_argument("--endpoints", type=int, default=None,
                        help="simulated vLLM replicas in total (default 8; overload: 4)")
    parser.add_argument("--loads", default=None,
                        help="comma list of offered load / fleet capacity, instead of --qps; shared-prefix: the "
                             f"capacity with {CAPACITY_HIT_RATE * 100:.0f}%% of every system prompt cached; overload: "
                             f"see there (default for overload {DEFAULT_LOADS})")
    add_shape_options(parser)
    parser.add_argument("--capacity", type=float, default=None,
                        help="overload only: the fleet's capacity in req/s (default: from the simulator profile)")
    parser.add_argument("--slo-ttft", type=float, default=2.0,
                        help="overload only: TTFT (s) a served request must meet to count as goodput (default 2)")
    parser.add_argument("--client-timeout", type=float, default=120.0,
                        help="overload only: seconds a client waits for its whole response (default 120)")
    parser.add_argument("--seed", type=int, default=0, help="workload, arrival and simulator seed (default 0)")
    parser.add_argument("--out", default=None, help="report directory (default reports/routing-<workload>)")
    parser.add_argument("--stream-chunk-tokens", type=int, default=8,
                        help="tokens per SSE chunk from the simulator; larger saves CPU (default 8)")
    parser.add_argument("--kv-blocks", default="auto",
                        help="KV cache blocks (16 tokens) per simulated replica, or 'auto': max(working set / "
                             f"{KV_TARGET_RATIO:g}, working set x {FLEET_HEADROOM:g} / replicas, 512) (default auto)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: one QPS point (the middle default or the first --qps), 20 s, 3 s warm-up")
    parser.add_argument("--workdir", default=None, help="where configs and logs go (default: a temp directory)")


@dataclass(frozen=True)
class Plan:
    workload: str
    layout: Layout
    strategies: tuple[str, ...]
    qps: tuple[float, ...]
    duration_s: float
    warmup_s: float
    kv_blocks: int
    sizing: dict[str, Any]
    out: Path
    workdir: Path
    sim_args: tuple[str, ...]
    replicas: int
    seed: int


def _plan(args: argparse.Namespace) -> Plan:
    strategies = tuple(_csv(args.strategies or DEFAULT_STRATEGIES))
    known = set(ENVOY_STRATEGIES) | set(BUILTIN_PROFILES) | set(PEERS)
    unknown = [s for s in strategies if split_strategy(s)[0] not in known
               or (s.endswith(NOFLOW) and split_strategy(s)[0] not in BUILTIN_PROFILES)]
    if not strategies or unknown:
        raise ValueError(f"unknown strategies {unknown}; known: {', '.join(sorted(known))} "
                         f"(a profile may take {NOFLOW})")
    endpoints = args.endpoints or 8
    shape = PrefixShape.from_args(args)
    layout = layout_for(args.workload, endpoints, shape)
    peers = [s for s in strategies if s in PEERS]
    if peers and len(layout.pools) > 1:
        raise ValueError(f"peer routers {peers} front one pool; the {args.workload} workload has "
                         f"{len(layout.pools)} (one peer per pool behind a pool router is not built)")
    if args.loads is not None:
        if args.workload != "shared-prefix" or args.qps is not None:
            raise ValueError("--loads (instead of --qps) is for the shared-prefix and overload workloads")
        capacity = fleet_capacity_rps(load_profile(BASE_PROFILE), endpoints, shape)
        rates = [round(float(x) * capacity, 2) for x in _csv(args.loads)]
    else:
        rates = [float(q) for q in _csv(args.qps or DEFAULT_QPS[args.workload])]
    if not rates or min(rates) <= 0:
        raise ValueError("--qps and --loads need positive values")
    duration, warmup = args.duration, args.warmup
    if args.quick:
        rates = [rates[0]] if args.qps else [rates[len(rates) // 2]]
        duration, warmup = 20.0, 3.0
    if args.replicas < 1 or endpoints < 1 or duration <= 0 or warmup < 0:
        raise ValueError("--replicas and --endpoints must be >= 1, --duration > 0, --warmup >= 0")
    working_set = layout.workload(args.seed).prefix_working_set_tokens
    replicas = {p.name: p.replicas for p in layout.pools}
    auto = max(kv_blocks_for(tokens, replicas[pool]) for pool, tokens in working_set.items())
    kv_blocks = auto if args.kv_blocks == "auto" else int(args.kv_blocks)
    sizing = {
        "rule": f"blocks per replica = max(ceil(WS / 16 / {KV_TARGET_RATIO:g}), "
                f"ceil(WS / 16 x {FLEET_HEADROOM:g} / pool replicas), 512), WS = prefix working set in tokens "
                "of the largest pool (distinct shared prefixes, once per LoRA adapter)",
        "working_set_tokens": working_set, "auto_kv_blocks": auto, "kv_blocks": kv_blocks,
        "working_set_per_replica_capacity": {pool: round(tokens / 16 / kv_blocks, 2)
                                             for pool, tokens in working_set.items()},
        "fleet_capacity_per_working_set": {pool: round(replicas[pool] * kv_blocks * 16 / tokens, 2)
                                           for pool, tokens in working_set.items() if tokens},
    }
    out = Path(args.out or f"reports/routing-{args.workload}")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="extproc-routing-"))
    profile_path = workdir / "sim-profile.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    profile_path.write_text(yaml.safe_dump(sim_profile(kv_blocks), sort_keys=False))
    sim_args = ("--profile", str(profile_path.resolve()), "--stream-chunk-tokens", str(args.stream_chunk_tokens),
                "--seed", str(args.seed))
    return Plan(args.workload, layout, strategies, tuple(rates), duration, warmup, kv_blocks, sizing, out,
                workdir, sim_args, args.replicas, args.seed)


def _use_profile(stack: Stack, pools: Sequence[SimPool], strategy: str) -> None:
    """Point every pool at the strategy's scheduling profile, set its flow control and declare the pools' LoRA
    adapters (not part of stack.prepare)."""
    profile, flow = split_strategy(strategy)
    document = yaml.safe_load(stack.policy_path.read_text())
    document.setdefault("flow_control", {})["enabled"] = flow
    for entry, pool in zip(document["pools"], pools, strict=True):
        entry["profile"] = profile
        if pool.lora:
            entry["lora_adapters"] = list(pool.lora)
    stack.policy_path.write_text(yaml.safe_dump(document, sort_keys=False))
    stack.policy = parse_policy(stack.policy_path.read_text(), str(stack.policy_path))
    write_config(stack.policy, stack.envoy_dir)


async def _start(group: ProcessGroup, workdir: Path, plan: Plan, strategy: str) -> tuple[Stack, Peer | None]:
    pools = plan.layout.pools
    envoy_only = strategy in ENVOY_STRATEGIES
    alone = envoy_only or strategy in PEERS  # no service of ours in the stack
    stack = prepare(workdir, pools, service_replicas=1 if alone else plan.replicas)
    if not alone:
        _use_profile(stack, pools, strategy)
    stack.children["sim"] = await start_sim(group, workdir, pools, stack.sim_ports, plan.sim_args)
    if strategy in PEERS:  # the peer is the front door, in place of Envoy (one pool, checked by _plan)
        workers = [f"http://127.0.0.1:{port}" for port in stack.sim_ports[pools[0].name]]
        peer = await start_peer(group, strategy, workers)
        stack.children[peer.router.binary] = peer.child
        return stack, peer
    if not envoy_only:
        for index in range(plan.replicas):
            child = await start_service(group, stack, index)
            stack.children[child.name] = child
        stack.children["envoy"] = await start_envoy(group, stack)
        return stack, None
    # The gateway listener's port is free here (no gateway listener), so the baseline takes it.
    await start_envoy_only(group, stack, strategy)
    return stack, None


async def _scrape(client: HttpClient, addresses: Sequence[str]) -> dict[str, str]:
    texts: dict[str, str] = {}
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            response = await client.request("GET", host, int(port), "/metrics", timeout_s=5.0)
        except RequestError:
            continue
        if response.status == 200:
            texts[address] = response.body.decode("utf-8", "replace")
    return texts


def _with_pool_header(next_spec: Callable[[int], RequestSpec]) -> Callable[[int], RequestSpec]:
    def spec(index: int) -> RequestSpec:
        original = next_spec(index)
        return dataclasses.replace(original, headers=(*original.headers, (POOL_HEADER, original.labels["pool"])))

    return spec


async def _run_point(plan: Plan, strategy: str, qps: float) -> dict[str, Any]:
    workdir = plan.workdir / f"{strategy}-q{qps:g}"
    async with ProcessGroup(workdir / "logs") as group, HttpClient() as client:
        stack, peer = await _start(group, workdir, plan, strategy)
        workload = plan.layout.workload(plan.seed)
        next_spec = workload.next_spec
        if strategy in ENVOY_STRATEGIES:
            next_spec = _with_pool_header(next_spec)
        port = stack.envoy_port if peer is None else peer.port
        warm = await run_open_loop("127.0.0.1", port, next_spec, rate=qps, duration_s=plan.warmup_s,
                                   seed=plan.seed, client=client) if plan.warmup_s > 0 else []
        offset = len(warm)
        endpoints = {pool: [f"127.0.0.1:{p}" for p in ports] for pool, ports in stack.sim_ports.items()}
        addresses = [a for pool in endpoints.values() for a in pool]
        metrics_before = await _scrape(client, addresses)
        ours = peer is None and strategy not in ENVOY_STRATEGIES
        admin_ports = [admin for _, admin in stack.service_ports] if ours else []
        flow_before = await flow_counts(client, admin_ports)
        peer_before = await scrape_peer(client, peer) if peer is not None else {}
        cpu_before, self_before, t0 = group.cpu_seconds(), self_cpu_seconds(), time.perf_counter()
        printer = ProgressPrinter(prefix=f"{strategy} @ {qps:g} qps ")
        try:
            samples = await run_open_loop("127.0.0.1", port, lambda i: next_spec(i + offset), rate=qps,
                                          duration_s=plan.duration_s, seed=plan.seed + 1, client=client,
                                          progress=printer, timeout_s=120.0)
        finally:
            printer.close()
        wall = time.perf_counter() - t0
        cpu_after, self_after = group.cpu_seconds(), self_cpu_seconds()
        metrics_after = await _scrape(client, addresses)
        flow: FlowCounts | None = (await flow_counts(client, admin_ports)) - flow_before if ours else None
        peer_report: dict[str, Any] | None = None
        if peer is not None:
            peer_after = await scrape_peer(client, peer)
            await stop_peer(group, peer)
            served = sum(1 for s in samples if s.error is None and not s.aborted)
            peer_report = peer_summary(peer, peer_before, peer_after, served,
                                       plan.out / "peer-logs" / f"{strategy}-q{qps:g}.log")
    cores = cores_used({**cpu_before, "client": self_before}, {**cpu_after, "client": self_after}, wall)
    by_pool: dict[str, list[Sample]] = {}
    for sample in samples:
        by_pool.setdefault(sample.labels.get("pool", "-"), []).append(sample)
    pool_counts = {pool: endpoint_counts(by_pool.get(pool, []), hosts) for pool, hosts in endpoints.items()}
    row = point_row(strategy, qps, samples, summarize(samples), hit_rate(metrics_before, metrics_after),
                    pool_counts, cores)
    row["wall_s"] = round(wall, 2)
    row["warmup_requests"] = offset
    if flow is not None:
        row["flow"] = flow.as_dict()
    if peer_report is not None:
        row["peer"] = peer_report
    return row


TABLE = [("strategy", "strategy"), ("qps", "qps"), ("ok", "ok"), ("errors", "err"),
         ("ttft_p50_ms", "ttft50"), ("ttft_p90_ms", "ttft90"), ("ttft_p99_ms", "ttft99"),
         ("tpot_p50_ms", "tpot50"), ("e2e_p50_ms", "e2e50"), ("e2e_p99_ms", "e2e99"),
         ("output_tokens_per_s", "out_tok/s"), ("hit_rate", "hit"), ("spread_cv", "cv"),
         ("spread_max_min", "max/min"), ("flow.queued", "fc_q"), ("flow.waited_over_1s", "fc_q>1s"),
         ("flow.rejected", "fc_rej"), ("max_cores", "max_core")]


def _point_line(row: dict[str, Any]) -> str:
    if "failed" in row:
        return f"{row['strategy']} @ {row['qps']:g} qps FAILED: {row['failed']}"
    flag = f" SATURATED: {','.join(row['saturated'])}" if row["saturated"] else ""
    if "peer" in row:
        check = row["peer"]["policy_check"]
        flag += (f" peer {check['policy']}: {check['decisions']} decisions for {check['served']} served, "
                 f"fallbacks {check['fallbacks'] or 0}{'' if check['ok'] else ' POLICY NOT IN EFFECT'}")
    return (f"{row['strategy']} @ {row['qps']:g} qps: ok={row['ok']} err={row['errors']} "
            f"ttft p50/p99={row['ttft_p50_ms']}/{row['ttft_p99_ms']} ms hit={row['hit_rate']} "
            f"cv={row['spread_cv']} cores={row['cores']}{flag}")


async def run_routing(args: argparse.Namespace) -> int:
    if args.workload == "overload":
        return await run_overload(args)
    try:
        plan = _plan(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    sizing = plan.sizing
    print(f"workload {plan.workload}: {len(plan.strategies)} strategies x {len(plan.qps)} rates, "
          f"{plan.warmup_s:g}+{plan.duration_s:g} s per point; kv_blocks={plan.kv_blocks} per replica "
          f"(working set / replica capacity = {sizing['working_set_per_replica_capacity']}); "
          f"workdir {plan.workdir}", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    for qps in plan.qps:
        for strategy in plan.strategies:
            try:
                row = await _run_point(plan, strategy, qps)
            except Exception as exc:  # one broken point (e.g. a profile the service lacks) must not end the run
                traceback.print_exc(file=sys.stderr)
                row = {"strategy": strategy, "qps": qps, "failed": f"{type(exc).__name__}: {str(exc)[:300]}"}
            rows.append(row)
            print(_point_line(row), file=sys.stderr)
    wall = round(time.perf_counter() - started, 1)
    good = [r for r in rows if "failed" not in r]
    print(format_table(good, TABLE))
    paths = write_reports(plan.out, rows, TABLE, {
        "workload": plan.workload, "strategies": list(plan.strategies), "qps": list(plan.qps),
        "duration_s": plan.duration_s, "warmup_s": plan.warmup_s, "endpoints": args.endpoints or 8,
        "service_replicas": plan.replicas, "seed": plan.seed, "stream_chunk_tokens": args.stream_chunk_tokens,
        "kv_sizing": sizing, "sim_profile": sim_profile(plan.kv_blocks), "wall_s": wall,
        "saturation_limit_cores": SATURATED_CORES,
        "isolation": "fresh stack (simulator, service, Envoy) per point: cold caches, no carried-over state",
        "pools": [dataclasses.asdict(p) for p in plan.layout.pools], "workdir": str(plan.workdir),
    })
    saturated = sorted({f"{r['strategy']}@{r['qps']:g}:{n}" for r in good for n in r["saturated"]})
    if saturated:
        print(f"warning: processes above {SATURATED_CORES} core (results may be CPU-bound): {saturated}")
    print(f"wall time {wall} s; reports: {', '.join(str(p) for p in paths)}")
    failed = len(rows) - len(good)
    not_in_effect = [r for r in good if "peer" in r and not r["peer"]["policy_check"]["ok"]]
    for row in not_in_effect:
        print(f"error: {row['strategy']} @ {row['qps']:g}: the peer's policy was not in effect "
              f"(see {row['peer']['log']})", file=sys.stderr)
    return 1 if failed or not_in_effect or any(r["errors"] for r in good) else 0
