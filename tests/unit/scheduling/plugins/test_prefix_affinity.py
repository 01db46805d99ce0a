from __future__ import annotations

from extproc.scheduling.plugins.prefix_affinity import Params, PrefixAffinityScorer
from tests.unit.scheduling.helpers import endpoint, fleet, request

SYSTEMS = [f"System prompt number {g}: " + f"rule {g} " * 200 for g in range(40)]


def home(scorer: PrefixAffinityScorer, prompt: str, endpoints: list) -> int:  # type: ignore[type-arg]
    scores = scorer.score(request(prompt), endpoints)
    assert scores.count(1.0) == 1
    return scores.index(1.0)


def test_same_prefix_same_home_in_independent_replicas() -> None:
    endpoints = fleet(8)
    replica_a, replica_b = PrefixAffinityScorer("a", Params()), PrefixAffinityScorer("b", Params())
    for system in SYSTEMS:
        first = home(replica_a, system + "question one?", endpoints)
        assert home(replica_a, system + "another, different question", endpoints) == first
        assert home(replica_b, system + "a third question", endpoints) == first


def test_groups_spread_over_the_pool() -> None:
    endpoints = fleet(8)
    scorer = PrefixAffinityScorer("p", Params())
    homes = [home(scorer, system, endpoints) for system in SYSTEMS]
    assert len(set(homes)) >= 7
    assert max(homes.count(h) for h in set(homes)) <= 12


def test_overloaded_home_spills_to_the_next_ranked_endpoint() -> None:
    endpoints = fleet(8)
    scorer = PrefixAffinityScorer("p", Params(load_bound=1.25))
    prompt = SYSTEMS[0] + "q"
    first = home(scorer, prompt, endpoints)
    second = scorer.score(request(prompt), endpoints).index(0.5)
    endpoints[first] = endpoint(endpoints[first].address, running=16, waiting=20)
    assert home(scorer, prompt, endpoints) == second


def test_learned_index_knows_deeper_matches() -> None:
    endpoints = fleet(4)
    scorer = PrefixAffinityScorer("p", Params(anchor_blocks=2))
    conversation = SYSTEMS[1] + " user: hello " * 30
    chosen = endpoints[3]
    scorer.observe(request(conversation), chosen)
    follow_up = conversation + " assistant: hi there " * 10 + " user: next question"
    scores = scorer.score(request(follow_up), endpoints)
    assert scores[3] >= 0.6  # most of the follow-up's blocks were sent to endpoint 3


def test_short_prompts_get_no_affinity_and_index_is_bounded() -> None:
    endpoints = fleet(4)
    scorer = PrefixAffinityScorer("p", Params(index_capacity=50))
    assert scorer.score(request("short"), endpoints) == [0.0] * 4
    for system in SYSTEMS[:5]:
        scorer.observe(request(system), endpoints[0])
    assert len(scorer._index) == 50
