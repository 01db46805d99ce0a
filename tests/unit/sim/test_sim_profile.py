from __future__ import annotations

from pathlib import Path

import pytest

from extproc.sim.profile import BUILTIN_PROFILES, Profile, ProfileError, load_profile, profile_from_mapping


def test_default_profile_matches_an_8b_model_on_one_h100() -> None:
    p = load_profile("h100-8b")
    assert (p.itl_s, p.prefill_overhead_s, p.prefill_per_token_s) == (0.012, 0.030, 0.000250)
    assert (p.max_num_seqs, p.load_factor, p.block_size) == (16, 2.0, 16)
    assert p == Profile()


def test_itl_grows_linearly_with_the_batch() -> None:
    p = Profile()
    assert p.itl_for(1) == pytest.approx(0.012)
    assert p.itl_for(0) == pytest.approx(0.012)
    assert p.itl_for(9) == pytest.approx(0.012 * (1 + 2.0 * 8 / 16))
    assert p.itl_for(16) > p.itl_for(8) > p.itl_for(2)


def test_prefill_time_is_overhead_plus_per_token() -> None:
    assert Profile().prefill_s(1000) == pytest.approx(0.030 + 0.25)


def test_yaml_file_overrides_a_base_profile(tmp_path: Path) -> None:
    path = tmp_path / "slow.yaml"
    path.write_text("base: fast\nitl_s: 0.05\nmax_num_seqs: 2\n")
    p = load_profile(str(path))
    assert p.name == "slow"
    assert p.itl_s == 0.05 and p.max_num_seqs == 2
    assert p.num_gpu_blocks == BUILTIN_PROFILES["fast"].num_gpu_blocks


def test_json_file_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"name": "j", "itl_s": 0.02}')
    assert load_profile(str(path)).itl_s == 0.02


@pytest.mark.parametrize(
    "raw",
    [{"itl_s": 0}, {"load_factor": -1}, {"unknown_field": 1}, {"base": "nope"}, {"min_output_fraction": 2},
     {"num_gpu_blocks": 10, "max_model_len": 8192}, {"itl_s": "fast"}],
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
