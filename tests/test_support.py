"""The waiting helpers of tests/support.py fail when the awaited fact never comes, and say what it was."""

from __future__ import annotations

import asyncio

import pytest

from tests.support import SteppedSleep, eventually, holds_for


async def test_eventually_returns_the_first_truthy_value_of_a_plain_or_async_check() -> None:
    values = iter([0, None, 7])
    assert await eventually(lambda: next(values), "a value", interval_s=0.001) == 7

    async def ready() -> str:
        return "yes"

    assert await eventually(ready, "an async check") == "yes"


async def test_eventually_fails_naming_what_was_awaited_and_the_last_assertion() -> None:
    def check() -> bool:
        raise AssertionError("queued = 3")

    with pytest.raises(AssertionError, match=r"waiting for the queue to drain; last: AssertionError\('queued = 3'\)"):
        await eventually(check, "the queue to drain", timeout_s=0.01, interval_s=0.001)


async def test_holds_for_fails_as_soon_as_the_check_does_not_hold() -> None:
    values = iter([True, True, False, True])
    with pytest.raises(AssertionError, match="the breaker open stopped holding at check 3"):
        await holds_for(lambda: next(values), "the breaker open", 5.0, interval_s=0.001)
    assert await holds_for(lambda: True, "always", 0.0) == 1


async def test_stepped_sleep_runs_a_loop_one_round_per_step() -> None:
    sleep = SteppedSleep()
    rounds: list[int] = []

    async def loop() -> None:
        while True:
            rounds.append(len(rounds))
            await sleep(0.5)

    task = asyncio.create_task(loop())
    await sleep.wait_parked()
    assert rounds == [0]
    await sleep.step()
    await sleep.step()
    assert rounds == [0, 1, 2] and sleep.delays == [0.5] * 3
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sleep.parked == 0
    with pytest.raises(AssertionError, match="0 of 1 loops reached their sleep"):
        await sleep.wait_parked(timeout_s=0.01)
