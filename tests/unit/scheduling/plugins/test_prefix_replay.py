"""Service replicas sharing placements replay each other's requests (extproc.scheduling.prefix_sent)."""

from __future__ import annotations

import math

import pytest

from extproc.endpoints import Endpoint
from extproc.scheduling.plugins.prefix_affinity import REPLAY_WITHIN_S, Params, PrefixAffinityScorer
from extproc.scheduling.prefix_sent import SENT_MARK, Sent
from tests.unit.scheduling.helpers import NOW, endpoint, fleet, request

SYSTEMS = [f"System prompt number {g}: " + f"rule {g} " * 400 for g in range(8)]


def pick(scorer: PrefixAffinityScorer, prompt: str, endpoints: list[Endpoint], now: float = NOW) -> int:
    scores = scorer.score(request(prompt, now=now), endpoints)
    return scores.index(1.0)


def exported(scorer: PrefixAffinityScorer, now: float) -> list[str]:
    """What a replica sends: its placements and its requests (those pushed as they come, by default)."""
    return scorer.export_shared(now) + scorer.export_perishable(now)


def replicas() -> tuple[PrefixAffinityScorer, PrefixAffinityScorer]:
    a, b = PrefixAffinityScorer("a", Params()), PrefixAffinityScorer("b", Params())
    for scorer in (a, b):
        scorer.export_shared(NOW)  # an exchange started: record from now on
    return a, b


@pytest.mark.parametrize(("age_s", "steered"), [(0.0, True), (0.2, True), (REPLAY_WITHIN_S + 0.5, False)])
def test_a_replica_places_a_new_prefix_away_from_prefill_another_replica_just_sent(age_s: float,
                                                                                    steered: bool) -> None:
    endpoints = fleet(8)
    a, b = replicas()
    target = pick(b, SYSTEMS[7], endpoints)  # where b would place a new prefix on an idle fleet
    for system in SYSTEMS[:2]:  # a sends two full prefills there (its load model: nothing in flight)
        a.observe(request(system), endpoints[target])
    lines = exported(a, NOW)
    assert len(lines) == 4  # two placements, two requests
    assert b.import_shared(lines, NOW, age_s) == (4 if steered else 2)
    assert (pick(b, SYSTEMS[7], endpoints) != target) is steered  # an old request (a late starter) is not replayed
    assert b.directory.depths(request(SYSTEMS[0]).prefix_blocks)  # its placement is learned either way


def test_a_replayed_backlog_is_discounted_by_its_age() -> None:
    endpoints = fleet(2)
    a, b = replicas()
    a.observe(request(SYSTEMS[0]), endpoints[0])
    later = NOW + 0.05
    b.import_shared(exported(a, later), later, 0.02)  # exported 50 ms after the send, 20 ms in transit
    sent = a.backlog.tokens(endpoints[0].address, later)
    assert sent > 0
    assert math.isclose(b.backlog.tokens(endpoints[0].address, later), sent * math.exp(-0.02 / 0.2), rel_tol=1e-3)


def test_second_homes_paired_by_one_replica_pace_the_others() -> None:
    endpoints = [endpoint(e.address, running=8) for e in fleet(8)]  # a busy pool (pair_load 6)
    a, b = (PrefixAffinityScorer(n, Params(pair_lifetime=0.0)) for n in "ab")
    for scorer in (a, b):
        scorer.export_shared(NOW)
    question = SYSTEMS[3] + " question {:03d} " + "about this and that " * 8 + "?"

    def send(scorer: PrefixAffinityScorer, n: int, now: float) -> int:
        chosen = pick(scorer, question.format(n), endpoints, now)
        scorer.observe(request(question.format(n), now=now), endpoints[chosen])
        return chosen

    first = send(a, 0, NOW)
    b.import_shared(exported(a, NOW), NOW)
    second = send(b, 1, NOW + 0.01)  # b saw a's request: the prefix's second request branches off, b pairs it
    assert second != first
    a.import_shared(exported(b, NOW + 0.01), NOW + 0.01)
    assert a.pairs is not None and a.pairs.is_paired(b._counted[1])
    # a knows both homes and that the prefix is paired: it goes on choosing between the two, places no third.
    assert {send(a, n, NOW + 0.02 + n * 0.01) for n in range(2, 8)} <= {first, second}


def test_requests_are_perishable_lines_announced_as_they_are_routed() -> None:
    endpoints = fleet(2)
    a, _ = replicas()
    told: list[int] = []
    a.watch(lambda: told.append(1))
    a.observe(request(SYSTEMS[0]), endpoints[0])
    a.observe(request(SYSTEMS[0] + " again"), endpoints[0])
    assert len(told) == 2  # once per request routed
    placements, requests = a.export_shared(NOW), a.export_perishable(NOW + 0.03)
    assert placements and not any(line.startswith(SENT_MARK) for line in placements)
    assert len(requests) == 2 and all(line.startswith(SENT_MARK) for line in requests)
    parsed = [Sent.parse(line) for line in requests]
    assert all(p is not None and p[1] == pytest.approx(0.03) for p in parsed)  # their age at export
    assert a.export_perishable(NOW) == [] and a.export_shared(NOW) == []  # each sent once
