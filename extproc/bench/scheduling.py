"""`extproc bench scheduling`: CPU cost of one routing decision inside the service (no network).

Measures the whole body phase (JSON parse, prefix hashing, scheduling over N endpoints with live
metrics, route building) and, separately, the scheduling stage alone (candidates, the profile, the route), for a
few prompt sizes; then the body phase of
a hostile request (issue 14): 3.5 MB of 100,000 tiny chat messages, which the service must refuse cheaply.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

from prometheus_client import CollectorRegistry

from extproc.bench.report import format_table, write_json
from extproc.config import parse_policy
from extproc.endpoints import EndpointMetrics
from extproc.gateway import BodyPhase, Decision, Gateway, RequestHead, RuntimeHolder, build_gateway
from extproc.telemetry import GatewayMetrics

_WORDS = ("gpu", "token", "cache", "prefix", "stream", "latency", "envoy", "router", "batch", "model")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoints", type=int, default=8, help="endpoints in the pool (default 8)")
    parser.add_argument("--iterations", type=int, default=2000, help="decisions per case (default 2000)")
    parser.add_argument("--profile", default="default", help="scheduling profile (default 'default')")
    parser.add_argument("--max-candidates", type=int, default=None,
                        help="the policy's scheduling.max_candidates (default: the schema's)")
    parser.add_argument("--json", metavar="FILE", default="reports/scheduling.json", help="report path")


def _prompt(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:chars]


def _percentiles(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6, 1)

    return {"p50_us": at(0.50), "p99_us": at(0.99), "max_us": round(ordered[-1] * 1e6, 1)}


def _gateway(policy_json: dict[str, Any]) -> tuple[Gateway, RuntimeHolder]:
    runtimes = RuntimeHolder(parse_policy(json.dumps(policy_json)))
    return build_gateway(runtimes, GatewayMetrics(CollectorRegistry())).gateway, runtimes


def _decide(phase: BodyPhase) -> Decision:
    """Run a body phase that needs no store and no queue (no limits; flow control finds room) to its end."""
    try:
        waited = next(phase)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise RuntimeError(f"the benchmark's decision waited on {waited!r}")


def run_case(endpoints: int, iterations: int, profile: str, prompt_chars: int,
             max_candidates: int | None = None) -> dict[str, Any]:
    addresses = [f"10.0.{i // 250}.{i % 250 + 1}:8000" for i in range(endpoints)]
    policy: dict[str, Any] = {"pools": [{"name": "p", "model": "m", "profile": profile, "endpoints": addresses}]}
    if max_candidates is not None:
        policy["scheduling"] = {"max_candidates": max_candidates}
    gateway, runtimes = _gateway(policy)
    runtime = runtimes.current
    pool = runtime.pools["p"]
    rng = random.Random(prompt_chars)
    now = time.monotonic()
    for endpoint in pool.endpoints:
        endpoint.scraped(EndpointMetrics(scraped_at=now + 3600, running=rng.randint(0, 16),
                                         waiting=rng.randint(0, 4), kv_usage=rng.random()), 0,
                         runtime.policy.saturation)
    systems = [_prompt(rng, prompt_chars) for _ in range(8)]
    bodies = [json.dumps({"model": "m", "max_tokens": 64, "messages": [
        {"role": "system", "content": systems[i % 8]}, {"role": "user", "content": f"question {i}"}]}).encode()
        for i in range(64)]
    head = RequestHead("POST", "/v1/chat/completions", {})
    full: list[float] = []
    scheduling: list[float] = []
    schedule = gateway.stages.schedule
    for i in range(iterations):
        body = bodies[i % len(bodies)]
        exchange, _ = gateway.headers(head)
        started = time.thread_time()  # CPU time: other processes on a shared machine do not count
        _decide(gateway.body(exchange, body))
        full.append(time.thread_time() - started)
        gateway.finish(exchange)
        assert exchange.caller is not None and exchange.resolved is not None
        started = time.thread_time()
        routed = schedule(exchange.caller, exchange.resolved, None)  # the stage: sample, health, profile, route
        scheduling.append(time.thread_time() - started)
        for lease in routed.leases:
            lease.release()
    return {"prompt_chars": prompt_chars, "approx_tokens": prompt_chars // 4, "body_phase": _percentiles(full),
            "scheduling_only": _percentiles(scheduling)}


def run_hostile(endpoints: int, iterations: int = 20, messages: int = 100_000) -> dict[str, Any]:
    """CPU time of the body phase for a body of `messages` tiny messages (the gateway's own bounds apply)."""
    addresses = [f"10.0.{i // 250}.{i % 250 + 1}:8000" for i in range(endpoints)]
    gateway, _ = _gateway({"pools": [{"name": "p", "model": "m", "endpoints": addresses}]})
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}] * messages}).encode()
    head = RequestHead("POST", "/v1/chat/completions", {})
    spent: list[float] = []
    status = 0
    for _ in range(iterations):
        exchange, _ = gateway.headers(head)
        started = time.thread_time()
        decision = _decide(gateway.body(exchange, body))
        spent.append(time.thread_time() - started)
        status = getattr(decision, "status", 200)
        gateway.finish(exchange)
    spent.sort()
    return {"bytes": len(body), "messages": messages, "iterations": iterations, "status": status,
            "p50_ms": round(spent[len(spent) // 2] * 1000, 1)}


def run_scheduling(args: argparse.Namespace) -> int:
    cases = [run_case(args.endpoints, args.iterations, args.profile, chars, args.max_candidates)
             for chars in (400, 16_000, 200_000)]
    rows = [{"prompt": f"{c['prompt_chars'] // 1000 or c['prompt_chars']}{'KB' if c['prompt_chars'] >= 1000 else 'B'}"
                       f" (~{c['approx_tokens']} tok)",
             "body p50 us": c["body_phase"]["p50_us"], "body p99 us": c["body_phase"]["p99_us"],
             "sched p50 us": c["scheduling_only"]["p50_us"], "sched p99 us": c["scheduling_only"]["p99_us"]}
            for c in cases]
    print(format_table(rows, ["prompt", "body p50 us", "body p99 us", "sched p50 us", "sched p99 us"]))
    hostile = run_hostile(args.endpoints)
    print(f"hostile body ({hostile['bytes'] / 1e6:.1f} MB, {hostile['messages']} messages): answered "
          f"{hostile['status']} in {hostile['p50_ms']} ms (p50 of {hostile['iterations']}, CPU time)")
    report = {"endpoints": args.endpoints, "profile": args.profile, "max_candidates": args.max_candidates,
              "iterations": args.iterations,
              "tokenizer": "character estimate (no tokenizer file)", "cases": cases, "hostile": hostile}
    path = write_json(args.json, report)
    print(f"report written to {path}", file=sys.stderr)
    return 0
