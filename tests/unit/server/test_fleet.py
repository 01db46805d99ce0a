"""Replica exchanges run on one timer: one carries the other's rounds (extproc.server.fleet.ReplicaExchange.carry)."""

from __future__ import annotations

import asyncio

from extproc.limits.types import StoreUnavailable
from extproc.server.fleet import ReplicaExchange
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
