"""The load generator against a local HTTP server: schedules, drops, error kinds, aborts, closed loops.

An open-loop generator's subject is time (arrivals at fixed offsets for a duration), so these tests keep their
durations short and their bounds generous; the server never answers "later" but on a fact (see conftest)."""

from __future__ import annotations

import socket

import pytest

from extproc.bench.loadgen import (
    Progress,
    RequestSpec,
    arrival_offsets,
    run_closed_loop,
    run_open_loop,
)
from extproc.bench.stats import summarize
from tests.support import block_event_loop

from .conftest import Server

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"


def _get(path: str, **labels: str) -> RequestSpec:
    return RequestSpec("GET", path, labels=labels)


async def test_open_loop_fixed_sends_expected_count(server: Server) -> None:
    seen: list[int] = []

    def next_spec(i: int) -> RequestSpec:
        seen.append(i)
        return _get("/json", model="m-a" if i % 2 else "m-b")

    samples = await run_open_loop(
        HOST, server.port, next_spec, rate=50, duration_s=0.4, arrival="fixed", seed=0,
        max_in_flight=100, timeout_s=2,
    )
    assert abs(len(samples) - 20) <= 1
    assert server.state.requests == len(samples)
    assert seen == list(range(len(samples)))
    assert [s.index for s in samples] == seen
    assert all(s.error is None and s.status == 200 for s in samples)
    assert samples[1].labels == {"model": "m-a"}
    assert samples[0].headers == {"x-sim-replica": "r1"}
    assert (samples[0].prompt_tokens, samples[0].completion_tokens) == (7, 3)
    starts = [s.start_s for s in samples]
    # Sent on schedule (the schedule is the behaviour): the last arrival is due at 0.38 s.
    assert starts == sorted(starts) and starts[-1] < 0.4 + 0.1


async def test_open_loop_poisson_matches_schedule(server: Server) -> None:
    expected = len(arrival_offsets(60, 0.3, "poisson", seed=42))
    counts = []
    for _ in range(2):
        samples = await run_open_loop(
            HOST, server.port, lambda i: _get("/json"), rate=60, duration_s=0.3, arrival="poisson", seed=42,
            max_in_flight=100, timeout_s=2,
        )
        counts.append(len(samples))
    assert counts == [expected, expected]


async def test_open_loop_records_dropped_arrivals_and_reports_progress(server: Server) -> None:
    reports: list[Progress] = []

    def progress(report: Progress) -> None:
        reports.append(report)
        if report.dropped == 8:  # every arrival past the first two found both slots taken: let those two end
            server.state.release.set()

    samples = await run_open_loop(
        HOST, server.port, lambda i: _get("/hang"), rate=40, duration_s=0.25, arrival="fixed",
        seed=0, max_in_flight=2, timeout_s=5, progress=progress, progress_interval_s=0.1,
    )
    assert len(samples) == 10
    dropped = [s for s in samples if s.error == "dropped"]
    assert len(dropped) == 8
    assert server.state.max_in_flight == 2
    assert len(reports) >= 3
    final = reports[-1]
    assert (final.sent, final.done, final.dropped, final.in_flight) == (2, 2, 8, 0)
    assert final.errors == 8


async def test_error_kinds_are_classified(server: Server) -> None:
    specs = [_get("/status/503"), _get("/status/429"), _get("/hang"), _get("/json")]
    samples = await run_open_loop(
        HOST, server.port, lambda i: specs[i], rate=40, duration_s=0.1, arrival="fixed", seed=0,
        max_in_flight=10, timeout_s=0.2,
    )
    assert [s.error for s in samples] == ["http_5xx", "http_4xx", "timeout", None]
    assert [s.status for s in samples] == [503, 429, 0, 200]

    with socket.socket() as sock:
        sock.bind((HOST, 0))
        closed_port = sock.getsockname()[1]
    samples = await run_open_loop(
        HOST, closed_port, lambda i: _get("/"), rate=20, duration_s=0.1, arrival="fixed", seed=0,
        max_in_flight=10, timeout_s=0.5,
    )
    assert [s.error for s in samples] == ["connect", "connect"]


async def test_aborting_spec_is_marked_aborted_not_error(server: Server) -> None:
    spec = RequestSpec("GET", "/sse?n=50&hang_after=2", stream=True, abort_after_s=0.1)
    samples = await run_open_loop(
        HOST, server.port, lambda i: spec, rate=10, duration_s=0.1, arrival="fixed", seed=0,
        max_in_flight=10, timeout_s=2,
    )
    assert len(samples) == 1
    assert samples[0].aborted and samples[0].error is None and samples[0].stream
    assert samples[0].chunks == 2  # what arrived before the stream stalled


async def test_closed_loop_respects_concurrency(server: Server) -> None:
    samples = await run_closed_loop(
        HOST, server.port, lambda i: _get("/json?together=3"), concurrency=3, duration_s=0.3, timeout_s=30,
    )
    # Errors first: a request that timed out (a starved machine) discards its connection and the worker opens
    # a fourth, which would otherwise surface as a confusing connection count. The generous timeout keeps
    # that from happening: the server answers on a fact (three in flight together), not after a delay.
    assert all(s.error is None for s in samples)
    assert len(samples) > 6
    assert server.state.max_in_flight == 3
    assert len(server.state.peers) == 3  # each worker keeps its keep-alive connection
    assert sorted(s.index for s in samples) == list(range(len(samples)))
    assert max(s.start_s for s in samples) < 0.3 + 0.05  # nothing starts after the duration (a bound in time)


async def test_closed_loop_propagates_spec_errors(server: Server) -> None:
    def next_spec(i: int) -> RequestSpec:
        if i == 5:
            raise RuntimeError("bad spec")
        return _get("/json")

    with pytest.raises(RuntimeError, match="bad spec"):
        await run_closed_loop(HOST, server.port, next_spec, concurrency=2, duration_s=1.0)


async def test_open_loop_catches_up_after_a_stall_instead_of_shrinking_rate(server: Server) -> None:
    def next_spec(i: int) -> RequestSpec:
        if i == 0:
            # Arrivals 1..9 become due during the stall and must be sent late, not skipped.
            block_event_loop(0.1)  # the stall under test
        return _get("/json")

    reports: list[Progress] = []
    samples = await run_open_loop(
        HOST, server.port, next_spec, rate=100, duration_s=0.2, arrival="fixed", seed=0,
        max_in_flight=100, timeout_s=2, progress=reports.append,
    )
    assert len(samples) == 20 and all(s.error is None for s in samples)
    late = [s.index for s in samples if s.late_s > 0.01]
    assert late[:5] == [1, 2, 3, 4, 5]
    assert reports[-1].late == len(late)
    assert summarize(samples)["late"] == len(late)
