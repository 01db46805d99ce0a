from __future__ import annotations

from extproc.scheduling.plugins import lora_affinity, pickers, saturation, session_affinity
from extproc.scheduling.plugins.pickers import MaxScorePicker, Params, RandomPicker
from tests.unit.scheduling.helpers import endpoint, fleet, request


def test_lora_affinity() -> None:
    scorer = lora_affinity.create("l", {})
    endpoints = [endpoint("a:1", loras=frozenset({"sql"})), endpoint("b:1", loras=frozenset({"x", "y"}), max_lora=2),
                 endpoint("c:1", loras=frozenset()), endpoint("d:1", scraped=False)]
    assert scorer.score(request(lora="sql"), endpoints) == [1.0, 0.0, 0.5, 0.5]
    assert scorer.score(request(), endpoints) == [1.0] * 4


def test_session_affinity_is_stable_and_spreads() -> None:
    scorer = session_affinity.create("s", {})
    endpoints = fleet(4)
    first = scorer.score(request(session="user-1"), endpoints)
    assert first.count(1.0) == 1
    assert scorer.score(request(session="user-1"), endpoints) == first
    homes = {scorer.score(request(session=f"user-{i}"), endpoints).index(1.0) for i in range(40)}
    assert homes == {0, 1, 2, 3}
    assert scorer.score(request(), endpoints) == [0.0] * 4


def test_saturation_filter_drops_full_endpoints_by_the_shared_load_model_but_never_empties() -> None:
    plugin = saturation.create("s", {})
    healthy = endpoint("a:1", running=2)
    transient = endpoint("b:1", running=1, waiting=3)  # a queue of one step, capacity unknown: not full
    seated = endpoint("c:1", running=8, waiting=1)  # at the pool's max_num_seqs of 8
    kv_full = endpoint("d:1", running=3, waiting=1, kv=0.99)
    assert plugin.filter(request(seats=8), [healthy, transient, seated, kv_full]) == [healthy, transient]
    assert plugin.filter(request(), [healthy, transient, seated, kv_full]) == [healthy, transient, seated]
    assert plugin.filter(request(seats=8), [seated, kv_full]) == [seated, kv_full]
    assert plugin.filter(request(seats=1), [endpoint("e:1", running=99, age=30)])[0].address == "e:1"


def test_pickers() -> None:
    endpoints = fleet(4)
    picker = MaxScorePicker("m", Params())
    assert picker.pick(request(), endpoints, [0.1, 0.9, 0.5, 0.2], 3) == [endpoints[1], endpoints[2], endpoints[3]]
    firsts = {picker.pick(request(sequence=i), endpoints, [1.0] * 4, 1)[0].address for i in range(4)}
    assert picker.pick(request(sequence=7), endpoints, [1.0] * 4, 1) == picker.pick(request(sequence=7), endpoints,
                                                                                    [1.0] * 4, 1)
    assert len(firsts) == 4  # equal scores rotate
    chosen = RandomPicker("r", Params(seed=3)).pick(request(), endpoints, [0.0] * 4, 2)
    assert len(chosen) == 2 and len(set(map(id, chosen))) == 2
    assert pickers.MAX_SCORE == "max-score-picker"
