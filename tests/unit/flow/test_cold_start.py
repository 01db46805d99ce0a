"""Flow control for a pool that scales from zero: requests wait for its first endpoint, whatever their class."""

from __future__ import annotations

from collections.abc import Callable

from extproc.flow import GO, FlowControlConfig, FlowController, PriorityClass, Rejected, Room, Ticket


class Handle:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Pool:
    """Cold (no ready endpoint, `cold_s`) until the test makes it warm; virtual time and timers."""

    def __init__(self, cold_s: float) -> None:
        self.cold_s = cold_s
        self.warm = False
        self.now = 100.0
        self.timers: list[tuple[float, Callable[[], None], Handle]] = []

    def room(self, pool: str, now: float, reserve: float, enough: float = float("inf")) -> Room:
        return Room(float("inf"), 0) if self.warm else Room(0.0, 0, self.cold_s)

    def timer(self, delay: float, callback: Callable[[], None]) -> Handle:
        handle = Handle()
        self.timers.append((self.now + delay, callback, handle))
        return handle

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for due, callback, handle in list(self.timers):
            if due <= self.now and not handle.cancelled:
                handle.cancelled = True
                callback()


def controller(pool: Pool) -> FlowController:
    classes = {"standard": PriorityClass(priority=50, max_wait_s=1.0, reject_status=429),
               "sheddable": PriorityClass(priority=0, max_wait_s=0.0)}
    config = FlowControlConfig.model_validate({"classes": classes})
    return FlowController(lambda: config, pool.room, clock=lambda: pool.now, timer=pool.timer)


async def test_a_cold_pool_holds_every_class_past_its_wait_and_releases_them_when_warm() -> None:
    pool = Pool(cold_s=20.0)
    flow = controller(pool)
    woken: list[str] = []
    flow.cold_listeners.append(woken.append)
    standard = flow.offer("p", "t", "standard", 10)
    sheddable = flow.offer("p", "t", "sheddable", 10)  # never queued when saturated; held when cold
    assert isinstance(standard, Ticket) and isinstance(sheddable, Ticket)
    assert standard.cold and standard.deadline == 120.0
    assert woken == ["p", "p"]
    pool.advance(5.0)  # past the class's 1 s: still held
    assert not standard.settled and flow.queued("p") == 2
    flow.kick("p")  # a scrape while cold grants nothing
    assert not standard.settled
    pool.warm = True
    flow.kick("p")  # the first endpoint is ready
    assert standard.granted and sheddable.granted
    assert await standard.wait() is None
    flow.routed(standard)
    flow.routed(sheddable)
    assert flow.offer("p", "t", "standard", 10) == GO


async def test_a_pool_that_never_warms_answers_503_at_the_cold_start_timeout() -> None:
    pool = Pool(cold_s=3.0)
    flow = controller(pool)
    ticket = flow.offer("p", "t", "standard", 10)
    assert isinstance(ticket, Ticket)
    pool.advance(2.5)
    assert not ticket.settled
    pool.advance(0.5)
    outcome = await ticket.wait()
    # 503 even though the class refuses with 429: the capacity failed, not the client's rate.
    assert isinstance(outcome, Rejected) and outcome.reason == "cold_start" and outcome.status == 503
    assert outcome.retry_after_s == 1.0 and flow.queued("p") == 0
    assert flow.stats()["p"]["classes"]["standard"]["rejected"] == {"cold_start": 1}


async def test_a_held_request_whose_client_leaves_frees_its_place() -> None:
    pool = Pool(cold_s=10.0)
    flow = controller(pool)
    ticket = flow.offer("p", "t", "standard", 10)
    assert isinstance(ticket, Ticket)
    flow.leave(ticket)
    assert flow.queued("p") == 0
    outcome = await ticket.wait()
    assert isinstance(outcome, Rejected) and outcome.reason == "left"
