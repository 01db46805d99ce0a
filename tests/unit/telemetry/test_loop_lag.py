"""The event-loop lag monitor on a real asyncio loop: a callback that holds the loop shows as one lag of its length."""

from __future__ import annotations

import time

import pytest

from extproc.telemetry.loop_lag import LoopLag
from tests.support import eventually


def _hold_loop(seconds: float) -> None:
    """Keep the event loop busy (no sleep: a computation that does not yield)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def test_a_blocked_loop_is_recorded_once_with_the_length_of_the_block() -> None:
    seen: list[float] = []
    lag = LoopLag(seen.append, interval_s=0.02)
    lag.start()
    try:
        await eventually(lambda: lag.ticks >= 3, "the monitor ticks")
        assert max(seen) < 0.2  # an idle loop runs its timer about on time
        _hold_loop(0.3)
        await eventually(lambda: lag.max_s >= 0.25, "the 0.3 s block recorded as a lag")
        await eventually(lambda: lag.ticks >= len(seen) and seen[-1] < 0.2, "the loop on time again")
        # One stall, one long sample: the ticks it skipped are not counted again.
        assert sum(1 for value in seen if value >= 0.2) == 1, seen
        assert lag.describe()["max_lag_s"] == pytest.approx(lag.max_s, abs=1e-6)
    finally:
        lag.stop()
    ticks = lag.ticks
    await eventually(lambda: True, "a turn of the loop")
    assert lag.ticks == ticks


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        LoopLag(interval_s=0)
