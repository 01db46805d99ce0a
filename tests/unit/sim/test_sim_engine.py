from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from extproc.sim.engine import Engine, GenRequest, RequestState
from extproc.sim.profile import Profile

# Easy numbers: a step costs 10 ms + 1 ms per sequence + 0.1 ms per prefill token; 64-token budget.
PROFILE = Profile(name="test", step_base_s=0.010, step_per_seq_s=0.001, prefill_per_token_s=0.0001,
                  max_num_seqs=4, max_num_batched_tokens=64, block_size=16, num_gpu_blocks=64,
                  max_model_len=1024, max_loras=1)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(prompt_len: int, out: int = 4, *, base: int = 0, lora: str | None = None, rid: str = "r") -> GenRequest:
    return GenRequest(rid, list(range(base, base + prompt_len)), list(range(5000, 5000 + out)), lora)


def engine(profile: Profile = PROFILE) -> tuple[Engine, Clock]:
    clock = Clock()
    return Engine(profile, clock), clock


def step(eng: Engine, clock: Clock) -> float:
    """One step in virtual time; returns its duration."""
    planned = eng.begin_step(clock.now)
    assert planned is not None
    clock.now += planned.duration_s
    eng.end_step(planned, clock.now)
    return planned.duration_s


def run(eng: Engine, clock: Clock, until: Callable[[], bool] | None = None, limit: int = 10_000) -> int:
    steps = 0
    while eng.has_work and not (until is not None and until()):
        step(eng, clock)
        steps += 1
        assert steps < limit
    return steps


def test_a_prompt_within_the_budget_gets_its_first_token_after_one_step() -> None:
    eng, clock = engine()
    req = make(60)
    eng.submit(req)
    duration = step(eng, clock)
    assert duration == pytest.approx(0.010 + 0.001 + 60 * 0.0001)
    assert req.generated == 1 and req.first_token_at == clock.now
    ttft = eng.counters.histograms["vllm:time_to_first_token_seconds"]
    assert ttft.total == 1 and ttft.sum == pytest.approx(duration)
    # Decoding: one token per step, each step without prefill work.
    assert step(eng, clock) == pytest.approx(0.011)
    assert req.generated == 2


def test_a_long_prompt_is_prefilled_in_budget_sized_chunks_while_running() -> None:
    eng, clock = engine()
    req = make(150, out=2)
    eng.submit(req)
    step(eng, clock)
    assert req.state is RequestState.RUNNING and req.computed == 64 and req.generated == 0
    step(eng, clock)
    assert req.computed == 128 and req.generated == 0
    step(eng, clock)  # the last 22 tokens, then the first token is sampled
    assert req.generated == 1
    assert PROFILE.ttft_alone_s(150) == pytest.approx(req.first_token_at - req.arrival)


def test_a_request_arriving_behind_a_long_prefill_waits_with_free_seats() -> None:
    """The transient queue real engines show: one running request, three free seats, one waiting."""
    eng, clock = engine()
    eng.submit(make(300, out=2, rid="long"))
    step(eng, clock)
    short = make(20, base=10_000, rid="short")
    eng.submit(short)
    assert eng.gauges(0).waiting == 0  # arrived during the step: not counted until the next boundary
    step(eng, clock)  # the long prefill takes the whole budget
    assert short.state is RequestState.WAITING
    gauges = eng.gauges(0)
    assert (gauges.running, gauges.waiting) == (1, 1)
    run(eng, clock, until=lambda: short.state is RequestState.RUNNING)
    assert short.scheduled_at is not None and short.scheduled_at > short.arrival


def test_decode_tokens_are_scheduled_before_new_prefill() -> None:
    eng, clock = engine()
    decoders = [make(10, out=50, base=1000 * i, rid=f"d{i}") for i in range(3)]
    for req in decoders:
        eng.submit(req)
    step(eng, clock)  # 3 x 10 prompt tokens
    newcomer = make(100, out=2, base=50_000, rid="new")
    eng.submit(newcomer)
    planned = eng.begin_step(clock.now)
    assert planned is not None
    counts = {r.request_id: n for r, n in planned.scheduled}
    assert counts == {"d0": 1, "d1": 1, "d2": 1, "new": 61}  # 64 - 3 decode tokens
    assert planned.prefill_tokens == 61


def test_seats_bound_the_batch_and_the_rest_wait_fifo() -> None:
    eng, clock = engine()
    reqs = [make(8, out=3 + i, base=100 * i, rid=f"r{i}") for i in range(6)]
    for req in reqs:
        eng.submit(req)
    step(eng, clock)
    assert [r.request_id for r in eng.running] == ["r0", "r1", "r2", "r3"]
    assert [r.request_id for r in eng.waiting] == ["r4", "r5"]
    run(eng, clock, until=lambda: reqs[4].state is RequestState.RUNNING)
    assert reqs[0].state is RequestState.FINISHED and reqs[5].state is RequestState.WAITING
    queue = eng.counters.histograms["vllm:request_queue_time_seconds"]
    assert queue.total == 5 and queue.sum > 0


def test_prefix_hit_skips_prefill_of_cached_full_blocks() -> None:
    eng, clock = engine()
    first = make(50)
    eng.submit(first)
    run(eng, clock)
    second = make(50, rid="again")
    eng.submit(second)
    planned = eng.begin_step(clock.now)
    assert planned is not None and planned.prefill_tokens == 2  # 3 full blocks cached, 2 tokens left
    assert second.cached_tokens == 48
    assert eng.counters.prefix_queries_tokens == 100 and eng.counters.prefix_hits_tokens == 48


def test_block_aligned_fully_cached_prompt_recomputes_its_last_block() -> None:
    eng, clock = engine()
    eng.submit(make(64))
    run(eng, clock)
    again = make(64)
    eng.submit(again)
    step(eng, clock)
    assert again.cached_tokens == 48


def test_generated_blocks_are_cached_for_the_next_turn() -> None:
    eng, clock = engine()
    first = make(20, out=30)
    eng.submit(first)
    run(eng, clock)
    follow_up = GenRequest("turn2", first.prompt_ids + first.output_ids + list(range(9000, 9020)), [1])
    eng.submit(follow_up)
    step(eng, clock)
    assert follow_up.cached_tokens == 48  # 50 tokens of history -> 3 full blocks


def test_lora_requests_do_not_share_blocks_with_the_base_model() -> None:
    eng, clock = engine()
    eng.submit(make(100))
    run(eng, clock)
    adapted = make(100, lora="sql")
    eng.submit(adapted)
    step(eng, clock)
    assert adapted.cached_tokens == 0


def test_max_loras_skips_a_request_whose_adapter_cannot_join() -> None:
    eng, clock = engine()
    eng.submit(make(10, out=20, lora="a", rid="a1"))
    step(eng, clock)
    b = make(10, base=500, lora="b", rid="b1")
    plain = make(10, base=900, rid="plain")
    eng.submit(b)
    eng.submit(plain)
    step(eng, clock)
    assert b.state is RequestState.WAITING and plain.state is RequestState.RUNNING
    gauges = eng.gauges(1.0)
    assert gauges.running_loras == ("a",) and gauges.waiting_loras == ("b",)


def test_kv_blocks_grow_as_tokens_are_computed() -> None:
    eng, clock = engine()
    req = make(16, out=40)
    eng.submit(req)
    step(eng, clock)
    assert req.table.size == 1  # 16 prompt tokens
    run(eng, clock, until=lambda: req.generated == 17)  # 16 + 16 known tokens computed
    assert req.table.size == 2
    assert eng.kv.used_blocks == 2


def test_kv_exhaustion_preempts_the_newest_request_which_later_resumes() -> None:
    small = dataclasses.replace(PROFILE, num_gpu_blocks=8, max_model_len=128, max_num_batched_tokens=256)
    eng, clock = engine(small)
    old = make(40, out=60, rid="old")  # grows to 7 blocks
    new = make(40, out=60, base=10_000, rid="new")
    eng.submit(old)
    eng.submit(new)
    step(eng, clock)
    assert {r.request_id for r in eng.running} == {"old", "new"}  # 3 + 3 blocks
    run(eng, clock, until=lambda: eng.counters.preemptions > 0)
    assert new.state is RequestState.WAITING and new.preemptions == 1 and new.computed == 0
    assert eng.waiting[0] is new and old.state is RequestState.RUNNING
    assert eng.gauges(0).waiting == 1
    run(eng, clock)
    assert old.state is RequestState.FINISHED and new.state is RequestState.FINISHED
    assert new.generated == 60 and eng.counters.generation_tokens == 120
    assert eng.kv.used_blocks == 0


def test_admission_stops_at_the_first_request_that_does_not_fit() -> None:
    small = dataclasses.replace(PROFILE, num_gpu_blocks=10, max_model_len=160)
    eng, clock = engine(small)
    eng.submit(make(60, out=100, rid="big"))
    step(eng, clock)  # 4 blocks, growing to 10
    run(eng, clock, until=lambda: eng.kv.used_blocks >= 9)
    blocked = make(40, out=4, base=50_000, rid="blocked")  # needs 3 blocks for its first chunk
    behind = make(10, base=90_000, rid="behind")  # would fit, but FIFO keeps it behind
    eng.submit(blocked)
    eng.submit(behind)
    step(eng, clock)
    assert blocked.state is RequestState.WAITING and behind.state is RequestState.WAITING
    run(eng, clock)
    assert blocked.state is RequestState.FINISHED and behind.state is RequestState.FINISHED


def test_abort_frees_blocks_and_counts_abort() -> None:
    eng, clock = engine()
    running = make(100)
    eng.submit(running)
    step(eng, clock)
    assert eng.kv.used_blocks > 0
    eng.abort(running)
    eng.abort(running)  # idempotent
    assert eng.kv.used_blocks == 0 and not eng.running
    assert eng.counters.finished["abort"] == 1
    assert eng.kv.cached_blocks == 4  # the 64 prompt tokens computed so far stay cached


def test_abort_in_the_inbox_or_the_queue_removes_it() -> None:
    eng, clock = engine(dataclasses.replace(PROFILE, max_num_seqs=1))
    eng.submit(make(10))
    queued = make(10, base=100)
    eng.submit(queued)
    step(eng, clock)
    assert list(eng.waiting) == [queued]
    eng.abort(queued)
    fresh = make(10, base=200)
    eng.submit(fresh)
    eng.abort(fresh)
    assert not eng.waiting and not eng.inbox and eng.counters.finished["abort"] == 2


def test_a_request_aborted_during_its_step_is_not_advanced() -> None:
    eng, clock = engine()
    req = make(10)
    eng.submit(req)
    planned = eng.begin_step(clock.now)
    assert planned is not None
    eng.abort(req)
    eng.end_step(planned, clock.now + planned.duration_s)
    assert req.generated == 0 and eng.counters.generation_tokens == 0


def test_slow_factor_multiplies_the_step() -> None:
    eng, _ = engine()
    eng.slow_factor = 3.0
    eng.submit(make(10))
    planned = eng.begin_step(0.0)
    assert planned is not None and planned.duration_s == pytest.approx(3 * (0.011 + 10 * 0.0001))


def test_inter_token_latency_and_tpot_histograms() -> None:
    eng, clock = engine()
    req = make(10, out=5)
    eng.submit(req)
    run(eng, clock)
    itl = eng.counters.histograms["vllm:inter_token_latency_seconds"]
    assert itl.total == 4 and itl.sum == pytest.approx(4 * 0.011)
    tpot = eng.counters.histograms["vllm:time_per_output_token_seconds"]
    assert tpot.total == 1 and tpot.sum == pytest.approx(0.011)
    assert eng.counters.generation_tokens == 5 and eng.counters.finished["stop"] == 1


def test_progress_is_reported_first_token_then_every_n_then_finish() -> None:
    eng, clock = engine()
    seen: list[int] = []
    req = make(10, out=9)
    req.notify_every = 4
    req.on_progress = lambda r: seen.append(r.generated)
    eng.submit(req)
    run(eng, clock)
    assert seen == [1, 5, 9]


def test_reset_clears_counters_and_cache() -> None:
    eng, clock = engine()
    eng.submit(make(100))
    run(eng, clock)
    eng.reset()
    assert eng.counters.requests == 0 and eng.kv.cached_blocks == 0
    again = make(100)
    eng.submit(again)
    step(eng, clock)
    assert again.cached_tokens == 0


def test_too_long_request_is_refused_by_submit() -> None:
    eng, _ = engine()
    with pytest.raises(ValueError):
        eng.submit(make(1020, out=10))
