from __future__ import annotations

from pathlib import Path

import pytest

from extproc.config import ConfigError, load_policy, parse_policy

GOOD = """\
pools:
  - name: chat
    model: m/chat
    aliases: [gpt-4o-mini]
    endpoints: ["127.0.0.1:8001", "127.0.0.1:8002"]
"""


def test_good_policy_parses_with_defaults() -> None:
    policy = parse_policy(GOOD)
    assert policy.pools[0].endpoints == ("127.0.0.1:8001", "127.0.0.1:8002")
    assert policy.pools[0].fallbacks == 2
    assert policy.envoy.failure_mode_allow is False
    assert policy.bounds.max_json_depth == 32


def test_errors_carry_file_and_line_of_the_offending_key() -> None:
    text = GOOD + "  - name: Bad_Name\n    model: other\n    endpoints: [\"not-an-ip:80\"]\n    typo: 1\n"
    with pytest.raises(ConfigError) as info:
        parse_policy(text, "p.yaml")
    rendered = [str(p) for p in info.value.problems]
    assert any(r.startswith("p.yaml:6:") and "pool name" in r for r in rendered)
    assert any(r.startswith("p.yaml:8:") and "not an IP address" in r for r in rendered)
    assert any(r.startswith("p.yaml:9:") and "Extra inputs" in r for r in rendered)


def test_model_claimed_by_two_pools_is_rejected() -> None:
    text = GOOD + "  - name: other\n    model: gpt-4o-mini\n    endpoints: [\"127.0.0.1:9000\"]\n"
    with pytest.raises(ConfigError, match="claimed by pools"):
        parse_policy(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pools: [\n", "YAML syntax"),
        ("", "is empty"),
        ("- a\n- b\n", "mapping at the top level"),
        ("pools: []\n", "at least 1"),
        ("pools:\n  - name: a\n    name: b\n", "duplicate key 'name'"),
    ],
)
def test_malformed_files_are_rejected_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_policy(text)


def test_duplicate_endpoint_and_port_range(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("pools:\n  - name: a\n    model: m\n    endpoints: ['127.0.0.1:1', '127.0.0.1:1']\n")
    with pytest.raises(ConfigError, match="duplicate endpoint"):
        load_policy(path)
    path.write_text("pools:\n  - name: a\n    model: m\n    endpoints: ['127.0.0.1:70000']\n")
    with pytest.raises(ConfigError, match="port out of range"):
        load_policy(path)


def test_unreadable_file_reports_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_policy(tmp_path / "missing.yaml")
    bad = tmp_path / "latin.yaml"
    bad.write_bytes(b"pools: \xff\n")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_policy(bad)


def test_shipped_example_policies_validate() -> None:
    for path in sorted(Path(__file__).parents[3].joinpath("policies").glob("*.yaml")):
        load_policy(path)


def test_unknown_plugin_type_reported_at_load_with_line() -> None:
    text = GOOD + "scheduling:\n  plugins:\n    - {name: x, type: no-such-plugin}\n"
    with pytest.raises(ConfigError, match=r"<policy>:7: .*unknown type 'no-such-plugin'"):
        parse_policy(text)


def test_pool_profile_must_exist() -> None:
    with pytest.raises(ConfigError, match="unknown scheduling profile"):
        parse_policy(GOOD + "    profile: fastest\n")


@pytest.mark.parametrize(("text", "message"), [
    ("service: {grpc_token_file: token.txt}\n", "must be an absolute path"),
    ("envoy: {request_timeout_s: 20}\n", "request_timeout_s .* must exceed the longest flow_control wait"),
    ("rollout: {fallback_route_file: /tmp/rds.yaml}\n", "needs envoy.failure_mode_allow: true"),
    ("bounds: {max_json_containers: 1}\n", "max_json_containers"),
    ("auth: {mode: trusted-header}\nbounds: {tenant_parse_burst_ms: 1000}\n", "tenant_parse_burst_ms must be below"),
    ("auth: {mode: trusted-header}\nenvoy: {message_timeout_ms: 200}\n", "tenant_parse_burst_ms must be below"),
])
def test_security_settings_are_validated(text: str, message: str) -> None:
    pools = "pools: [{name: p, model: m, endpoints: ['10.0.0.1:8000']}]\n"
    with pytest.raises(ConfigError, match=message):
        parse_policy(pools + text)


def test_a_parse_burst_at_or_past_the_message_timeout_is_allowed_only_where_no_parse_budget_applies() -> None:
    pools = "pools: [{name: p, model: m, endpoints: ['10.0.0.1:8000']}]\n"
    assert parse_policy(pools).bounds.tenant_parse_burst_ms < parse_policy(pools).envoy.message_timeout_ms
    tenants = "auth: {mode: trusted-header}\n"
    assert parse_policy(pools + tenants + "bounds: {tenant_parse_burst_ms: 999}\n")
    assert parse_policy(pools + tenants + "bounds: {tenant_parse_ms_per_s: 0, tenant_parse_burst_ms: 5000}\n")
    assert parse_policy(pools + "envoy: {message_timeout_ms: 200}\n")  # no tenants (auth none), no parse budget


def test_request_timeout_may_be_off_or_above_every_wait() -> None:
    pools = "pools: [{name: p, model: m, endpoints: ['10.0.0.1:8000']}]\n"
    assert parse_policy(pools).request_timeout_s() == 30 + 1 + 30  # the longest class wait + message timeout + 30 s
    assert parse_policy(pools + "envoy: {request_timeout_s: 0}\n").request_timeout_s() == 0
    assert parse_policy(pools + "flow_control: {enabled: false}\nenvoy: {request_timeout_s: 2}\n")
    # Unset, it grows with the longest admission-queue wait: long waits configured before stay valid.
    patient = "flow_control: {classes: {standard: {priority: 1, max_wait_s: 120}}, default_class: standard}\n"
    assert parse_policy(pools + patient).request_timeout_s() == 120 + 1 + 30


@pytest.mark.parametrize(("extra", "shares", "unshared"), [
    ("", False, 1),  # one process
    ("envoy: {extproc_endpoints: ['127.0.0.1:1', '127.0.0.1:2', '127.0.0.1:3']}\n", False, 3),  # no Redis
    ("envoy: {extproc_endpoints: ['127.0.0.1:1', '127.0.0.1:2']}\nlimits: {store: redis, redis_url: 'redis://h/0'}\n",
     True, 1),
    ("envoy: {extproc_endpoints: ['127.0.0.1:1', '127.0.0.1:2']}\nlimits: {store: redis, redis_url: 'redis://h/0', "
     "replicas: 4}\nscheduling: {placement_sync_ms: 0}\n", False, 4),
])
def test_replicas_placing_prefixes_without_sharing(extra: str, shares: bool, unshared: int) -> None:
    policy = parse_policy(GOOD + extra, "p.yaml")
    assert policy.shares_placements() is shares and policy.unshared_replicas() == unshared
