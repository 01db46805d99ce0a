"""Replica exchanges run on one timer: one carries the other's rounds (extproc.server.fleet.ReplicaExchange.carry)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

import pytest

from extproc.limits.resp import Arg, Script, ScriptCall
from extproc.limits.types import StoreUnavailable
from extproc.server.fleet import ReplicaExchange, carried_every
from tests.support import eventually


class Client:
    """The network, faked: a batch of script calls is one write; each call's reply is its exchange's outcome."""

    def __init__(self, timeout_s: float = 0.05) -> None:
        self.writes: list[int] = []  # script calls per write
        self.timeouts: list[float] = []  # each write's deadline
        self.down = False
        self.timeout_s = timeout_s

    async def evalsha(self, script: Script, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        reply = (await self.evalsha_batch([(script, keys, args)]))[0]
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def evalsha_batch(self, calls: Sequence[ScriptCall], timeout_s: float | None = None) -> list[Any]:
        if self.down:
            return [StoreUnavailable("not connected")] * len(calls)
        self.writes.append(len(calls))
        self.timeouts.append(self.timeout_s if timeout_s is None else timeout_s)
        exchanges = [cast(Exchange, args[0]) for _, _, args in calls]
        await asyncio.sleep(max(e.work_s for e in exchanges))
        return [StoreUnavailable("down") if e.fail else e.name for e in exchanges]

    async def close(self) -> None:
        pass


SCRIPT = Script("return 1")


class Exchange(ReplicaExchange):
    def __init__(self, interval_s: float, *, fail: bool = False, work_s: float = 0.0, client: Client | None = None,
                 name: str = "") -> None:
        super().__init__(client or Client(), interval_s)  # type: ignore[arg-type]
        self.fail, self.work_s, self.name = fail, work_s, name
        self.rounds = 0
        self.running = 0
        self.most_running = 0
        self.failed = 0

    def request(self) -> ScriptCall:
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        return SCRIPT, ["k"], [self]  # type: ignore[list-item]

    def settle(self, reply: Any) -> None:
        assert reply == self.name  # its own reply, not the carrier's
        self.running -= 1
        self.rounds += 1

    def _failed(self) -> None:
        self.running -= 1
        self.failed += 1


async def test_a_carried_exchange_runs_with_the_carriers_rounds_only_in_the_same_write() -> None:
    client = Client(timeout_s=0.05)
    carrier = Exchange(0.002, client=client, name="carrier")
    carried = Exchange(3600.0, name="carried", client=Client(timeout_s=0.1))
    carrier.carry(carried)  # (alone the carried one would wait an hour for its first round)
    await carried.start()  # a no-op: its rounds come with the carrier's
    await carrier.start()
    try:
        await eventually(lambda: carried.rounds >= 5, "rounds")
        assert abs(carrier.rounds - carried.rounds) <= 1
        assert set(client.writes) == {2}  # both script calls in each write, on the carrier's connection
        assert set(client.timeouts) == {0.1}  # each waited for as long as alone (the longer deadline)
    finally:
        await carrier.stop()
        await carried.stop()


async def test_each_counts_its_own_failures() -> None:
    client = Client()
    carrier, carried = Exchange(0.002, fail=True, client=client, name="carrier"), Exchange(0.002, name="carried")
    carrier.carry(carried)
    await carrier.start()
    try:
        await eventually(lambda: carrier.failures_total >= 3 and carried.rounds >= 3, "rounds")
        assert carried.failures_total == 0 and carrier.failed == carrier.failures_total
        carrier.fail, carried.fail = False, True
        await eventually(lambda: carried.failures_total >= 3, "rounds")
        failures, settled = carrier.failures_total, carrier.rounds
        await eventually(lambda: carrier.rounds >= settled + 3, "rounds")
        assert carrier.failures_total == failures  # it goes on working
        assert carried.failed >= carried.failures_total - 1  # its own failure handling ran (the last may be due)
        client.down = True  # no connection: the round fails for both
        both = carrier.failures_total, carried.failures_total
        await eventually(lambda: carrier.failures_total > both[0] and carried.failures_total > both[1], "rounds")
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
