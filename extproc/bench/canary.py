"""`extproc bench canary`: a canary rollout under open-loop load, with or without a faulty canary.

Two simulated pools serve model "m" through one split: the baseline `v1` and the canary `v2`. The
canary's replicas are made to fail a share of requests (`--fault error`), to run slower (`slow`) or
are left alone (`none`); then open-loop load runs until the rollout ends (promoted or rolled back)
plus a short tail, or the `--duration` cap. `/debug/rollouts` is polled every 0.25 s. The report has
the timeline of weight changes, how long the rollout took to react, how many requests the faulty
canary served and how many failed (overall and per pool), whether any request sent after a rollback
still reached the canary, and the CPU each process used during the load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from extproc.bench.canary_analysis import (
    BASELINE,
    CANARY,
    FINAL_STATUSES,
    Snapshot,
    TimelineEntry,
    error_shares,
    exit_problems,
    expected_status,
    extract_timeline,
    min_samples_from_samples,
    min_samples_from_verdicts,
    sample_pool,
    served_after,
)
from extproc.bench.httpclient import HttpClient, RequestError
from extproc.bench.loadgen import RequestSpec, Sample, run_open_loop
from extproc.bench.procs import ProcessGroup, self_cpu_seconds
from extproc.bench.report import format_table, write_json
from extproc.bench.stack import SimPool, Stack, launch

__all__ = [
    "FINAL_STATUSES",
    "Snapshot",
    "TimelineEntry",
    "configure",
    "error_shares",
    "exit_problems",
    "expected_status",
    "extract_timeline",
    "min_samples_from_samples",
    "min_samples_from_verdicts",
    "parse_steps",
    "rollout_policy",
    "run_canary",
    "sample_pool",
    "served_after",
]

MODEL = "m"
POLL_INTERVAL_S = 0.25
SEGMENT_S = 1.0  # the open loop runs in back-to-back segments so it can stop soon after the rollout ends
_HOST = "127.0.0.1"


# -- command line ------------------------------------------------------------------------------------------
def parse_steps(text: str) -> tuple[float, ...]:
    """'5,25,50,100' -> (5.0, 25.0, 50.0, 100.0); the rollout config validates order and range."""
    try:
        steps = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"steps must be comma-separated percentages, got {text!r}") from None
    if not steps:
        raise argparse.ArgumentTypeError("at least one step is needed")
    return steps


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fault", choices=("error", "slow", "none"), default="error",
                        help="what happens to the canary's replicas before the load starts (default %(default)s)")
    parser.add_argument("--error-rate", type=float, default=0.1,
                        help="with --fault error: fraction of canary requests answered 500 (default %(default)s)")
    parser.add_argument("--slow-factor", type=float, default=3.0,
                        help="with --fault slow: canary prefill and token latency multiplier (default %(default)s)")
    parser.add_argument("--steps", type=parse_steps, default=(5.0, 25.0, 50.0, 100.0), metavar="P,P,...",
                        help="canary weight steps in percent (default 5,25,50,100)")
    parser.add_argument("--hold", type=float, default=5.0, help="seconds each step is held (default %(default)s)")
    parser.add_argument("--min-samples", type=int, default=100,
                        help="requests per side before a step is judged (default %(default)s)")
    parser.add_argument("--interval", type=float, default=1.0,
                        help="analysis_interval_s of the rollout (default %(default)s); the service re-reads "
                             "rollout state every min(1, interval/4) s")
    parser.add_argument("--max-error-rate-delta", type=float, default=0.02,
                        help="rollback bound: canary error rate minus baseline's (default %(default)s)")
    parser.add_argument("--max-ttft-ratio", type=float, default=1.5,
                        help="rollback bound: canary / baseline TTFT p99 (default %(default)s)")
    parser.add_argument("--max-tpot-ratio", type=float, default=1.3,
                        help="rollback bound: canary / baseline mean TPOT (default %(default)s)")
    parser.add_argument("--rate", type=float, default=60.0, help="offered requests/s, Poisson (default %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=16, help="max_tokens of each request (default %(default)s)")
    parser.add_argument("--duration", type=float, default=90.0,
                        help="cap on the seconds of load, tail included (default %(default)s)")
    parser.add_argument("--tail", type=float, default=5.0,
                        help="seconds of load after the rollout ends, to check where traffic goes (default "
                             "%(default)s)")
    parser.add_argument("--replicas", type=int, default=2, help="simulated replicas per pool (default %(default)s)")
    parser.add_argument("--profile", default="fast", help="simulator profile (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of arrivals and the simulator (default 0)")
    parser.add_argument("--json", metavar="FILE", default="reports/canary.json", help="report path")
    parser.add_argument("--workdir", metavar="DIR", help="where config and logs go (default: temp)")


def rollout_policy(args: argparse.Namespace) -> dict[str, Any]:
    """The `rollout:` section: split of MODEL over baseline and canary, with the rollout under test."""
    return {"rollout": {
        "refresh_interval_s": min(1.0, args.interval / 4),
        "splits": [{
            "model": MODEL, "sticky_by": "request",
            "backends": [{"pool": BASELINE, "weight": 100}, {"pool": CANARY, "weight": 0}],
            "rollout": {"canary": CANARY, "baseline": BASELINE, "steps": list(args.steps), "hold_s": args.hold,
                        "min_samples": args.min_samples, "analysis_interval_s": args.interval,
                        "max_error_rate_delta": args.max_error_rate_delta,
                        "max_ttft_p99_ratio": args.max_ttft_ratio, "max_tpot_ratio": args.max_tpot_ratio},
        }],
    }}


def _fault_body(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.fault == "error":
        return {"error_rate": args.error_rate}
    if args.fault == "slow":
        return {"slow_factor": args.slow_factor}
    return None


# -- the run -----------------------------------------------------------------------------------------------
def _spec(index: int, max_tokens: int) -> RequestSpec:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"canary question {index}: how are you?"}],
            "max_tokens": max_tokens}
    return RequestSpec("POST", "/v1/chat/completions", (("content-type", "application/json"),),
                       json.dumps(body).encode())


async def _drive_load(port: int, next_spec: Callable[[int], RequestSpec], *, rate: float, t0: float,
                      cap_s: float, stop: asyncio.Event, seed: int, client: HttpClient) -> list[Sample]:
    """Open-loop load from perf_counter `t0` until `stop` is set or `cap_s`, as back-to-back open-loop
    segments (a Poisson process cut into intervals is still one); start_s is relative to `t0`."""
    counter = itertools.count()

    def spec(_: int) -> RequestSpec:
        return next_spec(next(counter))

    async def segment(k: int, length: float) -> tuple[float, list[Sample]]:
        begin = time.perf_counter() - t0
        return begin, await run_open_loop(_HOST, port, spec, rate=rate, duration_s=length, seed=seed + k,
                                          client=client, timeout_s=30.0, max_in_flight=4096)

    tasks: list[asyncio.Task[tuple[float, list[Sample]]]] = []
    for k in itertools.count():
        offset = k * SEGMENT_S
        if stop.is_set() or offset >= cap_s:
            break
        delay = t0 + offset - time.perf_counter()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                break
        tasks.append(asyncio.create_task(segment(k, min(SEGMENT_S, cap_s - offset))))
    samples = [dataclasses.replace(s, start_s=begin + s.start_s)
               for begin, part in await asyncio.gather(*tasks) for s in part]
    samples.sort(key=lambda s: s.start_s)
    return [dataclasses.replace(s, index=i) for i, s in enumerate(samples)]


async def _rollout_entry(client: HttpClient, admin_port: int) -> Mapping[str, Any] | None:
    try:
        response = await client.request("GET", _HOST, admin_port, "/debug/rollouts", timeout_s=2.0)
    except RequestError:
        return None
    if response.status != 200:
        return None
    for entry in json.loads(response.body)["rollouts"]:
        if entry.get("model") == MODEL:
            return dict(entry)
    return None


async def _set_faults(client: HttpClient, stack: Stack, body: Mapping[str, Any]) -> None:
    for port in stack.sim_ports[CANARY]:
        response = await client.request("POST", _HOST, port, "/sim/faults", (("content-type", "application/json"),),
                                        json.dumps(body).encode(), timeout_s=5.0)
        if response.status != 200:
            raise RuntimeError(f"POST /sim/faults on {port}: {response.status} {response.body[:200]!r}")


async def _poll_rollout(client: HttpClient, admin_port: int, snapshots: list[Snapshot], *, t0_wall: float,
                        cap_s: float, tail_s: float, stop: asyncio.Event) -> None:
    """Poll until the rollout ended `tail_s` ago or the cap; then stop the load."""
    ended_at: float | None = None
    last: tuple[Any, ...] | None = None
    try:
        while True:
            entry = await _rollout_entry(client, admin_port)
            now = time.time()
            if entry is not None:
                snapshots.append(Snapshot(now, entry))
                rollout = Snapshot(now, entry).rollout
                if rollout is not None:
                    key = (rollout.get("version"), rollout.get("status"), rollout.get("weight_percent"))
                    if key != last:
                        last = key
                        print(f"[{now - t0_wall:6.1f}s] {rollout.get('status')} at {rollout.get('weight_percent'):g}%"
                              f": {rollout.get('reason')}", file=sys.stderr)
                    if ended_at is None and rollout.get("status") in FINAL_STATUSES:
                        ended_at = now
            if ended_at is not None and now >= ended_at + tail_s:
                return
            if now >= t0_wall + cap_s:
                return
            await asyncio.sleep(POLL_INTERVAL_S)
    finally:
        stop.set()


def _final_rollout(snapshots: Sequence[Snapshot]) -> Mapping[str, Any] | None:
    for snap in reversed(snapshots):
        if snap.rollout is not None:
            return snap.rollout
    return None


def _seconds(value: float | None, reference: float | None) -> float | None:
    return None if value is None or reference is None else round(value - reference, 3)


async def run_canary(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="extproc-canary-"))
    workdir.mkdir(parents=True, exist_ok=True)
    pools = [SimPool(BASELINE, "org/m-v1", args.replicas), SimPool(CANARY, "org/m-v2", args.replicas)]
    fault = _fault_body(args)
    report: dict[str, Any] = {
        "fault": args.fault, "fault_settings": fault, "rate_rps": args.rate, "duration_cap_s": args.duration,
        "tail_s": args.tail, "profile": args.profile, "replicas_per_pool": args.replicas,
        "rollout": rollout_policy(args)["rollout"], "workdir": str(workdir),
    }
    snapshots: list[Snapshot] = []
    async with ProcessGroup(workdir / "logs") as group:
        stack = await launch(group, workdir, pools, extra_policy=rollout_policy(args),
                             sim_args=["--profile", args.profile, "--seed", str(args.seed)])
        admin_port = stack.policy.service.admin_port
        pool_by_address = {f"{_HOST}:{port}": pool for pool, ports in stack.sim_ports.items() for port in ports}
        async with HttpClient() as control:
            for _ in range(100):  # the service starts the rollout on its first refresh
                entry = await _rollout_entry(control, admin_port)
                if entry is not None and entry.get("rollout") is not None:
                    break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError("the service never reported the rollout on /debug/rollouts")
            cpu_before, bench_before = group.cpu_seconds(), self_cpu_seconds()
            fault_wall: float | None = None
            if fault is not None:
                fault_wall = time.time()
                await _set_faults(control, stack, fault)
            print(f"load: {args.rate:g} req/s on model {MODEL!r}, canary fault {args.fault} {fault or ''}, "
                  f"until the rollout ends + {args.tail:g} s (cap {args.duration:g} s)", file=sys.stderr)
            stop = asyncio.Event()
            t0_perf, t0_wall = time.perf_counter(), time.time()
            async with HttpClient() as load_client:
                poller = asyncio.create_task(_poll_rollout(control, admin_port, snapshots, t0_wall=t0_wall,
                                                           cap_s=args.duration, tail_s=args.tail, stop=stop))
                try:
                    samples = await _drive_load(stack.envoy_port, lambda i: _spec(i, args.max_tokens),
                                                rate=args.rate, t0=t0_perf, cap_s=args.duration, stop=stop,
                                                seed=args.seed, client=load_client)
                finally:
                    stop.set()
                    poller.cancel()
                    await asyncio.gather(poller, return_exceptions=True)
            load_s = time.perf_counter() - t0_perf
            entry = await _rollout_entry(control, admin_port)
            if entry is not None:
                snapshots.append(Snapshot(time.time(), entry))
        cpu_after, bench_after = group.cpu_seconds(), self_cpu_seconds()

    # Times below are seconds from the load start (the fault is switched on just before it).
    final = _final_rollout(snapshots)
    final_status = None if final is None else str(final.get("status"))
    ended_wall = None if final is None or final_status not in FINAL_STATUSES else float(final["updated_at"])
    ended_s = _seconds(ended_wall, t0_wall)
    fault_start_s = _seconds(fault_wall, t0_wall)
    verdict_wall = min_samples_from_verdicts(snapshots, args.min_samples)
    from_samples_s = min_samples_from_samples(samples, pool_by_address, args.min_samples)
    min_samples_s = _seconds(verdict_wall, t0_wall) if verdict_wall is not None else (
        round(from_samples_s, 3) if from_samples_s is not None else None)
    source = "verdict" if verdict_wall is not None else ("samples" if from_samples_s is not None else None)
    faulty_until = ended_s if final_status == "rolled_back" else None
    shares = error_shares(samples, pool_by_address, fault_start_s=fault_start_s, faulty_until_s=faulty_until)
    after_end = served_after(samples, pool_by_address, ended_s) if ended_s is not None else None
    origin = fault_wall if fault_wall is not None else t0_wall
    cpu = {name: round(cpu_after[name] - cpu_before.get(name, 0.0), 3) for name in cpu_after}
    cpu["bench (this process)"] = round(bench_after - bench_before, 3)
    problems = exit_problems(args.fault, final_status, shares, after_end)
    report.update(
        load_s=round(load_s, 3), final_status=final_status, expected_status=expected_status(args.fault),
        final_reason=None if final is None else final.get("reason"),
        last_verdict=None if final is None else final.get("last_verdict"),
        fault_start_s=fault_start_s, ended_s=ended_s,
        fault_to_rollback_s=_seconds(ended_wall, origin) if final_status == "rolled_back" else None,
        load_to_promotion_s=ended_s if final_status == "promoted" else None,
        fault_to_min_samples_s=None if min_samples_s is None else round(min_samples_s - (fault_start_s or 0.0), 3),
        min_samples_source=source,
        min_samples_from_samples_s=None if from_samples_s is None else round(from_samples_s, 3),
        timeline=extract_timeline(snapshots, t0_wall), requests=shares, served_after_end=after_end,
        cpu_seconds=cpu, cpu_share_of_load=({name: round(value / load_s, 3) for name, value in cpu.items()}
                                            if load_s > 0 else {}),
        problems=problems, polls=len(snapshots),
    )
    _print(report)
    path = write_json(args.json, report)
    print(f"report written to {path}")
    return 0 if not problems else 1


def _print(report: Mapping[str, Any]) -> None:
    print("rollout timeline (seconds from the load start):")
    rows = [{"t": e.t_s, "weight %": e.weight_percent, "status": e.status, "reason": e.reason}
            for e in report["timeline"]]
    print(format_table(rows, ["t", "weight %", "status", "reason"]))
    shares = report["requests"]
    pools = [{"pool": name, **row} for name, row in shares["per_pool"].items()]
    print(format_table(pools, ["pool", "requests", "errors", "error_rate", ("share_of_requests", "share of all"),
                               ("errors_share_of_requests", "errors / all")]))
    summary = [
        {"figure": "outcome (expected)", "value": f"{report['final_status']} ({report['expected_status']})"},
        {"figure": "fault (none: load) start -> min_samples on both sides, s",
         "value": report["fault_to_min_samples_s"], "note": report["min_samples_source"]},
        {"figure": "  same, from served responses, s", "value": report["min_samples_from_samples_s"]},
        {"figure": "fault start -> rollback, s", "value": report["fault_to_rollback_s"]},
        {"figure": "load start -> promotion, s", "value": report["load_to_promotion_s"]},
        {"figure": "requests / errors", "value": f"{shares['requests']} / {shares['errors']}",
         "note": f"{shares['error_share']:.2%} errored"},
        {"figure": "served by the canary while faulty", "value": shares["canary_while_faulty"],
         "note": None if shares["canary_share_while_faulty"] is None
         else f"{shares['canary_share_while_faulty']:.2%} of all"},
        {"figure": "sent after the end, by pool", "value": report["served_after_end"]},
        {"figure": "CPU seconds during the load", "value": report["cpu_seconds"],
         "note": f"over {report['load_s']:.1f} s"},
    ]
    print(format_table(summary, ["figure", "value", "note"]))
    for problem in report["problems"]:
        print(f"FAILED: {problem}")
