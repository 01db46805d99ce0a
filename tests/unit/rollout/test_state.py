from __future__ import annotations

import pytest

from extproc.rollout import MemoryRolloutStore, PoolWindow, RolloutState


def state(version: int = 1, **changes: object) -> RolloutState:
    base = RolloutState("chat", "v2", "v1", 0, 5.0, "running", "started", 10.0, 10.0, 1, version)
    return base.next(**changes) if changes else base


def test_json_round_trip_and_bad_status() -> None:
    original = state()
    assert RolloutState.from_json(original.to_json()) == original
    with pytest.raises(ValueError, match="unknown rollout status"):
        RolloutState.from_json(original.to_json().replace("running", "exploded"))


def test_next_bumps_the_version() -> None:
    advanced = state().next(step=1, weight=25.0)
    assert (advanced.version, advanced.step, advanced.weight) == (2, 1, 25.0)
    assert state().active and not state(status="promoted").active


async def test_memory_store_compare_and_set() -> None:
    store = MemoryRolloutStore()
    assert await store.load("chat") is None
    first = state()
    assert not await store.save(first, expected_version=3)
    assert await store.save(first, expected_version=0)
    assert not await store.save(first.next(), expected_version=0)  # someone else already created it
    second = first.next(weight=25.0)
    assert await store.save(second, expected_version=1)
    assert not await store.save(first.next(weight=50.0), expected_version=1)  # the loser of a race
    assert await store.load("chat") == second


async def test_memory_store_pools_outcomes_per_epoch() -> None:
    store = MemoryRolloutStore()
    a, b = PoolWindow(), PoolWindow()
    a.record(True, 0.1, 0.01)
    b.record(False, None, None)
    await store.add_outcomes("chat", 1, {"v2": a})
    await store.add_outcomes("chat", 1, {"v2": b, "v1": a})
    pooled = await store.load_outcomes("chat", 1)
    assert pooled["v2"].requests == 2 and pooled["v2"].errors == 1 and pooled["v1"].requests == 1
    assert await store.load_outcomes("chat", 2) == {}
    await store.add_outcomes("chat", 3, {"v2": a})
    assert await store.load_outcomes("chat", 1) == {}  # two epochs old: dropped
