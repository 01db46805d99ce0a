"""The event loop's lag: how late a periodic timer of ours runs.

Everything this process does (gRPC streams, flow control's grants and expiries, scrapes, the admin API) runs on one
asyncio loop; a callback that holds it (a long computation, a garbage collection, a blocking call, a starved CPU)
delays all of them by the same amount, and no per-request metric says why. One timer, every `interval_s`, notes how
long after its due time it ran: that delay is what any other callback ready then also waited. The cost is one
callback per interval (a few microseconds), nothing per request.

`extproc_event_loop_lag_seconds` (a histogram) and /debug/loop (the largest lag since start and when it was) show
it; `extproc bench routing --workload overload` reports it for its measured run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

__all__ = ["LoopLag"]


class LoopLag:
    """`start()` on the running loop, `stop()` before it closes. `observe(lag_s)` is called on every tick."""

    def __init__(self, observe: Callable[[float], None] | None = None, interval_s: float = 0.1) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = interval_s
        self._observe = observe
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self.ticks = 0
        self.last_s = 0.0
        self.max_s = 0.0
        self.max_at = 0.0  # wall-clock time (time.time()) of the largest lag

    def start(self) -> None:
        if self._handle is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._due = self._loop.time() + self.interval_s
        self._handle = self._loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        lag = max(0.0, now - self._due)
        self.ticks += 1
        self.last_s = lag
        if lag > self.max_s:
            self.max_s, self.max_at = lag, time.time()
        if self._observe is not None:
            self._observe(lag)
        # The next tick is due one interval after this one ran, not after it was due: a stall is counted once,
        # not again by every tick it skipped.
        self._due = now + self.interval_s
        self._handle = loop.call_at(self._due, self._tick)

    def describe(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "ticks": self.ticks, "last_lag_s": round(self.last_s, 6),
                "max_lag_s": round(self.max_s, 6), "max_lag_at": round(self.max_at, 3) if self.max_at else None}
