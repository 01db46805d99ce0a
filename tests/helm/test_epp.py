"""The chart's `epp` mode: the endpoint picker of an InferencePool (Deployment, Service, RBAC, the InferencePool
pointing at it) and the strict values schema (a typo fails the install)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from extproc.config import parse_policy
from tests.helm.chart import CHART, FULLNAME, NAMESPACE, Chart, containers, find, kinds, policy_text

EPP: dict[str, Any] = {"mode": "epp", "epp": {"inferencePool": {"selector": {"app": "vllm-qwen"},
                                                                "targetPorts": [8000, 8001]}}}


def test_the_inference_pool_points_at_the_picker_service(chart: Chart) -> None:
    objects = chart.template(EPP)
    assert "EnvoyFilter" not in kinds(objects)
    pool = find(objects, "InferencePool", "llama-8b")
    service = find(objects, "Service", FULLNAME)
    (grpc,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    assert pool["spec"] == {
        "selector": {"matchLabels": {"app": "vllm-qwen"}},
        "targetPorts": [{"number": 8000}, {"number": 8001}],
        "appProtocol": "http",
        "endpointPickerRef": {"group": "", "kind": "Service", "name": FULLNAME, "port": {"number": grpc["port"]},
                              "failureMode": "FailClose"},
    }
    assert service["spec"]["selector"] == find(objects, "Deployment", FULLNAME)["spec"]["selector"]["matchLabels"]


def test_the_picker_serves_one_pool_from_the_inference_pool(chart: Chart) -> None:
    policy = parse_policy(policy_text(chart.template(EPP)))
    assert policy.mode == "endpoint-picker"
    (pool,) = policy.pools
    assert (pool.name, pool.endpoints, pool.discovery) == ("llama-8b", (), None)
    assert pool.inference_pool is not None
    assert (pool.inference_pool.name, pool.inference_pool.namespace) == ("llama-8b", NAMESPACE)
    chosen = parse_policy(policy_text(chart.template({**EPP, "epp": {"pool": "qwen-embed", "inferencePool": {
        "name": "embeddings", "selector": {"app": "e"}}}})))
    assert [(p.name, p.inference_pool and p.inference_pool.name) for p in chosen.pools] == [
        ("qwen-embed", "embeddings")]


def test_rbac_lets_the_picker_read_its_pool_and_pods_only(chart: Chart) -> None:
    objects = chart.template(EPP)
    role = find(objects, "Role", f"{FULLNAME}-epp")
    assert role["rules"] == [
        {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = find(objects, "RoleBinding", f"{FULLNAME}-epp")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    pod = find(objects, "Deployment", FULLNAME)["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    assert "Role" not in kinds(chart.template({**EPP, "epp": {"rbac": {"create": False}}}))
    assert "Role" not in kinds(chart.template())  # the other modes call no Kubernetes API


def test_tls_secret_is_mounted_where_the_policy_reads_it(chart: Chart) -> None:
    objects = chart.template({**EPP, "epp": {"tls": {"secretName": "picker-tls"}}})
    policy = parse_policy(policy_text(objects))
    assert policy.service.tls is not None
    deployment = find(objects, "Deployment", FULLNAME)
    mounts = {m["name"]: m["mountPath"] for m in containers(deployment)["extproc"]["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert policy.service.tls.cert_file == f"{mounts['tls']}/tls.crt"
    assert policy.service.tls.key_file == f"{mounts['tls']}/tls.key"
    assert volumes["tls"]["secret"]["secretName"] == "picker-tls"


def test_the_picker_takes_grpc_from_any_gateway_unless_told(chart: Chart) -> None:
    policy = find(chart.template(EPP), "NetworkPolicy", FULLNAME)
    (grpc,) = [rule for rule in policy["spec"]["ingress"] if rule["ports"][0]["port"] == "grpc"]
    assert "from" not in grpc
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "istio-system"}}}]
    told = find(chart.template({**EPP, "networkPolicy": {"grpcFrom": peers}}), "NetworkPolicy", FULLNAME)
    assert told["spec"]["ingress"][0]["from"] == peers


@pytest.mark.parametrize(("values", "message"), [
    ({**EPP, "epp": {"pool": "nope"}}, 'epp.pool "nope" is not one of policy.pools'),
    ({**EPP, "epp": {"inferencePool": {"selector": None}}}, "epp.inferencePool.selector"),  # null clears it
    ({**EPP, "epp": {"tls": {"secretName": "t"}}, "probes": {"grpc": True}}, "kubelet's gRPC probes"),
    ({**EPP, "epp": {"inferencePool": {"targetPorts": [8000, 8000]}}}, "/epp/inferencePool/targetPorts"),
    ({**EPP, "epp": {"inferencePool": {"failureMode": "Open"}}}, "/epp/inferencePool/failureMode"),
])
def test_unusable_epp_values_fail_with_a_clear_message(chart: Chart, values: dict[str, Any], message: str) -> None:
    assert message in chart.template_error(values)


@pytest.mark.parametrize(("values", "where"), [
    ({"replicaCont": 3}, "additional properties 'replicaCont'"),
    ({"istio": {"routing": {"clusters": True}}}, "/istio/routing"),
    ({"epp": {"inferencepool": {}}}, "/epp"),
    ({"policy": {"envoy": {"retriez": 3}}}, "/policy/envoy"),
    ({"policy": {"limits": {"store": "rediss"}}}, "/policy/limits/store"),
    ({"policy": {"endpoint_picker": {"single_endpoints": True}}}, "/policy/endpoint_picker"),
    ({"probes": {"readiness": {"periodSecond": 5}}}, "/probes/readiness"),
])
def test_a_typo_in_the_values_fails_the_install(chart: Chart, values: dict[str, Any], where: str) -> None:
    assert where in chart.template_error(values)


def test_the_values_schema_is_generated_from_the_policy_model() -> None:
    checked = subprocess.run([sys.executable, str(CHART / "tools" / "values_schema.py"), "--check"],
                             capture_output=True, text=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stderr
