from __future__ import annotations

import pytest

from extproc.config.loader import ConfigError, parse_yaml_model
from extproc.rollout import RolloutPolicy, check_splits

GOOD = """\
splits:
  - model: chat
    backends:
      - {pool: v1, weight: 100}
      - {pool: v2, weight: 0}
    sticky_by: session
    override_header: x-canary-pool
    allow_override_tiers: [internal]
    rollout:
      canary: v2
      baseline: v1
      steps: [5, 25, 50, 100]
      hold_s: 300
fallback_default_model: chat
"""


def test_good_section_parses_with_defaults() -> None:
    policy = parse_yaml_model(RolloutPolicy, GOOD, "p.yaml")
    split = policy.by_model()["chat"]
    assert split.rollout is not None
    assert split.rollout.min_samples == 200 and split.rollout.analysis_interval_s == 30
    assert split.rollout.max_error_rate_delta == 0.02 and split.rollout.max_ttft_p99_ratio == 1.5
    assert policy.refresh_interval_s == 1.0
    assert check_splits(policy, {"v1": None, "v2": None}, {"default": None, "internal": None}) == []


@pytest.mark.parametrize(("text", "line", "message"), [
    ("splits:\n  - model: m\n    backends: [{pool: a, weight: -1}]\n", 3, "greater than or equal to 0"),
    ("splits:\n  - model: m\n    backends: [{pool: a, weight: 0}]\n", 2, "at least one backend weight"),
    ("splits:\n  - model: m\n    backends: [{pool: a, weight: 1}]\n    sticky_by: ip\n", 4, "Input should be"),
    ("splits:\n  - model: m\n    backends: [{pool: a, weight: 1}, {pool: b, weight: 1}]\n    rollout:\n"
     "      canary: b\n      baseline: a\n      steps: [25, 5]\n", 7, "strictly increasing"),
    ("splits:\n  - model: m\n    backends: [{pool: a, weight: 1}, {pool: b, weight: 1}]\n    rollout:\n"
     "      canary: b\n      baseline: a\n      steps: [100]\n", 7, "below 100"),
    ("splits:\n  - model: m\n    backends: [{pool: a, weight: 1}]\n    rollout: {canary: c, baseline: a}\n",
     2, "not one of its backends"),
    ("splits:\n  - model: m\n    backends: [{pool: a, weight: 1}]\n    typo: 1\n", 4, "Extra inputs"),
])
def test_bad_sections_are_rejected_with_file_and_line(text: str, line: int, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml_model(RolloutPolicy, text, "p.yaml")
    rendered = [str(p) for p in info.value.problems]
    assert any(r.startswith(f"p.yaml:{line}:") and message in r for r in rendered), rendered


def test_cross_checks_against_pools_and_tiers() -> None:
    policy = parse_yaml_model(RolloutPolicy, GOOD, "p.yaml")
    problems = check_splits(policy, {"v1": None}, {"default": None})
    assert "split 'chat': unknown pool 'v2'" in problems
    assert "split 'chat': unknown tier 'internal' in allow_override_tiers" in problems


def test_duplicate_split_and_unknown_default_are_rejected() -> None:
    entry = "  - {model: m, backends: [{pool: a, weight: 1}]}\n"
    text = "splits:\n" + entry + entry
    with pytest.raises(ConfigError, match="duplicate split model"):
        parse_yaml_model(RolloutPolicy, text, "p.yaml")
    with pytest.raises(ConfigError, match="not a split model"):
        parse_yaml_model(RolloutPolicy, "fallback_default_model: x\n", "p.yaml")


def test_models_are_frozen() -> None:
    policy = parse_yaml_model(RolloutPolicy, GOOD, "p.yaml")
    with pytest.raises(ValueError, match="frozen"):
        setattr(policy.splits[0], "model", "other")  # noqa: B010


def test_importing_rollout_does_not_import_the_policy_schema() -> None:
    # extproc.config.schema mounts extproc.rollout.config: the reverse import would be a cycle.
    import subprocess
    import sys

    code = "import sys, extproc.rollout; print('extproc.config' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
