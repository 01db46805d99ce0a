"""`Periodic` and `FailureLog` with an injected sleep and clock: no real time passes."""

from __future__ import annotations

import asyncio
import logging

import pytest

from extproc.periodic import FailureLog, Periodic

log = logging.getLogger("tests.periodic")


class Steps:
    """An injected sleep: records each delay, parks the loop until `step()`; a fake clock the test moves."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.now = 100.0
        self._wake: asyncio.Future[None] | None = None
        self._parked = asyncio.Event()

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        self._wake = asyncio.get_running_loop().create_future()
        self._parked.set()
        await self._wake

    async def parked(self) -> None:
        async with asyncio.timeout(5):
            await self._parked.wait()
        self._parked.clear()

    async def step(self, advance: float = 0.0) -> None:
        """Let the parked loop run one round (after moving the clock by `advance`) until it sleeps again."""
        self.now += advance
        assert self._wake is not None
        self._wake.set_result(None)
        await self.parked()


async def test_fixed_delay_waits_first_and_reads_the_interval_every_round() -> None:
    steps, rounds = Steps(), []
    interval = [2.0]

    async def work() -> None:
        rounds.append(steps.now)

    loop = Periodic("t", work, lambda: interval[0], log=log, sleep=steps.sleep, clock=steps.clock)
    loop.start()
    loop.start()  # already running: no second task
    await steps.parked()
    assert rounds == [] and steps.delays == [2.0] and loop.running
    await steps.step(2.0)
    interval[0] = 5.0  # e.g. a reloaded policy
    await steps.step(2.0)
    assert len(rounds) == 2 and steps.delays == [2.0, 2.0, 5.0]
    assert [task.get_name() for task in asyncio.all_tasks()].count("t") == 1
    await loop.stop()
    assert not loop.running


async def test_fixed_rate_keeps_the_schedule_and_skips_rounds_missed_while_blocked() -> None:
    steps, rounds = Steps(), []

    async def work() -> None:
        rounds.append(steps.now)
        steps.now += 0.25  # a round takes a quarter of the interval

    loop = Periodic("t", work, 1.0, log=log, immediate=True, fixed_rate=True, sleep=steps.sleep, clock=steps.clock)
    loop.start()
    await steps.parked()
    assert rounds == [100.0] and steps.delays == [0.75]  # the first round at once, then the rest of the interval
    await steps.step(0.75)
    assert rounds == [100.0, 101.0] and steps.delays[-1] == 0.75  # on schedule
    await steps.step(0.75 + 3.5)  # the event loop was blocked for 3.5 intervals
    assert rounds[-1] == 105.5 and steps.delays[-1] == 0.0  # one round now, no burst of the missed ones
    await steps.step(0.0)
    assert rounds[-1] == 105.75 and steps.delays[-1] == 0.75  # a new schedule from the late round
    await loop.stop()


async def test_failures_are_counted_logged_once_per_state_change_and_never_end_the_loop(
        caplog: pytest.LogCaptureFixture) -> None:
    steps = Steps()
    outcomes: list[Exception | None] = [ConnectionError("down"), ConnectionError("down"), ConnectionError("refused"),
                                        None, None, ValueError("bug"), ValueError("bug"), None]

    async def work() -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    loop = Periodic("sync", work, 1.0, log=log, immediate=True, expected=(ConnectionError,), sleep=steps.sleep,
                    what="the sync")
    caplog.set_level(logging.INFO, logger=log.name)
    loop.start()
    await steps.parked()
    for _ in range(7):
        await steps.step()
    assert outcomes == [] and loop.failures.failures_total == 5 and not loop.failures.failing
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "the sync failing: down"),
        ("WARNING", "the sync failing: refused"),
        ("INFO", "the sync recovered"),
        ("ERROR", "the sync failed"),
        ("INFO", "the sync recovered"),
    ]
    assert caplog.records[3].exc_info is not None  # an unexpected error keeps its traceback
    await loop.stop()


async def test_run_once_applies_the_same_handling_to_other_work() -> None:
    async def fails() -> None:
        raise ConnectionError("no store")

    async def works() -> None:
        pass

    loop = Periodic("t", works, 1.0, log=log, expected=(ConnectionError,))
    assert not await loop.run_once(fails) and loop.failures.reason == "no store"
    assert await loop.run_once() and not loop.failures.failing


async def test_cancel_does_not_wait_and_stop_waits_for_the_task_to_unwind() -> None:
    unwound: list[str] = []
    parked = asyncio.Event()
    cleanup_done = asyncio.Event()

    async def sleep(delay: float) -> None:
        parked.set()
        try:
            await asyncio.Event().wait()
        finally:
            asyncio.get_running_loop().call_soon(cleanup_done.set)
            await cleanup_done.wait()  # a cleanup that itself awaits
            unwound.append("done")

    async def work() -> None:
        pass

    loop = Periodic("t", work, 1.0, log=log, sleep=sleep)
    loop.start()
    await parked.wait()
    await loop.stop()
    assert unwound == ["done"] and not loop.running
    parked.clear()
    cleanup_done.clear()
    loop.start()  # restartable
    await parked.wait()
    loop.cancel()
    assert not loop.running and unwound == ["done"]  # cancelled, not yet unwound
    await loop.stop()  # nothing left to wait for


def test_failure_log_by_itself(caplog: pytest.LogCaptureFixture) -> None:
    failures = FailureLog("scrape of a", log)
    caplog.set_level(logging.INFO, logger=log.name)
    assert not failures.recovered()  # nothing to recover from
    assert failures.failed("timed out") and not failures.failed("timed out") and failures.failed("HTTP 503")
    assert failures.recovered() and failures.failures_total == 3
    assert [r.getMessage() for r in caplog.records] == [
        "scrape of a failing: timed out", "scrape of a failing: HTTP 503", "scrape of a recovered"]
