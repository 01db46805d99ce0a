"""SIGTERM one of two service replicas while long streams it routed are in flight.

It reports NOT_SERVING and keeps serving for `--drain-delay` (Envoy's health check moves new streams to
the other replica meanwhile), then stops taking streams and gives the in-flight ones `--grace`. Its
streams finish normally ([DONE]) - they outlive the drain delay, so they really are drained - and it
exits 0 within drain delay + grace; clients see no error at all. The scenario runs once (module
fixture); the tests check different parts of its outcome.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from extproc.bench.loadgen import Sample, run_open_loop
from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack
from tests.chaos.conftest import FAST, assert_no_leaked_in_flight, chat_body, chat_spec, debug_pools, launch_stack
from tests.support import LoadProgress, eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

POOL = SimPool("chat", "org/chat", 2, aliases=("chat",))
DRAIN_DELAY_S = 3.0  # the product default, explicit here because the timing below depends on it
GRACE_S = 6.0
STREAMS = 6
# 1024 tokens at the fast profile's 2 ms x 2 (slow factor): ~5 s, longer than the drain delay.
SIM_ARGS = (*FAST, "--slow-factor", "2")


@dataclass
class Outcome:
    stack: Stack
    streams: list[tuple[int, bool, float]] = field(default_factory=list)  # (status, [DONE], ended after SIGTERM)
    drained_in_flight: int = 0  # leases the terminated replica held when it got SIGTERM
    exit_code: int | None = None
    exit_s: float = 0.0
    samples: list[Sample] = field(default_factory=list)


async def stream(http: aiohttp.ClientSession, stack: Stack, index: int,
                 clock: list[float]) -> tuple[int, bool, float]:
    body = chat_body("chat", f"tell me a long story {index}", max_tokens=1024, stream=True, ignore_eos=True)
    async with http.post(f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions", json=body) as response:
        try:
            raw = await response.read()
            done = raw.rstrip().endswith(b"data: [DONE]")
        except aiohttp.ClientPayloadError:
            done = False
        return response.status, done, time.monotonic() - clock[0]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def outcome(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Outcome]:
    workdir: Path = tmp_path_factory.mktemp("drain")
    async with ProcessGroup(workdir / "logs") as group:
        stack = await launch_stack(group, workdir, [POOL], service_replicas=2, grace_s=GRACE_S,
                                   drain_delay_s=DRAIN_DELAY_S, sim_args=SIM_ARGS)
        result = Outcome(stack)
        draining = stack.children["service"]
        terminated = [0.0]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            streams = [asyncio.create_task(stream(http, stack, i, terminated)) for i in range(STREAMS)]

            async def all_routed() -> bool:  # every stream holds a lease on one of the two replicas
                leases = [sum(e["in_flight"] for e in (await debug_pools(http, url))["chat"])
                          for url in stack.admin_urls]
                assert sum(leases) == STREAMS, leases
                return True

            await eventually(all_routed, f"{STREAMS} streams routed")
            progress = LoadProgress()
            load = asyncio.create_task(run_open_loop("127.0.0.1", stack.envoy_port, chat_spec("chat"), rate=20,
                                                     duration_s=6, arrival="fixed", timeout_s=10, progress=progress,
                                                     progress_interval_s=0.05))
            await progress.answered(3)  # new requests flowing before the SIGTERM
            result.drained_in_flight = sum(e["in_flight"] for e in (await debug_pools(http, stack.admin_url))["chat"])
            draining.send_signal(signal.SIGTERM)
            terminated[0] = time.monotonic()
            try:
                result.exit_code = await asyncio.wait_for(draining.process.wait(), DRAIN_DELAY_S + GRACE_S + 5)
            except TimeoutError:
                result.exit_code = None
            result.exit_s = time.monotonic() - terminated[0]
            result.streams = list(await asyncio.gather(*streams))
            result.samples = await load
        yield result


async def test_in_flight_streams_finish_and_the_process_exits_0_within_grace(outcome: Outcome) -> None:
    assert outcome.drained_in_flight >= 1  # the terminated replica really had streams to drain
    assert [(status, done) for status, done, _ in outcome.streams] == [(200, True)] * STREAMS
    assert min(ended for _, _, ended in outcome.streams) > DRAIN_DELAY_S  # they ran into the grace period
    assert outcome.exit_code == 0
    assert outcome.exit_s <= DRAIN_DELAY_S + GRACE_S + 1.0  # the behaviour: the drain is bounded (1 s margin)
    async with aiohttp.ClientSession() as http:
        await assert_no_leaked_in_flight(http, outcome.stack.admin_urls[1:])


async def test_other_replica_takes_new_requests_so_clients_see_no_error(outcome: Outcome) -> None:
    assert len(outcome.samples) == 120
    errors = [(round(s.start_s, 2), s.status, s.error) for s in outcome.samples if s.error is not None]
    assert errors == [], errors[:5]
