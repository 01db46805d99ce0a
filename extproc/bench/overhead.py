"""`extproc bench overhead`: latency our ext_proc filter adds, measured in one run.

One Envoy serves three listeners: a `direct_response` backend (so no simulator is the bottleneck), the
rendered gateway listener (header_mutation + ext_proc + router, pool -> the backend) and a bare listener
(router only, same backend). The same requests go through both, in alternating rounds so machine
noise falls on both alike; the difference is what our filter costs. With several `--store` values
(e.g. memory,redis) each store gets its own service and Envoy (with its own backend listener, so every
variant's path has the same hops), and the rounds alternate over all of them, so the stores are compared
in one run; `--body-modes`: extproc/bench/body_modes.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from extproc.bench.body_modes import add_body_modes, over_buffered, parse_modes, picker_policy
from extproc.bench.limits import ADMISSION_PATHS, DEGRADED
from extproc.bench.loadgen import Sample, run_closed_loop, run_open_loop
from extproc.bench.otlp_sink import spans_received, start_sink
from extproc.bench.overhead_stack import MODEL, bench_bootstrap, request_spec
from extproc.bench.paired import TRACED_SUFFIXES, TWIN, round_p50, tracing_report
from extproc.bench.procs import (
    ProcessGroup,
    cpu_seconds,
    metric_sums,
    self_cpu_seconds,
    start_redis,
    tree_cpu_seconds,
    wait_http_ok,
    wait_port,
)
from extproc.bench.report import format_table, write_json
from extproc.bench.stack import PYTHON, free_port_block, free_ports
from extproc.bench.stats import summarize
from extproc.config import parse_policy
from extproc.guard import DETECTORS
from extproc.telemetry.metrics import PHASE_CPU, PHASES, STREAMS
from extproc.xds import find_envoy


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=float, default=200.0, help="fixed request rate per variant (default 200)")
    parser.add_argument("--duration", type=float, default=20.0,
                        help="seconds of fixed-rate load per variant, split in rounds (default 20)")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds per variant (default 4)")
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop workers for max req/s")
    parser.add_argument("--max-duration", type=float, default=8.0, help="seconds per max-throughput run")
    parser.add_argument("--envoy-concurrency", type=int, default=1, help="Envoy worker threads (default 1)")
    parser.add_argument("--json", metavar="FILE", default="reports/overhead.json", help="report path")
    parser.add_argument("--workdir", metavar="DIR", help="where config and logs go (default: temp)")
    parser.add_argument("--store", default="none",
                        help="limits admission on every request through this store: none (default: no limits), "
                             "memory or redis (starts a redis-server); several, comma-separated (memory,redis), "
                             "are compared in one run")
    parser.add_argument("--redis-server", default="redis-server", help="redis-server binary (with --store redis)")
    parser.add_argument("--guard", type=_guard_choice, default="none",
                        help="content guard on every request: none, builtin = every built-in detector, or a "
                             "comma list of them (e.g. email,phone); prompt_injection denies, the others mask; "
                             "compare runs to see its cost")
    parser.add_argument("--prompt-chars", type=int, default=0,
                        help="prompt length in characters (prose with one e-mail address per ~1 KiB); "
                             "default 0: the short prompt 'Say ok.'")
    parser.add_argument("--system-chars", type=int, default=0,
                        help="a system prompt of this many characters before the prompt, the same in every request "
                             "(the prompt then numbered per request: a shared prefix); default 0: none")
    parser.add_argument("--slices", choices=["on", "off"], default="on",
                        help="with --store redis: limits.slices (default on; off = every admission "
                             "waits for Redis)")
    parser.add_argument("--workers", default="1",
                        help="service processes (service.workers) of the first store's variant; several, "
                             "comma-separated (1,2), each get their own service and Envoy in the same run")
    parser.add_argument("--tracing", type=float, default=None, metavar="RATIO",
                        help="also run the first store with tracing on at this sample ratio (Envoy's tracer too), "
                             "exporting to an OTLP receiver in this process, and print its cost over tracing off "
                             "in the same run (needs the tracing extra)")
    parser.add_argument("--tracing-envoy", choices=sorted(TRACED_SUFFIXES), default="on",
                        help="with --tracing: Envoy's tracer on too (on, as shipped), off (our spans only), or both "
                             "variants in the same run (tells Envoy's share of the cost from ours)")
    parser.add_argument("--trivial", choices=["on", "off"], default="on",
                        help="also run the trivial CONTINUE-only processor (extproc.bench.trivial) behind the "
                             "same Envoy configuration: the floor that grpc.aio and the event loop cost")
    parser.add_argument("--service-env", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE]",
                        help="also run the first store (and the trivial processor) with these environment variables "
                             "(e.g. GRPC_POLL_STRATEGY=poll), as extra variants in the same run (repeat for more)")
    parser.add_argument("--front-ends", default="lean", metavar="NAME[,NAME]",
                        help="service.front_end of the variants (lean, grpcio); a second one runs every store and "
                             "workers variant again on it, in the same rounds (default lean)")
    add_body_modes(parser)


def _guard_choice(value: str) -> str:
    names = [] if value == "none" else list(DETECTORS) if value == "builtin" else value.split(",")
    unknown = [name for name in names if name not in DETECTORS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown detector(s) {unknown}: none, builtin or some of {list(DETECTORS)}")
    return value


def _guard_rules(value: str) -> list[dict[str, Any]]:
    names = list(DETECTORS) if value == "builtin" else value.split(",")
    return [{"name": name.replace("_", "-"), "detector": name,
             "action": "deny" if name == "prompt_injection" else "mask"} for name in names]


def _latency(samples: list[Sample]) -> dict[str, Any]:
    summary = summarize(samples)
    return {"requests": summary["total"], "errors": summary["errors"], "e2e_ms": summary["e2e_ms"]}


def _policy(workdir: Path, name: str, store: str, args: argparse.Namespace, direct_port: int,
            redis_port: int, workers: int, tracing: float | None = None, body_mode: str = "",
            front_end: str = "lean") -> Path:
    grpc_port, admin_port, gw_port, envoy_admin = free_ports(4)
    if workers > 1:  # the supervisor's admin port, its workers' right after it
        admin_port = free_port_block(workers + 1)
    policy_doc: dict[str, Any] = {
        "service": {"grpc_port": grpc_port, "admin_port": admin_port, "workers": workers, "front_end": front_end},
        "envoy": {"listen_port": gw_port, "admin_port": envoy_admin},
        "pools": [{"name": "bench", "model": MODEL, "endpoints": [f"127.0.0.1:{direct_port}"]}],
    }
    if store not in ("none", "trivial"):  # every dimension checked, never refusing: the cost of admission itself
        policy_doc["tiers"] = {"default": {"limits": {"requests_per_s": 1e6, "concurrency": 100_000,
                                                      "tokens_per_min": 10**12, "tokens_per_day": 10**13}}}
        policy_doc["limits"] = {"store": store, "redis_url": f"redis://127.0.0.1:{redis_port}/0",
                                "slices": args.slices == "on"}
    if args.guard != "none" and store != "trivial":
        policy_doc["guard"] = {"rules": _guard_rules(args.guard)}
    if tracing is not None:
        policy_doc["tracing"] = {"enabled": True, "sample_ratio": tracing, "envoy": not name.endswith("ours-only"),
                                 "otlp_endpoint": f"127.0.0.1:{args.otlp_port}"}
    picker_policy(policy_doc, body_mode)
    path = workdir / f"policy-{name}.yaml"
    path.write_text(yaml.safe_dump(policy_doc))
    return path


@dataclass
class Target:
    """One variant behind its own Envoy listener: our service (its processes and admin URL), the trivial
    processor, or none (Envoy alone)."""

    name: str
    port: int
    pid: int | None = None  # the service's (or supervisor's) process; its workers are its children
    admin: str | None = None


# name, store, workers, tracing ratio (None: off), body mode, environment of the service, front end
Variant = tuple[str, str, int, float | None, str, tuple[tuple[str, str], ...], str]


def _variants(args: argparse.Namespace) -> list[Variant] | str:
    """The services to start (request body mode "": policy mode), or an error message."""
    stores = [name.strip() for name in args.store.split(",") if name.strip()]
    if not stores or any(name not in ("none", "memory", "redis") for name in stores) or len(set(stores)) < len(stores):
        return f"--store takes distinct values among none, memory, redis; got {args.store!r}"
    try:
        workers = sorted({int(n) for n in args.workers.split(",") if n.strip()})
    except ValueError:
        workers = []
    if not workers or workers[0] < 1:
        return f"--workers takes positive integers, comma-separated; got {args.workers!r}"
    if args.tracing is not None and not 0 <= args.tracing <= 1:
        return f"--tracing takes a sample ratio in [0, 1]; got {args.tracing}"
    if isinstance(modes := parse_modes(args.body_modes, len(stores), len(workers)), str):
        return modes  # else endpoint-picker mode: one variant per request body mode (or none)
    fronts = [name.strip() for name in args.front_ends.split(",") if name.strip()]
    if not fronts or any(name not in ("lean", "grpcio") for name in fronts) or len(set(fronts)) < len(fronts):
        return f"--front-ends takes distinct values among lean, grpcio; got {args.front_ends!r}"
    single = len(stores) == 1 and len(workers) == 1 and not modes
    front = fronts[0]
    variants: list[Variant] = [(f"with_extproc[{mode}]", stores[0], workers[0], None, mode, (), front)
                               for mode in modes] or [
        (f"with_extproc[{store}]" if not single else "with_extproc", store, workers[0], None, "", (), front)
        for store in stores]
    variants += [(f"with_extproc[{stores[0]}]x{n}", stores[0], n, None, "", (), front) for n in workers[1:]]
    variants += [(f"{v[0]}{{{other}}}", *v[1:6], other) for other in fronts[1:] for v in list(variants)]
    if args.tracing is not None:  # compared with a tracing-off twin in the same position (see extproc/bench/paired.py)
        variants += [(variants[0][0] + suffix, stores[0], workers[0], None if suffix == TWIN else args.tracing,
                      variants[0][4], (), front) for suffix in (TWIN, *TRACED_SUFFIXES[args.tracing_envoy])]
    envs = [tuple((k, v) for k, _, v in (item.partition("=") for item in spec.split(","))) for spec in args.service_env]
    if any(not k or not v for env in envs for k, v in env):
        return f"--service-env takes NAME=VALUE[,NAME=VALUE]; got {args.service_env!r}"
    first = variants[0]
    variants += [(f"{first[0]}{{{_env_label(env)}}}", *first[1:5], env, front) for env in envs]
    if args.trivial == "on":
        variants += [("trivial", "trivial", 1, None, "", (), front),
                     *((f"trivial{{{_env_label(env)}}}", "trivial", 1, None, "", env, front) for env in envs)]
    return variants


def _env_label(env: tuple[tuple[str, str], ...]) -> str:
    return ",".join(f"{k}={v}" for k, v in env)


async def _start(group: ProcessGroup, workdir: Path, args: argparse.Namespace, variant: Variant,
                 first: bool, ports: tuple[int, int, int]) -> Target:
    name, store, workers, tracing, body_mode, env, front_end = variant
    direct_port, bare_port, redis_port = ports
    if not first:  # each variant's Envoy serves its own backend: no variant pays a hop to another Envoy
        (direct_port,) = free_ports(1)
    label = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)
    policy_path = _policy(workdir, label, store, args,
                          direct_port, redis_port, workers, tracing, body_mode, front_end)
    policy = parse_policy(policy_path.read_text(), str(policy_path))
    envoy_config = workdir / f"envoy-{policy_path.stem}.yaml"
    bootstrap = bench_bootstrap(policy, direct_port, bare_port if first else None)
    envoy_config.write_text(yaml.safe_dump(bootstrap, sort_keys=False))
    admin: str | None = None
    if store == "trivial":
        service = await group.start(label, [PYTHON, "-m", "extproc.bench.trivial", "--port",
                                            str(policy.service.grpc_port), "--set", "x-gateway-pool=bench", "--set",
                                            f"x-gateway-destination-endpoint=127.0.0.1:{direct_port}",
                                            *(["--hold-headers"] if policy.envoy.request_body_mode == "prebuffered"
                                              else [])],
                                    env=dict(env))
        await wait_port("127.0.0.1", policy.service.grpc_port, 30, child=service)
    else:
        service = await group.start(label, [PYTHON, "-m", "extproc", "--log-level", "WARNING", "serve",
                                            "--config", str(policy_path)], env=dict(env))
        admin = f"http://127.0.0.1:{policy.service.admin_port}"
        await wait_http_ok(f"{admin}/readyz", 30, child=service)
    envoy = await group.start(f"envoy-{label}", [find_envoy(), "-c", str(envoy_config), "--log-level", "warn",
                                                 "--concurrency", str(args.envoy_concurrency),
                                                 "--disable-hot-restart"])
    await wait_http_ok(f"http://127.0.0.1:{policy.envoy.admin_port}/ready", 30, child=envoy)
    return Target(name, policy.envoy.listen_port, service.pid, admin)


def _rows(fixed: dict[str, Any], maximum: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"variant": name, "p50_ms": v["e2e_ms"]["p50"], "p95_ms": v["e2e_ms"]["p95"],
             "p99_ms": v["e2e_ms"]["p99"], "errors": sum(v["errors"].values()),
             "cpu_us": v.get("cpu_us_per_request"), "max_rps": maximum[name]["achieved_rps"],
             "cpu_us_at_max": maximum[name].get("cpu_us_per_request")} for name, v in fixed.items()]


async def _phases(admin: str) -> dict[str, float]:
    """The service's own per-phase CPU seconds and exchange count (sums over its workers)."""
    names = {phase: f'{PHASE_CPU}{{phase="{phase}"}}' for phase in PHASES}
    sums = await metric_sums([admin], [STREAMS, *names.values()])
    return {"exchanges": sums[STREAMS], **{phase: sums[name] for phase, name in names.items()}}


async def run_overhead(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="extproc-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    variants = _variants(args)
    if isinstance(variants, str):
        print(variants, file=sys.stderr)
        return 2
    stores = {variant[1] for variant in variants}
    direct_port, bare_port, redis_port = free_ports(3)
    ports = (direct_port, bare_port, redis_port)
    _spec = request_spec(args.prompt_chars, args.system_chars)
    report: dict[str, Any] = {"store": args.store, "slices": args.slices, "guard": args.guard,
                              "front_ends": args.front_ends,
                              "prompt_chars": args.prompt_chars, "system_chars": args.system_chars, "rate": args.rate,
                              "workers": args.workers,
                              "duration_s": args.duration, "rounds": args.rounds, "cores": os.cpu_count(),
                              "envoy_concurrency": args.envoy_concurrency, "workdir": str(workdir)}
    spans_file: Path | None = None
    async with ProcessGroup(workdir / "logs") as group:
        if "redis" in stores:
            await start_redis(group, ports[2], args.redis_server)
        if args.tracing is not None:  # a collector of our own, in its own process
            args.otlp_port, spans_file = await start_sink(group, workdir)
        # One service + Envoy (with its own backend) per variant; the first Envoy also serves the bare listener.
        targets = [await _start(group, workdir, args, variant, index == 0, ports)
                   for index, variant in enumerate(variants)]
        targets.append(Target("envoy_only", ports[1]))
        for target in targets:
            await wait_port("127.0.0.1", target.port, 10)
        print(f"warming up (2 s per variant); logs in {workdir / 'logs'}", file=sys.stderr)
        for target in targets:
            await run_open_loop("127.0.0.1", target.port, _spec, rate=args.rate, duration_s=2.0, arrival="fixed")
        samples: dict[str, list[Sample]] = {target.name: [] for target in targets}
        rounds_p50: dict[str, list[float | None]] = {target.name: [] for target in targets}
        cpu: dict[str, float] = {target.name: 0.0 for target in targets if target.pid is not None}
        phases: dict[str, dict[str, float]] = {}
        round_s = args.duration / args.rounds
        for index in range(args.rounds):
            order = targets[index % len(targets):] + targets[:index % len(targets)]  # each variant leads in turn
            for target in order:
                print(f"round {index + 1}/{args.rounds}: {target.name} at {args.rate:g} req/s for {round_s:g} s",
                      file=sys.stderr)
                started = tree_cpu_seconds(target.pid) if target.pid is not None else 0.0
                before = await _phases(target.admin) if target.admin else {}
                ran = await run_open_loop("127.0.0.1", target.port, _spec, rate=args.rate,
                                          duration_s=round_s, arrival="fixed", seed=index)
                samples[target.name] += ran
                rounds_p50[target.name].append(round_p50(ran))
                if target.pid is not None:
                    cpu[target.name] += tree_cpu_seconds(target.pid) - started
                if target.admin:
                    after = await _phases(target.admin)
                    total = phases.setdefault(target.name, {})
                    for key, value in after.items():
                        total[key] = total.get(key, 0.0) + value - before.get(key, 0.0)
        fixed = {name: _latency(s) for name, s in samples.items()}
        without_ms = fixed["envoy_only"]["e2e_ms"]
        for name, seconds in cpu.items():
            fixed[name]["cpu_us_per_request"] = round(seconds / max(1, fixed[name]["requests"]) * 1e6, 1)
        for name, total in phases.items():
            exchanges = max(1.0, total.pop("exchanges"))
            per_phase = {phase: round(seconds / exchanges * 1e6, 1) for phase, seconds in sorted(total.items())}
            per_phase["grpc_and_loop"] = round(fixed[name]["cpu_us_per_request"] - sum(per_phase.values()), 1)
            fixed[name]["cpu_us_per_phase"] = per_phase
        added = {name: {q: round(fixed[name]["e2e_ms"][q] - without_ms[q], 3) for q in ("p50", "p95", "p99")
                        if fixed[name]["e2e_ms"][q] is not None and without_ms[q] is not None} for name in cpu}
        report["fixed_rate"] = fixed
        report["p50_ms_per_round"] = rounds_p50
        report["added_ms"] = added
        maximum: dict[str, Any] = {}
        envoy_pids = {target.name: pid for target, pid in zip(targets, _envoy_pids(group, targets), strict=True)}
        for target in targets:
            print(f"max throughput: {target.name}, {args.concurrency} workers for {args.max_duration:g} s",
                  file=sys.stderr)
            pid = target.pid if target.pid is not None else None
            before_cpu = (tree_cpu_seconds(pid) if pid else 0.0, cpu_seconds(envoy_pids[target.name]),
                          self_cpu_seconds())
            result = await run_closed_loop("127.0.0.1", target.port, _spec, concurrency=args.concurrency,
                                           duration_s=args.max_duration)
            after_cpu = (tree_cpu_seconds(pid) if pid else 0.0, cpu_seconds(envoy_pids[target.name]),
                         self_cpu_seconds())
            summary = summarize(result)
            maximum[target.name] = {
                "achieved_rps": summary["achieved_rps"], "errors": summary["errors"], "e2e_ms": summary["e2e_ms"],
                "cpu_share": {k: round((a - b) / summary["duration_s"], 3) for k, a, b in
                              zip(("service", "envoy", "client"), after_cpu, before_cpu, strict=True)},
            }
            if pid:
                maximum[target.name]["cpu_us_per_request"] = round(
                    (after_cpu[0] - before_cpu[0]) / max(1, summary["total"]) * 1e6, 1)
        report["max_throughput"] = maximum
        if "redis" in stores:
            redis_admin = next(t.admin for t, v in zip(targets, variants, strict=False) if v[1] == "redis")
            assert redis_admin is not None
            counts = await metric_sums([redis_admin], [*ADMISSION_PATHS, DEGRADED])
            report["admissions"] = {path: int(counts[name]) for path, name in zip(("slice", "awaited"),
                                                                                  ADMISSION_PATHS, strict=True)}
            report["degraded_admits"] = int(counts[DEGRADED])
    print(format_table(_rows(fixed, maximum),
                       ["variant", "p50_ms", "p95_ms", "p99_ms", "errors", "cpu_us", "max_rps", "cpu_us_at_max"]))
    for name, extra in added.items():
        print(f"[{name}, guard: {args.guard}, prompt: {args.prompt_chars} chars, system: {args.system_chars}] added at "
              f"{args.rate:g} req/s: "
              f"p50 {extra.get('p50')} ms, p99 {extra.get('p99')} ms; service CPU "
              f"{fixed[name]['cpu_us_per_request']} us/request")
        if "cpu_us_per_phase" in fixed[name]:
            print(f"    CPU us/request by phase: {fixed[name]['cpu_us_per_phase']}")
    if "trivial" in maximum:
        floor = maximum["trivial"]["achieved_rps"] or 1.0
        report["of_trivial_max_rps"] = {name: round(m["achieved_rps"] / floor, 3) for name, m in maximum.items()
                                        if name.startswith("with_extproc")}
        print(f"saturated req/s as a share of the trivial processor's, same run: {report['of_trivial_max_rps']}")
    if "with_extproc[memory]" in added and "with_extproc[redis]" in added:
        difference = {q: round(added["with_extproc[redis]"][q] - added["with_extproc[memory]"][q], 3)
                      for q in ("p50", "p99")}
        report["redis_minus_memory_ms"] = difference
        print(f"Redis store over the memory store, same run: p50 {difference['p50']} ms, p99 {difference['p99']} ms")
    over_buffered(added, report)
    if args.tracing is not None:
        tracing_report(report, added, rounds_p50, variants[0][0], spans_received(spans_file) if spans_file else 0,
                       args.tracing)
    if "admissions" in report:
        print(f"admissions through Redis: {report['admissions']}, decided locally (deadline missed): "
              f"{report['degraded_admits']}")
    print(f"{os.cpu_count()} cores: the service, its workers, Envoy and the load generator share them")
    path = write_json(args.json, report)
    print(f"report written to {path}")
    errors = sum(sum(v["errors"].values()) for v in fixed.values())
    return 0 if errors == 0 else 1


def _envoy_pids(group: ProcessGroup, targets: list[Target]) -> list[int]:
    """Each target's Envoy (envoy_only is served by the first one)."""
    envoys = [child.pid for child in group.children if child.name.startswith("envoy-")]
    return [envoys[index] if index < len(envoys) else envoys[0] for index in range(len(targets))]
