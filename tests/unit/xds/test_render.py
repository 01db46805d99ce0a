from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from extproc.config import parse_policy
from extproc.openai.apis import RATELIMIT_HEADERS
from extproc.xds import render_files, render_static, write_config
from extproc.xds.render import route_config

POLICY_TEXT = """\
bounds: {max_body_bytes: 100000}
pools:
  - name: chat
    model: org/chat
    endpoints: ["10.0.0.1:8000", "10.0.0.2:8000"]
  - name: embed
    model: e
    endpoints: ["[::1]:9000"]
"""
POLICY = parse_policy(POLICY_TEXT + "envoy: {cluster_header: x-pool, endpoint_header: x-dest, message_timeout_ms: 250, "
                                    "expose_upstream_host: true}\n")


def test_one_cluster_and_eds_file_per_pool() -> None:
    files = render_files(POLICY, Path("/cfg"))
    clusters = {c["name"]: c for c in files["cds.yaml"]["resources"]}
    assert set(clusters) == {"extproc", "chat", "embed"}
    assert clusters["chat"]["type"] == "EDS"
    assert clusters["chat"]["eds_cluster_config"]["eds_config"]["path_config_source"]["path"] == "/cfg/eds-chat.yaml"
    chat_eds = files["eds-chat.yaml"]["resources"][0]
    addresses = [e["endpoint"]["address"]["socket_address"] for e in chat_eds["endpoints"][0]["lb_endpoints"]]
    assert addresses == [{"address": "10.0.0.1", "port_value": 8000}, {"address": "10.0.0.2", "port_value": 8000}]
    embed_eds = files["eds-embed.yaml"]["resources"][0]
    assert embed_eds["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["address"] == "::1"
    policy = clusters["chat"]["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.override_host"
    assert policy["typed_config"]["override_host_sources"] == [{"header": "x-dest"}]
    assert clusters["chat"]["outlier_detection"]["consecutive_5xx"] == 3


def test_filter_chain_order_and_processing_mode() -> None:
    files = render_files(POLICY, Path("/cfg"))
    listener = files["lds.yaml"]["resources"][0]
    assert listener["per_connection_buffer_limit_bytes"] > 100000
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    names = [f["name"] for f in hcm["http_filters"]]
    # prebuffered (the default): the buffer filter holds the whole body before ext_proc sees the request
    assert names == ["envoy.filters.http.header_mutation", "envoy.filters.http.buffer", "envoy.filters.http.ext_proc",
                     "envoy.filters.http.json_to_metadata", "envoy.filters.http.sse_to_metadata",
                     "envoy.filters.http.router"]
    assert hcm["http_filters"][1]["typed_config"]["max_request_bytes"] == listener["per_connection_buffer_limit_bytes"]
    removed = [m["remove"] for m in hcm["http_filters"][0]["typed_config"]["mutations"]["request_mutations"]]
    assert removed == ["x-pool", "x-dest", "x-tenant-id", "x-tenant-tier"]
    early = hcm["early_header_mutation_extensions"][0]["typed_config"]["mutations"]
    assert [m["remove"] for m in early] == removed  # stripped before the route is chosen, too
    assert hcm["access_log"][0]["typed_config"]["common_config"]["grpc_service"]["envoy_grpc"]["cluster_name"] == (
        "extproc")
    ext_proc = hcm["http_filters"][2]["typed_config"]
    assert ext_proc["processing_mode"]["request_header_mode"] == "SEND"
    # headers and the whole body together: the body without waiting for the headers reply, one chunk
    assert ext_proc["processing_mode"]["request_body_mode"] == "STREAMED"
    assert ext_proc["send_body_without_waiting_for_header_response"] is True
    assert ext_proc["message_timeout"] == "0.25s"
    # Nothing of the response goes to the service: the rate-limit headers come from its metadata, each one, and
    # replace an upstream's copy; an empty value (no such metadata) adds nothing.
    assert ext_proc["processing_mode"]["response_header_mode"] == "SKIP" and "allow_mode_override" not in ext_proc
    added = [m["append"] for m in hcm["http_filters"][0]["typed_config"]["mutations"]["response_mutations"]]
    assert [a["header"]["key"] for a in added] == list(RATELIMIT_HEADERS)
    assert all(a["header"]["value"] == f"%DYNAMIC_METADATA(extproc:{a['header']['key']})%" and
               a["append_action"] == "OVERWRITE_IF_EXISTS_OR_ADD" and not a.get("keep_empty_value") for a in added)
    # ext_proc fails open (a routed exchange outlives the service); the routes fail closed.
    assert ext_proc["failure_mode_allow"] is True
    route, unrouted = files["rds.yaml"]["resources"][0]["virtual_hosts"][0]["routes"]
    assert route["route"]["cluster_header"] == "x-pool"
    assert route["match"] == {"prefix": "/", "headers": [{"name": "x-pool", "present_match": True}]}
    assert route["response_headers_to_add"][0]["header"]["key"] == "x-gateway-upstream-host"
    assert unrouted["match"] == {"prefix": "/"} and unrouted["direct_response"]["status"] == 500
    assert json.loads(unrouted["direct_response"]["body"]["inline_string"])["error"]["code"] == "gateway_error"
    # The whole request: the longest admission wait (30 s) + the message timeout (0.25 s) + 30 s.
    assert (hcm["request_headers_timeout"], hcm["request_timeout"]) == ("10s", "60.25s")
    assert "initial_metadata" not in ext_proc["grpc_service"]


def test_fail_open_sends_unrouted_requests_to_the_fallback_pool() -> None:
    policy = parse_policy(POLICY_TEXT + "envoy: {failure_mode_allow: true, fallback_pool: embed}\n")
    route, fallback = route_config(policy)["virtual_hosts"][0]["routes"]
    assert "headers" in route["match"] and fallback["route"]["cluster"] == "embed"


def test_grpc_token_goes_to_both_grpc_services(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    policy = parse_policy(POLICY_TEXT + f"service: {{grpc_token_file: {token}}}\n")
    hcm = render_static(policy)["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext_proc = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")
    expected = [{"key": "x-extproc-token", "value": "s3cret"}]
    assert ext_proc["typed_config"]["grpc_service"]["initial_metadata"] == expected
    assert hcm["access_log"][0]["typed_config"]["common_config"]["grpc_service"]["initial_metadata"] == expected


def test_static_copy_matches_dynamic_pools() -> None:
    static = render_static(POLICY)
    clusters = {c["name"]: c for c in static["static_resources"]["clusters"]}
    assert set(clusters) == {"extproc", "chat", "embed"}
    assert clusters["chat"]["type"] == "STATIC"
    assert "route_config" in static["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]


def test_write_config_is_complete_and_leaves_no_temp_files(tmp_path: Path) -> None:
    written = write_config(POLICY, tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert names == ["bootstrap.yaml", "cds.yaml", "eds-chat.yaml", "eds-embed.yaml", "lds.yaml", "rds.yaml"]
    assert written[-1] == tmp_path / "static" / "envoy.yaml"
    assert yaml.safe_load((tmp_path / "bootstrap.yaml").read_text())["dynamic_resources"]["lds_config"][
        "path_config_source"]["watched_directory"]["path"] == str(tmp_path.resolve())


def test_dns_discovered_pool_is_a_strict_dns_cluster() -> None:
    policy = parse_policy("""\
pools:
  - name: chat
    model: m
    discovery: {dns: vllm.ns.svc.cluster.local, port: 8000, interval_s: 2, family: v4}
""")
    files = render_files(policy, Path("/cfg"))
    cluster = next(c for c in files["cds.yaml"]["resources"] if c["name"] == "chat")
    assert cluster["type"] == "STRICT_DNS" and cluster["dns_lookup_family"] == "V4_ONLY"
    assert cluster["dns_refresh_rate"] == "2s"
    address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert address["socket_address"] == {"address": "vllm.ns.svc.cluster.local", "port_value": 8000}
    assert "eds-chat.yaml" not in files


def test_audit_log_is_a_json_file_log_next_to_the_grpc_log() -> None:
    def logs(policy_text: str) -> list[dict[str, object]]:
        listener = render_static(parse_policy(policy_text))["static_resources"]["listeners"][0]
        found: list[dict[str, object]] = listener["filter_chains"][0]["filters"][0]["typed_config"]["access_log"]
        return found

    pools = "pools: [{name: p, model: m, endpoints: ['10.0.0.1:8000']}]\n"
    assert [log["name"] for log in logs(pools)] == ["envoy.access_loggers.http_grpc"]
    grpc, audit = logs(pools + "audit: {path: /dev/stdout}\n")
    assert (grpc["name"], audit["name"]) == ("envoy.access_loggers.http_grpc", "envoy.access_loggers.file")
    config = audit["typed_config"]
    assert isinstance(config, dict) and config["path"] == "/dev/stdout"
    fields = config["log_format"]["json_format"]
    assert fields["tenant"] == "%DYNAMIC_METADATA(extproc:tenant)%"
    assert fields["request_id"] == "%DYNAMIC_METADATA(extproc:request_id)%"  # ours, not the client's
    assert fields["client_request_id"] == "%REQ(X-REQUEST-ID)%"
    assert fields["prompt_tokens"] == "%DYNAMIC_METADATA(extproc.usage:prompt_tokens)%"
    assert "%REQ(AUTHORIZATION)%" not in str(fields)


def test_an_endpoint_picker_policy_renders_istio_s_inference_pool_shape(tmp_path: Path) -> None:
    from extproc.config.epp import DESTINATION_ENDPOINT, DESTINATION_ENDPOINT_SERVED

    policy = parse_policy("""\
mode: endpoint-picker
service: {grpc_port: 9100}
envoy: {request_body_mode: streamed}
pools: [{name: chat, model: m, endpoints: ["10.0.0.1:8000", "10.0.0.2:8000"]}]
""")
    static = render_static(policy)["static_resources"]
    (pool, picker) = static["clusters"]
    override = pool["load_balancing_policy"]["policies"][0]["typed_extension_config"]["typed_config"]
    assert override["override_host_sources"] == [{"metadata": {"key": "envoy.lb",
                                                               "path": [{"key": DESTINATION_ENDPOINT}]}}]
    assert override["selected_host_key"] == {"key": "envoy.lb", "path": [{"key": DESTINATION_ENDPOINT_SERVED}]}
    assert picker["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] == {
        "socket_address": {"address": "127.0.0.1", "port_value": 9100}}
    hcm = static["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext_proc = hcm["http_filters"][0]["typed_config"]
    assert ext_proc["metadata_options"]["forwarding_namespaces"] == {"untyped": ["envoy.lb"]}
    assert ext_proc["send_body_without_waiting_for_header_response"] is True  # STREAMED must not wait
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]
    mode = route["typed_per_filter_config"]["envoy.filters.http.ext_proc"]["overrides"]["processing_mode"]
    assert mode["request_body_mode"] == "STREAMED"
    written = write_config(policy, tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == ["bootstrap.yaml", "static/envoy.yaml"]


def test_usage_rules_read_every_response_shape() -> None:
    filters = {f["name"]: f["typed_config"] for f in render_static(POLICY)["static_resources"][
        "listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]}

    def paths(rules: list[dict[str, Any]]) -> set[tuple[tuple[str, ...], str]]:
        return {(tuple(s["key"] for s in r["selectors"]), r["on_present"]["key"]) for r in rules}

    body = paths(filters["envoy.filters.http.json_to_metadata"]["response_rules"]["rules"])
    stream = paths([r["rule"] for r in filters["envoy.filters.http.sse_to_metadata"]["response_rules"][
        "content_parser"]["typed_config"]["rules"]])
    for shape in (body, stream):  # OpenAI, and Anthropic / Responses JSON bodies and Anthropic's message_delta
        assert {(("usage", "prompt_tokens"), "prompt_tokens"), (("usage", "input_tokens"), "prompt_tokens"),
                (("usage", "output_tokens"), "completion_tokens")} <= shape
    assert (("response", "usage", "input_tokens"), "prompt_tokens") in stream - body  # response.completed


def test_local_replies_on_the_messages_path_are_anthropic_shaped() -> None:
    hcm = render_static(POLICY)["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    mappers = hcm["typed_config"]["local_reply_config"]["mappers"]
    for anthropic, openai in zip(mappers[::2], mappers[1::2], strict=True):
        # First match wins: each condition's Messages-path variant comes first.
        assert anthropic["filter"]["and_filter"]["filters"][0] == openai["filter"]
        assert anthropic["body_format_override"]["json_format"]["type"] == "error"
        assert "code" in openai["body_format_override"]["json_format"]["error"]


def test_envoy_tracer_is_rendered_only_with_tracing_on() -> None:
    def hcm_and_clusters(extra: str) -> tuple[dict[str, Any], list[str]]:
        static = render_static(parse_policy(POLICY_TEXT + extra))["static_resources"]
        hcm = static["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        return hcm, [c["name"] for c in static["clusters"]]

    hcm, clusters = hcm_and_clusters("")
    assert "tracing" not in hcm and "otel_collector" not in clusters
    hcm, clusters = hcm_and_clusters("tracing: {enabled: true, otlp_endpoint: '10.1.2.3:4317', sample_ratio: 0.05}\n")
    assert hcm["tracing"]["random_sampling"] == {"value": 5.0}
    assert hcm["tracing"]["provider"]["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"] == "otel_collector"
    assert "otel_collector" in clusters
    hcm, clusters = hcm_and_clusters("tracing: {enabled: true, envoy: false}\n")
    assert "tracing" not in hcm and "otel_collector" not in clusters


@pytest.mark.parametrize("mode", ["streamed", "prebuffered"])
def test_a_streamed_policy_sends_the_body_without_waiting_and_keeps_the_stream_to_the_end(mode: str) -> None:
    policy = parse_policy(POLICY_TEXT + f"envoy: {{request_body_mode: {mode}}}\n")
    buffered = render_static(parse_policy(POLICY_TEXT + "envoy: {request_body_mode: buffered}\n"))[
        "static_resources"]["listeners"][0]
    listener = render_static(policy)["static_resources"]["listeners"][0]
    filters = listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
    # prebuffered: Envoy's buffer filter first, so that the whole body follows the headers as one chunk
    assert [f["name"] for f in filters[1:-4]] == (["envoy.filters.http.buffer"] if mode == "prebuffered" else [])
    ext_proc = filters[-4]["typed_config"]
    processing = ext_proc["processing_mode"]
    assert (processing["request_body_mode"], processing["request_header_mode"]) == ("STREAMED", "SEND")
    assert ext_proc["send_body_without_waiting_for_header_response"] is True
    # Nothing of the response is processed, but the trailers keep the gRPC stream to the exchange's end.
    assert (processing["response_header_mode"], processing["response_body_mode"],
            processing["response_trailer_mode"]) == (
        "SKIP", "NONE", "SEND")
    # Streamed: a client's upload while the headers reply is held may take up to the request timeout (prebuffered:
    # the upload ended before the headers were sent, the timers are buffered's).
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    longest = float(ext_proc["max_message_timeout"].rstrip("s"))
    assert (longest > float(hcm["request_timeout"].rstrip("s"))) is (mode == "streamed")
    assert ext_proc["failure_mode_allow"] is True  # routed exchanges still outlive the service
    plain = buffered["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][1]["typed_config"]
    assert "send_body_without_waiting_for_header_response" not in plain
    assert plain["processing_mode"]["response_trailer_mode"] == "SKIP"
