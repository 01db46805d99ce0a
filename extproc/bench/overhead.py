"""`extproc bench overhead`: latency our ext_proc filter adds, measured in one run.

One Envoy serves three listeners: a `direct_response` backend (so no simulator is the bottleneck), the
rendered gateway listener (header_mutation + ext_proc + router, pool -> the backend) and a bare listener
(router only, same backend). The same requests go through both, in alternating rounds so machine
noise falls on both alike; the difference is what our filter costs. With several `--store` values
(e.g. memory,redis) each store gets its own service and Envoy, and the rounds alternate over all of
them, so the stores are compared in one run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from extproc.bench.limits import ADMISSION_PATHS, DEGRADED
from extproc.bench.loadgen import RequestSpec, Sample, run_closed_loop, run_open_loop
from extproc.bench.procs import (
    ProcessGroup,
    cpu_seconds,
    metric_sums,
    self_cpu_seconds,
    start_redis,
    wait_http_ok,
    wait_port,
)
from extproc.bench.report import format_table, write_json
from extproc.bench.stack import PYTHON, free_ports
from extproc.bench.stats import summarize
from extproc.config import Policy, parse_policy
from extproc.guard import DETECTORS
from extproc.xds import find_envoy
from extproc.xds.picker import BODY_MODES, POOL_CLUSTER
from extproc.xds.render import render_static

MODEL = "bench-model"
_BACKEND_BODY = json.dumps({
    "id": "cmpl-bench", "object": "chat.completion", "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
})


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
    parser.add_argument("--guard", choices=["none", "builtin"], default="none",
                        help="content guard on every request: none, or builtin = every built-in detector "
                             "(prompt_injection denies, the others mask); compare runs to see its cost")
    parser.add_argument("--prompt-chars", type=int, default=0,
                        help="prompt length in characters (prose with one e-mail address per ~1 KiB); "
                             "default 0: the short prompt 'Say ok.'")
    parser.add_argument("--slices", choices=["on", "off"], default="on",
                        help="with --store redis: limits.slices (default on; off = every admission "
                             "waits for Redis)")
    parser.add_argument("--body-modes", default="",
                        help="endpoint-picker mode behind Envoy shaped like Istio's InferencePool support, once "
                             "per request body mode: buffered, streamed, full-duplex (comma-separated, compared in "
                             "one run; default: policy mode)")


def _listener(name: str, port: int, routes: list[dict[str, Any]], filters: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
                         "HttpConnectionManager",
                "stat_prefix": name,
                "route_config": {"virtual_hosts": [{"name": name, "domains": ["*"], "routes": routes}]},
                "http_filters": filters,
            },
        }]}],
    }


def bench_bootstrap(policy: Policy, direct_port: int, bare_port: int) -> dict[str, Any]:
    bootstrap = render_static(policy)
    pool_cluster = POOL_CLUSTER if policy.mode == "endpoint-picker" else policy.pools[0].name
    router = [{"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
    backend = [{"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": _BACKEND_BODY}},
                "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}}]}]
    bare = [{"match": {"prefix": "/"}, "route": {"cluster": pool_cluster}}]
    bootstrap["static_resources"]["listeners"] += [
        _listener("backend", direct_port, backend, router),
        _listener("bare", bare_port, bare, router),
    ]
    return bootstrap


_PROSE = ("The Q3 2025 report covers revenue (up 12.5% to 4.2 million), churn and the roadmap for releases "
          "7.1 and 7.2 due 2025-11-30; questions go to finance.team@example.com before Friday. ")


def _request_spec(prompt_chars: int) -> Callable[[int], RequestSpec]:
    text = (_PROSE * (prompt_chars // len(_PROSE) + 1))[:prompt_chars] if prompt_chars > 0 else "Say ok."
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1}).encode()
    spec = RequestSpec("POST", "/v1/chat/completions", (("content-type", "application/json"),), body)
    return lambda _: spec


def _guard_rules() -> list[dict[str, Any]]:
    return [{"name": name.replace("_", "-"), "detector": name,
             "action": "deny" if name == "prompt_injection" else "mask"} for name in DETECTORS]


def _latency(samples: list[Sample]) -> dict[str, Any]:
    summary = summarize(samples)
    return {"requests": summary["total"], "errors": summary["errors"], "e2e_ms": summary["e2e_ms"]}


def _policy(workdir: Path, store: str, args: argparse.Namespace, direct_port: int, redis_port: int,
            body_mode: str = "") -> Path:
    grpc_port, admin_port, gw_port, envoy_admin = free_ports(4)
    policy_doc: dict[str, Any] = {
        "service": {"grpc_port": grpc_port, "admin_port": admin_port},
        "envoy": {"listen_port": gw_port, "admin_port": envoy_admin},
        "pools": [{"name": "bench", "model": MODEL, "endpoints": [f"127.0.0.1:{direct_port}"]}],
    }
    if store != "none":  # every dimension checked, never refusing: the cost of admission itself
        policy_doc["tiers"] = {"default": {"limits": {"requests_per_s": 1e6, "concurrency": 100_000,
                                                      "tokens_per_min": 10**12, "tokens_per_day": 10**13}}}
        policy_doc["limits"] = {"store": store, "redis_url": f"redis://127.0.0.1:{redis_port}/0",
                                "slices": args.slices == "on"}
    if args.guard == "builtin":
        policy_doc["guard"] = {"rules": _guard_rules()}
    if body_mode:  # endpoint-picker mode, the body sent as the gateway's ext_proc filter says
        policy_doc["mode"] = "endpoint-picker"
        policy_doc["envoy"]["request_body_mode"] = body_mode
    path = workdir / f"policy-{store}{'-' + body_mode if body_mode else ''}.yaml"
    path.write_text(yaml.safe_dump(policy_doc))
    return path


async def run_overhead(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="extproc-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stores = [name.strip() for name in args.store.split(",") if name.strip()]
    if not stores or any(name not in ("none", "memory", "redis") for name in stores) or len(set(stores)) < len(stores):
        print(f"--store takes distinct values among none, memory, redis; got {args.store!r}", file=sys.stderr)
        return 2
    modes = [name.strip() for name in args.body_modes.split(",") if name.strip()]
    if any(mode not in BODY_MODES for mode in modes) or len(set(modes)) < len(modes) or (
            modes and len(stores) > 1):
        print(f"--body-modes takes distinct values among {', '.join(BODY_MODES)} (with one --store); "
              f"got {args.body_modes!r}", file=sys.stderr)
        return 2
    # One service + Envoy per variant: a store, or a body mode (endpoint-picker mode).
    plan = [(store, "") for store in stores] if not modes else [(stores[0], mode) for mode in modes]
    direct_port, bare_port, redis_port = free_ports(3)
    _spec = _request_spec(args.prompt_chars)
    report: dict[str, Any] = {"store": args.store, "body_modes": modes, "slices": args.slices, "guard": args.guard,
                              "prompt_chars": args.prompt_chars, "rate": args.rate,
                              "duration_s": args.duration, "rounds": args.rounds,
                              "envoy_concurrency": args.envoy_concurrency, "workdir": str(workdir)}
    async with ProcessGroup(workdir / "logs") as group:
        if "redis" in stores:
            await start_redis(group, redis_port, args.redis_server)
        # One service + Envoy per store; the first Envoy also serves the backend and the bare listener.
        variants: dict[str, int] = {}
        pids: dict[str, tuple[int, int]] = {}
        admin: dict[str, str] = {}
        for index, (store, mode) in enumerate(plan):
            label = mode or store
            policy_path = _policy(workdir, store, args, direct_port, redis_port, mode)
            policy = parse_policy(policy_path.read_text(), str(policy_path))
            envoy_config = workdir / f"envoy-{label}.yaml"
            bootstrap = bench_bootstrap(policy, direct_port, bare_port) if index == 0 else render_static(policy)
            envoy_config.write_text(yaml.safe_dump(bootstrap, sort_keys=False))
            service = await group.start(f"service-{label}", [PYTHON, "-m", "extproc", "--log-level", "WARNING",
                                                             "serve", "--config", str(policy_path)])
            admin[label] = f"http://127.0.0.1:{policy.service.admin_port}"
            await wait_http_ok(f"{admin[label]}/readyz", 30, child=service)
            envoy = await group.start(f"envoy-{label}", [find_envoy(), "-c", str(envoy_config), "--log-level", "warn",
                                                         "--concurrency", str(args.envoy_concurrency),
                                                         "--disable-hot-restart"])
            await wait_http_ok(f"http://127.0.0.1:{policy.envoy.admin_port}/ready", 30, child=envoy)
            name = "with_extproc" if len(plan) == 1 else f"with_extproc[{label}]"
            variants[name] = policy.envoy.listen_port
            pids[name] = (service.pid, envoy.pid)
        variants["envoy_only"] = bare_port
        for port in variants.values():
            await wait_port("127.0.0.1", port, 10)
        print(f"warming up (2 s per variant); logs in {workdir / 'logs'}", file=sys.stderr)
        for port in variants.values():
            await run_open_loop("127.0.0.1", port, _spec, rate=args.rate, duration_s=2.0, arrival="fixed")
        samples: dict[str, list[Sample]] = {name: [] for name in variants}
        cpu: dict[str, float] = dict.fromkeys(pids, 0.0)
        round_s = args.duration / args.rounds
        names = list(variants)
        for index in range(args.rounds):
            order = names[index % len(names):] + names[:index % len(names)]  # each variant leads in turn
            for name in order:
                print(f"round {index + 1}/{args.rounds}: {name} at {args.rate:g} req/s for {round_s:g} s",
                      file=sys.stderr)
                started = cpu_seconds(pids[name][0]) if name in pids else 0.0
                samples[name] += await run_open_loop("127.0.0.1", variants[name], _spec, rate=args.rate,
                                                     duration_s=round_s, arrival="fixed", seed=index)
                if name in pids:
                    cpu[name] += cpu_seconds(pids[name][0]) - started
        fixed = {name: _latency(s) for name, s in samples.items()}
        without_ms = fixed["envoy_only"]["e2e_ms"]
        added = {name: {q: round(fixed[name]["e2e_ms"][q] - without_ms[q], 3) for q in ("p50", "p95", "p99")
                        if fixed[name]["e2e_ms"][q] is not None and without_ms[q] is not None} for name in pids}
        report["fixed_rate"] = fixed
        report["added_ms"] = added["with_extproc"] if len(plan) == 1 else added
        report["service_cpu_us_per_request"] = {
            name: round(seconds / max(1, fixed[name]["requests"]) * 1e6, 1) for name, seconds in cpu.items()}
        if len(plan) == 1:
            report["service_cpu_us_per_request"] = report["service_cpu_us_per_request"]["with_extproc"]
        maximum: dict[str, Any] = {}
        for name, port in variants.items():
            print(f"max throughput: {name}, {args.concurrency} workers for {args.max_duration:g} s", file=sys.stderr)
            processes = pids.get(name, pids[next(iter(pids))])
            before = (cpu_seconds(processes[0]), cpu_seconds(processes[1]), self_cpu_seconds())
            result = await run_closed_loop("127.0.0.1", port, _spec, concurrency=args.concurrency,
                                           duration_s=args.max_duration)
            after = (cpu_seconds(processes[0]), cpu_seconds(processes[1]), self_cpu_seconds())
            summary = summarize(result)
            maximum[name] = {
                "achieved_rps": summary["achieved_rps"], "errors": summary["errors"], "e2e_ms": summary["e2e_ms"],
                "cpu_share": {k: round((a - b) / summary["duration_s"], 3) for k, a, b in
                              zip(("service", "envoy", "client"), after, before, strict=True)},
            }
        report["max_throughput"] = maximum
        if "redis" in stores:
            counts = await metric_sums(list(admin.values()), [*ADMISSION_PATHS, DEGRADED])
            report["admissions"] = {path: int(counts[name]) for path, name in zip(("slice", "awaited"),
                                                                                  ADMISSION_PATHS, strict=True)}
            report["degraded_admits"] = int(counts[DEGRADED])
    rows = [{"variant": name, "p50_ms": v["e2e_ms"]["p50"], "p95_ms": v["e2e_ms"]["p95"],
             "p99_ms": v["e2e_ms"]["p99"], "errors": sum(v["errors"].values()),
             "max_rps": maximum[name]["achieved_rps"]} for name, v in fixed.items()]
    print(format_table(rows, ["variant", "p50_ms", "p95_ms", "p99_ms", "errors", "max_rps"]))
    for name, extra in added.items():
        print(f"[{name}, guard: {args.guard}, prompt: {args.prompt_chars} chars] added by ext_proc at "
              f"{args.rate:g} req/s: p50 {extra.get('p50')} ms, p99 {extra.get('p99')} ms; service CPU "
              f"{round(cpu[name] / max(1, fixed[name]['requests']) * 1e6, 1)} us/request")
    if "memory" in stores and "redis" in stores:
        difference = {q: round(added["with_extproc[redis]"][q] - added["with_extproc[memory]"][q], 3)
                      for q in ("p50", "p99")}
        report["redis_minus_memory_ms"] = difference
        print(f"Redis store over the memory store, same run: p50 {difference['p50']} ms, p99 {difference['p99']} ms")
    if "buffered" in modes:
        for mode in modes:
            if mode != "buffered" and {"p50", "p99"} <= added[f"with_extproc[{mode}]"].keys() <= (
                    added["with_extproc[buffered]"].keys()):
                difference = {q: round(added[f"with_extproc[{mode}]"][q] - added["with_extproc[buffered]"][q], 3)
                              for q in ("p50", "p99")}
                report[f"{mode}_minus_buffered_ms"] = difference
                print(f"{mode} request bodies over buffered, same run: p50 {difference['p50']} ms, "
                      f"p99 {difference['p99']} ms")
    if "admissions" in report:
        print(f"admissions through Redis: {report['admissions']}, decided locally (deadline missed): "
              f"{report['degraded_admits']}")
    path = write_json(args.json, report)
    print(f"report written to {path}")
    errors = sum(sum(v["errors"].values()) for v in fixed.values())
    return 0 if errors == 0 else 1
