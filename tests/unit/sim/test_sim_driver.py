from __future__ import annotations

import asyncio

import pytest

from extproc.sim.driver import drive
from extproc.sim.engine import Engine, GenRequest, RequestState
from extproc.sim.profile import Profile

PROFILE = Profile(name="t", itl_s=0.010, prefill_overhead_s=0.020, prefill_per_token_s=0.001, max_num_seqs=1,
                  load_factor=0.0, num_gpu_blocks=64, max_model_len=1024)


class VirtualTime:
    """A clock plus a sleep that advances it instantly (fine for one coroutine at a time)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def request(out: int, rid: str = "r") -> GenRequest:
    return GenRequest(rid, list(range(30)), list(range(1000, 1000 + out)), finish_reason="length")


async def test_first_token_alone_then_chunks_of_n_at_itl_pace() -> None:
    vt = VirtualTime()
    eng = Engine(PROFILE, vt.clock)
    emitted: list[tuple[int, int, float]] = []

    async def emit(start: int, count: int) -> None:
        emitted.append((start, count, vt.now))

    req = request(out=10)
    await drive(eng, req, 4, emit, sleep=vt.sleep)
    prefill = 0.020 + 30 * 0.001
    assert [(s, c) for s, c, _ in emitted] == [(0, 1), (1, 4), (5, 4), (9, 1)]
    assert emitted[0][2] == pytest.approx(prefill)
    assert emitted[1][2] == pytest.approx(prefill + 0.040)
    assert emitted[3][2] == pytest.approx(prefill + 0.090)
    assert req.state is RequestState.FINISHED and eng.counters.finished["length"] == 1
    assert eng.kv.used_blocks == 0


async def test_waits_in_queue_until_the_running_request_finishes() -> None:
    loop_clock = asyncio.get_running_loop().time  # real clock, millisecond sleeps
    fast = Profile(name="f", itl_s=0.001, prefill_overhead_s=0.001, prefill_per_token_s=0.0, max_num_seqs=1,
                   num_gpu_blocks=64, max_model_len=1024)
    eng = Engine(fast, loop_clock)
    first, second = request(5, "a"), request(5, "b")
    task_a = asyncio.create_task(drive(eng, first, 1, None))
    task_b = asyncio.create_task(drive(eng, second, 1, None))
    await asyncio.sleep(0)
    assert first.state is RequestState.RUNNING and second.state is RequestState.WAITING
    await asyncio.gather(task_a, task_b)
    assert second.admitted_at >= first.last_token_at
    assert eng.counters.finished["length"] == 2


async def test_emit_failure_aborts_and_frees_blocks() -> None:
    vt = VirtualTime()
    eng = Engine(PROFILE, vt.clock)

    async def emit(start: int, count: int) -> None:
        if start > 0:
            raise ConnectionResetError

    req = request(out=10)
    with pytest.raises(ConnectionResetError):
        await drive(eng, req, 1, emit, sleep=vt.sleep)
    assert eng.counters.finished["abort"] == 1 and eng.kv.used_blocks == 0 and not eng.running


async def test_cancelled_while_waiting_leaves_the_queue() -> None:
    eng = Engine(PROFILE, asyncio.get_running_loop().time)
    blocker = request(100, "blocker")
    eng.submit(blocker)
    waiting = request(5, "w")
    task = asyncio.create_task(drive(eng, waiting, 1, None))
    await asyncio.sleep(0)
    assert list(eng.waiting) == [waiting]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not eng.waiting and eng.counters.finished["abort"] == 1


async def test_embedding_style_request_finishes_after_prefill() -> None:
    vt = VirtualTime()
    eng = Engine(PROFILE, vt.clock)
    req = GenRequest("e", list(range(30)), [])
    await drive(eng, req, 1, None, sleep=vt.sleep)
    assert vt.now == pytest.approx(0.050)
    assert eng.counters.finished["stop"] == 1 and eng.counters.generation_tokens == 0
