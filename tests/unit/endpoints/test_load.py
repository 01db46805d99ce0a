from __future__ import annotations

import math

from extproc.config.schema import SaturationConfig
from extproc.endpoints import Endpoint, EndpointMetrics
from extproc.endpoints.load import LoadModel
from extproc.flow.controller import _NO_RESERVE

CONFIG = SaturationConfig(max_kv_utilization=0.9, sustain_ms=1000, capacity_ttl_s=10)


def model(seats: int | None = None, replicas: int = 1) -> LoadModel:
    return LoadModel(CONFIG, stale_after_s=1.0, seats=seats, replicas=replicas)


def scrape(ep: Endpoint, at: float, running: float = 0, waiting: float = 0, kv: float = 0.1,
           steps: tuple[tuple[float, float], ...] = ()) -> None:
    ep.scraped(EndpointMetrics(scraped_at=at, running=running, waiting=waiting, kv_usage=kv,
                               step_tokens_buckets=steps), ep.fleet_in_flight, CONFIG)


def queue_for(ep: Endpoint, start: float, seconds: float, running: float, waiting: float = 2,
              kv: float = 0.1) -> float:
    """Scrapes every 100 ms showing `running` and a queue; returns the last scrape time."""
    at = start
    while at <= start + seconds + 1e-9:
        scrape(ep, at, running=running, waiting=waiting, kv=kv)
        at += 0.1
    return at - 0.1


def test_an_engine_without_a_lasting_queue_or_a_known_capacity_holds_nothing() -> None:
    ep = Endpoint("a:1", in_flight=50)
    scrape(ep, 10.0, running=40, waiting=10)
    assert model().room(ep, 10.1) == math.inf
    assert not model().saturated(ep, 10.1)


def test_a_lasting_queue_holds_new_requests_until_the_engine_has_taken_its_own() -> None:
    ep = Endpoint("a:1", in_flight=14)
    last = queue_for(ep, 10.0, 1.2, running=10, waiting=4, kv=0.85)  # KV-bound: no capacity learned
    assert ep.engine.capacity == 0 and model().queueing(ep)
    assert model().room(ep, last) == 0
    ep.in_flight = 11  # three finished: the engine admitted three of its four
    assert model().room(ep, last) == 0
    ep.in_flight = 10  # its queue is empty by now: one more may go
    assert model().room(ep, last) == 1
    scrape(ep, last + 0.1, running=10, waiting=0)  # the first scrape without a queue ends it
    assert not model().queueing(ep) and model().room(ep, last + 0.1) == math.inf


def test_a_queue_of_one_step_teaches_nothing() -> None:
    """The transient queue of vLLM's step boundaries: waiting now and then while 2 of 32 seats run."""
    ep = Endpoint("a:1")
    for i in range(100):
        scrape(ep, 10.0 + i * 0.1, running=2, waiting=1 if i % 3 == 0 else 0)
    assert ep.engine.capacity == 0 and model().room(ep, 20.0) == math.inf


def test_a_queue_that_lasts_on_a_plateau_teaches_the_capacity_never_below_the_peak() -> None:
    ep = Endpoint("a:1")
    scrape(ep, 9.0, running=30)  # the most ever seen running
    last = queue_for(ep, 10.0, 0.8, running=28)
    assert ep.engine.capacity == 0  # 0.8 s is not sustained yet
    last = queue_for(ep, last + 0.1, 0.3, running=27)
    assert ep.engine.capacity == 30 and ep.engine.confirmed_at == last
    assert model().room(ep, last) == 0  # queueing still
    scrape(ep, last + 0.1, running=27, waiting=0)
    assert model().room(ep, last + 0.1) == 30 - 27


def test_a_queue_while_running_climbs_is_not_a_plateau() -> None:
    ep = Endpoint("a:1")
    for i in range(20):  # 1 -> 20 running, requests waiting all along: the engine is still filling up
        scrape(ep, 10.0 + i * 0.1, running=1 + i, waiting=3)
    assert ep.engine.capacity == 0


def test_learned_capacity_grows_one_request_per_ttl_until_confirmed_again() -> None:
    ep = Endpoint("a:1")
    last = queue_for(ep, 10.0, 1.2, running=8)
    lm = model()
    assert lm.capacity(ep, last) == 8
    assert lm.capacity(ep, last + 25) == 10
    assert lm.capacity(ep, last + 25, reserve=0.25) == 6  # lower classes never probe: floor(8 x 0.75)
    queue_for(ep, last + 30, 1.2, running=9)
    assert lm.capacity(ep, last + 31.5) == 9


def test_a_class_whose_reserve_does_not_apply_gets_every_seat_and_does_not_probe() -> None:
    """Flow control lifts a lower class's reserve to `_NO_RESERVE` (not 0, which would probe): that must not
    cost it a seat per endpoint by rounding (it did: floor(32 x (1 - 1e-9) + 1e-9) = 31)."""
    ep = Endpoint("a:1")
    last = queue_for(ep, 10.0, 1.2, running=32)
    lm = model()
    assert lm.capacity(ep, last + 25, reserve=_NO_RESERVE) == 32  # neither 31 nor the probe's 34
    for seats in (8, 32, 256, 1024, 100_000):
        assert model(seats=seats).capacity(Endpoint("b:1"), 0.0, reserve=_NO_RESERVE) == seats


def test_configured_seats_cap_the_capacity_and_a_learned_one_lowers_it() -> None:
    ep = Endpoint("a:1", in_flight=3)
    scrape(ep, 10.0, running=3)
    assert model(seats=16).room(ep, 10.1) == 13
    assert model(seats=16).room(ep, 10.1, reserve=0.25) == 12 - 3
    last = queue_for(ep, 11.0, 1.2, running=6)
    assert model(seats=16).capacity(ep, last) == 6
    assert model(seats=4).capacity(ep, last) == 4


def test_requests_sent_since_the_scrape_count_and_the_in_flight_floor_holds() -> None:
    ep = Endpoint("a:1", in_flight=1)
    scrape(ep, 10.0, running=4, waiting=0)
    ep.in_flight = 4  # three sent since the scrape
    assert model().requests(ep, 10.05) == 4 + 3
    closing = Endpoint("b:1", in_flight=10)
    scrape(closing, 10.0, running=4)  # 6 finished in the engine, their streams still closing
    assert model().requests(closing, 10.05) == 10  # never below what is in flight
    closing.others_in_flight = 5
    assert model().requests(closing, 10.05) == 15
    assert model(replicas=3).in_flight(closing) == 10 * 3 + 5


def test_a_full_kv_cache_with_a_queue_has_no_room_until_a_request_finishes_there() -> None:
    lm = model(seats=100)
    queued = Endpoint("a:1", in_flight=6)
    scrape(queued, 10.0, running=5, waiting=1, kv=0.95)
    assert lm.room(queued, 10.1) == 0
    queued.in_flight = 5  # one finished: it freed blocks the scrape did not see
    assert lm.room(queued, 10.1) == 100 - 6 + 1
    idle = Endpoint("b:1")
    scrape(idle, 10.0, running=5, kv=0.95)
    assert lm.room(idle, 10.1) == 95  # full, but nothing waits: the next request's blocks fit
    calm = Endpoint("c:1")
    scrape(calm, 10.0, running=5, waiting=1, kv=0.5)
    assert lm.room(calm, 10.1) == 100 - 6


def test_stale_or_missing_metrics_leave_the_room_unknown() -> None:
    ep = Endpoint("a:1")
    assert model(seats=4).room(ep, 10.0) is None
    scrape(ep, 8.0, running=4)
    assert model(seats=4).room(ep, 10.0) is None
    assert model(seats=4).requests(ep, 10.0) == 0  # only the in-flight count is left


def steps(light: float, heavy: float) -> tuple[tuple[float, float], ...]:
    """A step-size histogram (cumulative, vLLM's buckets) with `light` steps of ~40 tokens, `heavy` of ~2,048."""
    bounds = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, math.inf)
    return tuple((b, light + (heavy if b >= 2048 else 0.0)) if b >= 64 else (b, 0.0) for b in bounds)


def test_a_queue_while_steps_are_full_of_prefill_teaches_nothing_about_seats() -> None:
    """Requests wait for the step's token budget (long prompts), not for a seat: 12 of 64 seats run."""
    ep = Endpoint("a:1")
    scrape(ep, 9.0, running=12, steps=steps(light=100, heavy=10))
    at, light, heavy = 10.0, 100.0, 10.0
    for _ in range(15):
        heavy += 9
        light += 1
        scrape(ep, at, running=12, waiting=3, steps=steps(light, heavy))
        at += 0.1
    assert ep.engine.capacity == 0
    # The same queue while steps are mostly light (decode): the seats are what is short.
    for _ in range(15):
        heavy += 1
        light += 9
        scrape(ep, at, running=12, waiting=3, steps=steps(light, heavy))
        at += 0.1
    assert ep.engine.capacity == 12


def test_a_queue_with_the_kv_cache_filling_up_teaches_nothing_about_seats() -> None:
    ep = Endpoint("a:1")
    for i in range(15):
        scrape(ep, 10.0 + i * 0.1, running=7, waiting=2, kv=0.85)
    assert ep.engine.capacity == 0
