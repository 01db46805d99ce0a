"""The benchmark client's own garbage-collection pauses: a client that stops to collect delays every response it
is reading, and a latency tail that comes from the load generator is not the system's."""

from __future__ import annotations

import gc
import time
from types import TracebackType
from typing import Any

__all__ = ["GcPauses"]


class GcPauses:
    """`with GcPauses() as pauses:` records every collection of this process meanwhile: (start s from entry,
    duration ms, generation). `longest(n)`: the n longest."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, float, int]] = []
        self._entered = self._began = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._began = now
        else:
            self.pauses.append((now - self._entered, (now - self._began) * 1000.0, int(info.get("generation", -1))))

    def __enter__(self) -> GcPauses:
        self._entered = time.perf_counter()
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        gc.callbacks.remove(self._callback)

    def longest(self, n: int = 3) -> list[dict[str, float]]:
        top = sorted(self.pauses, key=lambda p: -p[1])[:n]
        return [{"at_s": round(at, 2), "ms": round(ms, 1), "generation": generation} for at, ms, generation in top]
