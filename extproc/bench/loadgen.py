"""Open-loop (scheduled arrivals) and closed-loop (fixed concurrency) load generation.

The open loop computes every arrival time up front and sleeps towards each one on the run's timeline, so
a slow wake-up makes the following sends catch up instead of shrinking the offered rate. Arrivals that
find `max_in_flight` requests outstanding are recorded as `dropped` samples, never skipped silently.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from extproc.bench.httpclient import HttpClient, RequestError

__all__ = [
    "DEFAULT_CAPTURE_HEADERS",
    "Progress",
    "RequestSpec",
    "Sample",
    "arrival_offsets",
    "run_closed_loop",
    "run_open_loop",
]

Arrival = Literal["poisson", "fixed"]

DEFAULT_CAPTURE_HEADERS: tuple[str, ...] = (
    "x-sim-replica",
    "x-sim-request",
    "x-gateway-upstream-host",
    "x-gateway-destination-endpoint",
)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    method: str
    path: str
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    stream: bool = False
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    # Closes the connection this long after the send: a client that gives up mid-response.
    abort_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    """One arrival's outcome. `error` is None for an HTTP response below 400 and for deliberate aborts;
    otherwise one of connect, timeout, reset, protocol, http_4xx, http_5xx, dropped, client."""

    index: int
    labels: Mapping[str, str]
    start_s: float
    late_s: float
    status: int = 0
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int = 0
    stream: bool = False
    aborted: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)
    cached_tokens: int | None = None  # prompt tokens the engine read from its prefix cache (usage), if it said
    sent_clock_s: float = 0.0  # time.perf_counter() at the send: CLOCK_MONOTONIC, comparable across processes


@dataclass(frozen=True, slots=True)
class Progress:
    elapsed_s: float
    sent: int
    done: int
    errors: int
    in_flight: int
    rps: float
    late: int = 0
    dropped: int = 0


def arrival_offsets(rate: float, duration_s: float, arrival: Arrival, seed: int) -> list[float]:
    """Send times (seconds from the start) of every arrival in [0, duration_s)."""
    if rate <= 0 or duration_s <= 0:
        return []
    if arrival == "fixed":
        return [i / rate for i in range(math.ceil(rate * duration_s)) if i / rate < duration_s]
    if arrival != "poisson":
        raise ValueError(f"unknown arrival process {arrival!r}")
    rng = np.random.default_rng(seed)
    expected = rate * duration_s
    batch = int(expected + 6 * math.sqrt(expected) + 16)
    times = np.cumsum(rng.exponential(1.0 / rate, batch))
    while times[-1] < duration_s:
        more = np.cumsum(rng.exponential(1.0 / rate, batch)) + times[-1]
        times = np.concatenate([times, more])
    return [float(t) for t in times[times < duration_s]]


class _Run:
    """Counters and samples of one run (created per call; nothing is shared between runs)."""

    def __init__(
        self, host: str, port: int, client: HttpClient, timeout_s: float, capture: tuple[str, ...],
        late_threshold_s: float,
    ) -> None:
        self.host, self.port, self.client = host, port, client
        self.timeout_s = timeout_s
        self.capture = tuple(h.lower() for h in capture)
        self.late_threshold_s = late_threshold_s
        self.t0_ns = time.perf_counter_ns()
        self.samples: list[Sample] = []
        self.sent = self.done = self.errors = self.in_flight = self.late = self.dropped = 0

    def elapsed_s(self) -> float:
        return (time.perf_counter_ns() - self.t0_ns) / 1e9

    def drop(self, index: int, spec: RequestSpec, late_s: float) -> None:
        self.dropped += 1
        self.errors += 1
        self.samples.append(
            Sample(index, spec.labels, self.elapsed_s(), late_s, error="dropped", stream=spec.stream)
        )

    async def send(self, index: int, spec: RequestSpec, late_s: float) -> None:
        self.sent += 1
        self.in_flight += 1
        if late_s > self.late_threshold_s:
            self.late += 1
        start_ns = time.perf_counter_ns()
        start_s = (start_ns - self.t0_ns) / 1e9
        try:
            resp = await self.client.request(
                spec.method, self.host, self.port, spec.path, spec.headers, spec.body,
                timeout_s=self.timeout_s, abort_after_s=spec.abort_after_s,
            )
        except RequestError as exc:
            sample = Sample(
                index, spec.labels, start_s, late_s, error=exc.kind,
                e2e_s=(time.perf_counter_ns() - start_ns) / 1e9, stream=spec.stream,
            )
        except Exception as exc:  # a client bug must show up as a counted error, not a lost sample
            sample = Sample(
                index, spec.labels, start_s, late_s, error=f"client:{type(exc).__name__}",
                e2e_s=(time.perf_counter_ns() - start_ns) / 1e9, stream=spec.stream,
            )
        else:
            error = None
            if resp.status >= 500:
                error = "http_5xx"
            elif resp.status >= 400:
                error = "http_4xx"
            sample = Sample(
                index, spec.labels, start_s, late_s, resp.status, error, resp.ttft_s, resp.e2e_s,
                resp.prompt_tokens, resp.completion_tokens, resp.chunks, spec.stream, resp.aborted,
                {h: resp.headers[h] for h in self.capture if h in resp.headers}, resp.cached_tokens,
                start_ns / 1e9,
            )
        finally:
            self.in_flight -= 1
            self.done += 1
        if sample.error is not None:
            self.errors += 1
        self.samples.append(sample)

    def progress(self, rps: float) -> Progress:
        return Progress(
            self.elapsed_s(), self.sent, self.done, self.errors, self.in_flight, rps, self.late, self.dropped
        )

    async def report_progress(self, callback: Callable[[Progress], None], interval_s: float) -> None:
        last_done, last_t = 0, self.elapsed_s()
        while True:
            await asyncio.sleep(interval_s)
            now = self.elapsed_s()
            rps = (self.done - last_done) / (now - last_t) if now > last_t else 0.0
            last_done, last_t = self.done, now
            callback(self.progress(rps))

    def final_progress(self, callback: Callable[[Progress], None] | None) -> None:
        if callback is not None:
            elapsed = self.elapsed_s()
            callback(self.progress(self.done / elapsed if elapsed > 0 else 0.0))


async def _drive(
    run: _Run, owned: bool, body: Callable[[], Awaitable[None]],
    progress: Callable[[Progress], None] | None, interval_s: float,
) -> list[Sample]:
    reporter = (
        asyncio.create_task(run.report_progress(progress, interval_s)) if progress is not None else None
    )
    # What exists before the run (the workload, earlier runs' samples) is out of the collector's sight meanwhile:
    # a full collection walking it stopped the client's reading for 50-80 ms, a tail that is not the system's.
    gc.freeze()
    try:
        await body()
    finally:
        gc.unfreeze()
        if reporter is not None:
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
        if owned:
            await run.client.close()
    run.final_progress(progress)
    run.samples.sort(key=lambda s: s.index)
    return run.samples


async def run_open_loop(
    target_host: str, target_port: int, next_spec: Callable[[int], RequestSpec], *,
    rate: float, duration_s: float, arrival: Arrival = "poisson", seed: int = 0,
    max_in_flight: int = 1024, timeout_s: float = 30.0,
    progress: Callable[[Progress], None] | None = None, progress_interval_s: float = 1.0,
    client: HttpClient | None = None, capture_headers: tuple[str, ...] = DEFAULT_CAPTURE_HEADERS,
    late_threshold_s: float = 0.01,
) -> list[Sample]:
    """Offer `rate` requests/s for `duration_s`, then wait for outstanding requests (bounded by timeout_s).

    Returns one Sample per scheduled arrival, ordered by arrival index.
    """
    offsets = arrival_offsets(rate, duration_s, arrival, seed)
    run = _Run(target_host, target_port, client or HttpClient(), timeout_s, capture_headers, late_threshold_s)
    tasks: set[asyncio.Task[None]] = set()

    async def dispatch() -> None:
        t0 = run.t0_ns / 1e9  # perf_counter_ns and perf_counter share one clock
        try:
            for index, offset in enumerate(offsets):
                delay = t0 + offset - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif index % 16 == 0:
                    await asyncio.sleep(0)  # while catching up, still let responses be read
                late_s = max(0.0, time.perf_counter() - t0 - offset)
                spec = next_spec(index)
                if run.in_flight >= max_in_flight:
                    run.drop(index, spec, late_s)
                    continue
                task = asyncio.create_task(run.send(index, spec, late_s))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            remaining = t0 + duration_s - time.perf_counter()
            if remaining > 0:
                await asyncio.sleep(remaining)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    return await _drive(run, client is None, dispatch, progress, progress_interval_s)


async def run_closed_loop(
    target_host: str, target_port: int, next_spec: Callable[[int], RequestSpec], *,
    concurrency: int, duration_s: float, timeout_s: float = 30.0,
    progress: Callable[[Progress], None] | None = None, progress_interval_s: float = 1.0,
    client: HttpClient | None = None, capture_headers: tuple[str, ...] = DEFAULT_CAPTURE_HEADERS,
) -> list[Sample]:
    """`concurrency` workers each send the next request as soon as the previous one finishes.

    No request starts after `duration_s`; requests already started are allowed to finish.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    run = _Run(target_host, target_port, client or HttpClient(), timeout_s, capture_headers, math.inf)
    counter = itertools.count()
    deadline = time.perf_counter() + duration_s

    async def worker() -> None:
        while time.perf_counter() < deadline:
            index = next(counter)
            await run.send(index, next_spec(index), 0.0)

    async def workers() -> None:
        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(concurrency):
                    group.create_task(worker())
        except BaseExceptionGroup as failed:  # surface the cause (e.g. a next_spec bug) itself
            raise failed.exceptions[0] from None

    return await _drive(run, client is None, workers, progress, progress_interval_s)
