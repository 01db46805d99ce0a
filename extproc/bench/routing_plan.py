"""Options and plan of `extproc bench routing`: which workload, pools, strategies, offered rates and seeds.

KV capacity per simulated replica is sized from the workload's prefix working set (see
`routing_metrics.kv_blocks_for`) so that one replica cannot cache everything but the fleet can. `--loads` are
shares of the fleet's capacity as measured on the workload itself (`routing_capacity`).
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extproc.bench.agents import agents_and_chats_workload, agents_workload
from extproc.bench.cpu_split import CpuSplit, parse_split
from extproc.bench.overload import DEFAULT_LOADS as OVERLOAD_LOADS
from extproc.bench.overload import DEFAULT_STRATEGIES as OVERLOAD_STRATEGIES
from extproc.bench.peers import PEERS
from extproc.bench.routing_capacity import CAPACITY_HIT_SHARE, measure_capacity
from extproc.bench.routing_envoy import ENVOY_STRATEGIES
from extproc.bench.routing_metrics import FLEET_HEADROOM, KV_TARGET_RATIO, kv_blocks_for
from extproc.bench.routing_options import (
    BUFFERED,
    GRPCIO,
    LEAN,
    NOFLOW,
    SHARE,
    STREAMED,
    SUFFIXES,
    PrefixShape,
    add_shape_options,
    body_mode,
    front_end,
    service_replicas,
    strategy_flags,
)
from extproc.bench.routing_workloads import (
    MixedPool,
    RoutingWorkload,
    mixed_workload,
    multi_turn_workload,
    shared_prefix_workload,
)
from extproc.bench.stack import SimPool, held_ports
from extproc.config.schema import BUILTIN_PROFILES
from extproc.endpoints.config import ScrapeConfig
from extproc.flow.config import FlowControlConfig
from extproc.scheduling.config import SchedulingConfig
from extproc.sim.profile import load_profile

__all__ = ["BASE_PROFILE", "DEFAULT_STRATEGIES", "WORKLOADS", "Layout", "Plan", "configure", "layout_for",
           "make_plan", "sim_profile"]

DEFAULT_STRATEGIES = "envoy-round-robin,envoy-least-request,default"
WORKLOADS = ("shared-prefix", "multi-turn", "agents", "agents+chat", "mixed", "mixed-models", "drift", "overload")
DEFAULT_LOADS = "0.4,0.8"
ISOLATE_DEFAULT = "off"  # --isolate
# Workloads whose capacity is not measured (bodies other than chat completions), with their default rates.
QPS_ONLY = {"agents": "8,24,48", "agents+chat": "8,24,48"}
CHAT_MODEL = "llama-3.1-8b-instruct"
CODE_MODEL = "qwen2.5-coder-7b"
ADAPTERS = ("sql-lora", "summarize-lora", "support-lora")
BASE_PROFILE = "h100-8b"
MIXED_DOCUMENTS = 48
# Where the drift workload's hot set moves: this share of the way through the measured run.
DRIFT_AT = 0.5

WorkloadFactory = Callable[[int, int | None], RoutingWorkload]  # (seed, request index of the drift) -> workload


@dataclass(frozen=True)
class Layout:
    """Pools to simulate and a factory of the workload (a fresh, identical generator per point)."""

    pools: tuple[SimPool, ...]
    workload: WorkloadFactory


def layout_for(name: str, endpoints: int, shape: PrefixShape | None = None) -> Layout:
    s = shape or PrefixShape()
    if name in ("shared-prefix", "drift"):
        pool = SimPool("chat", CHAT_MODEL, endpoints)
        return Layout((pool,), lambda seed, drift_after: shared_prefix_workload(
            CHAT_MODEL, seed=seed, groups=s.groups, prefix_tokens=s.prefix_tokens,
            question_tokens=s.question_tokens, max_tokens=s.output_tokens, popularity=s.popularity,
            drift_after=(drift_after or 0) if name == "drift" else None))
    if name == "multi-turn":
        return Layout((SimPool("chat", CHAT_MODEL, endpoints),), lambda seed, _: multi_turn_workload(CHAT_MODEL,
                                                                                                    seed=seed))
    if name == "agents":
        return Layout((SimPool("chat", CHAT_MODEL, endpoints),), lambda seed, _: agents_workload(CHAT_MODEL, seed=seed))
    if name == "agents+chat":
        return Layout((SimPool("chat", CHAT_MODEL, endpoints),),
                      lambda seed, _: agents_and_chats_workload(CHAT_MODEL, seed=seed))
    if name == "mixed":
        one = (MixedPool("chat", CHAT_MODEL, 1.0, documents=MIXED_DOCUMENTS),)
        return Layout((SimPool("chat", CHAT_MODEL, endpoints),), lambda seed, _: mixed_workload(one, seed=seed))
    if name == "mixed-models":
        if endpoints < 2:
            raise ValueError("the mixed-models workload needs --endpoints >= 2 (two pools)")
        chat = SimPool("chat", CHAT_MODEL, math.ceil(endpoints / 2), lora=ADAPTERS)
        code = SimPool("code", CODE_MODEL, endpoints - chat.replicas)
        targets = (MixedPool("chat", CHAT_MODEL, 0.6, ADAPTERS), MixedPool("code", CODE_MODEL, 0.4))
        return Layout((chat, code), lambda seed, _: mixed_workload(targets, seed=seed))
    raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")


def sim_profile(kv_blocks: int) -> dict[str, Any]:
    return {"base": BASE_PROFILE, "name": f"{BASE_PROFILE}-kv{kv_blocks}", "num_gpu_blocks": kv_blocks}


def csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=WORKLOADS, default="shared-prefix",
                        help="shared-prefix: long system prompts x many questions (shape below); drift: the same with "
                             "a Zipf hot set that moves to the cold half of the prompts halfway through the measured "
                             "run; multi-turn: conversations of 5-10 rounds whose history grows, 8 users per each of "
                             "12 system prompts; agents: the same as coding-agent sessions over Anthropic "
                             "Messages (Claude Code) and Responses (Agents SDK): tools, tool calls and results, "
                             "screenshots; agents+chat: multi-turn and agents at once on one fleet, hit rate per "
                             "workload (from each response's cached tokens); mixed: one pool, long prompts after 48 "
                             "shared documents, long one-off prompts and short ones; mixed-models: the same over two "
                             "models with LoRA adapters on one (no peers); overload: three priority classes and "
                             "unequal tenants offered multiples of the fleet's capacity (see --loads) "
                             "(default %(default)s)")
    parser.add_argument("--strategies", default=None,
                        help="comma list: envoy-round-robin / envoy-least-request / envoy-ring-hash (Envoy alone, no "
                             "ext_proc; ring hash on the request's prompt group), a peer "
                             f"router ({', '.join(PEERS)}; one-pool workloads, needs the bench extra) or a "
                             "scheduling profile of the service, e.g. default, load-only, least-inflight, random, "
                             f"with flow control on, or off with the suffix {NOFLOW}, on the policy's front end (lean) "
                             f"or on {LEAN} / {GRPCIO}, the replicas sharing their scrapes with {SHARE}, Envoy's "
                             f"request body {STREAMED} or {BUFFERED} to the service, and with --replicas "
                             "service processes or N of them with the suffix @N (e.g. default@3) "
                             f"(default {DEFAULT_STRATEGIES}); "
                             f"overload: envoy-least-request, default, default{NOFLOW}, default{SHARE} "
                             f"(default {OVERLOAD_STRATEGIES})")
    parser.add_argument("--loads", default=None,
                        help="comma list of offered load as shares of the fleet's capacity, measured on the "
                             f"workload: the engines' throughput with {CAPACITY_HIT_SHARE * 100:.0f}%% of what a "
                             f"perfect cache could reuse cached (default {DEFAULT_LOADS}; overload: see there, "
                             f"default {OVERLOAD_LOADS})")
    parser.add_argument("--qps", default=None, help="comma list of offered request rates instead of --loads")
    parser.add_argument("--duration", type=float, default=25.0, help="measured seconds per point (default 25)")
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="seconds of the same load before each measured run, not counted (default 5)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every point with this many seeds (--seed, --seed + 1, ...); reports give the "
                             "median and the range (overload: the strategies interleaved per seed, and percentiles "
                             "pooled over every seed's requests) (default 1)")
    parser.add_argument("--replicas", type=int, default=1,
                        help="service processes behind Envoy; with more than one they share a redis-server (limits "
                             "store, in-flight counts, prefix placements) (default 1)")
    parser.add_argument("--fleet-sync-ms", type=int, default=None,
                        help="with --replicas > 1: how often the replicas exchange in-flight counts and placements "
                             "(flow_control.fleet_sync_ms and scheduling.placement_sync_ms; default: the policy's, "
                             f"{FlowControlConfig.model_fields['fleet_sync_ms'].default}; 0 = off)")
    parser.add_argument("--scrape-ms", type=int, default=None,
                        help="scheduling.scrape.interval_ms of the service (default: the policy's, "
                             f"{ScrapeConfig.model_fields['interval_ms'].default})")
    parser.add_argument("--endpoints", type=int, default=None,
                        help="simulated vLLM replicas in total (default 8; overload: 4)")
    add_shape_options(parser)
    parser.add_argument("--capacity", type=float, default=None,
                        help="overload only: the fleet's capacity in req/s (default: from the simulator profile)")
    parser.add_argument("--slo-ttft", type=float, default=None,
                        help="TTFT (s) a served request must meet to count as goodput (default 0.5; overload 2)")
    parser.add_argument("--client-timeout", type=float, default=120.0,
                        help="seconds a client waits for its whole response (default 120)")
    parser.add_argument("--seed", type=int, default=0, help="workload, arrival and simulator seed (default 0)")
    parser.add_argument("--out", default=None, help="report directory (default reports/routing-<workload>)")
    parser.add_argument("--stream-chunk-tokens", type=int, default=8,
                        help="tokens per SSE chunk from the simulator; larger saves CPU (default 8)")
    parser.add_argument("--kv-blocks", default="auto",
                        help="KV cache blocks (16 tokens) per simulated replica, or 'auto': max(working set / "
                             f"{KV_TARGET_RATIO:g}, working set x {FLEET_HEADROOM:g} / replicas, 512) (default auto)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: one point (the highest load or the first --qps), 20 s, 3 s warm-up")
    parser.add_argument("--workdir", default=None, help="where configs and logs go (default: a temp directory)")
    parser.add_argument("--scheduling", default=None, metavar="FILE",
                        help="YAML with `plugins:` and `profiles:` added to the service's `scheduling:` section "
                             "(variants of a profile to compare in one run, e.g. a plugin parameter changed); "
                             "--strategies may name its profiles, with the same suffixes as a built-in one")
    parser.add_argument("--isolate", default=ISOLATE_DEFAULT, metavar="auto|off|CPUS",
                        help="CPUs of the system under test (Envoy, our service replicas and their Redis, or a peer "
                             "router) apart from the harness's (simulated engines, load generator), as a deployment "
                             "has them: 'auto' = the first half of the usable CPUs (none with one CPU), a CPU list "
                             "such as 0 or 0-3 = those, the rest to the harness; 'off' = all share all "
                             "(default %(default)s)")
    parser.add_argument("--samples", action="store_true",
                        help="also write, per point, every measured request (start, TTFT, end, endpoint, cached "
                             "tokens, labels) as JSON lines and the service replicas' and simulators' /metrics "
                             "after the run, under OUT/samples/, with our Envoy's timing of each request "
                             "(envoy-timings.jsonl: duration points, ext_proc latencies, connections) and each "
                             "process's CPU run delay (run-delay.json) (for diagnosis; not summarised)")


@dataclass(frozen=True)
class Plan:
    workload: str
    layout: Layout
    strategies: tuple[str, ...]
    rates: tuple[tuple[float, float | None], ...]  # (req/s, share of capacity or None)
    seeds: tuple[int, ...]
    duration_s: float
    warmup_s: float
    kv_blocks: int
    sizing: dict[str, Any]
    capacity: dict[str, Any]
    out: Path
    workdir: Path
    profile_path: Path
    stream_chunk_tokens: int
    replicas: int  # service processes of a profile strategy without @N
    fleet_sync_ms: int | None
    slo_ttft_s: float
    client_timeout_s: float
    scheduling: dict[str, Any] = field(default_factory=dict)  # --scheduling: extra plugins and profiles
    scrape_ms: int | None = None  # --scrape-ms
    samples: bool = False  # --samples: every request's outcome and the processes' /metrics after each point
    isolate: CpuSplit | None = None  # --isolate: the system under test's CPUs and the harness's
    # Per seed, the simulated engines' ports, the same for every strategy of the seed (`engine_ports`).
    ports_by_seed: dict[int, list[int]] = field(default_factory=dict, init=False, repr=False)

    def service_replicas(self, strategy: str) -> int:
        return service_replicas(strategy, self.replicas)

    def sim_args(self, seed: int) -> tuple[str, ...]:
        return ("--profile", str(self.profile_path.resolve()), "--stream-chunk-tokens",
                str(self.stream_chunk_tokens), "--seed", str(seed))

    def engine_ports(self, seed: int) -> list[int]:
        """The seed's engine ports: the same for every strategy of the seed (new ones only when one is taken). The
        prefix scorer breaks ties between equal endpoints (a new prompt on an idle fleet) by a rendezvous hash of the
        prompt and the endpoint's address: new ports for every point placed the cold prompts anew, so two runs of
        identical code differed by +10% in TTFT p99 on Zipf 1.1 at 60 req/s, +52% in one seed (reports/i13-s12)."""
        ports = held_ports(sum(p.replicas for p in self.layout.pools), self.ports_by_seed.get(seed))
        self.ports_by_seed[seed] = ports
        return ports

    def workload_for(self, seed: int, rate: float) -> RoutingWorkload:
        """The point's workload; drift moves its hot set `DRIFT_AT` of the way through the measured run."""
        return self.layout.workload(seed, round(rate * (self.warmup_s + DRIFT_AT * self.duration_s)))


def _scheduling(path: str | None) -> dict[str, Any]:
    """The --scheduling file's plugins and profiles, checked as the policy loader would check them."""
    if path is None:
        return {}
    document = yaml.safe_load(Path(path).read_text())
    if not isinstance(document, dict) or set(document) - {"plugins", "profiles"}:
        raise ValueError(f"{path}: expected a mapping with plugins: and profiles: only")
    SchedulingConfig.model_validate(document)  # raises ValueError (pydantic) on a bad entry
    return document


def _unknown(strategy: str, known: set[str], profiles: set[str]) -> bool:
    name, flags = strategy_flags(strategy)
    if name not in known or not flags <= SUFFIXES:
        return True
    return name not in profiles and bool(flags or "@" in strategy)  # suffixes apply to our profiles only


def _strategies(args: argparse.Namespace, pools: int, extra: Mapping[str, Any]) -> tuple[str, ...]:
    strategies = tuple(csv(args.strategies or DEFAULT_STRATEGIES))
    profiles = set(BUILTIN_PROFILES) | {p["name"] for p in extra.get("profiles", ())}
    known = set(ENVOY_STRATEGIES) | profiles | set(PEERS)
    unknown = [s for s in strategies if _unknown(s, known, profiles)]
    if not strategies or unknown:
        raise ValueError(f"unknown strategies {unknown}; known: {', '.join(sorted(known))} "
                         f"(a profile may take {NOFLOW}, {LEAN}, {GRPCIO}, {SHARE}, {STREAMED} or {BUFFERED}, and @N "
                         "service replicas)")
    for strategy in strategies:
        service_replicas(strategy, 1)  # raises ValueError on a bad @N
        body_mode(strategy)  # and on contradicting body modes
        front_end(strategy)  # or front ends
    peers = [s for s in strategies if s in PEERS]
    if peers and pools > 1:
        raise ValueError(f"peer routers {peers} front one pool; the {args.workload} workload has "
                         f"{pools} (one peer per pool behind a pool router is not built; the mixed workload is "
                         "the one-pool variant)")
    return strategies


def make_plan(args: argparse.Namespace) -> Plan:
    endpoints = args.endpoints or 8
    layout = layout_for(args.workload, endpoints, PrefixShape.from_args(args))
    scheduling = _scheduling(getattr(args, "scheduling", None))
    strategies = _strategies(args, len(layout.pools), scheduling)
    if args.repeat < 1 or args.replicas < 1 or endpoints < 1 or args.duration <= 0 or args.warmup < 0:
        raise ValueError("--repeat, --replicas and --endpoints must be >= 1, --duration > 0, --warmup >= 0")
    if args.loads is not None and args.qps is not None:
        raise ValueError("give --loads or --qps, not both")
    profile = load_profile(BASE_PROFILE)
    replicas = {p.name: p.replicas for p in layout.pools}
    rates: list[tuple[float, float | None]]
    if args.workload in QPS_ONLY:  # its Messages / Responses bodies are not measured: rates are given
        if args.loads is not None:
            raise ValueError(f"the {args.workload} workload takes --qps (its capacity is not measured), not --loads")
        capacity = None
        rates = [(float(q), None) for q in csv(args.qps or QPS_ONLY[args.workload])]
    elif args.qps is not None:
        capacity = measure_capacity(layout.workload(args.seed, None), profile, replicas)
        rates = [(float(q), None) for q in csv(args.qps)]
    else:
        capacity = measure_capacity(layout.workload(args.seed, None), profile, replicas)
        rates = [(round(float(x) * capacity.rps, 2), float(x)) for x in csv(args.loads or DEFAULT_LOADS)]
    if not rates or min(rate for rate, _ in rates) <= 0:
        raise ValueError("--qps and --loads need positive values")
    duration, warmup = args.duration, args.warmup
    if args.quick:
        rates = [rates[0] if args.qps else rates[-1]]
        duration, warmup = 20.0, 3.0
    working_set = layout.workload(args.seed, None).prefix_working_set_tokens
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
    workdir.mkdir(parents=True, exist_ok=True)
    profile_path = workdir / "sim-profile.yaml"
    profile_path.write_text(yaml.safe_dump(sim_profile(kv_blocks), sort_keys=False))
    return Plan(args.workload, layout, strategies, tuple(rates),
                tuple(range(args.seed, args.seed + args.repeat)), duration, warmup, kv_blocks, sizing,
                capacity.describe() if capacity else {"rps": None, "rule": "not measured", "pools": {}}, out,
                workdir, profile_path, args.stream_chunk_tokens, args.replicas,
                args.fleet_sync_ms, 0.5 if args.slo_ttft is None else args.slo_ttft, args.client_timeout,
                scheduling, getattr(args, "scrape_ms", None), bool(getattr(args, "samples", False)),
                parse_split(getattr(args, "isolate", "off")))
