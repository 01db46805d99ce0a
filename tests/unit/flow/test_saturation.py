from __future__ import annotations

import math

from extproc.endpoints import Endpoint
from extproc.endpoints.registry import EndpointMetrics
from extproc.flow import SaturationConfig, pool_room

CONFIG = SaturationConfig(max_waiting=2, max_kv_utilization=0.9, stale_after_ms=1000)


def endpoint(waiting: float = 0.0, kv: float = 0.1, scraped_at: float = 10.0, in_flight: int = 0,
             at_scrape: int = 0) -> Endpoint:
    ep = Endpoint("10.0.0.1:8000", in_flight=in_flight)
    ep.metrics = EndpointMetrics(scraped_at=scraped_at, waiting=waiting, kv_usage=kv)
    ep.in_flight_at_scrape = at_scrape
    return ep


def test_room_is_what_is_left_below_the_queue_threshold() -> None:
    room = pool_room([endpoint(waiting=0), endpoint(waiting=1), endpoint(waiting=5)], 10.5, CONFIG)
    assert room.requests == 3 and room.stale == 0


def test_requests_sent_since_the_scrape_count_as_queued_and_finished_ones_free_room() -> None:
    assert pool_room([endpoint(waiting=0, in_flight=3, at_scrape=1)], 10.5, CONFIG).requests == 0
    assert pool_room([endpoint(waiting=2, in_flight=1, at_scrape=3)], 10.5, CONFIG).requests == 2


def test_full_kv_cache_has_no_room() -> None:
    assert pool_room([endpoint(kv=0.95)], 10.5, CONFIG).requests == 0


def test_stale_or_missing_metrics_never_stall() -> None:
    stale = endpoint(waiting=9, scraped_at=8.0)
    never = Endpoint("10.0.0.2:8000")
    room = pool_room([stale, endpoint(waiting=9), never], 10.5, CONFIG)
    assert math.isinf(room.requests) and room.stale == 2
    assert math.isinf(pool_room([], 10.5, CONFIG).requests)


def test_learned_batch_capacity_leaves_the_reserve_free_for_higher_classes() -> None:
    ep = endpoint(waiting=0, in_flight=1, at_scrape=0)
    ep.metrics = EndpointMetrics(scraped_at=10.0, running=12, waiting=0, kv_usage=0.5)
    ep.batch_capacity, ep.batch_capacity_at = 16, 5.0
    # Load 12 running + 1 sent since the scrape: 3 more for the top class, floor(16 x 0.9) - 13 = 1
    # for a 10% reserve (two slots stay free).
    assert pool_room([ep], 10.5, CONFIG).requests == 3
    assert pool_room([ep], 10.5, CONFIG, reserve=0.1).requests == 1
    assert pool_room([ep], 10.5, CONFIG, reserve=0.25).requests == 0
    # Limited by max_num_seqs (KV cache mostly free when seen full): the capacity is what it is.
    ep.batch_capacity_at = -50.0
    assert pool_room([ep], 10.5, SaturationConfig(capacity_ttl_s=30)).requests == 3
    # Limited by the KV cache: not seen full for 2 x capacity_ttl_s, it probes two slots higher.
    ep.batch_capacity_kv = 0.9
    assert pool_room([ep], 10.5, SaturationConfig(capacity_ttl_s=30)).requests == 3 + 2


def test_load_is_never_below_what_this_process_has_in_flight() -> None:
    # vLLM already finished 3 of ours whose streams are still closing, and the scrape saw them gone.
    ep = endpoint(in_flight=10, at_scrape=10)
    ep.metrics = EndpointMetrics(scraped_at=10.0, running=7, waiting=0, kv_usage=0.1)
    ep.batch_capacity, ep.batch_capacity_at = 12, 9.0
    assert pool_room([ep], 10.5, CONFIG).requests == 12 - 10


def test_the_other_replicas_in_flight_requests_count_too() -> None:
    # The scrape saw 8 running; since then another service replica sent 3 more (synced through Redis),
    # which this replica's own since-scrape delta cannot see.
    ep = endpoint(in_flight=4, at_scrape=4)
    ep.metrics = EndpointMetrics(scraped_at=10.0, running=8, waiting=0, kv_usage=0.1)
    ep.batch_capacity, ep.batch_capacity_at = 16, 9.0
    assert pool_room([ep], 10.5, CONFIG).requests == 16 - 8
    ep.others_in_flight = 4 + 3
    assert pool_room([ep], 10.5, CONFIG).requests == 16 - (4 + 7)
    assert pool_room([ep], 10.5, CONFIG, reserve=0.25).requests == 12 - 11
