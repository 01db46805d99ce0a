from __future__ import annotations

import pytest

from extproc.bench.routing_capacity import CAPACITY_HIT_SHARE, measure_capacity
from extproc.bench.routing_workloads import MixedPool, mixed_workload, multi_turn_workload, shared_prefix_workload
from extproc.sim.profile import Profile


def test_shared_prefix_capacity_counts_the_cached_system_prompt() -> None:
    profile = Profile()
    workload = shared_prefix_workload("m", groups=4, prefix_tokens=(400, 400), question_tokens=(40, 40),
                                      max_tokens=(50, 50))
    capacity = measure_capacity(workload, profile, {"chat": 8}, sample=200, skip=50)
    shape = capacity.pools["chat"]
    # "You are assistant N. " + 400 words, a 40-word question + "?", the chat template around both.
    assert 440 < shape.prompt_tokens < 470 and shape.output_tokens == 50
    # Every system prompt was seen during the skip: the cacheable part is its whole blocks, rarely the start of a
    # question (a block another question began alike).
    assert 390 <= shape.cacheable_tokens <= 420
    uncached = round(shape.prompt_tokens - CAPACITY_HIT_SHARE * shape.cacheable_tokens)
    assert capacity.rps == pytest.approx(8 * profile.capacity_rps(round(shape.prompt_tokens), 50, uncached))
    assert capacity.describe()["pools"]["chat"]["ideal_hit_rate"] == round(shape.ideal_hit_rate, 4)


def test_uncacheable_prompts_and_sampled_outputs() -> None:
    profile = Profile()
    # Short one-off prompts only: nothing beyond the one-line system prompt is cacheable, outputs stop early.
    workload = mixed_workload([MixedPool("chat", "m", 1.0)], long_share=0.0, unique_share=0.0, seed=3)
    shape = measure_capacity(workload, profile, {"chat": 2}, sample=300, skip=10).pools["chat"]
    assert shape.ideal_hit_rate < 0.15
    assert shape.output_tokens == pytest.approx(80 * (1 + profile.min_output_fraction) / 2, rel=0.1)


def test_conversations_reuse_their_history() -> None:
    capacity = measure_capacity(multi_turn_workload("m"), Profile(), {"chat": 8}, sample=600, skip=300)
    assert capacity.pools["chat"].ideal_hit_rate > 0.8  # each turn extends the previous one's prompt


def test_several_pools_fill_at_the_rate_of_the_first_full_one() -> None:
    pools = (MixedPool("chat", "m", 0.75), MixedPool("code", "c", 0.25))
    capacity = measure_capacity(mixed_workload(pools, seed=1), Profile(), {"chat": 1, "code": 3}, sample=400)
    shares = {name: shape.requests / 400 for name, shape in capacity.pools.items()}
    assert capacity.rps == pytest.approx(min(capacity.pool_rps[p] / shares[p] for p in shares))
    assert capacity.rps == pytest.approx(capacity.pool_rps["chat"] / shares["chat"])  # 1 replica for 75%
