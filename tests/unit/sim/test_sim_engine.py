from __future__ import annotations

import dataclasses

import pytest

from extproc.sim.engine import Engine, GenRequest, RequestState
from extproc.sim.profile import Profile

PROFILE = Profile(name="test", itl_s=0.010, prefill_overhead_s=0.020, prefill_per_token_s=0.001,
                  max_num_seqs=4, load_factor=2.0, block_size=16, num_gpu_blocks=64, max_model_len=1024,
                  max_loras=1)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(
    prompt_len: int, out: int = 4, *, base: int = 0, lora: str | None = None, rid: str = "r"
) -> GenRequest:
    return GenRequest(rid, list(range(base, base + prompt_len)), list(range(5000, 5000 + out)), lora)


def engine(profile: Profile = PROFILE) -> tuple[Engine, FakeClock]:
    clock = FakeClock()
    return Engine(profile, clock), clock


def run_to_end(eng: Engine, clock: FakeClock, req: GenRequest) -> None:
    clock.now += req.prefill_s
    eng.first_token(req)
    while req.generated < len(req.output_ids):
        clock.now += eng.itl_s()
        eng.tokens(req, 1)
    eng.finish(req, "length")


def test_ttft_is_queue_wait_plus_overhead_plus_uncached_tokens() -> None:
    eng, clock = engine()
    req = make(100)
    eng.submit(req)
    assert req.state is RequestState.RUNNING
    assert req.prefill_s == pytest.approx(0.020 + 100 * 0.001)
    clock.now += req.prefill_s
    eng.first_token(req)
    ttft = eng.counters.histograms["vllm:time_to_first_token_seconds"]
    assert ttft.total == 1 and ttft.sum == pytest.approx(0.120)


def test_prefix_hit_skips_prefill_of_cached_full_blocks() -> None:
    eng, clock = engine()
    first = make(100)
    eng.submit(first)
    run_to_end(eng, clock, first)
    second = make(100, rid="again")
    eng.submit(second)
    # 100 tokens = 6 full blocks; all are cached but the last token is always recomputed, so 96 hit.
    assert second.cached_tokens == 96
    assert second.prefill_s == pytest.approx(0.020 + 4 * 0.001)
    assert eng.counters.prefix_queries_tokens == 200
    assert eng.counters.prefix_hits_tokens == 96


def test_block_aligned_fully_cached_prompt_recomputes_its_last_block() -> None:
    eng, clock = engine()
    first = make(64)
    eng.submit(first)
    run_to_end(eng, clock, first)
    second = make(64)
    eng.submit(second)
    assert second.cached_tokens == 48


def test_generated_blocks_are_cached_for_the_next_turn() -> None:
    eng, clock = engine()
    first = make(20, out=30)
    eng.submit(first)
    run_to_end(eng, clock, first)
    follow_up = GenRequest("turn2", first.prompt_ids + first.output_ids + list(range(9000, 9020)), [1])
    eng.submit(follow_up)
    assert follow_up.cached_tokens == 48  # 50 tokens of history -> 3 full blocks


def test_lora_requests_do_not_share_blocks_with_the_base_model() -> None:
    eng, clock = engine()
    base = make(100)
    eng.submit(base)
    run_to_end(eng, clock, base)
    adapted = make(100, lora="sql")
    eng.submit(adapted)
    assert adapted.cached_tokens == 0


def test_itl_grows_with_the_running_batch() -> None:
    eng, _ = engine()
    eng.submit(make(10, base=0))
    one = eng.itl_s()
    eng.submit(make(10, base=1000))
    eng.submit(make(10, base=2000))
    three = eng.itl_s()
    assert one == pytest.approx(0.010)
    assert three == pytest.approx(0.010 * (1 + 2.0 * 2 / 4))


def test_slow_factor_multiplies_prefill_and_itl() -> None:
    eng, _ = engine()
    eng.slow_factor = 3.0
    req = make(100)
    eng.submit(req)
    assert req.prefill_s == pytest.approx(3 * 0.120)
    assert eng.itl_s() == pytest.approx(0.030)


def test_max_num_seqs_queues_the_rest_fifo_and_admits_on_finish() -> None:
    eng, clock = engine()
    admitted: list[str] = []
    reqs = [make(10, base=100 * i, rid=f"r{i}") for i in range(6)]
    for req in reqs:
        req.on_admit = lambda rid=req.request_id: admitted.append(rid)
        eng.submit(req)
    assert admitted == ["r0", "r1", "r2", "r3"]
    assert len(eng.running) == 4 and [r.request_id for r in eng.waiting] == ["r4", "r5"]
    clock.now += 1.0
    run_to_end(eng, clock, reqs[1])
    assert admitted[-1] == "r4" and reqs[4].admitted_at == clock.now
    queue = eng.counters.histograms["vllm:request_queue_time_seconds"]
    assert queue.total == 5 and queue.sum > 1.0


def test_request_waits_until_kv_blocks_are_free() -> None:
    small = dataclasses.replace(PROFILE, num_gpu_blocks=70, max_model_len=1024)
    eng, clock = engine(small)
    big = make(60 * 16, out=16, rid="big")  # 61 blocks
    eng.submit(big)
    blocked = make(100, out=60, base=50_000, rid="blocked")  # 10 blocks > 9 free
    eng.submit(blocked)
    behind = make(10, base=90_000, rid="behind")
    eng.submit(behind)
    assert blocked.state is RequestState.WAITING and behind.state is RequestState.WAITING  # FIFO
    assert eng.kv.usage == pytest.approx(61 / 70)
    run_to_end(eng, clock, big)
    assert blocked.state is RequestState.RUNNING and behind.state is RequestState.RUNNING


def test_max_loras_skips_a_request_whose_adapter_cannot_join() -> None:
    eng, _ = engine()
    eng.submit(make(10, lora="a", rid="a1"))
    b = make(10, base=500, lora="b", rid="b1")
    eng.submit(b)
    base = make(10, base=900, rid="plain")
    eng.submit(base)
    assert b.state is RequestState.WAITING and base.state is RequestState.RUNNING
    gauges = eng.gauges(1.0)
    assert gauges.running_loras == ("a",) and gauges.waiting_loras == ("b",)


def test_abort_frees_blocks_and_counts_abort() -> None:
    eng, _ = engine()
    running = make(100)
    eng.submit(running)
    assert eng.kv.used_blocks > 0
    eng.abort(running)
    eng.abort(running)  # idempotent
    assert eng.kv.used_blocks == 0 and not eng.running
    assert eng.counters.finished["abort"] == 1
    # Aborted prompt blocks stay cached; no generated block was cached.
    assert eng.kv.cached_blocks == 6


def test_abort_of_a_waiting_request_removes_it_from_the_queue() -> None:
    eng, _ = engine(dataclasses.replace(PROFILE, max_num_seqs=1))
    eng.submit(make(10))
    waiting = make(10, base=100)
    eng.submit(waiting)
    eng.abort(waiting)
    assert not eng.waiting and waiting.state is RequestState.FINISHED


def test_itl_and_tpot_histograms_record_chunked_tokens() -> None:
    eng, clock = engine()
    req = make(10, out=9)
    eng.submit(req)
    clock.now += req.prefill_s
    eng.first_token(req)
    for _ in range(2):
        clock.now += 0.040
        eng.tokens(req, 4)
    eng.finish(req, "length")
    itl = eng.counters.histograms["vllm:inter_token_latency_seconds"]
    assert itl.total == 8 and itl.sum == pytest.approx(0.080)
    tpot = eng.counters.histograms["vllm:time_per_output_token_seconds"]
    assert tpot.total == 1 and tpot.sum == pytest.approx(0.010)
    assert eng.counters.generation_tokens == 9 and eng.counters.finished["length"] == 1


def test_reset_clears_counters_and_cache() -> None:
    eng, clock = engine()
    req = make(100)
    eng.submit(req)
    run_to_end(eng, clock, req)
    eng.reset()
    assert eng.counters.requests == 0 and eng.kv.cached_blocks == 0
    again = make(100)
    eng.submit(again)
    assert again.cached_tokens == 0


def test_too_long_request_is_refused_by_submit() -> None:
    eng, _ = engine()
    with pytest.raises(ValueError):
        eng.submit(make(1020, out=10))
