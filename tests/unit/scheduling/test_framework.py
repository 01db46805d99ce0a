from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.config.schema import PluginConfig, PluginRef, ProfileConfig, SchedulingConfig
from extproc.endpoints import Endpoint
from extproc.scheduling import Explanation, PluginError, PluginRegistry, Scheduler, SchedulingRequest
from extproc.scheduling.framework import Profile, WeightedScorer
from extproc.scheduling.plugins import register_builtins
from extproc.scheduling.plugins.pickers import MaxScorePicker, Params
from tests.unit.scheduling.helpers import fleet, request


class FixedScorer:
    def __init__(self, name: str, values: list[float]) -> None:
        self.name = name
        self.values = values

    def score(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        return self.values[: len(endpoints)]


class DropFirst:
    name = "drop-first"

    def filter(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        return list(endpoints[1:])


def test_weights_clamping_and_explain() -> None:
    endpoints = fleet(3)
    profile = Profile("p", (), (WeightedScorer(FixedScorer("a", [2.0, 0.5, float("nan")]), 2.0),
                                WeightedScorer(FixedScorer("b", [0.0, 1.0, -1.0]), 1.0)),
                      MaxScorePicker("pick", Params()))
    explain = Explanation()
    timings: list[str] = []
    chosen = profile.schedule(request(), endpoints, 3, lambda name, _: timings.append(name), explain)
    # totals: 2*1.0 + 0 = 2.0 ; 2*0.5 + 1 = 2.0 ; 0 + 0 = 0  -> third endpoint last
    assert chosen[-1] is endpoints[2]
    assert explain.scores[endpoints[0].address] == {"a": 1.0, "b": 0.0}
    assert explain.totals[endpoints[2].address] == 0.0
    assert timings == ["a", "b", "pick"]


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.floats(), st.integers(-3, 3), st.booleans(), st.just(-0.0)), min_size=3,
                       max_size=3), weight=st.floats(0.0, 5.0))
def test_any_score_is_clamped_into_unit_interval_as_a_float(values: list[float], weight: float) -> None:
    endpoints = fleet(3)
    profile = Profile("p", (), (WeightedScorer(FixedScorer("a", values), weight),), MaxScorePicker("pick", Params()))
    explain = Explanation()
    profile.schedule(request(), endpoints, 3, None, explain)
    expected = [0.0 if v != v else min(1.0, max(0.0, float(v))) for v in values]  # NaN -> 0
    got = [explain.scores[e.address]["a"] for e in endpoints]
    assert [repr(g) for g in got] == [repr(x) for x in expected]  # floats, never -0.0
    assert [explain.totals[e.address] for e in endpoints] == [weight * x for x in expected]


def test_filters_run_before_scoring_and_empty_result() -> None:
    endpoints = fleet(2)
    profile = Profile("p", (DropFirst(),), (), MaxScorePicker("pick", Params()))
    explain = Explanation()
    assert profile.schedule(request(), endpoints, 2, explain=explain) == [endpoints[1]]
    assert explain.filtered_out == [endpoints[0].address]
    assert profile.schedule(request(), endpoints[:1], 2) == []


def test_builtin_profiles_exist_and_default_needs_prefix() -> None:
    scheduler = Scheduler(SchedulingConfig())
    assert set(scheduler.profiles) == {"default", "load-only", "least-inflight", "random"}
    assert scheduler.profile("default").needs_prefix
    assert not scheduler.profile("load-only").needs_prefix


def test_custom_profile_from_config() -> None:
    config = SchedulingConfig(
        plugins=(PluginConfig(name="q", type="queue-scorer", parameters={"running_weight": 1}),
                 PluginConfig(name="pick", type="max-score-picker")),
        profiles=(ProfileConfig(name="mine",
                                plugins=(PluginRef(pluginRef="q", weight=2), PluginRef(pluginRef="pick"))),),
    )
    scheduler = Scheduler(config)
    assert scheduler.profile("mine").scorers[0].weight == 2


@pytest.mark.parametrize(
    ("plugins", "message"),
    [
        ((PluginConfig(name="x", type="no-such-type"),), "unknown type"),
        ((PluginConfig(name="x", type="queue-scorer", parameters={"bogus": 1}),), "unknown parameter"),
        ((PluginConfig(name="x", type="queue-scorer", parameters={"running_weight": "soon"}),), "must be float"),
        ((PluginConfig(name="prefix", type="queue-scorer"),), "reserved"),
        ((PluginConfig(name="x", type="inflight-scorer", parameters={"mode": "bytes"}),), "mode"),
    ],
)
def test_bad_plugin_config_is_rejected(plugins: tuple[PluginConfig, ...], message: str) -> None:
    with pytest.raises(PluginError, match=message):
        Scheduler(SchedulingConfig(plugins=plugins))


def test_profile_needs_one_picker() -> None:
    config = SchedulingConfig(plugins=(PluginConfig(name="q", type="queue-scorer"),),
                              profiles=(ProfileConfig(name="nopick", plugins=(PluginRef(pluginRef="q"),)),))
    with pytest.raises(PluginError, match="exactly one picker"):
        Scheduler(config)


def test_registry_rejects_double_registration() -> None:
    registry = PluginRegistry()
    register_builtins(registry)
    with pytest.raises(PluginError, match="twice"):
        register_builtins(registry)
    assert "prefix-affinity-scorer" in registry.types()


def test_a_large_pool_is_scheduled_over_its_nominees_and_a_sample() -> None:
    scheduler = Scheduler(SchedulingConfig())
    default = scheduler.profile("default")
    endpoints = fleet(200)
    prompts = [f"system prompt {g}: " + "policy text " * 40 + "question" for g in range(30)]
    for g, prompt in enumerate(prompts):
        whole = default.schedule(request(prompt, sequence=g), endpoints, 1)
        chooser = random.Random(g)
        sample = default.narrow(request(prompt, sequence=g), endpoints, 16, chooser)
        assert 12 <= len(sample) <= 16  # 4 ranked homes, the rest a sample (which may hold them too)
        # The prefix's home of the whole pool is always among them, and still wins on an idle pool.
        assert whole[0] in sample
        assert default.schedule(request(prompt, sequence=g), sample, 1) == whole
    # Not larger than the limit: the pool itself.
    assert default.narrow(request(prompts[0]), endpoints[:16], 16, random.Random(0)) is not None
    assert list(default.narrow(request(prompts[0]), endpoints[:16], 16, random.Random(0))) == endpoints[:16]


def test_a_deeper_match_learned_here_is_nominated() -> None:
    scheduler = Scheduler(SchedulingConfig())
    default = scheduler.profile("default")
    endpoints = fleet(200)
    conversation = "system: be brief. " + " user: hello there " * 60
    served = endpoints[123]
    default.observe(request(conversation), served)
    follow_up = conversation + " assistant: hi " * 20 + " user: and then?"
    for seed in range(10):
        assert served in default.narrow(request(follow_up), endpoints, 8, random.Random(seed))
