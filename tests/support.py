"""Helpers shared by tests: waiting on facts (`eventually`, `holds_for`, the admin endpoints, load-generator
replies), a stepped `sleep` for background loops, stacks of real processes, and limits-store shorthands.

Tests wait for what they need to be true (a counter, an endpoint state, a file), never for an amount of time:
`eventually` polls a check until it holds and fails naming what was awaited. The one poll interval below is
the only place a test lets time pass while waiting.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import yaml

from extproc.bench.loadgen import Progress, RequestSpec, Sample, run_open_loop
from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack, free_ports, prepare, start_envoy, start_service, start_sim
from extproc.config import parse_policy
from extproc.limits.types import (
    AdmitRequest,
    AdmitResult,
    ConcurrencyLimit,
    LimitState,
    RateLimit,
    Reservation,
    TokenBudget,
)
from extproc.xds import find_envoy, write_config

FAST = ("--profile", "fast")  # the simulator's quick profile: tests need its behaviour, not a GPU's timing

T = TypeVar("T")
POLL_INTERVAL_S = 0.02


async def _pause(interval_s: float) -> None:
    await asyncio.sleep(interval_s)  # the poll interval of eventually/holds_for: a fact is checked after it


async def _checked(check: Callable[[], T | Awaitable[T]]) -> T:
    value = check()
    if inspect.isawaitable(value):
        return await value  # type: ignore[no-any-return]
    return value


async def eventually(check: Callable[[], T | Awaitable[T]], what: str, *, timeout_s: float = 5.0,
                     interval_s: float = POLL_INTERVAL_S) -> T:
    """Poll `check` (a plain or async function) until it returns a truthy value, and return that value.

    An AssertionError raised by `check` counts as "not yet", so a check can assert with a useful message.
    After `timeout_s` the test fails naming `what` was awaited and the last value or assertion seen.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        last: object
        try:
            value = await _checked(check)
        except AssertionError as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}; last: {last!r}")
        await _pause(interval_s)


async def holds_for(check: Callable[[], object], what: str, duration_s: float, *,
                    interval_s: float = POLL_INTERVAL_S) -> int:
    """Check that `check` stays truthy for `duration_s`, polling; fails at the first falsy value or assertion.

    Only for behaviour whose length in time is the point (an ejection period, a hold): returns the number
    of checks made.
    """
    deadline = time.monotonic() + duration_s
    checks = 0
    while True:
        value = await _checked(check)
        checks += 1
        assert value, f"{what} stopped holding at check {checks}: {value!r}"
        if time.monotonic() >= deadline:
            return checks
        await _pause(interval_s)


def wait_until(check: Callable[[], object], what: str, *, timeout_s: float,
               interval_s: float = POLL_INTERVAL_S) -> None:
    """`eventually` for synchronous set-up code (fixtures starting servers): poll `check` until it is truthy."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)  # the poll interval of a synchronous wait for a fact


# -- time as the behaviour under test ---------------------------------------------------------------------------
def block_event_loop(seconds: float) -> None:
    """Stall the whole process for `seconds` (a long callback, a descheduled process): the fault under test."""
    time.sleep(seconds)  # the behaviour: nothing else runs meanwhile


async def arrive_after(delay_s: float) -> None:
    """One request of a burst arriving `delay_s` after the burst starts, as bursts come through Envoy."""
    await asyncio.sleep(delay_s)  # the behaviour: arrivals spread over time


# -- the service's admin endpoints ----------------------------------------------------------------------------
async def admin_json(http: aiohttp.ClientSession, admin_url: str, path: str) -> Any:
    async with http.get(f"{admin_url}{path}") as response:
        assert response.status == 200, f"GET {path}: HTTP {response.status}"
        return await response.json()


async def debug_pools(http: aiohttp.ClientSession, admin_url: str) -> dict[str, list[dict[str, Any]]]:
    """/debug/pools: every pool's endpoints as the service sees them (in_flight, picked_total, breaker...)."""
    pools: dict[str, list[dict[str, Any]]] = (await admin_json(http, admin_url, "/debug/pools"))["pools"]
    return pools


async def pool_endpoint(http: aiohttp.ClientSession, admin_url: str, pool: str, address: str) -> dict[str, Any]:
    return next(e for e in (await debug_pools(http, admin_url))[pool] if e["address"] == address)


async def debug_flow(http: aiohttp.ClientSession, admin_url: str, pool: str) -> dict[str, Any]:
    """/debug/flow of one pool: queued per class, per-class counters, pending grants ({} before any use)."""
    stats: dict[str, Any] = (await admin_json(http, admin_url, "/debug/flow"))["pools"].get(pool, {})
    return stats


async def metric_value(http: aiohttp.ClientSession, admin_url: str, name: str, labels: str = "") -> float:
    """Sum of the samples of `name` whose label text contains `labels` (Prometheus text format)."""
    async with http.get(f"{admin_url}/metrics") as response:
        text = await response.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {") and labels in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def wait_metric(http: aiohttp.ClientSession, admin_url: str, name: str, labels: str = "", *,
                      above: float, timeout_s: float = 5.0) -> float:
    """Wait until `metric_value(name, labels)` exceeds `above`; returns the value."""
    async def grown() -> tuple[float]:
        value = await metric_value(http, admin_url, name, labels)
        assert value > above, f"{name}{{{labels}}} = {value:g}"
        return (value,)  # truthy whatever the value

    (value,) = await eventually(grown, f"{name}{{{labels}}} > {above:g}", timeout_s=timeout_s)
    return value


class LoadProgress:
    """A `progress` callback for the load generator that keeps the latest report, so a test waits for "N
    requests answered" rather than for the seconds they take. Pass `progress_interval_s` small (0.05)."""

    def __init__(self) -> None:
        self.latest: Progress | None = None

    def __call__(self, report: Progress) -> None:
        self.latest = report

    @property
    def done(self) -> int:
        return 0 if self.latest is None else self.latest.done

    async def answered(self, count: int, timeout_s: float = 10.0) -> None:
        def enough() -> bool:
            assert self.done >= count, f"{self.done} answered"
            return True

        await eventually(enough, f"{count} replies to the load generator", timeout_s=timeout_s)


# -- injected sleeps for background loops (extproc.aio.Sleep) ----------------------------------------------------
class SteppedSleep:
    """An injected `sleep` that parks every caller until the test calls `step()`: a background loop under test
    runs one round per step and no real time passes. `delays` records the durations the loop asked for."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self._parked: list[asyncio.Future[None]] = []
        self._changed = asyncio.Condition()

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._parked.append(wake)
        async with self._changed:
            self._changed.notify_all()
        try:
            await wake
        finally:
            if wake in self._parked:  # cancelled while parked
                self._parked.remove(wake)

    @property
    def parked(self) -> int:
        return len(self._parked)

    async def wait_parked(self, count: int = 1, timeout_s: float = 5.0) -> None:
        """Wait until `count` loops are parked in this sleep (each has finished the round it was on)."""
        try:
            async with asyncio.timeout(timeout_s), self._changed:
                await self._changed.wait_for(lambda: len(self._parked) >= count)
        except TimeoutError:
            raise AssertionError(
                f"{len(self._parked)} of {count} loops reached their sleep in {timeout_s:g} s") from None

    async def step(self, timeout_s: float = 5.0) -> None:
        """Wake every parked loop and wait until each is parked again: one full round each."""
        await self.wait_parked(1, timeout_s)
        woken, self._parked = self._parked, []
        for wake in woken:
            wake.set_result(None)
        await self.wait_parked(len(woken), timeout_s)


# -- limits-store shorthands and the Envoy binary ---------------------------------------------------------------
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


# -- stacks of real processes (simulator, service, Envoy) -------------------------------------------------------
async def launch_stack(
    group: ProcessGroup, workdir: Path, pools: Sequence[SimPool], *,
    envoy: Mapping[str, Any] | None = None, extra_policy: Mapping[str, Any] | None = None,
    patch: Callable[[dict[str, Any]], None] | None = None, service_replicas: int = 1,
    grace_s: float | None = None, drain_delay_s: float = 0.0, sim_args: Sequence[str] = FAST,
) -> Stack:
    """`extproc.bench.stack.launch` for tests: a hook to edit the policy document (e.g. per-pool keys such as
    `backup_pool`, which `SimPool` cannot express), the drain settings of the service replicas (no drain delay
    unless asked: see `extproc.bench.stack.start_service`), and the simulator's fast profile by default."""
    stack = prepare(workdir, pools, envoy=envoy, extra_policy=extra_policy, service_replicas=service_replicas)
    if patch is not None:
        document = yaml.safe_load(stack.policy_path.read_text())
        patch(document)
        stack.policy_path.write_text(yaml.safe_dump(document, sort_keys=False))
        stack.policy = parse_policy(stack.policy_path.read_text(), str(stack.policy_path))
        write_config(stack.policy, stack.envoy_dir)
    stack.children["sim"] = await start_sim(group, workdir, pools, stack.sim_ports, sim_args)
    for index in range(service_replicas):
        child = await start_service(group, stack, index, grace_s=grace_s, drain_delay_s=drain_delay_s)
        stack.children[child.name] = child
    stack.children["envoy"] = await start_envoy(group, stack)
    return stack


@dataclass
class Outage:
    """What `kill_and_restart` saw, on the load generator's timeline (seconds from its start)."""

    samples: list[Sample]
    killed_s: float  # SIGKILL sent
    back_s: float  # the restarted service answered /readyz


async def kill_and_restart(group: ProcessGroup, stack: Stack) -> Outage:
    """30 req/s for 6 s to pool `main` (served name org/main); our service is SIGKILLed once 45 requests have
    been answered (~1.5 s) and started again once 60 more have been answered without it (~2 s), and the load goes
    on until 10 requests sent after the restart were answered (or 10 s more). Every request
    also tries to steer itself to pool `spare` by our routing headers."""
    spare_endpoint = f"127.0.0.1:{stack.sim_ports['spare'][0]}"

    def spec(index: int) -> RequestSpec:
        # The served name: while bypassed nobody rewrites aliases (list them in vLLM --served-model-name).
        body = {"model": "org/main", "messages": [{"role": "user", "content": f"q{index}"}], "max_tokens": 4}
        headers = (("content-type", "application/json"), ("x-gateway-pool", "spare"),
                   ("x-gateway-destination-endpoint", spare_endpoint))
        return RequestSpec("POST", "/v1/chat/completions", headers, json.dumps(body).encode())

    progress = LoadProgress()
    started = time.monotonic()
    load = asyncio.create_task(run_open_loop("127.0.0.1", stack.envoy_port, spec, rate=30, duration_s=6,
                                             arrival="fixed", timeout_s=10, progress=progress,
                                             progress_interval_s=0.05))
    await progress.answered(45)
    stack.children["service"].send_signal(9)  # SIGKILL: no drain, like a crash
    killed_s = time.monotonic() - started
    await progress.answered(progress.done + 60)
    stack.children["service"] = await start_service(group, stack)
    back_s = time.monotonic() - started
    samples = await load
    # On a starved machine the restart can outlast the 6 s: 1 s more at a time (at most 10) until 10 requests
    # that arrived after the restart were answered, on the same timeline.
    for _ in range(10):
        if sum(1 for s in samples if s.start_s > back_s and s.status == 200) >= 10:
            break
        offset = time.monotonic() - started
        more = await run_open_loop("127.0.0.1", stack.envoy_port, spec, rate=30, duration_s=1, arrival="fixed",
                                   timeout_s=10)
        samples += [replace(s, start_s=s.start_s + offset) for s in more]
    return Outage(samples, killed_s, back_s)


__all__ = ["FAST", "LoadProgress", "Outage", "SteppedSleep", "admin_json", "arrive_after", "block_event_loop",
           "debug_flow", "debug_pools", "envoy_binary", "eventually", "free_ports", "held", "holds_for",
           "kill_and_restart", "launch_stack", "metric_value", "pool_endpoint", "req", "state",
           "wait_metric", "wait_until"]
