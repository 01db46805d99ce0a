"""The cache-lifetime rule of second homes: prefix-affinity-scorer's `pair_lifetime` and its state
(`extproc.scheduling.cache_life`)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from extproc.endpoints import Endpoint
from extproc.scheduling.cache_life import DECIDE_AGE_S, DECIDE_BY_S, CacheLife, _below
from extproc.scheduling.plugins.prefix_affinity import Params, PrefixAffinityScorer
from tests.unit.scheduling.helpers import NOW, endpoint
from tests.unit.scheduling.test_prefix_pairs import question, send

KV_BLOCKS = 500  # x 16 = 8,000 tokens per engine


def fleet(running: float = 8.0, blocks: int = KV_BLOCKS) -> list[Endpoint]:
    endpoints = [endpoint(f"10.0.0.{i + 1}:8000", running=running) for i in range(8)]
    for e in endpoints:
        assert e.metrics is not None
        e.metrics = dataclasses.replace(e.metrics, num_gpu_blocks=blocks, block_size=16)
    return endpoints


def test_the_lifetime_solves_the_lru_characteristic_time_equation() -> None:
    assert CacheLife.lifetime(60_000.0, 4_000.0, []) == pytest.approx(15.0, rel=1e-6)
    # A family asked very often is always cached: it takes its tokens off the room the writes cycle through.
    assert CacheLife.lifetime(60_000.0, 4_000.0, [(18_000.0, 100.0)]) == pytest.approx(10.5, rel=1e-3)
    # One asked rarely holds a part of its tokens: in between.
    assert 10.5 < CacheLife.lifetime(60_000.0, 4_000.0, [(18_000.0, 0.05)]) < 15.0
    assert CacheLife.lifetime(60_000.0, 0.0, []) == float("inf")


def replay(life: CacheLife, sends: list[tuple[float, int, str, float, float]]) -> None:
    """(time, family, address, prefix tokens, written tokens) sends, in time order as a gateway makes them."""
    for at, family, address, prefix, written in sorted(sends):
        life.sent(family, address, prefix, written, at)


def background(life: CacheLife, endpoints: list[Endpoint], start: float, seconds: int) -> None:
    """Every engine is sent a request of its own family each 0.1 s, writing 400 tokens: 4,000 tokens/s, so with
    8,000 tokens of KV its cache lifetime is about 1.9 s (the family's 400 prefix tokens always cached)."""
    for step in range(seconds * 10):
        for n, e in enumerate(endpoints):
            life.sent(1000 + n, e.address, 400.0, 400.0, start + step * 0.1)


@pytest.mark.parametrize(("gap", "placed"), [(0.1, True), (1.0, False)])
def test_a_copy_is_placed_only_if_requests_at_half_the_rate_come_within_the_lifetime(gap: float,
                                                                                      placed: bool) -> None:
    endpoints = fleet()
    life = CacheLife(margin=2.0)
    background(life, endpoints, NOW - 10.0, 10)
    home, target = endpoints[0], endpoints[1]
    for n in range(round(3.0 / gap)):  # the prefix asked every `gap` seconds at its home for 3 s
        life.sent(7, home.address, 300.0, 100.0, NOW - 3.0 + n * gap)
    # every 0.1 s: 2 x 2 / 10 = 0.4 s per copy within ~1.8 s; every 1 s: 4 s, not within it
    assert life.allows(7, 300.0, target, [home.address], NOW) == placed


def test_a_copy_that_would_push_the_targets_cached_families_out_is_refused_and_stays_refused() -> None:
    endpoints = fleet()
    home, target = endpoints[0], endpoints[1]
    # 10 s: both engines write 1,000 tokens/s; a new busy prefix (3,000 tokens) is asked 20 times a second at its
    # home for the last 2 s (young enough to be weighed).
    sends = [(NOW - 10.0 + step * 0.1, n, e.address, 100.0, 100.0) for step in range(100)
             for n, e in ((1, home), (2, target))]
    sends += [(NOW - 2.0 + n * 0.05, 7, home.address, 3000.0, 0.0) for n in range(40)]
    life = CacheLife(margin=2.0)
    replay(life, sends)
    assert life.allows(7, 3000.0, target, [home.address], NOW)
    # The target also caches a family of 3,000 tokens asked every 2.5 s: within its lifetime (~5 s) now, not
    # twice within it once a 3,000-token copy takes room there (~2.5 s).
    other = CacheLife(margin=2.0)
    replay(other, [*sends, *((NOW - 10.0 + n * 2.5, 3, target.address, 3000.0, 0.0) for n in range(4))])
    assert not other.allows(7, 3000.0, target, [home.address], NOW)
    # Decided once: not weighed again for REFUSED_S, even towards an engine with room (nothing sent there yet);
    # and never once the family is older than DECIDE_BY_S.
    idle = endpoints[2]
    assert life.allows(7, 3000.0, idle, [home.address], NOW)
    assert not other.allows(7, 3000.0, idle, [home.address], NOW + 1.0)
    fresh = CacheLife(margin=2.0)
    replay(fresh, sends)
    assert not fresh.allows(7, 3000.0, idle, [home.address], NOW - 2.0 + DECIDE_BY_S + 0.5)


def test_an_engine_that_did_not_report_its_kv_size_gets_no_copy() -> None:
    endpoints = fleet(blocks=0)
    life = CacheLife(margin=2.0)
    for n in range(20):
        life.sent(7, endpoints[0].address, 300.0, 100.0, NOW - 2.0 + n * 0.1)
    assert not life.allows(7, 300.0, endpoints[1], [endpoints[0].address], NOW)


def at(endpoints: list[Endpoint], now: float) -> list[Endpoint]:
    """The engines as scraped at `now` (busy: the pool's average load stays over `pair_load`)."""
    for e in endpoints:
        assert e.metrics is not None
        e.metrics = dataclasses.replace(e.metrics, scraped_at=now)
    return endpoints


@pytest.mark.parametrize("lifetime", [0.0, 2.0])
def test_a_prefix_asked_too_rarely_for_two_copies_to_stay_cached_keeps_one_home(lifetime: float) -> None:
    endpoints = fleet()
    scorer = PrefixAffinityScorer("p", Params(pair_requests=1.0, pair_lifetime=lifetime))
    assert (scorer.life is None) == (lifetime == 0)
    if scorer.life is not None:
        background(scorer.life, endpoints, NOW - 10.0, 20)  # the engines' caches turn over in ~2 s
    # Asked once a second: 2 s per copy, margin 2: 4 s; decided once DECIDE_AFTER requests are counted.
    homes = {send(scorer, question(n), at(endpoints, NOW + n), NOW + n) for n in range(6)}
    assert (len(homes) == 1) == (lifetime > 0)


def test_a_busy_prefix_still_gets_its_second_home_with_the_rule() -> None:
    endpoints = fleet(blocks=20_000)  # 320,000 tokens: the caches turn over in ~80 s
    scorer = PrefixAffinityScorer("p", Params(pair_requests=1.0, pair_lifetime=3.0))
    assert scorer.life is not None
    background(scorer.life, endpoints, NOW - 10.0, 11)
    homes = [send(scorer, question(n), at(endpoints, NOW + 0.1 * n), NOW + 0.1 * n) for n in range(30)]
    young = round(DECIDE_AGE_S / 0.1)
    assert len(set(homes[:young])) == 1  # not weighed in its first DECIDE_AGE_S
    assert len(set(homes)) == 2


def uniform(life: CacheLife, endpoints: list[Endpoint], start: float, seconds: float, rate: float) -> None:
    """Six families per engine, each asked `rate` times a second (3,000-token prefixes, 400 tokens written)."""
    step = 1.0 / rate
    for k in range(round(seconds / step)):
        for n, e in enumerate(endpoints):
            for f in range(6):
                life.sent(100 + 6 * n + f, e.address, 3000.0, 400.0, start + k * step + f * step / 6)


def test_where_every_family_is_asked_alike_a_young_family_is_weighed_on_the_pools_rate() -> None:
    endpoints = fleet(blocks=4_000)  # 64,000 tokens per engine
    life = CacheLife(margin=2.0, refresh_s=2.5)
    uniform(life, endpoints, NOW - 10.0, 10.0, 1.5)
    home, target = endpoints[0], endpoints[1]
    # A new family asked twice in its first 1.5 s (too few to rate it alone, DECIDE_AFTER): the families differ by
    # no more than Poisson noise, so it counts as asked like them (1.5 a second) and its copy stays cached.
    for at in (NOW - 1.5, NOW - 0.7):
        life.sent(7, home.address, 3000.0, 3400.0 if at == NOW - 1.5 else 400.0, at)
    assert life.allows(7, 3000.0, target, [home.address], NOW)
    # Where popularity is skewed (one busy family per engine besides the even ones), two requests are too few.
    skewed = CacheLife(margin=2.0, refresh_s=2.5)
    uniform(skewed, endpoints, NOW - 10.0, 10.0, 1.5)
    for n, e in enumerate(endpoints):
        for k in range(200):
            skewed.sent(900 + n, e.address, 3000.0, 400.0, NOW - 10.0 + k * 0.05)
    for at in (NOW - 1.5, NOW - 0.7):
        skewed.sent(7, home.address, 3000.0, 3400.0 if at == NOW - 1.5 else 400.0, at)
    assert not skewed.allows(7, 3000.0, target, [home.address], NOW)


@pytest.mark.parametrize(("replayed", "conversations"), [(False, False), (True, False), (False, True), (True, True)])
def test_a_conversation_family_is_paired_unless_conversations_are_off(replayed: bool, conversations: bool) -> None:
    endpoints = fleet(blocks=20_000)
    life = CacheLife(margin=2.0, conversations=conversations)
    home, target = endpoints[0], endpoints[1]
    for n in range(40):  # a busy family, one of whose requests replays an earlier prompt (a next turn)
        life.sent(7, home.address, 300.0, 100.0, NOW - 2.0 + n * 0.05, replayed=replayed and n == 20)
    assert life.allows(7, 300.0, target, [home.address], NOW) == (conversations or not replayed)


def test_placements_asked_again_are_the_familys_footprint_one_offs_are_writes() -> None:
    endpoints = fleet(blocks=2_000)
    target, other = endpoints[0], endpoints[1]
    life = CacheLife(margin=2.0)
    # Both engines are sent a 3,000-token prompt of a new family every 0.5 s; at `target` each family is asked
    # again at once (so each was the placement of a family kept there), at `other` never (one-off writes).
    for k in range(20):
        at = NOW - 10.0 + k * 0.5
        life.sent(500 + k, target.address, 3000.0, 3000.0, at)
        life.sent(500 + k, target.address, 3000.0, 50.0, at + 0.01)
        life.sent(900 + k, other.address, 3000.0, 3000.0, at)
    kept, _ = life._load(target.address, NOW, {})
    once, _ = life._load(other.address, NOW, {})
    assert once == pytest.approx(6_000.0, rel=0.15)  # 3,000 tokens twice a second
    assert kept < 0.1 * once  # the reuses' 50 tokens only


def test_the_rule_needs_pairs_and_a_non_negative_margin() -> None:
    with pytest.raises(ValueError):
        Params(pair_lifetime=-1.0)
    assert PrefixAffinityScorer("p", Params(pair_requests=0.0, pair_lifetime=3.0)).life is None


@pytest.mark.parametrize("expected", [40.0, 400.0, 4000.0])  # the exact Poisson sum, and the normal tail above 500
def test_a_count_is_unlikely_only_about_three_standard_deviations_below_the_mean(expected: float) -> None:
    sigma = math.sqrt(expected)
    assert not _below(expected - 2.5 * sigma, expected)
    assert _below(expected - 3.3 * sigma, expected)
