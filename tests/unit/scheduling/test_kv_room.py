"""The KV-room gate of second homes: prefix-affinity-scorer's `pair_shortfall` and `pair_hold_ms`, and its state
(`extproc.scheduling.kv_room`)."""

from __future__ import annotations

import dataclasses

import pytest

from extproc.endpoints import Endpoint
from extproc.scheduling.kv_room import KvRoom
from extproc.scheduling.plugins.prefix_affinity import Params, PrefixAffinityScorer
from tests.unit.scheduling.helpers import NOW, endpoint
from tests.unit.scheduling.test_prefix_pairs import fleet, question, send

GATED = Params(pair_requests=1.0, pair_shortfall=0.05, pair_hold_ms=500.0, pair_lifetime=0.0)


def report(endpoints: list[Endpoint], at: float, found: list[float], queried: float = 30_000.0) -> None:
    """A scrape of every engine at `at`: each looked up `queried` more prompt tokens and found `found[i]` of them."""
    for e, share in zip(endpoints, found, strict=True):
        m = e.metrics
        assert m is not None
        e.metrics = dataclasses.replace(m, scraped_at=at, prefix_queries=m.prefix_queries + queried,
                                        prefix_hits=m.prefix_hits + queried * share)


def expect(room: KvRoom, endpoints: list[Endpoint], at: float, tokens: float = 30_000.0) -> None:
    """The gateway sent every endpoint `tokens` of prompts that the directory said it held 90% of."""
    for e in endpoints:
        for n in range(10):
            room.sent(n, e.address, tokens / 10, 0.9 * tokens / 10, at)


def warm(room: KvRoom, endpoints: list[Endpoint], at: float, found: list[float]) -> None:
    """Sends and scrapes up to `at`: a first scrape (the counters' base), sends expected 90% cached, a scrape where
    the engines found `found` of what they looked up."""
    expect(room, endpoints, at - 1.0)
    report(endpoints, at - 1.0, found, 0.0)
    room.check(endpoints, at - 1.0)
    expect(room, endpoints, at - 0.5)
    report(endpoints, at - 0.2, found)


def test_an_engine_finding_less_than_the_gateway_expected_is_evicting_until_it_has_been_calm_for_the_hold() -> None:
    endpoints = [endpoint(f"10.0.0.{i}:8000") for i in range(2)]
    room = KvRoom(shortfall=0.05, hold_s=1.0)
    warm(room, endpoints, NOW, [0.9, 0.6])
    room.check(endpoints, NOW)
    assert not room.evicting(endpoints[0].address)
    assert room.evicting(endpoints[1].address) and room.pool_evicting
    assert room.shortfall_of(endpoints[1].address) == pytest.approx(0.3)
    # Both now find what they were sent (much more of it: the shortfall falls under half the threshold at once).
    for step in range(1, 4):
        expect(room, endpoints, NOW + 0.5 * step, 1e6)
        report(endpoints, NOW + 0.5 * step + 0.1, [0.9, 0.9], 1e6)
        room.check(endpoints, NOW + 0.5 * step + 0.2)
        assert room.evicting(endpoints[1].address) == (step < 3)  # calm from the first of these; 1 s later: clear
    assert not room.pool_evicting


def test_a_prefix_placed_moments_ago_is_not_expected_cached_yet() -> None:
    endpoints = [endpoint("10.0.0.1:8000")]
    room = KvRoom(shortfall=0.05, hold_s=1.0)
    room.sent(7, endpoints[0].address, 1000.0, 0.0, NOW - 1.1)  # placed: its first prefill may still be queued
    room.check(endpoints, NOW - 1.0)
    for n in range(30):  # requests following it at once find nothing cached: not eviction
        room.sent(7, endpoints[0].address, 1000.0, 900.0, NOW - 1.0 + n * 0.01)
    report(endpoints, NOW - 0.2, [0.0])
    room.check(endpoints, NOW)
    assert not room.pool_evicting


@pytest.mark.parametrize("found", [0.9, 0.5])
def test_no_second_home_while_an_engine_is_evicting(found: float) -> None:
    endpoints = fleet(running=8)  # busy: a prefix's second request would get a second home
    scorer = PrefixAffinityScorer("p", GATED)
    assert scorer.room is not None
    warm(scorer.room, endpoints, NOW, [0.9] * 7 + [found])
    first = send(scorer, question(0), endpoints, NOW)
    second = send(scorer, question(1), endpoints, NOW + 0.1)
    assert (second == first) == (found < 0.9)


def test_paired_prefixes_keep_to_one_home_under_eviction_and_pair_again_once_it_clears() -> None:
    endpoints = fleet(running=8)
    scorer = PrefixAffinityScorer("p", GATED)
    room = scorer.room
    assert room is not None
    warm(room, endpoints, NOW, [0.9] * 8)
    first = send(scorer, question(0), endpoints, NOW)
    second = send(scorer, question(1), endpoints, NOW + 0.1)
    assert second != first
    # An engine starts missing what it was sent: the prefix keeps to the home it was sent to last.
    later = NOW + 10.0
    warm(room, endpoints, later, [0.9] * 7 + [0.5])
    assert [send(scorer, question(n), endpoints, later + 0.01 * n) for n in range(2, 10)] == [second] * 8
    # It finds what it is sent again; after the hold, requests alternate between the two homes again.
    for step in range(1, 4):
        expect(room, endpoints, later + 0.4 * step, 1e6)
        report(endpoints, later + 0.4 * step + 0.1, [0.9] * 8, 1e6)
        room.check(endpoints, later + 0.4 * step + 0.2)
    assert not room.pool_evicting
    again = later + 10.0
    assert {send(scorer, question(n), endpoints, again) for n in range(10, 18)} == {first, second}


def test_gate_parameters_are_validated_and_the_gate_needs_pairs() -> None:
    for bad in ({"pair_shortfall": -0.1}, {"pair_hold_ms": -1.0}):
        with pytest.raises(ValueError):
            Params(**bad)  # type: ignore[arg-type]
    assert PrefixAffinityScorer("p", Params(pair_requests=0.0, pair_shortfall=0.05)).room is None
