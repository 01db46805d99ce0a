"""Second homes for busy shared prefixes: prefix-affinity-scorer's `pair_*` parameters and their state
(`extproc.scheduling.prefix_pairs`)."""

from __future__ import annotations

import pytest

from extproc.endpoints import Endpoint
from extproc.scheduling.plugins.prefix_affinity import Params, PrefixAffinityScorer
from extproc.scheduling.prefix_pairs import PrefixPairs
from tests.unit.scheduling.helpers import NOW, endpoint, request

SYSTEM = "System prompt number 0: " + "rule 0 " * 200


def fleet(running: float) -> list[Endpoint]:
    return [endpoint(f"10.0.0.{i + 1}:8000", running=running) for i in range(8)]


def send(scorer: PrefixAffinityScorer, prompt: str, endpoints: list[Endpoint], now: float) -> int:
    """Score, then route to the best as the gateway does (observe)."""
    scores = scorer.score(request(prompt, now=now), endpoints)
    chosen = scores.index(1.0)
    scorer.observe(request(prompt, now=now), endpoints[chosen])
    return chosen


def question(n: int) -> str:
    # Equal lengths (equal uncached tokens per request), different from their first block on.
    return SYSTEM + f" question {n:03d} " + "about this and that " * 8 + "?"


def test_a_busy_shared_prefix_gets_one_second_home_then_alternates_to_the_home_with_less_prefill_ahead() -> None:
    endpoints = fleet(running=8)  # average load 8: busy (pair_load 6)
    scorer = PrefixAffinityScorer("p", Params(pair_requests=1.0, pair_lifetime=0.0))
    first = send(scorer, question(0), endpoints, NOW)
    second = send(scorer, question(1), endpoints, NOW + 0.1)  # the prefix's second request: a second home
    assert second != first
    # Much later (the prefill backlogs decayed), requests arriving together: each one's question is prefill work
    # on the home it went to, so the next one goes to the other home.
    later = NOW + 10.0
    homes = [send(scorer, question(n), endpoints, later) for n in range(2, 10)]
    assert homes == [first, second] * 4  # no third home; the first one back is the one idle longest


def test_without_pairs_or_on_an_idle_pool_a_prefix_keeps_one_home() -> None:
    for params, running in ((Params(pair_requests=0.0), 8.0), (Params(pair_requests=1.0, pair_lifetime=0.0), 2.0)):
        endpoints = fleet(running)
        scorer = PrefixAffinityScorer("p", params)
        homes = {send(scorer, question(n), endpoints, NOW + n * 0.1) for n in range(10)}
        assert len(homes) == 1


@pytest.mark.parametrize(("slot", "unshared", "pairs"), [((0, 1), 1, True), ((0, 3), 1, True), ((1, 3), 1, True),
                                                      ((0, 1), 3, False)])
def test_replicas_sharing_nothing_place_no_second_homes(slot: tuple[int, int], unshared: int, pairs: bool) -> None:
    """Replicas sharing nothing would each give a prefix a copy of its own: they place none. One alone or sharing
    placements (replaying the others' requests) places them."""
    endpoints = fleet(running=8)
    scorer = PrefixAffinityScorer("p", Params(pair_requests=1.0, pair_lifetime=0.0))
    scorer.replica_slot(*slot)
    scorer.unshared_replicas(unshared)
    homes = {send(scorer, question(n), endpoints, NOW + n * 0.1) for n in range(6)}
    assert len(homes) == (2 if pairs else 1)


def test_a_conversations_next_turn_is_not_a_shared_prefix() -> None:
    endpoints = fleet(running=8)
    scorer = PrefixAffinityScorer("p", Params(pair_requests=1.0, pair_lifetime=0.0))
    turn = question(0)
    first = send(scorer, turn, endpoints, NOW)
    for n in range(1, 6):  # each turn replays the whole previous prompt, then adds an answer and a question
        turn += f" answer {n}. " + "more words " * 20 + f" next question {n}?"
        assert send(scorer, turn, endpoints, NOW + n * 0.1) == first


def test_a_home_left_idle_past_the_refresh_gets_the_next_request() -> None:
    endpoints = fleet(running=8)
    scorer = PrefixAffinityScorer("p", Params(pair_requests=1.0, pair_refresh_ms=500, pair_lifetime=0.0))
    first = send(scorer, question(0), endpoints, NOW)
    second = send(scorer, question(1), endpoints, NOW + 0.1)
    assert second != first
    start = NOW + 10.0
    assert send(scorer, question(2), endpoints, start) == first  # idle longest
    assert send(scorer, question(3), endpoints, start) == second  # idle past the refresh too
    scorer.backlog.add(endpoints[second].address, 1e6, start)  # the second home now looks busy for long
    assert [send(scorer, question(n), endpoints, start + 0.1 * n) for n in range(1, 5)] == [first] * 4
    assert send(scorer, question(9), endpoints, start + 0.6) == second  # not sent the prefix for 0.6 s > 0.5 s


def test_requests_count_for_the_prefix_their_windows_share_and_second_homes_are_paced() -> None:
    pairs = PrefixPairs(wanted=2.0, decay_s=10.0, every_s=0.05, refresh_s=2.5, capacity=16)
    assert not pairs.count([1, 2], NOW)  # one request of the prefix
    assert pairs.count([2, 3], NOW)  # a question one block deeper: block 2 is counted twice
    pairs.paired([2, 3], NOW)
    assert not pairs.count([2, 3], NOW + 0.01)  # due, but a second home was placed 10 ms ago
    assert pairs.count([2, 3], NOW + 0.06)


def test_a_prompt_sent_whole_before_is_not_counted() -> None:
    pairs = PrefixPairs(wanted=1.0, decay_s=10.0, every_s=0.0, refresh_s=2.5, capacity=16)
    pairs.ends(5)  # a prompt whose chain ended at block 5 was sent
    assert not pairs.count([4, 5], NOW)  # its continuation (a next turn): one request would have been enough
    assert pairs.count([3, 4], NOW)


def test_pair_parameters_are_validated() -> None:
    for bad in ({"pair_requests": -1.0}, {"pair_decay_ms": 0.0}, {"pair_load": -1.0}, {"pair_every_ms": -1.0},
                {"pair_refresh_ms": -1.0}):
        with pytest.raises(ValueError):
            Params(**bad)  # type: ignore[arg-type]
