"""The benchmark client's own garbage-collection pauses: a client that stops to collect delays every response it
is reading, and a latency tail that comes from the load generator is not the system's."""

from __future__ import annotations

import time
from types import TracebackType

from extproc.telemetry.gc_pauses import GcTimer

__all__ = ["GcPauses"]


class GcPauses:
    """`with GcPauses() as pauses:` records every collection of this process meanwhile: (start s from entry,
    duration ms, generation). `longest(n)`: the n longest."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, float, int]] = []
        self._entered = 0.0
        self._timer = GcTimer(self._record)

    def _record(self, generation: int, seconds: float, collected: int) -> None:
        self.pauses.append((time.perf_counter() - seconds - self._entered, seconds * 1000.0, generation))

    def __enter__(self) -> GcPauses:
        self._entered = time.perf_counter()
        self._timer.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._timer.stop()

    def longest(self, n: int = 3) -> list[dict[str, float]]:
        top = sorted(self.pauses, key=lambda p: -p[1])[:n]
        return [{"at_s": round(at, 2), "ms": round(ms, 1), "generation": generation} for at, ms, generation in top]
