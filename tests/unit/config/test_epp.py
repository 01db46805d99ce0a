"""Endpoint-picker mode, InferencePool sources and gRPC TLS in the policy: what is refused, with file:line."""

from __future__ import annotations

import pytest

from extproc.config import ConfigError, parse_policy

ONE_POOL = "pools: [{name: chat, model: m, endpoints: ['10.0.0.1:8000']}]\n"


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_policy(text, "p.yaml")
    return [str(problem) for problem in caught.value.problems]


def test_endpoint_picker_mode_with_an_inference_pool_source() -> None:
    policy = parse_policy("""\
mode: endpoint-picker
endpoint_picker: {single_endpoint: true, shed_status: 503, outcomes: access-log}
envoy: {request_body_mode: full-duplex}
service: {tls: {cert_file: /tls/tls.crt, key_file: /tls/tls.key}}
pools: [{name: chat, model: m, inference_pool: {name: vllm-chat, namespace: llm}}]
""")
    assert policy.mode == "endpoint-picker" and policy.endpoint_picker.single_endpoint
    source = policy.pools[0].inference_pool
    assert source is not None and (source.name, source.namespace, source.watch_timeout_s) == ("vllm-chat", "llm", 300)
    assert policy.service.tls is not None and policy.service.tls.reload_interval_s == 5


@pytest.mark.parametrize(("text", "message"), [
    ("mode: endpoint-picker\npools: [{name: a, model: a, endpoints: ['10.0.0.1:1']},\n"
     "        {name: b, model: b, endpoints: ['10.0.0.2:1']}]\n", "serves one pool per process"),
    ("mode: endpoint-picker\npools: [{name: a, model: a, endpoints: ['10.0.0.1:1'], backup_pool: a}]\n",
     "backup_pool cannot apply"),
    ("envoy: {request_body_mode: full-duplex}\n" + ONE_POOL, "needs mode: endpoint-picker (in policy mode a routed"),
    ("pools: [{name: a, model: a, endpoints: ['10.0.0.1:1'], inference_pool: {name: p}}]\n", "exactly one"),
    ("pools: [{name: a, model: a, inference_pool: {name: Bad_Name}}]\n", "not a Kubernetes object name"),
    ("pools: [{name: a, model: a, inference_pool: {name: p, api_server: 'ftp://x'}}]\n", "https://"),
    ("pools: [{name: a, model: a, inference_pool: {name: p, token_file: token}}]\n", "absolute path"),
    ("service: {tls: {cert_file: cert.pem, key_file: /k}}\n" + ONE_POOL, "absolute path"),
    ("mode: picker\n" + ONE_POOL, "mode"),
    ("endpoint_picker: {shed_status: 500}\n" + ONE_POOL, "shed_status"),
    ("mode: endpoint-picker\nenvoy: {request_body_mode: prebuffered}\n" + ONE_POOL, "prebuffered is policy mode's"),
    ("pools: [{name: a, model: a, endpoints: ['10.0.0.1:1'], cluster: 'bad cluster'}]\n", "cluster"),
])
def test_what_endpoint_picker_mode_refuses(text: str, message: str) -> None:
    found = problems(text)
    assert any(message in problem and problem.startswith("p.yaml:") for problem in found), found


def test_the_example_policy_is_an_endpoint_picker() -> None:
    from pathlib import Path

    from extproc.config import load_policy

    policy = load_policy(Path(__file__).parents[3] / "policies" / "endpoint-picker.yaml")
    assert policy.mode == "endpoint-picker" and len(policy.pools) == 1


def test_the_request_body_mode_default_depends_on_the_mode() -> None:
    """Policy mode: prebuffered (one round trip to the service, our rendered Envoy's buffer filter); endpoint-picker
    mode: buffered (the gateway's ext_proc filter is configured by its owner)."""
    assert parse_policy(ONE_POOL).envoy.request_body_mode == "prebuffered"
    assert parse_policy("mode: endpoint-picker\n" + ONE_POOL).envoy.request_body_mode == "buffered"
    assert parse_policy("mode: endpoint-picker\nenvoy: {message_timeout_ms: 500}\n" + ONE_POOL).envoy == \
        parse_policy("mode: endpoint-picker\nenvoy: {message_timeout_ms: 500, request_body_mode: buffered}\n"
                     + ONE_POOL).envoy
