"""Replica exchanges run on one timer: one carries the other's rounds (extproc.server.fleet.ReplicaExchange.carry)."""

from __future__ import annotations

import asyncio

import pytest

from extproc.limits.types import StoreUnavailable
from extproc.server.fleet import ReplicaExchange, carried_every
from tests.support import eventually


class Client:
    async def close(self) -> None:
        pass


class Exchange(ReplicaExchange):
    def __init__(self, interval_s: float, *, fail: bool = False, work_s: float = 0.0) -> None:
        super().__init__(Client(), interval_s)  # type: ignore[arg-type]
        self.fail, self.work_s = fail, work_s
        self.rounds = 0
        self.running = 0
        self.most_running = 0

    async def sync_once(self) -> None:
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(self.work_s)
            self.rounds += 1
            if self.fail:
                raise StoreUnavailable("down")
        finally:
            self.running -= 1


async def test_a_carried_exchange_runs_with_the_carriers_rounds_only() -> None:
    carrier, carried = Exchange(0.002), Exchange(3600.0)  # (alone it would wait an hour for its first round)
    carrier.carry(carried)
    await carried.start()  # a no-op: its rounds come with the carrier's
    await carrier.start()
    try:
        await eventually(lambda: carried.rounds >= 5, "rounds")
        assert abs(carrier.rounds - carried.rounds) <= 1
    finally:
        await carrier.stop()
        await carried.stop()


async def test_each_counts_its_own_failures() -> None:
    carrier, carried = Exchange(0.002, fail=True), Exchange(0.002)
    carrier.carry(carried)
    await carrier.start()
    try:
        await eventually(lambda: carrier.failures_total >= 3 and carried.rounds >= 3, "rounds")
        assert carried.failures_total == 0
        carrier.fail, carried.fail = False, True
        await eventually(lambda: carried.failures_total >= 3, "rounds")
        failures = carrier.failures_total
        await eventually(lambda: carrier.rounds >= carried.failures_total + 3, "rounds")
        assert carrier.failures_total == failures  # it goes on working
    finally:
        await carrier.stop()


async def test_a_round_waits_for_the_carried_one() -> None:
    carrier, carried = Exchange(0.001), Exchange(0.001, work_s=0.02)  # carried slower than the interval
    carrier.carry(carried)
    await carrier.start()
    try:
        await eventually(lambda: carried.rounds >= 5, "rounds")
        assert carried.most_running == 1 and carrier.rounds - carried.rounds <= 1  # never overlapping itself
    finally:
        await carrier.stop()
    assert carried.running == 0  # stopping the carrier ends the carried round too


async def test_a_slower_exchange_rides_every_nth_round() -> None:
    carrier, carried = Exchange(0.002), Exchange(0.004)
    carrier.carry(carried, carried_every(carrier, carried))
    await carrier.start()
    try:
        await eventually(lambda: carrier.rounds >= 12, "rounds")
    finally:
        await carrier.stop()
    # The first round and every second one after it (stopping may cut the last round of either short).
    assert carrier.rounds // 2 <= carried.rounds <= carrier.rounds // 2 + 1


@pytest.mark.parametrize(("carrier_s", "other_s", "every"), [
    (0.01, 0.01, 1), (0.01, 0.02, 2), (0.01, 0.03, 3), (0.01, 0.015, 0), (0.02, 0.01, 0), (0.0, 0.02, 0)])
def test_an_exchange_is_carried_only_at_a_whole_multiple_of_the_carriers_interval(
        carrier_s: float, other_s: float, every: int) -> None:
    assert carried_every(Exchange(carrier_s), Exchange(other_s)) == every


def test_carrying_every_zeroth_round_is_refused() -> None:
    with pytest.raises(ValueError, match="every"):
        Exchange(0.01).carry(Exchange(0.01), 0)
