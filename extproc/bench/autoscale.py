"""`extproc bench autoscale`: a pool that follows demand through our KEDA external scaler.

One pool starts at `--start-replicas` (0: scale from zero). The load rises from nothing to `--peak` times one
replica's capacity, holds, falls back to nothing, then stays idle long enough for the scale-down window and
KEDA's cooldown. A small controller in the bench acts as KEDA + the HPA (`keda_controller.py`): it polls the
service's scaler over gRPC, starts simulator replicas after `--cold-start` seconds and stops them when asked.

Reported: replicas over time (desired / ready), TTFT p50/p99 and errors per phase, the longest wait of a held
request, how long each scale-up took to be ready (the acceptance: within one cold start plus the poll
interval), split into its parts, scale-downs before the stabilisation window, and direction changes of the
desired count (flapping); JSON and a PNG plot. Replica processes are pre-started parked (`Replicas`): the
simulated cold start is a new replica's only delay, as for a real one, not Python's start-up on a busy box.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from extproc.bench.httpclient import HttpClient, RequestError
from extproc.bench.keda_controller import Controller, Replicas, ScalerClient
from extproc.bench.loadgen import RequestSpec, Sample, run_open_loop
from extproc.bench.procs import ProcessGroup
from extproc.bench.report import format_table, plot_lines, write_json
from extproc.bench.stack import SimPool, prepare, start_envoy, start_service
from extproc.bench.stats import summarize
from extproc.endpoints.vllm_metrics import parse_vllm_metrics
from extproc.sim.profile import profile_from_mapping

MODEL = "org/auto"
SEATS = 4
OUTPUT_TOKENS = 32
PROFILE = {"base": "fast", "name": "autoscale", "max_num_seqs": SEATS, "step_base_s": 0.02,
           "min_output_fraction": 1.0, "max_tokens_cap": 1024}
SEGMENT_S = 2.0  # a ramp is a staircase of constant-rate segments this long


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--start-replicas", type=int, default=0, help="replicas at the start (default 0)")
    parser.add_argument("--max-replicas", type=int, default=4, help="most replicas (default 4)")
    parser.add_argument("--peak", type=float, default=3.0, help="peak load, in replicas' capacity (default 3)")
    parser.add_argument("--ramp", type=float, default=30.0, help="seconds of rise and of fall (default 30)")
    parser.add_argument("--hold", type=float, default=30.0, help="seconds at the peak (default 30)")
    parser.add_argument("--cold-start", type=float, default=5.0,
                        help="seconds before a new replica's process starts (default 5; real vLLM: 30-60)")
    parser.add_argument("--poll", type=float, default=2.0, help="the controller's polling interval (default 2)")
    parser.add_argument("--stabilization", type=float, default=20.0,
                        help="autoscaling.scale_down_stabilization_s (default 20)")
    parser.add_argument("--cooldown", type=float, default=10.0, help="KEDA's cooldownPeriod to zero (default 10)")
    parser.add_argument("--predict", type=float, default=10.0, help="autoscaling.predict_s (default 10)")
    parser.add_argument("--smoothing", type=float, default=2.0,
                        help="autoscaling.smoothing_s (default 2: the poll interval; 0 = raw samples)")
    parser.add_argument("--json", metavar="FILE", default="reports/autoscale.json", help="report path (+ .png)")
    parser.add_argument("--workdir", metavar="DIR", help="where config and logs go (default: temp)")


def capacity_rps() -> float:
    """Requests/s one replica completes when saturated by the bench's requests (the profile's own figure)."""
    return profile_from_mapping(PROFILE).capacity_rps(prompt_tokens=16, output_tokens=OUTPUT_TOKENS)


def phases(args: argparse.Namespace, peak_rps: float) -> list[tuple[str, float, float, float]]:
    """(phase, start s, duration s, rate) segments: idle, ramp up, hold, ramp down, idle tail."""
    segments: list[tuple[str, float, float, float]] = []
    t = 2.0  # a moment of nothing first
    steps = max(1, round(args.ramp / SEGMENT_S))
    for i in range(steps):
        segments.append(("ramp-up", t, args.ramp / steps, peak_rps * (i + 1) / steps))
        t += args.ramp / steps
    segments.append(("hold", t, args.hold, peak_rps))
    t += args.hold
    for i in range(steps):
        segments.append(("ramp-down", t, args.ramp / steps, peak_rps * (steps - i - 1) / steps))
        t += args.ramp / steps
    return segments


def _spec(phase: str) -> Any:
    def spec(index: int) -> RequestSpec:
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"{phase} {index}"}],
                "max_tokens": OUTPUT_TOKENS, "stream": True, "ignore_eos": True}
        return RequestSpec("POST", "/v1/chat/completions", (("content-type", "application/json"),),
                           json.dumps(body).encode(), stream=True, labels={"phase": phase})
    return spec


async def _segment(port: int, phase: str, start: float, duration: float, rate: float, t0: float,
                   client: HttpClient) -> list[tuple[float, Sample]]:
    await asyncio.sleep(max(0.0, t0 + start - time.monotonic()))
    if rate <= 0:
        return []
    samples = await run_open_loop("127.0.0.1", port, _spec(phase), rate=rate, duration_s=duration,
                                  arrival="poisson", seed=int(start * 1000), timeout_s=120, client=client)
    return [(start, s) for s in samples]


def follow_lags(timeline: Sequence[dict[str, float]], ready_at: Sequence[tuple[float, int]]) -> list[float]:
    """For every rise of the desired count: seconds until that many replicas were ready."""
    lags: list[float] = []
    previous = 0.0
    for point in timeline:
        desired = point["desired"]
        if desired > previous:
            done = next((t for t, ready in ready_at if t >= point["t"] - 1e-9 and ready >= desired), None)
            lags.append(round(done - point["t"], 3) if done is not None else float("inf"))
        previous = desired
    return lags


def demand_lags(segments: Sequence[tuple[str, float, float, float]], capacity: float,
                timeline: Sequence[dict[str, float]], ready_at: Sequence[tuple[float, int]]) -> list[dict[str, Any]]:
    """For every replica count k the offered load needs on the way up (ceil(rate / one replica's capacity)):
    when the load first needed k, when the controller first asked for k, and when k were ready."""
    rows: list[dict[str, Any]] = []
    for start, rate in [(start, rate) for phase, start, _, rate in segments if phase == "ramp-up"]:
        need = math.ceil(rate / capacity - 1e-9)
        if rows and need <= rows[-1]["replicas"]:
            continue
        asked = next((p["t"] for p in timeline if p["desired"] >= need), None)
        ready = next((t for t, n in ready_at if n >= need), None)
        rows.append({"replicas": need, "load_needs_at_s": round(start, 3),
                     "asked_at_s": asked, "ready_at_s": ready,
                     "asked_after_s": None if asked is None else round(asked - start, 3),
                     "ready_after_s": None if ready is None else round(ready - start, 3)})
    return rows


async def engine_demand(client: HttpClient, replicas: Replicas, t0: float, until: float, every_s: float,
                        into: list[tuple[float, float]]) -> None:
    """The engines' own running + waiting (their /metrics), summed over the replicas listening: what the
    scaler's demand estimates, sampled beside it."""
    while time.monotonic() < until:
        total = 0.0
        for port in list(replicas.running):
            with contextlib.suppress(RequestError, OSError, TimeoutError, ValueError):
                response = await client.request("GET", "127.0.0.1", port, "/metrics", timeout_s=2.0)
                metrics = parse_vllm_metrics(response.body.decode(), 0.0)
                total += metrics.running + metrics.waiting
        into.append((round(time.monotonic() - t0, 3), total))
        await asyncio.sleep(every_s)


def direction_changes(values: Sequence[float]) -> int:
    changes, direction = 0, 0
    for before, after in itertools.pairwise(values):
        step = (after > before) - (after < before)
        if step and direction and step != direction:
            changes += 1
        direction = step or direction
    return changes


async def run_autoscale(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="extproc-autoscale-"))
    peak_rps = args.peak * capacity_rps()
    segments = phases(args, peak_rps)
    load_end = segments[-1][1] + segments[-1][2]
    run_s = load_end + args.stabilization + args.cooldown + 3 * args.poll + 5
    profile = workdir / "autoscale-profile.json"
    workdir.mkdir(parents=True, exist_ok=True)
    profile.write_text(json.dumps(PROFILE))
    pool = SimPool("auto", MODEL, args.max_replicas, aliases=("auto",), max_num_seqs=SEATS,
                   options=(("cold_start_timeout_s", args.cold_start + 30.0),))
    # One class without a reserve: a replica's capacity is all of its seats (the figure the peak is built on).
    policy = {"scheduling": {"scrape": {"interval_ms": 100}},
              "flow_control": {"classes": {"standard": {"priority": 50, "max_wait_s": 10.0}},
                               "default_class": "standard"},
              "autoscaling": {"enabled": True, "allow_unauthenticated": True,  # loopback
                              "target_per_replica": SEATS, "sample_interval_s": 0.5,
                              "predict_s": args.predict, "trend_window_s": 10.0, "smoothing_s": args.smoothing,
                              "scale_down_stabilization_s": args.stabilization}}
    # Replicas start while gRPC threads run here: no preexec hook for them (keda_controller.py).
    async with ProcessGroup(workdir / "logs") as group, \
            ProcessGroup(workdir / "logs", die_with_parent=False) as replica_group:
        stack = prepare(workdir, [pool], extra_policy=policy)
        await start_service(group, stack)
        await start_envoy(group, stack)
        replicas = Replicas(replica_group, workdir, MODEL, stack.sim_ports["auto"], str(profile), args.cold_start,
                            time.monotonic)
        await replicas.prestart()
        replicas.scale(args.start_replicas)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.policy.service.grpc_port}") as channel, \
                HttpClient() as client:
            controller = Controller(ScalerClient(channel, "auto"), replicas, args.poll, 0, args.max_replicas,
                                    args.cooldown)
            t0 = time.monotonic()
            control = asyncio.create_task(controller.run(t0 + run_s))
            engines: list[tuple[float, float]] = []
            engine_sampler = asyncio.create_task(engine_demand(client, replicas, t0, t0 + run_s, 0.5, engines))
            loads = await asyncio.gather(*(_segment(stack.envoy_port, phase, start, duration, rate, t0, client)
                                           for phase, start, duration, rate in segments))
            await control
            await engine_sampler
            response = await client.request("GET", "127.0.0.1", stack.policy.service.admin_port, "/debug/flow")
            flow = json.loads(response.body)["pools"].get("auto", {})
        await replicas.close()
    samples = [(start + s.start_s, s) for chunk in loads for start, s in chunk]
    by_phase = {name: summarize([s for _, s in samples if s.labels.get("phase") == name])
                for name in ("ramp-up", "hold", "ramp-down")}
    timeline = [{**p, "t": round(p["t"] - t0, 3)} for p in controller.timeline]
    ready = [(round(t - t0, 3), n) for t, n in replicas.ready_at]
    lags = follow_lags(timeline, ready)
    bound = args.cold_start + args.poll
    starts = [{"asked_s": round(s["asked"] - t0, 3), "cold_start_s": round(s["told"] - s["asked"], 3),
               "listening_after_s": round(s["ready"] - s["told"], 3), "parked_late": bool(s["parked_late"])}
              for s in replicas.starts]
    by_load = demand_lags(segments, capacity_rps(), timeline, ready)
    # The load starts to fall when the hold ends: no replica may go before the stabilisation window has passed.
    fall_start = next(start for phase, start, _, _ in segments if phase == "ramp-down")
    # (A scale-down before the fall, during the rise or the hold, is the HPA undoing an overshoot: counted in
    # the direction changes, and by the scaler's rule too only once the window since the higher demand passed.)
    downs = [t for (_, before), (t, n) in itertools.pairwise(ready) if n < before and t >= fall_start]
    early_downs = [t for t in downs if t < fall_start + args.stabilization]
    # The hold: the demand the pool really carried (Little's law: arrival rate x mean time in the system) against
    # what the scaler reported and the replicas asked for.
    hold_start = next(start for phase, start, _, _ in segments if phase == "hold")
    in_hold = [p for p in timeline if hold_start + args.poll <= p["t"] < fall_start]
    hold = by_phase["hold"]
    carried = float(hold["achieved_rps"]) * float(hold["e2e_ms"]["mean"] or 0.0) / 1000
    in_hold_engines = [n for t, n in engines if hold_start + args.poll <= t < fall_start]
    hold_report = {"carried_in_flight": round(carried, 2), "replicas_for_it": math.ceil(carried / SEATS - 1e-9),
                   "engines_running_waiting_mean": round(sum(in_hold_engines) / max(1, len(in_hold_engines)), 2),
                   "engines_running_waiting_max": max(in_hold_engines, default=0.0),
                   "reported_mean": round(sum(p["value"] for p in in_hold) / max(1, len(in_hold)), 2),
                   "reported_max": round(max((p["value"] for p in in_hold), default=0.0), 2),
                   "desired_max": max((p["desired"] for p in in_hold), default=0)}
    report: dict[str, Any] = {
        "command": "extproc " + " ".join(sys.argv[1:]), "workdir": str(workdir),
        "replica_capacity_rps": round(capacity_rps(), 2), "peak_rps": round(peak_rps, 2),
        "cold_start_s": args.cold_start, "poll_s": args.poll, "stabilization_s": args.stabilization,
        "predict_s": args.predict, "smoothing_s": args.smoothing, "max_replicas": args.max_replicas,
        "phases": by_phase, "timeline": timeline, "engines": engines, "ready": ready,
        "hold": hold_report, "scale_up_lags_s": lags, "lag_bound_s": bound, "replica_starts": starts,
        "load_follow": by_load,
        "first_scale_down_after_fall_s":
            round(downs[0] - fall_start, 3) if downs else None, "scale_downs_before_window": early_downs,
        "desired_direction_changes": direction_changes([p["desired"] for p in timeline]),
        "longest_held_s": max((c.get("max_wait_s", 0.0) for c in flow.get("classes", {}).values()), default=0.0),
        "flow": flow,
    }
    rows = [{"phase": name, "requests": s["total"], "errors": sum(s["errors"].values()),
             "ttft p50 ms": s["ttft_ms"]["p50"], "ttft p99 ms": s["ttft_ms"]["p99"]} for name, s in by_phase.items()]
    print(format_table(rows, ["phase", "requests", "errors", "ttft p50 ms", "ttft p99 ms"]))
    print(format_table(by_load, ["replicas", "load_needs_at_s", "asked_after_s", "ready_after_s"]))
    print("replica starts (asked -> told to listen -> listening, s): "
          + ", ".join(f"{s['cold_start_s']}+{s['listening_after_s']}{' (parked late)' if s['parked_late'] else ''}"
                      for s in starts))
    print(f"hold: {hold_report['carried_in_flight']} requests in flight on average (Little's law) = "
          f"{hold_report['replicas_for_it']} replicas at {SEATS} each; engines' running + waiting mean "
          f"{hold_report['engines_running_waiting_mean']}, max {hold_report['engines_running_waiting_max']}; "
          "reported demand mean "
          f"{hold_report['reported_mean']}, max {hold_report['reported_max']}; replicas asked: "
          f"{hold_report['desired_max']}")
    print(f"scale-up lags (s): {lags} (bound {bound:g}); first scale-down {report['first_scale_down_after_fall_s']} s "
          f"after the load began to fall (window {args.stabilization:g} s); desired direction changes: "
          f"{report['desired_direction_changes']}; scale-downs before the window: {len(early_downs)}; "
          f"longest held request: {report['longest_held_s']} s")
    path = write_json(args.json, report)
    plot_lines(path.with_suffix(".png"), {
        "desired": [(p["t"], p["desired"]) for p in timeline],
        "ready": [point for (t, n), (_, before) in zip(ready, [(0.0, args.start_replicas), *ready], strict=False)
                  for point in ((t, float(before)), (t, float(n)))],  # a staircase
        "demand / target": [(p["t"], p["value"] / SEATS) for p in timeline],
    }, "seconds", "replicas", f"autoscale: 0 -> {args.peak:g}x one replica -> 0")
    print(f"report written to {path} (+ .png)")
    errors = sum(sum(s["errors"].values()) for s in by_phase.values())
    ok = not errors and all(lag <= bound for lag in lags) and not early_downs
    return 0 if ok else 1
