"""What flow control hands out and reads: a pool's `Room`, a queued request's `Ticket`, a `Rejected` verdict, and
the `Timer` that expires tickets (asyncio's `call_later` by default, a virtual clock in tests)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from extproc.flow.queue import Waiter

__all__ = ["Reason", "Rejected", "Room", "Ticket", "Timer", "TimerHandle", "asyncio_timer"]

Reason = Literal["saturated", "queue_full", "displaced", "timeout", "cold_start", "adapter_unavailable", "left"]


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


# Calls the function after the delay (seconds); the handle cancels it.
Timer = Callable[[float, Callable[[], None]], TimerHandle]


def asyncio_timer(delay: float, callback: Callable[[], None]) -> TimerHandle:
    return asyncio.get_running_loop().call_later(delay, callback)


@dataclass(frozen=True, slots=True)
class Room:
    """How many more requests of a class a pool takes before it is full."""

    requests: float  # math.inf: no limit known
    stale: int = 0  # usable endpoints whose metrics were missing or stale
    # > 0: the pool has no ready endpoint by design (it scales from zero); requests wait up to this long for
    # its first one, whatever their class.
    cold_s: float = 0.0

    @classmethod
    def of(cls, rooms: Iterable[float | None], enough: float = math.inf) -> Room:
        """A pool's room from its usable endpoints' (None: unknown). An endpoint of unknown room, or no
        usable endpoint at all, leaves the pool unlimited: flow control never stalls on missing data (and
        routing answers for a pool without endpoints). Counting stops once the room reaches `enough` or an
        endpoint's is unknown (then `requests` is a lower bound and `stale` at least 1): large pools are not
        walked whole when any room will do."""
        total = 0.0
        stale = seen = 0
        for room in rooms:
            seen += 1
            if room is None:
                stale += 1
                break
            total += room
            if total >= enough:
                break
        return cls(math.inf if stale or not seen else total, stale)


@dataclass(frozen=True, slots=True)
class Rejected:
    klass: str
    reason: Reason
    status: int
    retry_after_s: float
    waited_s: float = 0.0


class Ticket(Waiter):
    """A queued request, as its pool's queue holds it. `await ticket.wait()` -> None when granted, or
    the `Rejected`."""

    __slots__ = ("_future", "_outcome", "_timer", "cold", "consumed", "pool", "settled")

    def __init__(self, pool: str, tenant: str, klass: str, priority: int, weight: float, tokens: int,
                 enqueued: float, deadline: float) -> None:
        super().__init__(tenant, klass, priority, weight, tokens, enqueued, deadline)
        self.pool = pool
        self.cold = False  # held because its pool had no ready endpoint
        self._future: asyncio.Future[Rejected | None] | None = None  # made by the first wait()
        self._outcome: Rejected | None = None
        self._timer: TimerHandle | None = None
        self.settled = False
        self.consumed = False

    async def wait(self) -> Rejected | None:
        if self.settled:
            return self._outcome
        if self._future is None:
            self._future = asyncio.get_running_loop().create_future()
        return await asyncio.shield(self._future)

    @property
    def granted(self) -> bool:
        return self.settled and self._outcome is None

    @property
    def outcome(self) -> Rejected | None:
        return self._outcome

    def arm(self, timer: Timer, delay_s: float, expire: Callable[[Ticket], None]) -> None:
        self._timer = timer(delay_s, lambda: expire(self))

    def settle(self, outcome: Rejected | None) -> None:
        if self.settled:
            return
        if self._timer is not None:
            self._timer.cancel()
        self.settled = True
        self._outcome = outcome
        if self._future is not None and not self._future.done():
            self._future.set_result(outcome)
