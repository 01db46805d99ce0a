"""The garbage collector's stops and what it freed, as the service exports them: real collections of this process."""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry

from extproc.telemetry.gc_pauses import GcPauseCollector, GcTimer


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycles(count: int) -> None:
    for _ in range(count):
        a, b = _Node(), _Node()
        a.other, b.other = b, a


def _value(registry: CollectorRegistry, name: str, generation: str) -> float:
    value = registry.get_sample_value(name, {"generation": generation})
    assert value is not None
    return value


def test_a_full_collection_counts_its_pause_and_the_cycles_it_freed_only_while_started() -> None:
    registry = CollectorRegistry()
    collector = GcPauseCollector()
    registry.register(collector)
    gc.collect()
    assert _value(registry, "extproc_gc_pause_seconds_count", "2") == 0  # not started: nothing counted
    collector.start()
    try:
        _cycles(100)
        gc.collect(2)
        assert _value(registry, "extproc_gc_pause_seconds_count", "2") == 1
        freed = _value(registry, "extproc_gc_collected_objects_total", "2")
        assert freed >= 200  # the 200 nodes (and their dicts, if made)
        buckets = [registry.get_sample_value("extproc_gc_pause_seconds_bucket", {"generation": "2", "le": le})
                   for le in ("0.001", "1.0", "+Inf")]
        assert buckets[2] == 1 and buckets[1] is not None and buckets[1] <= 1  # cumulative
        assert 0 < _value(registry, "extproc_gc_pause_seconds_sum", "2") < 1.0
        gc.collect(2)  # nothing left to free: a pause, no objects
        assert _value(registry, "extproc_gc_pause_seconds_count", "2") == 2
        assert _value(registry, "extproc_gc_collected_objects_total", "2") - freed < 50
    finally:
        collector.stop()
    gc.collect(2)
    assert _value(registry, "extproc_gc_pause_seconds_count", "2") == 2  # stopped: no longer counted


def test_the_timer_reports_generation_duration_and_collected() -> None:
    seen: list[tuple[int, float, int]] = []
    timer = GcTimer(lambda generation, seconds, collected: seen.append((generation, seconds, collected)))
    timer.start()
    timer.start()  # idempotent: one callback
    try:
        _cycles(10)
        gc.collect(1)
    finally:
        timer.stop()
        timer.stop()
    assert [generation for generation, _, _ in seen] == [1]
    assert seen[0][1] >= 0 and seen[0][2] >= 20
