"""`extproc demo`: a simulated vLLM fleet + our service + a real Envoy, mixed traffic, a summary."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from extproc.bench.loadgen import run_open_loop
from extproc.bench.procs import ProcessGroup
from extproc.bench.report import ProgressPrinter, format_table, write_json
from extproc.bench.stack import SimPool, launch
from extproc.bench.stats import share_by, summarize, summarize_by
from extproc.bench.workloads import ModelTarget, demo_mix

POOLS = (
    SimPool("llama-8b", "meta-llama/Llama-3.1-8B-Instruct", 4, aliases=("llama-8b", "gpt-4o-mini")),
    SimPool("qwen-1b", "Qwen/Qwen2.5-1.5B-Instruct", 2, aliases=("qwen-small",)),
)
TARGETS = (
    ModelTarget("llama-8b", ("meta-llama/Llama-3.1-8B-Instruct", "llama-8b", "gpt-4o-mini"), 0.7),
    ModelTarget("qwen-1b", ("Qwen/Qwen2.5-1.5B-Instruct", "qwen-small"), 0.3),
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of traffic (default 60)")
    parser.add_argument("--rate", type=float, default=8.0, help="offered requests/s, Poisson arrivals (default 8)")
    parser.add_argument("--seed", type=int, default=1, help="workload seed")
    parser.add_argument("--json", metavar="FILE", help="also write the summary as JSON")
    parser.add_argument("--workdir", metavar="DIR", help="where policy, Envoy files and logs go (default: temp)")
    parser.add_argument("--stream-chunk-tokens", type=int, default=4,
                        help="tokens per SSE chunk in the simulator (default 4; 1 = like vLLM)")
    parser.add_argument("--keep-running", action="store_true",
                        help="after the report, keep the stack up (metrics stay reachable) until Ctrl-C")


def build_summary(samples: list[Any], duration_s: float) -> dict[str, Any]:
    summary = summarize(samples, duration_s=duration_s)
    return {
        "total": summary["total"],
        "errors": sum(summary["errors"].values()),
        "errors_by_kind": summary["errors"],
        "status": summary["status"],
        "ttft_ms": summary["ttft_ms"],
        "e2e_ms": summary["e2e_ms"],
        "tpot_ms": summary["tpot_ms"],
        "output_tokens_per_s": summary["output_tokens_per_s"],
        "achieved_rps": summary["achieved_rps"],
        "per_pool": share_by(samples, "pool"),
        "per_endpoint": share_by(samples, "x-gateway-upstream-host", only_ok=True),
        "per_pool_detail": {
            pool: {"total": s["total"], "ttft_ms": s["ttft_ms"], "errors": sum(s["errors"].values())}
            for pool, s in summarize_by(samples, "pool", duration_s=duration_s).items()
        },
    }


def print_report(summary: dict[str, Any], out: Any = sys.stdout, pool_of: dict[str, str] | None = None) -> None:
    ttft = summary["ttft_ms"]
    rows = [
        {"metric": "requests", "value": summary["total"]},
        {"metric": "errors", "value": summary["errors"]},
        {"metric": "TTFT p50 / p95 / p99 (ms)", "value": f"{ttft['p50']} / {ttft['p95']} / {ttft['p99']}"},
        {"metric": "output tokens/s", "value": summary["output_tokens_per_s"]},
        {"metric": "achieved req/s", "value": summary["achieved_rps"]},
    ]
    print(format_table(rows, ["metric", "value"]), file=out)
    print(file=out)
    pools = [{"pool": k, "requests": v, "share": f"{v / max(1, summary['total']):.1%}",
              "ttft_p50_ms": summary["per_pool_detail"].get(k, {}).get("ttft_ms", {}).get("p50")}
             for k, v in sorted(summary["per_pool"].items())]
    print(format_table(pools, ["pool", "requests", "share", "ttft_p50_ms"]), file=out)
    print(file=out)
    served = max(1, sum(summary["per_endpoint"].values()))
    owner = pool_of or {}
    endpoints = [{"pool": owner.get(k, "-"), "endpoint": k, "requests": v, "share": f"{v / served:.1%}"}
                 for k, v in sorted(summary["per_endpoint"].items(), key=lambda kv: (owner.get(kv[0], ""), kv[0]))]
    print(format_table(endpoints, ["pool", "endpoint", "requests", "share"]), file=out)


async def run_demo(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="extproc-demo-"))
    print(f"workdir {workdir} (policy, Envoy config, logs)", file=sys.stderr)
    async with ProcessGroup(workdir / "logs") as group:
        stack = await launch(group, workdir, POOLS,
                             sim_args=["--stream-chunk-tokens", str(args.stream_chunk_tokens)])
        print(f"fleet up: {', '.join(f'{p.name} x{p.replicas}' for p in POOLS)}; "
              f"Envoy on 127.0.0.1:{stack.envoy_port}; service metrics at {stack.admin_url}/metrics",
              file=sys.stderr)
        printer = ProgressPrinter()
        try:
            samples = await run_open_loop(
                "127.0.0.1", stack.envoy_port, demo_mix(TARGETS, seed=args.seed), rate=args.rate,
                duration_s=args.duration, arrival="poisson", seed=args.seed, timeout_s=60.0, progress=printer,
            )
        finally:
            printer.close()
        summary = build_summary(samples, args.duration)
        summary["cpu_seconds"] = group.cpu_seconds()
        summary["service_metrics_url"] = f"{stack.admin_url}/metrics"
        pool_of = {f"127.0.0.1:{port}": pool for pool, ports in stack.sim_ports.items() for port in ports}
        print_report(summary, pool_of=pool_of)
        print(f"\nservice metrics: {stack.admin_url}/metrics   Envoy admin: {stack.envoy_admin_url}"
              f"   logs: {workdir / 'logs'}")
        if args.json:
            write_json(args.json, summary)
            print(f"summary written to {args.json}")
        if args.keep_running:
            print(f"stack kept running; try: curl {stack.admin_url}/metrics | grep pool_ttft  (Ctrl-C to stop)",
                  file=sys.stderr)
            await asyncio.Event().wait()
        print("the stack stops now; `extproc demo --keep-running` keeps it (and /metrics) up afterwards")
    return 0 if summary["errors"] == 0 else 1
