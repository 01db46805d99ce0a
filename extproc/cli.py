"""`extproc` command line: serve | sim | demo | bench | validate | envoy render."""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import inspect
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from extproc.config import ConfigError, load_policy

log = logging.getLogger(__name__)


def _run_async(main: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop

        return int(uvloop.run(main))
    except ImportError:  # pragma: no cover - uvloop is a hard dependency on Linux
        return asyncio.run(main)


def _cmd_serve(args: argparse.Namespace) -> int:
    from extproc.server import run

    if args.workers is not None and args.workers < 1:
        print("--workers takes a positive number", file=sys.stderr)
        return 2
    if args.worker is None and (args.workers or load_policy(args.config).service.workers) > 1:
        return _run_async(_supervise(args))
    worker = None
    if args.worker is not None:
        index, _, count = args.worker.partition("/")
        worker = (int(index), int(count))
    return _run_async(run(Path(args.config), grace_s=args.grace, grpc_port=args.grpc_port, admin_port=args.admin_port,
                          drain_delay_s=args.drain_delay, worker=worker, epp=args.epp,
                          inference_pool=args.inference_pool))


async def _supervise(args: argparse.Namespace) -> int:
    from extproc.limits.config import TierLimits
    from extproc.server.app import endpoint_picker_policy
    from extproc.server.workers import Supervisor

    policy = load_policy(args.config)  # config errors end here, before any worker starts
    if args.epp or args.inference_pool is not None:
        try:
            endpoint_picker_policy(policy, args.inference_pool)
        except ValueError as exc:
            log.error("%s cannot run as an endpoint picker: %s", args.config, exc)
            return 2
    service = policy.service
    limited = policy.auth.mode == "api-key" or any(  # a keys file may give tenants limits of their own
        tier.limits != TierLimits() or tier.model_limits != TierLimits() for tier in policy.tiers.values())
    if policy.limits.store == "memory" and limited:
        log.warning("limits.store memory with several workers: each worker keeps its own limits, and usage "
                    "reported to another worker's access-log stream leaves the reserved estimate charged; use "
                    "limits.store redis for exact limits")
    admin_port = args.admin_port if args.admin_port is not None else service.admin_port
    workers = args.workers or service.workers
    if workers != service.workers:
        log.warning("--workers %d, service.workers %d: Envoy's rendered configuration follows the policy (set "
                    "service.workers there, or Envoy's streams may not spread over the workers)", workers,
                    service.workers)

    def argv(index: int) -> list[str]:
        command = [sys.executable, "-m", "extproc", "--log-level", args.log_level, "serve", "--config", args.config,
                   "--worker", f"{index}/{workers}", "--grace", str(args.grace), "--drain-delay",
                   str(args.drain_delay), "--admin-port", str(admin_port)]
        command += ["--grpc-port", str(args.grpc_port)] if args.grpc_port is not None else []
        command += ["--epp"] if args.epp else []
        return command + (["--inference-pool", args.inference_pool] if args.inference_pool is not None else [])

    supervisor = Supervisor(workers, argv, service.admin_host, admin_port,
                            args.grace + args.drain_delay + 5)
    return await supervisor.run()


def _cmd_validate(args: argparse.Namespace) -> int:
    failed = 0
    for name in args.files:
        try:
            policy = load_policy(name)
        except ConfigError as exc:
            failed += 1
            for problem in exc.problems:
                print(problem, file=sys.stderr)
            continue
        endpoints = sum(len(pool.endpoints) for pool in policy.pools)
        print(f"{name}: ok ({len(policy.pools)} pools, {endpoints} endpoints)")
    return 1 if failed else 0


def _cmd_envoy_render(args: argparse.Namespace) -> int:
    from extproc.xds import write_config

    policy = load_policy(args.config)
    mount = Path(args.mount) if args.mount else None
    for path in write_config(policy, Path(args.out), mount):
        print(path)
    return 0


def _cmd_sim(args: argparse.Namespace) -> int:
    from extproc.sim import cli as sim_cli

    return sim_cli.run(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from extproc.demo import run_demo

    return _run_async(run_demo(args))


def _cmd_keys(args: argparse.Namespace) -> int:
    import secrets

    from extproc.tenants import hash_key

    if args.keys_command == "new":
        key = "sk-" + secrets.token_urlsafe(32)
        print(f"key:    {key}\nsha256: {hash_key(key)}")
        return 0
    key = args.key if args.key is not None else sys.stdin.readline().strip()
    if not key:
        print("no key given (argument or one line on stdin)", file=sys.stderr)
        return 2
    print(hash_key(key))
    return 0


def _cmd_rollout(args: argparse.Namespace) -> int:
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    base = args.admin.rstrip("/")
    token = os.environ.get("EXTPROC_ADMIN_TOKEN") or (
        Path(args.token_file).read_text(encoding="utf-8").strip() if args.token_file else "")
    headers = {"authorization": f"Bearer {token}"} if token else {}
    if args.rollout_command == "status":
        request = urllib.request.Request(f"{base}/debug/rollouts", headers=headers)
    else:
        to_end = getattr(args, "to_end", False)
        query = urllib.parse.urlencode({"model": args.model, **({"to_end": "1"} if to_end else {})})
        request = urllib.request.Request(f"{base}/rollouts/{args.rollout_command}?{query}", data=b"{}",
                                         method="POST", headers={**headers, "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            print(json.dumps(json.loads(response.read()), indent=2))
            return 0
    except urllib.error.HTTPError as exc:
        print(f"{exc.code}: {exc.read().decode(errors='replace')}", file=sys.stderr)
        return 1
    except urllib.error.URLError as exc:
        print(f"cannot reach {base}: {exc.reason}", file=sys.stderr)
        return 2


# name -> (module, runner, help, description); every module has `configure(parser)` and the runner.
BENCHMARKS: dict[str, tuple[str, str, str, str]] = {
    "overhead": ("extproc.bench.overhead", "run_overhead",
                 "Latency added by our filter: the same load through Envoy with and without it.",
                 "Latency added by our filter: the same load through Envoy with and without it "
                 "(backend: an Envoy direct_response)."),
    "soak": ("extproc.bench.soak", "run_soak",
             "Minutes of steady load with clients cutting requests: memory over time, nothing held at the end.",
             "Real Envoy, the service (Redis limits with a concurrency lease per request) and a simulated fleet "
             "under open-loop load, a share of the requests cut by the client mid-response; samples the service's "
             "memory, then checks no exchange, endpoint slot or Redis lease is left; writes JSON."),
    "scheduling": ("extproc.bench.scheduling", "run_scheduling",
                   "CPU cost of one routing decision (parse + prefix hashing + scheduling), no network.",
                   "CPU cost of one routing decision inside the service for several prompt sizes."),
    "limits": ("extproc.bench.limits", "run_limits",
               "Token limits across service replicas sharing Redis: one tenant at 5x its limit.",
               "Token limits across service replicas sharing Redis: one tenant offered 5x its tokens per minute; "
               "prints the tokens it really consumed per minute and the other tenants' latency."),
    "burst": ("extproc.bench.burst", "run_burst",
              "How far a burst overshoots a token budget before usage settles (output cap, prompt calibration).",
              "One tenant's burst of concurrent requests against its tokens per minute, with and without the "
              "tier output cap and the prompt calibration; prints the tokens really used as a share of the budget."),
    "routing": ("extproc.bench.routing", "run_routing",
                "TTFT, prefix-cache hit rate and load spread: our profiles vs peer routers and Envoy's LB policies.",
                "Open-loop load against a simulated fleet, through real Envoy for Envoy's own round-robin and "
                "least-request and for our scheduling profiles, or through sglang-router / vllm-router; writes JSON, "
                "Markdown and PNG plots."),
    "routing-suite": ("extproc.bench.routing_suite", "run_suite",
                      "Every routing workload at 40 and 80 percent of capacity, ours vs the peer routers, verdicts.",
                      "Runs bench routing for the uniform, Zipf, multi-turn, mixed and drift cases with every "
                      "strategy (ours, sglang-router, vllm-router, Envoy) over several seeds, then writes a summary "
                      "with one table per case and issue 15's acceptance verdicts."),
    "canary": ("extproc.bench.canary", "run_canary",
               "Canary rollout under load: a faulty canary rolled back, a healthy one promoted.",
               "Two simulated pools behind one split with a rollout, open-loop load until the rollout ends; "
               "prints the weight timeline, reaction times, error shares and CPU, and writes JSON."),
    "autoscale": ("extproc.bench.autoscale", "run_autoscale",
                  "A pool following a 0 -> 3x -> 0 load through our KEDA scaler, with KEDA + HPA simulated.",
                  "A pool that starts at 0 (or N) replicas under a step/ramp load; a controller in the bench acts "
                  "as KEDA + the HPA on our external scaler and starts simulator replicas after a cold start; "
                  "reports replicas over time, TTFT per phase, held waits, errors, scale-up lags, flapping; JSON "
                  "and PNG."),
    "failover": ("extproc.bench.failover", "run_failover",
                 "Kill 1 of N replicas under load: client errors, ejection and recovery times.",
                 "Kill one simulated replica under steady load, bring it back; report client errors, how fast "
                 "the router stopped and resumed picking it, and latency."),
}


def _cmd_bench(module_name: str, runner: str, args: argparse.Namespace) -> int:
    result = getattr(importlib.import_module(module_name), runner)(args)
    return _run_async(result) if inspect.iscoroutine(result) else int(result)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="extproc", description=__doc__)
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    serve = add("serve", _cmd_serve, "Run the ext_proc service (gRPC ext_proc + health, admin HTTP); with "
                                     "service.workers above 1, a supervisor and that many service processes.")
    serve.add_argument("--config", required=True, help="policy YAML file")
    serve.add_argument("--grace", type=float, default=10.0, help="seconds to drain in-flight streams on SIGTERM")
    serve.add_argument("--drain-delay", type=float, default=3.0,
                       help="seconds to keep serving after SIGTERM while health reports NOT_SERVING, so Envoy's "
                            "health check moves new streams to other replicas first (default 3)")
    serve.add_argument("--grpc-port", type=int, help="override service.grpc_port (several replicas on one host)")
    serve.add_argument("--admin-port", type=int, help="override service.admin_port")
    serve.add_argument("--epp", action="store_true",
                       help="endpoint-picker mode (Gateway API Inference Extension): the gateway picked the pool, "
                            "the service picks its endpoint; the policy must have one pool (= mode: endpoint-picker)")
    serve.add_argument("--inference-pool", metavar="[NAMESPACE/]NAME",
                       help="with --epp: the pool's endpoints from this InferencePool and its ready pods (namespace "
                            "default: the service's own)")
    serve.add_argument("--workers", type=int, help="override service.workers: service processes sharing the gRPC "
                                                   "port under a supervisor (default: the policy's, 1)")
    serve.add_argument("--worker", help=argparse.SUPPRESS)  # I/N: set by the supervisor for its workers

    validate = add("validate", _cmd_validate, "Validate policy files; prints file:line errors, exit 1 on any.")
    validate.add_argument("files", nargs="+", help="policy YAML files")

    envoy = commands.add_parser("envoy", help="Envoy configuration tools.", description="Envoy configuration tools.")
    envoy_commands = envoy.add_subparsers(dest="envoy_command", required=True, metavar="SUBCOMMAND")
    render = envoy_commands.add_parser(
        "render", help="Write Envoy bootstrap + file-based xDS (LDS/RDS/CDS/EDS) for a policy.",
        description="Write Envoy bootstrap + file-based xDS for a policy, each file by atomic rename, plus "
                    "static/envoy.yaml (everything inlined, for `envoy --mode validate`).",
    )
    render.add_argument("--config", required=True, help="policy YAML file")
    render.add_argument("--out", required=True, help="output directory (Envoy watches it)")
    render.add_argument("--mount", help="the directory's path as Envoy sees it, if different (e.g. /etc/envoy/xds "
                                        "in a container); file paths inside the config use it")
    render.set_defaults(handler=_cmd_envoy_render)

    keys = commands.add_parser("keys", help="API keys for the tenants file (only hashes are stored).",
                               description="API keys for the tenants file (only SHA-256 hashes are stored).")
    keys_commands = keys.add_subparsers(dest="keys_command", required=True, metavar="SUBCOMMAND")
    key_hash = keys_commands.add_parser("hash", help="Print the sha256 entry for a key (argument or stdin).",
                                        description="Print the sha256 entry for a key; read from stdin when "
                                                    "omitted, so the key stays out of shell history.")
    key_hash.add_argument("key", nargs="?", help="the API key (default: one line from stdin)")
    key_hash.set_defaults(handler=_cmd_keys)
    key_new = keys_commands.add_parser("new", help="Generate a random key and its sha256 entry.",
                                       description="Generate a random API key and its sha256 entry.")
    key_new.set_defaults(handler=_cmd_keys)

    rollout = commands.add_parser("rollout", help="Canary rollouts: status and manual promote/pause/resume/abort.",
                                  description="Canary rollouts through a service replica's admin API (the state is "
                                              "shared, so any replica will do).")
    rollout_commands = rollout.add_subparsers(dest="rollout_command", required=True, metavar="ACTION")
    for action, text in (("status", "Show every rollout."), ("promote", "Move to the next step (--to-end: the last)."),
                         ("pause", "Stop automatic promotion (a breach still rolls back)."),
                         ("resume", "Continue a paused rollout."), ("abort", "Send all traffic back to the baseline."),
                         ("restart", "Start the rollout again from its first step.")):
        sub = rollout_commands.add_parser(action, help=text, description=text)
        if action != "status":
            sub.add_argument("model", help="the split's client-facing model name")
        if action == "promote":
            sub.add_argument("--to-end", action="store_true", help="go straight to 100%%")
        sub.add_argument("--admin", default="http://127.0.0.1:9003", help="admin URL of a service replica")
        sub.add_argument("--token-file", help="file holding the admin token (env EXTPROC_ADMIN_TOKEN wins); "
                                             "without one only a loopback admin URL answers")
        sub.set_defaults(handler=_cmd_rollout)

    sim = add("sim", _cmd_sim, "Run a simulated vLLM fleet (OpenAI API, vLLM metrics, KV cache, faults).")
    from extproc.sim import cli as sim_cli

    sim_cli.configure(sim)

    demo = add("demo", _cmd_demo, "Start a simulated fleet, the service and a real Envoy; drive mixed traffic.")
    from extproc.demo import configure as demo_configure

    demo_configure(demo)

    bench = commands.add_parser("bench", help="Benchmarks that print numbers and write reports.",
                                description="Benchmarks that print numbers and write reports.")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    for name, (module_name, runner, summary, description) in BENCHMARKS.items():
        sub = bench_commands.add_parser(name, help=summary, description=description)
        module = importlib.import_module(module_name)
        module.configure(sub)
        sub.set_defaults(handler=functools.partial(_cmd_bench, module_name, runner))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.handler(args))
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
