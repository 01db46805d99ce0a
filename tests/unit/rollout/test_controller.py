from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping

import pytest

from extproc.rollout import (
    MemoryRolloutStore,
    PoolWindow,
    RolloutError,
    Rollouts,
    RolloutState,
    RolloutStore,
    RolloutStoreUnavailable,
)
from extproc.rollout.config import Backend, SplitConfig
from tests.support import SteppedSleep
from tests.unit.rollout.traffic import MODEL, FakeClock, PoolHealth, Traffic, split

HEALTHY = {"v1": PoolHealth(error_rate=0.005), "v2": PoolHealth(error_rate=0.005)}


async def drive(replicas: list[Rollouts], traffic: Traffic, clock: FakeClock, seconds: int) -> list[RolloutState]:
    """One tick per simulated second on every replica, traffic in between; returns all transitions."""
    transitions: list[RolloutState] = []
    for _ in range(seconds):
        traffic.second(replicas)
        clock.advance(1.0)
        for replica in replicas:
            transitions += await replica.tick()
        state = replicas[0].state(MODEL)
        if state is not None and not state.active:
            break
    return transitions


async def started(store: RolloutStore, clock: FakeClock, config: SplitConfig | None = None,
                  **kwargs: object) -> Rollouts:
    rollouts = Rollouts(store, [config or split()], clock=clock, **kwargs)  # type: ignore[arg-type]
    await rollouts.refresh()
    return rollouts


async def test_healthy_canary_walks_every_step_to_promoted() -> None:
    clock = FakeClock()
    rollouts = await started(MemoryRolloutStore(), clock)
    state = rollouts.state(MODEL)
    assert state is not None and (state.status, state.weight) == ("running", 5.0)
    assert rollouts.current_weights(MODEL) == pytest.approx({"v1": 0.95, "v2": 0.05})
    transitions = await drive([rollouts], Traffic(dict(HEALTHY)), clock, 600)
    assert [(s.status, s.weight) for s in transitions] == [
        ("running", 25.0), ("running", 50.0), ("promoted", 100.0)]
    for earlier, later in itertools.pairwise(transitions):
        assert later.updated_at - earlier.updated_at >= 60.0  # each step held hold_s
    final = rollouts.state(MODEL)
    assert final is not None and final.status == "promoted" and "promoted to 100%" in final.reason
    assert rollouts.current_weights(MODEL) == {"v1": 0.0, "v2": 1.0}


@pytest.mark.parametrize(("canary", "words"), [
    (PoolHealth(error_rate=0.15), "error rate"),
    (PoolHealth(error_rate=0.005, ttft_s=0.6), "TTFT p99"),
])
async def test_degraded_canary_is_rolled_back_within_one_interval_after_min_samples(
        canary: PoolHealth, words: str) -> None:
    clock = FakeClock()
    rollouts = await started(MemoryRolloutStore(), clock)
    traffic = Traffic({"v1": PoolHealth(error_rate=0.005), "v2": canary})
    reached_at: float | None = None
    state: RolloutState | None = None
    for _ in range(300):
        traffic.second([rollouts])
        if reached_at is None and traffic.sent.get("v2", 0) >= 200:
            reached_at = clock.now
        clock.advance(1.0)
        await rollouts.tick()
        state = rollouts.state(MODEL)
        assert state is not None
        if state.status != "running":
            break
    assert state is not None and state.status == "rolled_back", state
    assert words in state.reason and state.reason.startswith("rolled back at 5%")
    assert reached_at is not None and state.updated_at - reached_at <= 10.0 + 1.0
    assert rollouts.current_weights(MODEL) == {"v1": 1.0, "v2": 0.0}
    assert rollouts.verdicts[MODEL].action == "rollback"


async def test_two_replicas_on_one_store_make_one_transition_per_step() -> None:
    clock = FakeClock()
    store = MemoryRolloutStore()
    replicas = [await started(store, clock), await started(store, clock)]
    transitions = await drive(replicas, Traffic(dict(HEALTHY)), clock, 600)
    assert [s.weight for s in transitions] == [25.0, 50.0, 100.0]
    assert len({s.version for s in transitions}) == 3
    assert replicas[0].current_weights(MODEL) == replicas[1].current_weights(MODEL) == {"v1": 0.0, "v2": 1.0}


class RacingStore:
    """Holds the first save of each of `replicas` replicas until all of them have reached it: every replica
    has read the same state and reached the same verdict before any of them writes."""

    def __init__(self, inner: MemoryRolloutStore, replicas: int) -> None:
        self.inner = inner
        self.lost = 0
        self._all_verdicts_in: asyncio.Barrier | None = asyncio.Barrier(replicas)

    async def load(self, model: str) -> RolloutState | None:
        return await self.inner.load(model)

    async def save(self, state: RolloutState, expected_version: int) -> bool:
        barrier = self._all_verdicts_in
        if barrier is not None:
            async with asyncio.timeout(5):  # a bound: fewer replicas reaching a verdict fails the test
                await barrier.wait()
            self._all_verdicts_in = None
        won = await self.inner.save(state, expected_version)
        self.lost += not won
        return won

    async def add_outcomes(self, model: str, epoch: int, windows: Mapping[str, PoolWindow]) -> None:
        await self.inner.add_outcomes(model, epoch, windows)

    async def load_outcomes(self, model: str, epoch: int) -> dict[str, PoolWindow]:
        return await self.inner.load_outcomes(model, epoch)

    async def close(self) -> None:
        return None


async def test_simultaneous_verdicts_race_and_exactly_one_wins() -> None:
    clock = FakeClock()
    inner = MemoryRolloutStore()
    replicas = [await started(inner, clock) for _ in range(3)]
    store = RacingStore(inner, len(replicas))
    for replica in replicas:
        replica._store = store  # from now on every save races
    traffic = Traffic(dict(HEALTHY))
    for _ in range(70):  # enough samples and past the hold, but nobody analysed yet
        traffic.second(replicas)
        clock.advance(1.0)
    for replica in replicas:
        await replica.flush()
    results = await asyncio.gather(*(replica.tick() for replica in replicas))
    assert sorted(len(made) for made in results) == [0, 0, 1]
    assert store.lost == 2
    state = await store.load(MODEL)
    assert state is not None and (state.weight, state.version) == (25.0, 2)
    for replica in replicas:
        assert replica.current_weights(MODEL) == pytest.approx({"v1": 0.75, "v2": 0.25})


async def test_the_background_loop_refreshes_every_interval() -> None:
    clock = FakeClock()
    store = MemoryRolloutStore()
    sleep = SteppedSleep()
    follower = Rollouts(store, [split()], clock=clock, refresh_interval_s=0.5, sleep=sleep)
    await follower.start()
    try:
        await sleep.wait_parked()
        assert follower.current_weights(MODEL) == pytest.approx({"v1": 0.95, "v2": 0.05})
        leader = await started(store, clock)
        await leader.promote(MODEL)  # another replica moves the rollout on
        assert follower.current_weights(MODEL) == pytest.approx({"v1": 0.95, "v2": 0.05})
        await sleep.step()  # one refresh interval later the follower has converged
        assert follower.current_weights(MODEL) == pytest.approx({"v1": 0.75, "v2": 0.25})
        assert sleep.delays == [0.5, 0.5]
    finally:
        await follower.stop()


async def test_state_survives_a_restart_of_the_service() -> None:
    clock = FakeClock()
    store = MemoryRolloutStore()
    first = await started(store, clock)
    await first.promote(MODEL)
    second = Rollouts(store, [split()], clock=clock)
    assert second.current_weights(MODEL) == {"v1": 1.0, "v2": 0.0}  # nothing read yet: baseline only
    await second.start()
    try:
        assert second.current_weights(MODEL) == pytest.approx({"v1": 0.75, "v2": 0.25})
    finally:
        await second.stop()


async def test_manual_commands() -> None:
    clock = FakeClock()
    rollouts = await started(MemoryRolloutStore(), clock)
    with pytest.raises(RolloutError, match="it is running"):
        await rollouts.resume(MODEL)
    paused = await rollouts.pause(MODEL)
    assert paused.status == "paused" and paused.reason == "paused by operator"
    # Paused: healthy data never promotes.
    assert await drive([rollouts], Traffic(dict(HEALTHY)), clock, 150) == []
    resumed = await rollouts.resume(MODEL)
    assert resumed.status == "running" and resumed.epoch == paused.epoch + 1
    promoted = await rollouts.promote(MODEL)
    assert (promoted.weight, promoted.step) == (25.0, 1)
    aborted = await rollouts.abort(MODEL)
    assert (aborted.status, aborted.weight) == ("aborted", 0.0)
    assert rollouts.current_weights(MODEL)["v2"] == 0.0
    with pytest.raises(RolloutError, match="cannot promote"):
        await rollouts.promote(MODEL)
    restarted = await rollouts.restart(MODEL)
    assert (restarted.status, restarted.weight, restarted.step) == ("running", 5.0, 0)
    done = await rollouts.promote(MODEL, to_end=True)
    assert (done.status, done.weight) == ("promoted", 100.0)
    with pytest.raises(RolloutError, match="no rollout configured"):
        await rollouts.pause("unknown")


async def test_a_paused_canary_that_degrades_is_still_rolled_back() -> None:
    clock = FakeClock()
    rollouts = await started(MemoryRolloutStore(), clock)
    await rollouts.pause(MODEL)
    traffic = Traffic({"v1": PoolHealth(error_rate=0.005), "v2": PoolHealth(error_rate=0.3)})
    transitions = await drive([rollouts], traffic, clock, 200)
    assert [s.status for s in transitions] == ["rolled_back"]


async def test_new_canary_in_the_policy_starts_a_new_rollout() -> None:
    clock = FakeClock()
    store = MemoryRolloutStore()
    rollouts = await started(store, clock)
    await rollouts.abort(MODEL)
    three = SplitConfig.model_validate({
        "model": MODEL, "backends": [{"pool": "v1", "weight": 1}, {"pool": "v2", "weight": 0},
                                     {"pool": "v3", "weight": 0}],
        "rollout": {"canary": "v3", "baseline": "v1"}})
    rollouts.configure([three])
    assert rollouts.state(MODEL) is None and rollouts.current_weights(MODEL)["v3"] == 0.0
    await rollouts.refresh()
    state = rollouts.state(MODEL)
    assert state is not None and (state.canary, state.status, state.weight) == ("v3", "running", 5.0)
    assert state.version == 3 and state.epoch == 2


async def test_weights_listener_and_static_splits() -> None:
    clock = FakeClock()
    seen: list[dict[str, dict[str, float]]] = []

    async def listener(weights: Mapping[str, Mapping[str, float]]) -> None:
        seen.append({m: dict(w) for m, w in weights.items()})

    static = SplitConfig(model="emb", backends=(Backend(pool="a", weight=3), Backend(pool="b", weight=1)))
    rollouts = Rollouts(MemoryRolloutStore(), [split(), static], clock=clock, on_weights=listener)
    assert rollouts.current_weights("emb") == {"a": 0.75, "b": 0.25}
    assert rollouts.current_weights("nope") == {}
    await rollouts.refresh()
    await rollouts.refresh()  # unchanged: not published again
    await rollouts.promote(MODEL)
    assert [w[MODEL]["v2"] for w in seen] == pytest.approx([0.05, 0.25])
    assert seen[-1]["emb"] == {"a": 0.75, "b": 0.25}
    described = {d["model"]: d for d in rollouts.describe()}
    assert described[MODEL]["rollout"]["weight_percent"] == 25.0 and described["emb"]["rollout"] is None


async def test_outcomes_of_pools_outside_rollouts_are_not_kept() -> None:
    clock = FakeClock()
    store = MemoryRolloutStore()
    rollouts = await started(store, clock)
    rollouts.record("unrelated", True, 0.1, 0.01)
    rollouts.record("v2", False, None, None)
    await rollouts.flush()
    state = rollouts.state(MODEL)
    assert state is not None
    pooled = await store.load_outcomes(MODEL, state.epoch)
    assert set(pooled) == {"v2"} and pooled["v2"].errors == 1


class DownStore(MemoryRolloutStore):
    async def load(self, model: str) -> RolloutState | None:
        raise RolloutStoreUnavailable("down")

    async def add_outcomes(self, model: str, epoch: int, windows: Mapping[str, PoolWindow]) -> None:
        raise RolloutStoreUnavailable("down")


async def test_store_outage_keeps_cached_weights_and_samples() -> None:
    clock = FakeClock()
    healthy = MemoryRolloutStore()
    rollouts = await started(healthy, clock)
    await rollouts.promote(MODEL)
    rollouts._store = DownStore()  # the shared store goes away
    rollouts.record("v2", True, 0.1, 0.01)
    await rollouts.start()  # never raises
    try:
        assert not rollouts.store_ok
        assert rollouts.current_weights(MODEL) == pytest.approx({"v1": 0.75, "v2": 0.25})
        with pytest.raises(RolloutStoreUnavailable):
            await rollouts.tick()
        rollouts._store = healthy
        await rollouts.tick()
        state = rollouts.state(MODEL)
        assert state is not None
        assert (await healthy.load_outcomes(MODEL, state.epoch))["v2"].requests == 1
    finally:
        await rollouts.stop()
