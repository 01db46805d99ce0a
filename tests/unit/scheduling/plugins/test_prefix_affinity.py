from __future__ import annotations

from collections import Counter

from extproc.config.schema import SchedulingConfig
from extproc.endpoints import Endpoint
from extproc.scheduling import Scheduler
from extproc.scheduling.plugins.prefix_affinity import Params, PrefixAffinityScorer
from tests.unit.scheduling.helpers import NOW, endpoint, fleet, request

SYSTEMS = [f"System prompt number {g}: " + f"rule {g} " * 200 for g in range(48)]


def home(scorer: PrefixAffinityScorer, prompt: str, endpoints: list[Endpoint], now: float = NOW) -> int:
    scores = scorer.score(request(prompt, now=now), endpoints)
    assert scores.count(1.0) == 1
    return scores.index(1.0)


def send(scorer: PrefixAffinityScorer, prompt: str, endpoints: list[Endpoint]) -> int:
    """Score, then route to the home as the gateway does (observe + one more request in flight there)."""
    chosen = home(scorer, prompt, endpoints)
    scorer.observe(request(prompt), endpoints[chosen])
    endpoints[chosen].in_flight += 1
    return chosen


def loaded(endpoints: list[Endpoint], index: int, requests: int) -> None:
    endpoints[index] = endpoint(endpoints[index].address, running=requests)


def test_independent_replicas_place_a_new_prefix_alike_on_an_idle_fleet() -> None:
    endpoints = fleet(8)
    replica_a, replica_b = PrefixAffinityScorer("a", Params()), PrefixAffinityScorer("b", Params())
    for system in SYSTEMS:
        assert home(replica_a, system + "question one?", endpoints) == home(replica_b, system + "other", endpoints)


def test_new_prefixes_spread_evenly_and_then_stay() -> None:
    endpoints = fleet(8)
    scorer = PrefixAffinityScorer("p", Params())
    homes = [send(scorer, system + " first question", endpoints) for system in SYSTEMS]
    counts = Counter(homes)
    assert len(counts) == 8 and max(counts.values()) - min(counts.values()) <= 1  # 6 groups each
    for group, system in enumerate(SYSTEMS):  # later questions follow their group's home
        assert home(scorer, system + f" question {group}", endpoints) == homes[group]


def test_a_home_keeps_its_prefix_under_moderate_imbalance() -> None:
    endpoints = fleet(8)
    scorer = PrefixAffinityScorer("p", Params())
    first = send(scorer, SYSTEMS[0] + " q", endpoints)
    loaded(endpoints, first, 14)
    for i in range(8):
        if i != first:
            loaded(endpoints, i, 4)  # average 5.25: the old bound of 1.25 x (average + 1) would move it; hot is
            # 1.5 x 5.25 + 8 = 15.9
    assert home(scorer, SYSTEMS[0] + " another", endpoints) == first


def test_a_hot_prefix_gains_a_home_and_spreads_over_its_homes() -> None:
    endpoints = fleet(8)
    scorer = PrefixAffinityScorer("p", Params(hot_hold_ms=0))
    first = send(scorer, SYSTEMS[0] + " q0", endpoints)
    loaded(endpoints, first, 40)  # average 5, hot at 15.5
    second = send(scorer, SYSTEMS[0] + " q1", endpoints)
    assert second != first
    loaded(endpoints, first, 10)  # no longer hot: both are homes now, the less loaded one takes it
    loaded(endpoints, second, 12)
    assert home(scorer, SYSTEMS[0] + " q2", endpoints) == first
    loaded(endpoints, first, 13)
    assert home(scorer, SYSTEMS[0] + " q3", endpoints) == second


def test_a_home_hot_for_less_than_the_hold_keeps_its_prefix() -> None:
    endpoints = fleet(8)
    scorer = PrefixAffinityScorer("p", Params(hot_hold_ms=300))
    first = send(scorer, SYSTEMS[0] + " q0", endpoints)
    loaded(endpoints, first, 40)  # hot (average 5, hot at 15.5), first seen so now
    assert home(scorer, SYSTEMS[0] + " q1", endpoints, now=NOW) == first
    assert home(scorer, SYSTEMS[0] + " q2", endpoints, now=NOW + 0.2) == first
    assert home(scorer, SYSTEMS[0] + " q3", endpoints, now=NOW + 0.31) != first  # hot at every look for 300 ms
    loaded(endpoints, first, 4)  # cooled down: the hold starts over
    assert home(scorer, SYSTEMS[0] + " q4", endpoints, now=NOW + 0.4) == first
    loaded(endpoints, first, 40)
    assert home(scorer, SYSTEMS[0] + " q5", endpoints, now=NOW + 0.5) == first
    # Hot at two looks a second apart is not hot throughout: no look in between, so the hold starts over.
    endpoints[first] = endpoint(endpoints[first].address, running=40, age=-1.5)  # scraped at NOW + 1.5
    assert home(scorer, SYSTEMS[0] + " q6", endpoints, now=NOW + 1.5) == first
    assert home(scorer, SYSTEMS[0] + " q7", endpoints, now=NOW + 1.7) == first
    assert home(scorer, SYSTEMS[0] + " q8", endpoints, now=NOW + 1.81) != first


def test_a_conversation_follows_its_deepest_prefix_then_falls_back_to_its_system_prompt() -> None:
    endpoints = fleet(4)
    scorer = PrefixAffinityScorer("p", Params(load_slack=2.0, hot_hold_ms=0))
    system_home = send(scorer, SYSTEMS[1], endpoints)
    loaded(endpoints, system_home, 30)  # hot: the prefix gains a second home
    second_home = send(scorer, SYSTEMS[1] + " user: other chat " * 20, endpoints)
    loaded(endpoints, system_home, 0)
    conversation = SYSTEMS[1] + " user: hello " * 30
    chosen = send(scorer, conversation, endpoints)
    follow_up = conversation + " assistant: hi there " * 10 + " user: next question"
    assert home(scorer, follow_up, endpoints) == chosen  # the conversation's own endpoint, not another home
    loaded(endpoints, chosen, 30)  # hot: move to the other endpoint holding the system prompt
    assert home(scorer, follow_up, endpoints) == ({system_home, second_home} - {chosen}).pop()


def test_a_new_prefix_avoids_an_endpoint_busy_with_a_long_prefill() -> None:
    endpoints = fleet(2)
    scorer = PrefixAffinityScorer("p", Params())
    target = home(scorer, SYSTEMS[2], endpoints)  # where rank alone would put it
    long_prompt = "a long one-off document " * 600
    scorer.observe(request(long_prompt), endpoints[target])  # ~3,600 uncached tokens just sent there
    assert home(scorer, SYSTEMS[2], endpoints) != target
    without = PrefixAffinityScorer("p", Params(prefill_decay_ms=0))
    without.observe(request(long_prompt), endpoints[target])
    assert home(without, SYSTEMS[2], endpoints) == target


def test_scoring_changes_nothing_short_prompts_get_no_affinity_and_memory_is_bounded() -> None:
    endpoints = fleet(4)
    scorer = PrefixAffinityScorer("p", Params(index_capacity=50, homes=2))
    assert scorer.score(request("short"), endpoints) == [0.0] * 4
    before = scorer.score(request(SYSTEMS[0]), endpoints)
    assert scorer.score(request(SYSTEMS[0]), endpoints) == before and len(scorer.directory) == 0
    for system in SYSTEMS[:5]:
        for e in endpoints:
            scorer.observe(request(system), e)
    assert len(scorer.directory) == 50
    assert len(scorer.directory.match(request(SYSTEMS[4]).prefix_blocks, [e.address for e in endpoints])) == 2


def test_placements_carry_to_another_replica() -> None:
    endpoints = fleet(8)
    replica_a, replica_b = PrefixAffinityScorer("a", Params()), PrefixAffinityScorer("b", Params())
    assert replica_a.export_shared(0.0) == []  # starts recording
    loaded(endpoints, home(replica_a, SYSTEMS[3], endpoints), 3)  # A's first choice is busy now
    placed = send(replica_a, SYSTEMS[3] + " chat " * 40, endpoints)
    lines = replica_a.export_shared(0.0)
    assert replica_a.export_shared(0.0) == []  # sent once
    loaded(endpoints, placed, 6)  # B alone would place this prefix elsewhere now
    follow_up = SYSTEMS[3] + " chat " * 40 + " more " * 20
    assert home(replica_b, follow_up, endpoints) != placed
    assert replica_b.import_shared([*lines, "", "10.0.0.9:8000 not-a-hash", "10.0.0.9:8000 -5"], 0.0) == len(lines)
    assert home(replica_b, follow_up, endpoints) == placed


def test_replicas_that_share_nothing_place_by_rank_whatever_their_load_views() -> None:
    view_a, view_b = fleet(8), fleet(8)
    replica_a, replica_b = PrefixAffinityScorer("a", Params()), PrefixAffinityScorer("b", Params())
    for scorer in (replica_a, replica_b):
        scorer.unshared_replicas(3)
    for system in SYSTEMS[:12]:
        first_choice = home(replica_a, system, view_a)
        loaded(view_a, first_choice, 4)  # a sees its first choice busier than b does (not hot: hot is 12.5+)
        assert home(replica_a, system, view_a) == first_choice == home(replica_b, system, view_b)
        loaded(view_a, first_choice, 0)
    balanced = PrefixAffinityScorer("alone", Params())  # alone (or shared): the load decides
    first_choice = home(balanced, SYSTEMS[0], view_a)
    loaded(view_a, first_choice, 4)
    assert home(balanced, SYSTEMS[0], view_a) != first_choice
    loaded(view_a, first_choice, 40)  # hot: even replicas sharing nothing place elsewhere
    assert home(replica_a, SYSTEMS[0], view_a) != first_choice


def test_a_home_learned_from_another_replica_counts_as_deep_as_one_placed_here() -> None:
    endpoints = fleet(8)
    replica_a, replica_b = PrefixAffinityScorer("a", Params()), PrefixAffinityScorer("b", Params())
    replica_a.export_shared(0.0)
    # 22 blocks of system prompt (1,424 characters), then a question of many blocks.
    placed_by_a = send(replica_a, SYSTEMS[5] + " a long question" * 30, endpoints)
    replica_b.import_shared(replica_a.export_shared(0.0), 0.0)  # every fourth block and the last: b knows 20 deep
    others = [i for i in range(8) if i != placed_by_a]
    replica_b.observe(request(SYSTEMS[5] + " another one" * 30), endpoints[others[0]])  # b placed it too: 22
    loaded(endpoints, others[0], 3)
    loaded(endpoints, placed_by_a, 1)
    assert home(replica_b, SYSTEMS[5] + " next question", endpoints) == placed_by_a  # the less loaded home
    loaded(endpoints, placed_by_a, 5)
    assert home(replica_b, SYSTEMS[5] + " next question", endpoints) == others[0]


def test_in_the_default_profile_queue_and_kv_scores_never_outweigh_the_home() -> None:
    scheduler = Scheduler(SchedulingConfig())
    endpoints = fleet(4)
    prompt = SYSTEMS[6] + " question"
    chosen = scheduler.schedule("default", request(prompt), endpoints, 2)
    scheduler.profile("default").observe(request(prompt), chosen[0])
    home_index = endpoints.index(chosen[0])
    spill_index = endpoints.index(chosen[1])
    # The home is the most queued endpoint with the fullest cache (not full: nothing makes it saturated), the
    # spill idle with an empty cache; the home is not hot (hot: 1.5 x 1.5 + 8).
    endpoints[home_index] = endpoint(endpoints[home_index].address, running=4, waiting=2, kv=0.9)
    endpoints[spill_index] = endpoint(endpoints[spill_index].address, kv=0.0)
    assert scheduler.schedule("default", request(prompt + " again"), endpoints, 1)[0] is endpoints[home_index]


def _route(scorer: PrefixAffinityScorer, prompt: str, endpoints: list[Endpoint]) -> int:
    """Score and observe the pick, the fleet's load unchanged (no endpoint ever hot)."""
    chosen = home(scorer, prompt, endpoints)
    scorer.observe(request(prompt), endpoints[chosen])
    return chosen


def test_a_prefix_drawing_more_than_its_share_gets_homes_by_demand_before_any_home_is_hot() -> None:
    endpoints = fleet(8)
    scorer = PrefixAffinityScorer("p", Params())  # split_share 1.75, split_min_requests 16
    for other in SYSTEMS[1:17]:  # 16 requests of other prefixes in the counts
        _route(scorer, other + " q", endpoints)
    first = _route(scorer, SYSTEMS[0] + " q0", endpoints)  # new: placed, counted in the total only
    # Its requests 2..16: 1..15 counted, fewer than split_min_requests: they follow the one home.
    assert {_route(scorer, SYSTEMS[0] + f" q{i}", endpoints) for i in range(1, 16)} == {first}
    # 16 counted of 33 requests: 0.48 of the pool, 3.9 endpoints' share, 1 + int(3.9 / 1.75) = 3 homes wanted.
    second = _route(scorer, SYSTEMS[0] + " q16", endpoints)
    third = _route(scorer, SYSTEMS[0] + " q17", endpoints)
    assert len({first, second, third}) == 3
    later = set()
    for i in range(18, 40):  # about half of the requests: 3 homes wanted throughout, no fourth
        later.add(_route(scorer, SYSTEMS[0] + f" q{i}", endpoints))
        _route(scorer, SYSTEMS[17 + i % 20] + " q", endpoints)
    assert later <= {first, second, third}


def test_prefixes_within_their_share_or_with_the_split_off_keep_one_home() -> None:
    endpoints = fleet(8)
    even = PrefixAffinityScorer("p", Params())
    homes: dict[int, set[int]] = {}
    for round_ in range(40):  # 8 prefixes alike: each one endpoint's share, under split_share 1.75
        for group in range(8):
            homes.setdefault(group, set()).add(_route(even, SYSTEMS[group] + f" q{round_}", endpoints))
    assert all(len(h) == 1 for h in homes.values())
    off = PrefixAffinityScorer("p", Params(split_share=0))
    assert len({_route(off, SYSTEMS[0] + f" q{i}", endpoints) for i in range(40)}) == 1
    assert len(off.demand) == 0  # nothing counted when off


def test_split_parameters_are_validated() -> None:
    for bad in ({"split_share": -1.0}, {"split_decay_ms": 0.0}, {"split_min_requests": -1.0}):
        try:
            Params(**bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")


def dealt(index: int, replicas: int, endpoints: list[Endpoint]) -> set[int]:
    """The endpoints (indexes) dealt to replica `index`: in address order, one to each replica in turn."""
    ordered = sorted(range(len(endpoints)), key=lambda i: endpoints[i].address)
    return {i for n, i in enumerate(ordered) if n % replicas == index}


def test_replicas_placing_new_prefixes_at_once_use_their_own_share_of_endpoints() -> None:
    # Two new prefixes that one replica alone would place on the same idle endpoint (by rank), each placed by
    # another replica that does not see the other's send yet: without shares both land there.
    clash = next((x, y) for x in SYSTEMS for y in SYSTEMS if x != y and home(
        PrefixAffinityScorer("r", Params()), x, fleet(8)) == home(PrefixAffinityScorer("r", Params()), y, fleet(8)))
    blind = [PrefixAffinityScorer("a", Params()), PrefixAffinityScorer("b", Params())]
    assert send(blind[0], clash[0], fleet(8)) == send(blind[1], clash[1], fleet(8))
    shared = [PrefixAffinityScorer("a", Params()), PrefixAffinityScorer("b", Params())]
    for index, scorer in enumerate(shared):
        scorer.replica_slot(index, 2)
    view_a, view_b = fleet(8), fleet(8)
    placed_a, placed_b = send(shared[0], clash[0], view_a), send(shared[1], clash[1], view_b)
    assert placed_a in dealt(0, 2, view_a) and placed_b in dealt(1, 2, view_b)
    # Its own share first, spread by its own backlog: the next new prefix goes to another of them.
    assert send(shared[0], clash[1], view_a) in dealt(0, 2, view_a) - {placed_a}


def test_a_replica_leaves_its_share_when_it_is_worse_than_what_it_cannot_see() -> None:
    scorer = PrefixAffinityScorer("a", Params())
    scorer.replica_slot(1, 2)
    endpoints = fleet(8)
    own = dealt(1, 2, endpoints)
    for i in own:
        loaded(endpoints, i, 1)  # one request more than the least loaded: still its own
    assert home(scorer, SYSTEMS[7], endpoints) in own
    for i in own:
        loaded(endpoints, i, 2)  # two more: the least loaded instead
    assert home(scorer, SYSTEMS[7], endpoints) not in own
    endpoints = fleet(8)
    for i in own:  # a long prompt's prefill (more than this one's) just sent to each of its own
        scorer.observe(request("a long one-off document " * 600), endpoints[i])
    assert home(scorer, SYSTEMS[7], endpoints) not in own


def test_alone_or_with_owned_first_off_the_share_changes_nothing() -> None:
    endpoints = fleet(8)
    loaded(endpoints, 3, 2)
    reference = PrefixAffinityScorer("r", Params())
    alone, off, invalid = (PrefixAffinityScorer(n, p) for n, p in (
        ("alone", Params()), ("off", Params(owned_first=False)), ("invalid", Params())))
    alone.replica_slot(0, 1)
    off.replica_slot(1, 3)
    invalid.replica_slot(3, 2)  # not a slot: as alone
    for system in SYSTEMS[:24]:
        expected = reference.score(request(system), endpoints)
        assert all(s.score(request(system), endpoints) == expected for s in (alone, off, invalid))


def test_the_share_is_dealt_over_the_whole_pool_not_over_a_requests_candidates() -> None:
    # A 32-endpoint pool scheduled over 16 candidates (a sample of a large pool, or what filters left): two
    # requests whose candidates differ by one endpoint. Dealt over the candidates, every endpoint would change
    # owner between them; dealt over the pool, each replica places new prefixes on its own share in both.
    pool = tuple(fleet(32))
    ordered = sorted(pool, key=lambda e: e.address)
    for index in range(2):
        own = {pool[i].address for i in dealt(index, 2, list(pool))}
        scorer = PrefixAffinityScorer(str(index), Params())
        scorer.replica_slot(index, 2)
        for candidates in (ordered[:16], ordered[1:17]):
            for system in SYSTEMS[:8]:
                scores = scorer.score(request(system, pool=pool), candidates)
                assert candidates[scores.index(1.0)].address in own
    # A new endpoint set (the pool changed) is dealt anew: a first address in order moves every endpoint to the
    # other share. The scorer remembers both sets; each request is placed by its own pool's deal.
    grown = (endpoint("10.0.0.0:8000"), *pool)
    shares = {whole: {whole[i].address for i in dealt(0, 2, list(whole))} for whole in (pool, grown)}
    assert shares[grown].isdisjoint(shares[pool])
    scorer = PrefixAffinityScorer("g", Params())
    scorer.replica_slot(0, 2)
    for system in SYSTEMS[:8]:
        for whole in (pool, grown):
            scores = scorer.score(request(system, pool=whole), ordered[:16])
            assert ordered[scores.index(1.0)].address in shares[whole]
