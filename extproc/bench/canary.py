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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
BASELINE, CANARY = "v1", "v2"
FINAL_STATUSES = frozenset({"promoted", "rolled_back", "aborted"})
UNATTRIBUTED = "unattributed"  # no serving replica known: dropped, connect/timeout errors, local replies
POLL_INTERVAL_S = 0.25
SEGMENT_S = 1.0  # the open loop runs in back-to-back segments so it can stop soon after the rollout ends
_HOST = "127.0.0.1"
_REPLICA_HEADERS = ("x-sim-replica", "x-gateway-upstream-host")


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


# -- pure analysis ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Snapshot:
    """One poll of `/debug/rollouts`: wall-clock time of the poll and the split's entry."""

    at: float
    entry: Mapping[str, Any]

    @property
    def rollout(self) -> Mapping[str, Any] | None:
        rollout = self.entry.get("rollout")
        return rollout if isinstance(rollout, Mapping) else None


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    t_s: float  # when the state changed (its updated_at), seconds from the reference time
    weight_percent: float
    status: str
    step: int
    reason: str
    observed_s: float  # when the poll first saw it, same reference


def extract_timeline(snapshots: Sequence[Snapshot], t0_wall: float) -> list[TimelineEntry]:
    """Every distinct rollout state (by version) in poll order, times relative to `t0_wall`."""
    timeline: list[TimelineEntry] = []
    seen: tuple[Any, ...] | None = None
    for snap in snapshots:
        rollout = snap.rollout
        if rollout is None:
            continue
        key = (rollout.get("version"), rollout.get("status"), rollout.get("weight_percent"))
        if key == seen:
            continue
        seen = key
        updated = float(rollout.get("updated_at", snap.at))
        timeline.append(TimelineEntry(round(updated - t0_wall, 3), float(rollout.get("weight_percent", 0.0)),
                                      str(rollout.get("status")), int(rollout.get("step", 0)),
                                      str(rollout.get("reason", "")), round(snap.at - t0_wall, 3)))
    return timeline


def min_samples_from_verdicts(snapshots: Sequence[Snapshot], min_samples: int) -> float | None:
    """Wall time of the first verdict that saw `min_samples` requests on both sides, or None.

    A verdict carries no time of its own: when it moved the rollout (promote/rollback) since the last
    poll, that transition's `updated_at` is exact; otherwise the poll that first showed it (late by at
    most one poll interval after the analysis)."""
    previous_at: float | None = None
    for snap in snapshots:
        rollout = snap.rollout
        verdict = rollout.get("last_verdict") if rollout is not None else None
        stats = verdict.get("stats") if isinstance(verdict, Mapping) else None
        if rollout is not None and isinstance(verdict, Mapping) and isinstance(stats, Mapping) and (
                stats.get("canary_requests", 0) >= min_samples and stats.get("baseline_requests", 0) >= min_samples):
            updated = rollout.get("updated_at")
            if verdict.get("action") != "wait" and updated is not None and (
                    previous_at is None or float(updated) > previous_at):
                return min(float(updated), snap.at)
            return snap.at
        previous_at = snap.at
    return None


def sample_pool(sample: Sample, pool_by_address: Mapping[str, str]) -> str | None:
    """The pool of the replica that answered (from the simulator's or Envoy's header), None if unknown."""
    for header in _REPLICA_HEADERS:
        pool = pool_by_address.get(sample.headers.get(header, ""))
        if pool is not None:
            return pool
    return None


def min_samples_from_samples(samples: Sequence[Sample], pool_by_address: Mapping[str, str], min_samples: int,
                             pools: Sequence[str] = (CANARY, BASELINE)) -> float | None:
    """Seconds from the load start at which each pool had completed `min_samples` responses (the
    service counts outcomes as they complete), or None if some pool never did."""
    done: dict[str, list[float]] = {pool: [] for pool in pools}
    for sample in samples:
        pool = sample_pool(sample, pool_by_address)
        if pool in done:
            done[pool].append(sample.start_s + sample.e2e_s)
    if min_samples < 1 or any(len(ends) < min_samples for ends in done.values()):
        return None
    return max(sorted(ends)[min_samples - 1] for ends in done.values())


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def error_shares(samples: Sequence[Sample], pool_by_address: Mapping[str, str], *, canary: str = CANARY,
                 fault_start_s: float | None = None, faulty_until_s: float | None = None) -> dict[str, Any]:
    """Requests and errors overall and per pool (`unattributed` when no replica answered).

    `canary_while_faulty` counts requests the canary served while its fault was on (sent in
    [fault_start_s, faulty_until_s)); None without a fault. Its share is of all requests."""
    per_pool: dict[str, dict[str, Any]] = {}
    faulty = 0
    for sample in samples:
        pool = sample_pool(sample, pool_by_address) or UNATTRIBUTED
        row = per_pool.setdefault(pool, {"requests": 0, "errors": 0})
        row["requests"] += 1
        if sample.error is not None:
            row["errors"] += 1
        if (pool == canary and fault_start_s is not None and sample.start_s >= fault_start_s
                and (faulty_until_s is None or sample.start_s < faulty_until_s)):
            faulty += 1
    total = len(samples)
    errors = sum(row["errors"] for row in per_pool.values())
    for row in per_pool.values():
        row["error_rate"] = round(_ratio(row["errors"], row["requests"]), 5)
        row["share_of_requests"] = round(_ratio(row["requests"], total), 5)
        row["errors_share_of_requests"] = round(_ratio(row["errors"], total), 5)
    return {
        "requests": total, "errors": errors, "error_share": round(_ratio(errors, total), 5),
        "canary_while_faulty": faulty if fault_start_s is not None else None,
        "canary_share_while_faulty": round(_ratio(faulty, total), 5) if fault_start_s is not None else None,
        "per_pool": dict(sorted(per_pool.items())),
    }


def served_after(samples: Sequence[Sample], pool_by_address: Mapping[str, str], after_s: float) -> dict[str, int]:
    """Requests sent strictly after `after_s` (seconds from the load start), by serving pool."""
    counts: dict[str, int] = {}
    for sample in samples:
        if sample.start_s > after_s:
            pool = sample_pool(sample, pool_by_address) or UNATTRIBUTED
            counts[pool] = counts.get(pool, 0) + 1
    return dict(sorted(counts.items()))


def expected_status(fault: str) -> str:
    return "promoted" if fault == "none" else "rolled_back"


def exit_problems(fault: str, final_status: str | None, shares: Mapping[str, Any],
                  after_end: Mapping[str, int] | None) -> list[str]:
    """Why the run does not match expectations (empty: exit 0): the fault's expected outcome, no error
    on the baseline pool nor without a serving replica, and nothing on the canary after a rollback."""
    problems: list[str] = []
    wanted = expected_status(fault)
    if final_status != wanted:
        problems.append(f"rollout ended {final_status or 'never'}, expected {wanted}")
    pools = shares.get("per_pool", {})
    for pool in (BASELINE, UNATTRIBUTED):
        errors = int(pools.get(pool, {}).get("errors", 0))
        if errors:
            problems.append(f"{errors} errors on {pool}")
    if final_status == "rolled_back" and after_end:
        leaked = int(after_end.get(CANARY, 0))
        if leaked:
            problems.append(f"{leaked} requests sent after the rollback were served by the canary")
    return problems


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
