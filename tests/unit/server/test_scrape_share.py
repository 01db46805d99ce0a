"""Shared scrapes between service replicas, without Redis: one replica's published scrapes adopted by another
(the exchange through a real redis-server: tests/integration/server/test_fleet.py)."""

from __future__ import annotations

import json

import pytest

from extproc.endpoints import Endpoint, EndpointMetrics, EndpointRegistry
from extproc.endpoints.config import SaturationConfig
from extproc.endpoints.load import LoadModel
from extproc.server.scrape_share import ScrapeShare

ADDRESS = "10.0.0.1:8000"
WALL = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def replica(name: str, clock: Clock) -> tuple[ScrapeShare, Endpoint]:
    registry = EndpointRegistry()
    registry.adopt([("chat", [ADDRESS])])
    share = ScrapeShare(registry, name, 0.24, clock=clock)
    share.live(["a", "b"])
    return share, registry.endpoints()[0]


def test_an_adopted_scrape_counts_from_the_in_flight_of_its_moment_not_of_its_adoption() -> None:
    """The publisher's scrape showed 30 running, when the replicas had 30 requests there (its 10, the others' 20).
    By the adoption two have ended (the adopter has 9, the others 19): the adopter counts 28, as the publisher
    does. Taking the adopter's count at adoption as the scrape's moment (as before) kept them at 30 until the
    next shared scrape: a full pool with two seats free."""
    clock = Clock()
    publisher, scraped = replica("a", clock)
    adopter, adopted = replica("b", clock)
    scraped.in_flight, scraped.others_in_flight = 10, 20
    metrics = EndpointMetrics(scraped_at=50.0, running=30)
    scraped.scraped(metrics, 30, SaturationConfig())  # as the scraper records it: `fleet_in_flight`
    publisher.scraped(scraped, metrics)
    payload = publisher.payload(WALL, 1.0)
    assert payload is not None
    clock.now = 50.03
    scraped.in_flight, scraped.others_in_flight = 9, 19
    adopted.in_flight, adopted.others_in_flight = 9, 19
    assert adopter.adopt({publisher.field: payload.encode()}, WALL + 0.03) == 1
    assert adopted.in_flight_at_scrape == 30
    load = LoadModel(SaturationConfig(), stale_after_s=1.0, seats=30)
    assert load.requests(adopted, 50.03) == load.requests(scraped, 50.03) == 28
    assert load.room(adopted, 50.03) == 2


def test_an_older_replicas_entry_without_the_count_is_adopted_with_the_adopters_count() -> None:
    clock = Clock()
    adopter, adopted = replica("b", clock)
    adopted.in_flight, adopted.others_in_flight = 4, 3
    entry = [1, 0.01, 6, 1, 0.5, [], [], 0, 0, 0, 16, 1000, [], 0, 0, 0, []]  # sequence + the 16 scrape fields
    raw = f"{WALL} {json.dumps({ADDRESS: entry})}".encode()
    assert adopter.adopt({"a/scrapes": raw}, WALL) == 1
    assert adopted.metrics is not None and adopted.metrics.running == 6 and adopted.in_flight_at_scrape == 7


@pytest.mark.parametrize("count", [-1, 1 << 25, 2.5, True, "7", None, [3]])
def test_a_malformed_in_flight_count_rejects_the_entry(count: object) -> None:
    """The fleet hash is shared: a bad count (negative, absurd, not an integer) must not set anyone's load."""
    clock = Clock()
    adopter, adopted = replica("b", clock)
    entry = [1, 0.01, 6, 1, 0.5, [], [], 0, 0, 0, 16, 1000, [], 0, 0, 0, [], count]
    raw = f"{WALL} {json.dumps({ADDRESS: entry})}".encode()
    assert adopter.adopt({"a/scrapes": raw}, WALL) == 0
    assert adopted.metrics is None
    extra = [*entry[:-1], 3, 4]  # one value too many
    assert adopter.adopt({"a/scrapes": f"{WALL} {json.dumps({ADDRESS: extra})}".encode()}, WALL) == 0
