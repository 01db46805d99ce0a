"""The garbage collector's stops of this process, by generation.

A collection stops everything the process does (the event loop, every stream's decision) for as long as it walks
the objects of its generations. The service keeps those few: what startup built is frozen (`gc.freeze()`), and a
stream leaves no reference cycle behind (extproc/server/h2/output.py), so its objects are freed by reference
counting and collections find nothing to free. `extproc_gc_collected_objects_total` counts what they did free:
a steady rise means something per request went back to forming cycles, and `extproc_gc_pause_seconds` how long
the stops were (the event loop's lag shows their effect, not their cause).

The collector's callback only adds to plain numbers (no lock: it runs wherever an allocation triggers a
collection, possibly inside a metric's own lock); the metric families are built at scrape time.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

__all__ = ["GcPauseCollector", "GcTimer"]

PAUSE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
GENERATIONS = 3


class GcTimer:
    """While started, `on_collection(generation, seconds, collected)` after each collection of this process."""

    def __init__(self, on_collection: Callable[[int, float, int], None]) -> None:
        self._on_collection = on_collection
        self._began = 0.0
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            gc.callbacks.append(self._callback)

    def stop(self) -> None:
        if self._started:
            self._started = False
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._began = now
        else:
            self._on_collection(int(info.get("generation", 0)), now - self._began, int(info.get("collected", 0)))


class GcPauseCollector(Collector):
    """`extproc_gc_pause_seconds{generation}` and `extproc_gc_collected_objects_total{generation}`; `start()` /
    `stop()` with the service."""

    def __init__(self) -> None:
        self._buckets = [[0] * len(PAUSE_BUCKETS) for _ in range(GENERATIONS)]  # non-cumulative counts
        self._counts = [0] * GENERATIONS
        self._sums = [0.0] * GENERATIONS
        self._collected = [0] * GENERATIONS
        self._timer = GcTimer(self._record)

    def start(self) -> None:
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    def _record(self, generation: int, seconds: float, collected: int) -> None:
        generation = min(max(generation, 0), GENERATIONS - 1)
        self._counts[generation] += 1
        self._sums[generation] += seconds
        self._collected[generation] += collected
        for index, bound in enumerate(PAUSE_BUCKETS):
            if seconds <= bound:
                self._buckets[generation][index] += 1
                break

    def collect(self) -> Iterator[HistogramMetricFamily | CounterMetricFamily]:
        pauses = HistogramMetricFamily("extproc_gc_pause_seconds",
                                       "How long each garbage collection stopped this process, by generation",
                                       labels=["generation"])
        collected = CounterMetricFamily("extproc_gc_collected_objects",
                                        "Objects garbage collections freed (unreachable reference cycles)",
                                        labels=["generation"])
        for generation in range(GENERATIONS):
            running, buckets = 0, []
            for bound, count in zip(PAUSE_BUCKETS, self._buckets[generation], strict=True):
                running += count
                buckets.append((repr(bound), running))
            buckets.append(("+Inf", self._counts[generation]))
            pauses.add_metric([str(generation)], buckets, self._sums[generation])
            collected.add_metric([str(generation)], self._collected[generation])
        yield pauses
        yield collected
