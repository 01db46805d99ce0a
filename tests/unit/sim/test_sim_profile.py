from __future__ import annotations

from pathlib import Path

import pytest

from extproc.sim.engine import Engine, GenRequest
from extproc.sim.profile import BUILTIN_PROFILES, Profile, ProfileError, load_profile, profile_from_mapping

# The figures extproc/sim/README.md documents for each built-in profile: TTFT of one uncached 2,000-token
# prompt on an idle engine (s), decode output at full batch (tokens/s). Changing a profile changes every
# benchmark, so it must change this table and the README together.
DOCUMENTED = {
    "h100-8b": (0.135, 3095),
    "h100-70b-tp4": (0.178, 1882),
    "a10g-8b": (0.589, 233),
    "fast": (0.022, 4000),
}


def _measured(profile: Profile) -> tuple[float, float]:
    """Run the engine in virtual time: one lone 2,000-token prompt, then a full batch of decoders."""
    now = [0.0]
    engine = Engine(profile, lambda: now[0])
    lone = GenRequest("lone", list(range(2000)), [1])
    engine.submit(lone)
    while engine.has_work:
        step = engine.begin_step(now[0])
        assert step is not None
        now[0] += step.duration_s
        engine.end_step(step, now[0])
    ttft = lone.first_token_at - lone.arrival
    engine = Engine(profile, lambda: now[0])
    batch = [GenRequest(f"d{i}", list(range(10_000 * (i + 1), 10_000 * (i + 1) + 8)), list(range(200)))
             for i in range(profile.max_num_seqs)]
    for request in batch:
        engine.submit(request)
    step = engine.begin_step(now[0])  # the prompts' step
    assert step is not None
    now[0] += step.duration_s
    engine.end_step(step, now[0])
    start, tokens = now[0], engine.counters.generation_tokens
    for _ in range(100):  # pure decode steps, every seat busy
        step = engine.begin_step(now[0])
        assert step is not None and len(step.scheduled) == profile.max_num_seqs
        now[0] += step.duration_s
        engine.end_step(step, now[0])
    return ttft, (engine.counters.generation_tokens - tokens) / (now[0] - start)


@pytest.mark.parametrize("name", sorted(BUILTIN_PROFILES))
def test_engine_matches_the_documented_figures(name: str) -> None:
    ttft, throughput = _measured(BUILTIN_PROFILES[name])
    want_ttft, want_throughput = DOCUMENTED[name]
    assert ttft == pytest.approx(want_ttft, rel=0.01)
    assert throughput == pytest.approx(want_throughput, rel=0.01)


def test_default_profile_is_an_8b_model_on_one_h100_with_vllms_small_step_budget() -> None:
    p = load_profile("h100-8b")
    assert (p.max_num_seqs, p.max_num_batched_tokens, p.block_size) == (32, 2048, 16)
    assert p == Profile()


def test_step_time_is_base_plus_per_sequence_plus_prefill_tokens() -> None:
    p = Profile(step_base_s=0.01, step_per_seq_s=0.001, prefill_per_token_s=0.0001)
    assert p.step_s(4, 100) == pytest.approx(0.01 + 0.004 + 0.01)


def test_long_prefill_threshold_caps_the_chunk() -> None:
    assert Profile().chunk_limit() == 2048
    assert Profile(long_prefill_token_threshold=512).chunk_limit() == 512
    assert Profile(long_prefill_token_threshold=9999).chunk_limit() == 2048


def test_yaml_file_overrides_a_base_profile(tmp_path: Path) -> None:
    path = tmp_path / "slow.yaml"
    path.write_text("base: fast\nstep_base_s: 0.05\nmax_num_seqs: 2\n")
    p = load_profile(str(path))
    assert p.name == "slow"
    assert p.step_base_s == 0.05 and p.max_num_seqs == 2
    assert p.num_gpu_blocks == BUILTIN_PROFILES["fast"].num_gpu_blocks


def test_json_file_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"name": "j", "max_num_batched_tokens": 8192}')
    assert load_profile(str(path)).max_num_batched_tokens == 8192


@pytest.mark.parametrize(
    "raw",
    [{"step_base_s": 0}, {"prefill_per_token_s": -1}, {"unknown_field": 1}, {"base": "nope"},
     {"min_output_fraction": 2}, {"num_gpu_blocks": 10, "max_model_len": 8192}, {"step_base_s": "fast"},
     {"max_num_batched_tokens": 0}, {"itl_s": 0.01}],
)
def test_invalid_profiles_are_rejected(raw: dict[str, object]) -> None:
    with pytest.raises(ProfileError):
        profile_from_mapping(raw)


def test_unknown_name_that_is_not_a_file_is_rejected() -> None:
    with pytest.raises(ProfileError, match="neither a built-in"):
        load_profile("no-such-profile")


def test_builtin_profiles_cannot_be_mutated() -> None:
    with pytest.raises(TypeError):
        BUILTIN_PROFILES["x"] = Profile()  # type: ignore[index]


def _saturated_rps(profile: Profile, prompt: int, output: int, offered_rps: float, count: int = 600) -> float:
    """Completions per second of the engine offered `offered_rps` (above its capacity), in virtual time."""
    now = [0.0]
    engine = Engine(profile, lambda: now[0])
    arrivals = [i / offered_rps for i in range(count)]
    finished_at: list[float] = []
    pending = [GenRequest(f"r{i}", list(range(100_000 * (i + 1), 100_000 * (i + 1) + prompt)), list(range(output)))
               for i in range(count)]
    for request in pending:
        request.notify_every = 0
        request.on_progress = lambda r: finished_at.append(now[0]) if r.generated == len(r.output_ids) else None
    next_arrival = 0
    while next_arrival < count or engine.has_work:
        while next_arrival < count and arrivals[next_arrival] <= now[0]:
            engine.submit(pending[next_arrival])
            next_arrival += 1
        step = engine.begin_step(now[0])
        if step is None:
            now[0] = arrivals[next_arrival]
            continue
        now[0] += step.duration_s
        engine.end_step(step, now[0])
    window = sorted(finished_at)[count // 4: 3 * count // 4]  # steady state, away from the ramp and the drain
    return (len(window) - 1) / (window[-1] - window[0])


@pytest.mark.parametrize(("profile", "prompt", "output"), [
    (Profile(), 100, 96),  # seat-bound
    (Profile(), 3000, 100),  # prefill-heavy
    (Profile(max_num_seqs=256), 8000, 8),  # every step full of prefill tokens: budget-bound
    (Profile(num_gpu_blocks=800, max_model_len=4096), 1000, 200),  # the cache holds ~16 sequences: KV-bound
])
def test_capacity_model_matches_the_engine_at_saturation(profile: Profile, prompt: int, output: int) -> None:
    model = profile.capacity_rps(prompt, output)
    assert _saturated_rps(profile, prompt, output, 2.0 * model) == pytest.approx(model, rel=0.12)
