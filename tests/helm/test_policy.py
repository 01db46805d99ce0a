"""The chart's policy is one the service accepts, and standalone Envoy is rendered from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from extproc.cli import main as extproc_main
from extproc.config import EnvoyConfig, ServiceConfig, parse_policy
from extproc.config.schema import AuthConfig
from extproc.xds.render import EXTPROC_CLUSTER, render_files
from tests.helm.chart import FULLNAME, MODES, Chart, chart_values, containers, find, http_filter_patch, policy_text

XDS_DIR = Path("/etc/envoy/xds")


@pytest.mark.parametrize("mode", MODES)
def test_policy_configmap_parses(chart: Chart, mode: str) -> None:
    policy = parse_policy(policy_text(chart.template({"mode": mode})), f"configmap ({mode})")
    assert len(policy.pools) == (1 if mode == "epp" else 2)  # a picker serves one pool
    assert policy.service.admin_host == "0.0.0.0"
    # Standalone: only the Envoy of the same pod calls the gRPC port.
    assert policy.service.grpc_host == ("127.0.0.1" if mode == "standalone" else "0.0.0.0")


def test_values_policy_is_valid_as_written() -> None:
    policy = parse_policy(yaml.safe_dump(chart_values()["policy"]), "helm/values.yaml")
    assert [pool.name for pool in policy.pools] == ["llama-8b", "qwen-embed"]


def test_chart_defaults_are_the_schema_defaults(chart: Chart) -> None:
    values = chart_values()["policy"]
    for key in ("grpc_port", "admin_port"):
        assert values["service"][key] == getattr(ServiceConfig(), key), key
    for key in ("cluster_header", "endpoint_header", "message_timeout_ms", "failure_mode_allow", "listen_port",
                "admin_port", "retries", "route_timeout_s", "stream_idle_timeout_s"):
        assert values["envoy"][key] == getattr(EnvoyConfig(), key), key
    # With those sections removed, the templates fall back to the same defaults.
    objects = chart.template({"policy": {"envoy": None, "bounds": None}})
    policy = parse_policy(policy_text(objects))
    assert policy.envoy == EnvoyConfig()
    ext_proc = http_filter_patch(objects, "envoy.filters.http.ext_proc")["patch"]["value"]["typed_config"]
    assert ext_proc["message_timeout"] == "1s"
    assert ext_proc["failure_mode_allow"] is True  # the decision survives the service; the route fails closed
    strip = http_filter_patch(objects, "envoy.filters.http.header_mutation")["patch"]["value"]["typed_config"]
    envoy, auth = EnvoyConfig(), AuthConfig()
    assert [m["remove"] for m in strip["mutations"]["request_mutations"]] == [
        envoy.cluster_header, envoy.endpoint_header, auth.tenant_header, auth.tier_header]


def test_standalone_envoy_is_rendered_from_the_chart_policy(chart: Chart) -> None:
    objects = chart.template({"mode": "standalone"})
    policy = parse_policy(policy_text(objects))
    assert policy.envoy.extproc_endpoints == ("127.0.0.1:9002",)
    assert policy.envoy.listen_host == "0.0.0.0"
    files = render_files(policy, XDS_DIR)
    clusters = [c["name"] for c in files["cds.yaml"]["resources"]]
    assert clusters == [EXTPROC_CLUSTER, *(pool.name for pool in policy.pools)]
    extproc = files["cds.yaml"]["resources"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [e["endpoint"]["address"]["socket_address"] for e in extproc] == [
        {"address": "127.0.0.1", "port_value": 9002}]
    assert files["bootstrap.yaml"]["dynamic_resources"]["lds_config"]["path_config_source"]["path"] == \
        str(XDS_DIR / "lds.yaml")

    pod = containers(find(objects, "Deployment", FULLNAME))
    assert set(pod) == {"render-envoy-config", "extproc", "envoy"}
    envoy = pod["envoy"]
    assert envoy["args"][:2] == ["-c", str(XDS_DIR / "bootstrap.yaml")]
    assert {p["name"]: p["containerPort"] for p in envoy["ports"]} == {"http": policy.envoy.listen_port}
    assert envoy["image"].startswith("envoyproxy/envoy:")
    rendered_by = {m["name"] for m in pod["render-envoy-config"]["volumeMounts"]}
    shared = rendered_by & {m["name"] for m in envoy["volumeMounts"]}
    assert shared == {"envoy-xds"}
    service = find(objects, "Service", f"{FULLNAME}-envoy")
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_init_container_command_renders_the_files_envoy_loads(chart: Chart, tmp_path: Path) -> None:
    objects = chart.template({"mode": "standalone"})
    init = containers(find(objects, "Deployment", FULLNAME))["render-envoy-config"]
    args: list[str] = list(init["args"])
    assert args == ["envoy", "render", "--config", "/etc/extproc/policy.yaml", "--out", str(XDS_DIR)]
    (tmp_path / "policy.yaml").write_text(policy_text(objects), encoding="utf-8")
    args[args.index("--config") + 1] = str(tmp_path / "policy.yaml")
    args[args.index("--out") + 1] = str(tmp_path / "xds")
    assert extproc_main([*args, "--mount", str(XDS_DIR)]) == 0
    written = sorted(p.name for p in (tmp_path / "xds").glob("*.yaml"))
    assert written == ["bootstrap.yaml", "cds.yaml", "eds-llama-8b.yaml", "eds-qwen-embed.yaml", "lds.yaml", "rds.yaml"]


def checksum(objects: list[dict[str, Any]]) -> str:
    annotations = find(objects, "Deployment", FULLNAME)["spec"]["template"]["metadata"]["annotations"]
    value = annotations["checksum/policy"]
    assert isinstance(value, str) and len(value) == 64
    return value


def test_pods_roll_when_the_policy_changes(chart: Chart) -> None:
    base = checksum(chart.template())
    assert checksum(chart.template({"policy": {"envoy": {"message_timeout_ms": 900}}})) != base
    assert checksum(chart.template({"policy": {"pools": [
        {"name": "one", "model": "m", "endpoints": ["10.9.0.1:8000"]}]},
        "istio": {"routing": {"poolServices": {"one": "vllm-one.llm.svc.cluster.local:8000"}}}})) != base
    assert checksum(chart.template({"redis": {"enabled": True}})) != base  # limits.store becomes redis
    assert checksum(chart.template({"replicaCount": 5, "serviceMonitor": {"enabled": True}})) == base


def test_chart_redis_and_tenants_complete_the_policy(chart: Chart) -> None:
    plain = parse_policy(policy_text(chart.template()))
    assert plain.limits.store == "memory"
    assert plain.auth.keys_file is None
    objects = chart.template({"redis": {"url": "redis://r:6379/0"}, "tenants": {"existingSecret": "keys"},
                              "policy": {"auth": {"mode": "api-key"}}})
    policy = parse_policy(policy_text(objects))
    assert policy.limits.store == "redis"
    assert policy.auth.mode == "api-key"
    assert policy.auth.keys_file == "/etc/extproc/tenants/keys.yaml"
    extproc = containers(find(objects, "Deployment", FULLNAME))["extproc"]
    mounts = {m["name"]: m["mountPath"] for m in extproc["volumeMounts"]}
    assert policy.auth.keys_file.startswith(mounts["tenants"] + "/")
    # The operator's own choices are kept.
    kept = chart.template({"redis": {"enabled": True}, "tenants": {"existingSecret": "keys"},
                           "policy": {"limits": {"store": "memory"}, "auth": {"keys_file": "keys/k.yaml"}}})
    policy = parse_policy(policy_text(kept))
    assert (policy.limits.store, policy.auth.keys_file) == ("memory", "keys/k.yaml")


def test_inline_tenants_roll_pods_too(chart: Chart) -> None:
    def tenants_checksum(content: str) -> str:
        deployment = find(chart.template({"tenants": {"data": {"t.yaml": content}}}), "Deployment", FULLNAME)
        value = deployment["spec"]["template"]["metadata"]["annotations"]["checksum/tenants"]
        assert isinstance(value, str)
        return value

    assert tenants_checksum("a") != tenants_checksum("b")


@pytest.mark.parametrize(("values", "replicas"), [
    ({"redis": {"enabled": True}}, 10),  # the HPA may scale to maxReplicas: the smallest share
    ({"redis": {"enabled": True}, "autoscaling": {"enabled": False}, "replicaCount": 3}, 3),
    ({"redis": {"enabled": True}, "policy": {"limits": {"replicas": 7}}}, 7),
    ({}, None),  # memory store: every replica has its own limits, no share to set
])
def test_redis_limits_know_how_many_replicas_share_them(chart: Chart, values: dict[str, Any],
                                                       replicas: int | None) -> None:
    policy = parse_policy(policy_text(chart.template({"mode": "standalone", **values})))
    assert policy.limits.replicas == replicas
