"""One rule per kind of name, wherever the policy uses it: pools, priority classes and guard rules share the name
rule; every header name the policy sets is checked the same way, with the file and line of the bad value."""

from __future__ import annotations

import pytest

from extproc.config import ConfigError, parse_policy

POOLS = "pools:\n  - name: chat\n    model: m\n    endpoints: ['127.0.0.1:8001']\n"


def name_in(kind: str, name: str) -> str:
    """A policy naming one pool, priority class or guard rule `name`."""
    if kind == "pool":
        return f"pools:\n  - name: '{name}'\n    model: m\n    endpoints: ['127.0.0.1:8001']\n"
    if kind == "class":
        return POOLS + f"flow_control:\n  default_class: '{name}'\n  classes:\n    '{name}': {{priority: 1}}\n"
    return POOLS + f"guard:\n  rules:\n    - {{name: '{name}', detector: email}}\n"


@pytest.mark.parametrize("kind", ["pool", "class", "rule"])
@pytest.mark.parametrize(("name", "valid"), [
    ("llama-3.1-8b", True), ("a", True), ("a_b", True), ("x" * 63, True),
    ("x" * 64, False), ("Chat", False), ("-chat", False), ("chat.", False), ("ch at", False), ("", False),
])
def test_pools_classes_and_guard_rules_share_one_name_rule(kind: str, name: str, valid: bool) -> None:
    if valid:
        parse_policy(name_in(kind, name))
        return
    with pytest.raises(ConfigError, match="must be 1-63 lower-case letters"):
        parse_policy(name_in(kind, name))


@pytest.mark.parametrize(("section", "line"), [
    ("envoy:\n  cluster_header: {value}\n", 6),
    ("envoy:\n  endpoint_header: {value}\n", 6),
    ("flow_control:\n  priority_header: {value}\n", 6),
    ("auth:\n  mode: trusted-header\n  tenant_header: {value}\n", 7),
    ("auth:\n  tier_header: {value}\n", 6),
    ("rollout:\n  fallback_model_header: {value}\n", 6),
    ("rollout:\n  splits:\n    - model: m\n      backends: [{{pool: chat, weight: 1}}]\n"
     "      override_header: {value}\n", 9),
])
@pytest.mark.parametrize("value", ["X-Tenant", "x_tenant", "x" * 129])
def test_every_header_name_is_lower_case_and_bounded(section: str, line: int, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy(POOLS + section.format(value=value), "p.yaml")
    assert any(str(p).startswith(f"p.yaml:{line}:") and "header name" in str(p) for p in info.value.problems), \
        info.value.problems
    parse_policy(POOLS + section.format(value="x-" + "a" * 126))  # 128 characters
