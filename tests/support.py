"""Helpers shared by tests."""

from __future__ import annotations

import asyncio
import json

from extproc.bench.loadgen import RequestSpec, Sample, run_open_loop
from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import Stack, free_ports, start_service
from extproc.limits.types import (
    AdmitRequest,
    AdmitResult,
    ConcurrencyLimit,
    LimitState,
    RateLimit,
    Reservation,
    TokenBudget,
)
from extproc.xds import find_envoy


def envoy_binary() -> str:
    return find_envoy()


def req(rid: str, at: float, tokens: int = 0, rates: tuple[RateLimit, ...] = (),
        conc: tuple[ConcurrencyLimit, ...] = (), budgets: tuple[TokenBudget, ...] = ()) -> AdmitRequest:
    """A limits admission request, for the store tests."""
    return AdmitRequest(rid, at, tokens, rates=rates, concurrency=conc, budgets=budgets)


def held(request: AdmitRequest) -> Reservation:
    return Reservation.of(request)


def state(result: AdmitResult, name: str) -> LimitState:
    """The state of dimension `name` in an admission result."""
    return next(s for s in result.states if s.name == name)


async def kill_and_restart(group: ProcessGroup, stack: Stack) -> list[Sample]:
    """30 req/s for 6 s to pool `main` (served name org/main) while our service is SIGKILLed at 1.5 s and
    started again at 3.5 s. Every request also tries to steer itself to pool `spare` by our routing headers."""
    spare_endpoint = f"127.0.0.1:{stack.sim_ports['spare'][0]}"

    def spec(index: int) -> RequestSpec:
        # The served name: while bypassed nobody rewrites aliases (list them in vLLM --served-model-name).
        body = {"model": "org/main", "messages": [{"role": "user", "content": f"q{index}"}], "max_tokens": 4}
        headers = (("content-type", "application/json"), ("x-gateway-pool", "spare"),
                   ("x-gateway-destination-endpoint", spare_endpoint))
        return RequestSpec("POST", "/v1/chat/completions", headers, json.dumps(body).encode())

    load = asyncio.create_task(run_open_loop("127.0.0.1", stack.envoy_port, spec, rate=30, duration_s=6,
                                             arrival="fixed", timeout_s=10))
    await asyncio.sleep(1.5)
    stack.children["service"].send_signal(9)  # SIGKILL: no drain, like a crash
    await asyncio.sleep(2.0)
    stack.children["service"] = await start_service(group, stack)
    return await load


__all__ = ["envoy_binary", "free_ports", "held", "kill_and_restart", "req", "state"]
