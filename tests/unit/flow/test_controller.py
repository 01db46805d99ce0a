from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import pytest

from extproc.flow import GO, FlowControlConfig, FlowController, PriorityClass, Rejected, Room, Ticket


class Fleet:
    """A pool whose room (for the top class) the test sets; a class keeping `reserve` of the batch free
    sees `reserve x BATCH` less of it, as with one endpoint of BATCH slots."""

    BATCH = 10

    def __init__(self, room: float = 0.0) -> None:
        self.room = room
        self.now = 100.0

    def __call__(self, pool: str, now: float, reserve: float, enough: float) -> Room:
        return Room(self.room - reserve * self.BATCH, 0)


def controller(fleet: Fleet, **overrides: object) -> FlowController:
    classes = {"critical": PriorityClass(priority=100, max_wait_s=5.0),
               "standard": PriorityClass(priority=50, max_wait_s=0.2, reject_status=429, reserve=0.2),
               "sheddable": PriorityClass(priority=0, max_wait_s=0.0)}
    config = FlowControlConfig.model_validate({"classes": classes, **overrides})
    return FlowController(lambda: config, fleet, clock=lambda: fleet.now)


async def test_room_means_go_and_no_room_sheds_sheddable_at_once() -> None:
    fleet = Fleet(room=4)
    flow = controller(fleet)
    assert flow.offer("p", "t", "standard", 10) == GO
    fleet.room = 0
    shed = flow.offer("p", "t", "sheddable", 10)
    assert isinstance(shed, Rejected) and shed.reason == "saturated" and shed.status == 503
    assert flow.stats()["p"]["saturated"] is True


async def test_queued_requests_are_granted_in_priority_order_as_room_appears() -> None:
    fleet = Fleet(room=0)
    flow = controller(fleet)
    std = flow.offer("p", "t1", "standard", 10)
    crit = flow.offer("p", "t2", "critical", 10)
    assert isinstance(std, Ticket) and isinstance(crit, Ticket)
    assert flow.queued("p") == 2
    fleet.room = 1
    flow.kick("p")
    assert crit.granted and not std.granted
    # The grant counts against the room until the request is routed: no second grant yet.
    fleet.room = 3
    flow.kick("p")
    assert not std.granted
    flow.routed(crit)
    flow.kick("p")
    assert std.granted
    assert await crit.wait() is None


async def test_a_new_request_does_not_jump_the_queue() -> None:
    fleet = Fleet(room=0)
    flow = controller(fleet)
    first = flow.offer("p", "a", "critical", 10)
    assert isinstance(first, Ticket)
    fleet.room = 1
    second = flow.offer("p", "b", "critical", 10)  # the queued one takes the room first
    assert first.granted
    assert isinstance(second, Ticket) and not second.granted


async def test_wait_past_the_class_limit_is_rejected_with_its_status() -> None:
    fleet = Fleet(room=0)
    flow = controller(fleet)
    ticket = flow.offer("p", "t", "standard", 10)
    assert isinstance(ticket, Ticket)
    fleet.now += 0.25
    outcome = await asyncio.wait_for(ticket.wait(), 2.0)
    assert isinstance(outcome, Rejected) and outcome.reason == "timeout" and outcome.status == 429
    assert outcome.waited_s == pytest.approx(0.25)
    assert flow.queued("p") == 0
    assert flow.stats()["p"]["classes"]["standard"]["rejected"] == {"timeout": 1}


async def test_client_leaving_takes_its_place_out_at_once() -> None:
    fleet = Fleet(room=0)
    flow = controller(fleet)
    ticket = flow.offer("p", "t", "critical", 10)
    assert isinstance(ticket, Ticket)
    awaiting = asyncio.Event()

    async def handler() -> Rejected | None:
        awaiting.set()
        return await ticket.wait()  # no suspension between the two lines: the test resumes once this waits

    waiting = asyncio.create_task(handler())
    await awaiting.wait()
    waiting.cancel()  # what the gRPC stream's cancellation does to the awaiting handler
    flow.leave(ticket)
    assert flow.queued("p") == 0
    assert flow.stats()["p"]["classes"]["critical"]["left"] == 1
    # Room that appears later goes to nobody; a granted-but-abandoned ticket gives its room back.
    second = flow.offer("p", "t", "critical", 10)
    assert isinstance(second, Ticket)
    fleet.room = 1
    flow.kick("p")
    assert second.granted
    flow.leave(second)
    third = flow.offer("p", "t", "critical", 10)
    assert third == GO


async def test_full_queue_displaces_lower_classes_never_higher() -> None:
    fleet = Fleet(room=0)
    flow = controller(fleet, max_queued=2)
    low = flow.offer("p", "a", "standard", 10)
    crit1 = flow.offer("p", "b", "critical", 10)
    assert isinstance(low, Ticket) and isinstance(crit1, Ticket)
    crit2 = flow.offer("p", "c", "critical", 10)
    assert isinstance(crit2, Ticket)
    displaced = await low.wait()
    assert isinstance(displaced, Rejected) and displaced.reason == "displaced"
    refused = flow.offer("p", "d", "standard", 10)
    assert isinstance(refused, Rejected) and refused.reason == "queue_full"
    assert flow.queued("p") == 2


async def test_unknown_room_never_queues() -> None:
    fleet = Fleet(room=math.inf)
    flow = controller(fleet)
    assert all(flow.offer("p", "t", "standard", 10) == GO for _ in range(100))


async def test_reserved_slots_let_a_higher_class_start_while_a_lower_one_waits() -> None:
    fleet = Fleet(room=1)  # one slot left: inside the standard class's reserve (2 of 10)
    flow = controller(fleet, aging_per_s=1000.0)
    std = flow.offer("p", "a", "standard", 10)
    assert isinstance(std, Ticket)
    fleet.now += 1.0  # aged far past critical's priority, and still no room for its class
    assert flow.offer("p", "b", "critical", 10) == GO
    fleet.room = 0  # it was routed: the slot is taken
    crit = flow.offer("p", "c", "critical", 10)
    assert isinstance(crit, Ticket)
    fleet.room = 1
    flow.kick("p")  # ranked first, the aged standard request still has no room; critical fits
    assert crit.granted and not std.granted


def test_a_pools_room_is_counted_only_as_far_as_needed() -> None:
    seen: list[float | None] = []

    def rooms(values: list[float | None]) -> Iterator[float | None]:
        for value in values:
            seen.append(value)
            yield value

    assert Room.of(rooms([1.0, 2.0, 3.0, 4.0])) == Room(10.0, 0)  # exact without `enough`
    seen.clear()
    assert Room.of(rooms([0.0, 2.0, 3.0, 4.0]), enough=2.0) == Room(2.0, 0)
    assert seen == [0.0, 2.0]
    seen.clear()
    assert Room.of(rooms([0.0, None, 3.0, None]), enough=5.0) == Room(math.inf, 1)  # unknown: unlimited
    assert seen == [0.0, None]
    assert Room.of(rooms([0.0, 0.0]), enough=1.0) == Room(0.0, 0)
    assert Room.of(rooms([])) == Room(math.inf, 0)


async def test_the_reserve_applies_while_the_pool_is_saturated_and_not_while_seats_free_often() -> None:
    fleet = Fleet(room=1)  # one seat, which standard's reserve (0.2 x 10 seats) keeps for critical
    flow = controller(fleet)
    held = flow.offer("p", "t", "standard", 10)
    assert isinstance(held, Ticket)  # no request has finished yet (a pool filling from idle): the reserve holds
    for _ in range(20):  # the onset's first completions: what queued meanwhile still leaves the reserve free
        fleet.now += 0.01
        flow.finished("p")
    assert not held.granted
    flow.leave(held)  # the queue is empty: the pool is no longer saturated
    for _ in range(20):  # requests finish every 10 ms: a queued critical request would get a seat at once
        fleet.now += 0.01
        flow.finished("p")
    assert flow.offer("p", "t", "standard", 10) == GO
    fleet.room = 0  # the pool is full: standard queues, and after a second of queueing the reserve is back
    waiting = flow.offer("p", "t", "standard", 10)
    assert isinstance(waiting, Ticket)
    fleet.room = 1
    fleet.now += 1.0
    flow.finished("p")
    assert not waiting.granted
    fleet.room = 3  # beyond the reserve: granted; the queue empties, and the reserve stops applying
    flow.finished("p")
    assert waiting.granted
    flow.routed(waiting)
    fleet.room = 1
    for _ in range(20):
        fleet.now += 0.01
        flow.finished("p")
    assert flow.offer("p", "t", "standard", 10) == GO


async def test_while_reserves_do_not_apply_every_class_is_served_in_arrival_order() -> None:
    """Below saturation every class takes the same seats: a burst delays each a little, in arrival order, as the
    engines' own queues would (flow control invisible), not the lower classes a lot for critical's sake (with
    critical first, standard's TTFT p99 at 0.9x was +11% pooled over 12 seeds in virtual time, +53% on one:
    reports/i13-s11). A critical request that has waited PROMOTE_AFTER_S goes first; while the pool is saturated
    (it filled from idle: no seat has freed yet; or the queue lasted SATURATED_AFTER_S) priority order comes back
    with the reserves."""
    classes = {"critical": PriorityClass(priority=100, max_wait_s=5.0),
               "standard": PriorityClass(priority=50, max_wait_s=5.0, reserve=0.1),
               "sheddable": PriorityClass(priority=0, max_wait_s=5.0, reserve=0.1)}
    config = FlowControlConfig.model_validate({"classes": classes})
    fleet = Fleet(room=0)
    flow = FlowController(lambda: config, fleet, clock=lambda: fleet.now)
    for _ in range(20):  # seats free every 10 ms: a busy pool, not a saturated one
        fleet.now += 0.01
        flow.finished("p")
    shed = flow.offer("p", "a", "sheddable", 10)
    fleet.now += 0.001
    std = flow.offer("p", "b", "standard", 10)
    fleet.now += 0.001
    crit = flow.offer("p", "c", "critical", 10)
    assert isinstance(shed, Ticket) and isinstance(std, Ticket) and isinstance(crit, Ticket)
    fleet.room = 1
    for first, *rest in ((shed, std, crit), (std, crit), (crit,)):
        fleet.now += 0.01
        flow.finished("p")
        assert first.granted and not any(t.granted for t in rest)
        flow.routed(first)

    fleet.room = 0
    shed = flow.offer("p", "a", "sheddable", 10)
    crit = flow.offer("p", "c", "critical", 10)
    assert isinstance(shed, Ticket) and isinstance(crit, Ticket)
    for _ in range(30):  # seats still free every 10 ms, none for this queue: 0.3 s of queue, not saturated
        fleet.now += 0.01
        flow.finished("p")
    fleet.room = 1
    flow.kick("p")
    assert crit.granted and not shed.granted  # but critical waited PROMOTE_AFTER_S: it goes first
    flow.routed(crit)
    fleet.room = 0
    crit = flow.offer("p", "c", "critical", 10)
    assert isinstance(crit, Ticket)
    for _ in range(270):  # the queue has lasted SATURATED_AFTER_S
        fleet.now += 0.01
        flow.finished("p")
    fleet.room = 2  # one seat beyond the lower classes' reserve (0.1 x 10)
    flow.kick("p")
    assert crit.granted and not shed.granted

    filling = FlowController(lambda: config, Fleet(room=0), clock=lambda: fleet.now)
    shed = filling.offer("p", "a", "sheddable", 10)
    fleet.now += 0.001
    std = filling.offer("p", "b", "standard", 10)
    assert isinstance(shed, Ticket) and isinstance(std, Ticket)
    filling._room = Fleet(room=2)  # one seat for the lower classes beyond the reserve (0.1 x 10)
    filling.kick("p")
    assert std.granted and not shed.granted


async def test_with_several_replicas_the_pools_rate_of_freed_seats_counts_the_others_completions() -> None:
    """Each replica sees only its own completions: one per 80 ms here is slow for a pool (the reserve would hold
    standard), but with 3 replicas the pool frees one per ~27 ms, a busy pool whose reserve does not apply."""
    fleet = Fleet(room=1)  # one seat, inside standard's reserve (0.2 x 10)
    flows = {n: controller(fleet) for n in (1, 3)}
    flows[3].replicas = lambda: 3
    for _ in range(20):
        fleet.now += 0.08
        for flow in flows.values():
            flow.finished("p")
    assert isinstance(flows[1].offer("p", "t", "standard", 10), Ticket)
    assert flows[3].offer("p", "t", "standard", 10) == GO


async def test_a_queue_that_lasts_two_seconds_while_each_request_waits_briefly_is_no_saturation() -> None:
    """A burst at 0.9x drains at a tenth of the pool's rate: the queue stays non-empty for up to ~2 s (virtual time,
    15 seeds) while each request waits a few hundred ms. Reserves then (sessions 9-10: once the queue had lasted
    1 s) kept seats idle for critical while the lower classes queued and made the backlog last longer (sheddable
    TTFT p99 540 vs 277 ms without flow control, reports/i13-s11)."""
    fleet = Fleet(room=0)
    flow = controller(fleet)
    for _ in range(20):  # a busy pool: a seat frees every 10 ms
        fleet.now += 0.01
        flow.finished("p")
    queued = [flow.offer("p", "t", "critical", 10), flow.offer("p", "t", "critical", 10)]
    for _ in range(20):  # 2 s of queue, never empty: every 100 ms the oldest is granted and one more arrives
        fleet.room = 1
        fleet.now += 0.01
        flow.finished("p")
        ticket = queued.pop(0)
        assert isinstance(ticket, Ticket) and ticket.granted
        fleet.room = 0
        flow.routed(ticket)
        for _ in range(9):
            fleet.now += 0.01
            flow.finished("p")
        queued.append(flow.offer("p", "t", "critical", 10))
        assert flow.queued("p") == 2
    std = flow.offer("p", "u", "standard", 10)
    assert isinstance(std, Ticket)
    fleet.room = 3  # the two criticals, then one seat inside standard's reserve (0.2 x 10)
    flow.kick("p")
    assert std.granted  # the reserve does not apply


async def test_with_several_replicas_a_gap_in_this_replicas_own_completions_is_no_slow_pool() -> None:
    """At 0.9x with 3 replicas each sees ~28 of the pool's ~85 completions per second. A gap of 170 ms in its own
    (about 1% of them) said "seats free slowly" when judged over one replica's window: the reserves applied and
    held the lower classes while the pool freed a seat every 12 ms. Over a window that grows with the replicas, it
    takes a gap that long to mean as much as it does to one replica that sees every completion."""
    fleet = Fleet(room=1)  # one seat, inside standard's reserve (0.2 x 10)
    flows = {n: controller(fleet) for n in (1, 3)}
    flows[3].replicas = lambda: 3
    for _ in range(28):
        fleet.now += 1 / 28
        for flow in flows.values():
            flow.finished("p")
    fleet.now += 0.17
    assert isinstance(flows[1].offer("p", "t", "standard", 10), Ticket)  # one replica: the pool did slow down
    assert flows[3].offer("p", "t", "standard", 10) == GO


async def test_below_saturation_a_class_serves_its_tenants_in_arrival_order_and_by_fair_share_once_saturated() -> None:
    """Fair share between a class's tenants is for a saturated pool. Below saturation it made a light tenant's new
    request go before a heavy tenant's older one, and, the class being ranked by its oldest request, before older
    requests of the other classes too (sheddable TTFT p99 +23% at 0.9x on the locked bench, reports/i13-s11)."""
    for saturated in (False, True):
        fleet = Fleet(room=0)
        flow = controller(fleet)
        if not saturated:
            for _ in range(20):  # a busy pool: a seat frees every 10 ms
                fleet.now += 0.01
                flow.finished("p")
        heavy = []
        for _ in range(3):
            heavy.append(flow.offer("p", "heavy", "critical", 10))
            fleet.now += 0.001
        light = flow.offer("p", "light", "critical", 10)
        fleet.room = 1
        flow.kick("p")  # the oldest: heavy's first (both tenants' counters level)
        granted = [t for t in (*heavy, light) if isinstance(t, Ticket) and t.granted]
        assert len(granted) == 1
        for ticket in granted:
            flow.routed(ticket)
        flow.kick("p")
        second = [t for t in (*heavy, light) if isinstance(t, Ticket) and t.granted and t not in granted]
        assert len(second) == 1
        # Arrival order: heavy's second request. Fair share: light, served less than heavy (one grant).
        assert (second[0] is light) is saturated, saturated
