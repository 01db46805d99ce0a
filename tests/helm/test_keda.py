"""The chart's KEDA ScaledObjects: values-gated, one per pool, valid against KEDA's own CRD schema (offline)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from extproc.config import parse_policy
from tests.helm.chart import FULLNAME, NAMESPACE, Chart, HelmError, chart_values, kinds, policy_text

SCHEMA = Path(__file__).parent / "schemas" / "scaledobject.crd-schema.json"
AUTH_SCHEMA = Path(__file__).parent / "schemas" / "triggerauthentication.crd-schema.json"
TLS = {"tls": {"secretName": "scaler-tls", "clientSecretName": "keda-client-tls"}}
POOLS = [{"pool": "llama-8b", "scaleTargetRef": {"name": "vllm-llama"}, "maxReplicaCount": 8},
         {"pool": "qwen-embed", "scaleTargetRef": {"kind": "StatefulSet", "name": "vllm-embed"},
          "minReplicaCount": 1, "cooldownPeriod": 60}]


def strict(schema: Any) -> Any:
    """KEDA's structural schema as the API server applies it with strict field validation: an object with listed
    properties takes no other field."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


def validator(path: Path = SCHEMA, kind: str = "ScaledObject") -> jsonschema.Draft202012Validator:
    schema = strict(json.loads(path.read_text(encoding="utf-8")))
    schema["properties"]["apiVersion"] = {"const": "keda.sh/v1alpha1"}
    schema["properties"]["kind"] = {"const": kind}
    return jsonschema.Draft202012Validator(schema)


def values(**keda: Any) -> dict[str, Any]:
    policy = copy.deepcopy(chart_values()["policy"])
    policy["autoscaling"] = {"enabled": True}
    return {"policy": policy, "keda": {"enabled": True, "pools": POOLS, **(keda or TLS)}}


def test_no_scaled_object_unless_enabled(chart: Chart) -> None:
    assert "ScaledObject" not in kinds(chart.template())


def test_one_scaled_object_per_pool_validates_against_kedas_crd_schema(chart: Chart) -> None:
    objects = chart.template(values())
    scaled = [o for o in objects if o["kind"] == "ScaledObject"]
    assert [o["metadata"]["name"] for o in scaled] == [f"{FULLNAME}-llama-8b", f"{FULLNAME}-qwen-embed"]
    check = validator()
    for obj in scaled:
        check.validate(obj)
    first, second = (o["spec"] for o in scaled)
    (trigger,) = first["triggers"]
    assert trigger["type"] == "external-push" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"] == {"scalerAddress": f"{FULLNAME}.{NAMESPACE}.svc.cluster.local:9004",
                                   "pool": "llama-8b"}
    assert trigger["authenticationRef"] == {"name": f"{FULLNAME}-keda-tls"}
    assert (first["minReplicaCount"], first["maxReplicaCount"], first["cooldownPeriod"]) == (0, 8, 300)
    assert second["scaleTargetRef"] == {"kind": "StatefulSet", "name": "vllm-embed"}
    assert (second["minReplicaCount"], second["cooldownPeriod"]) == (1, 60)
    # The policy the chart ships with them serves the scaler, on its own port with mTLS.
    autoscaling = parse_policy(policy_text(objects), "configmap").autoscaling
    assert autoscaling.enabled and autoscaling.grpc_port == 9004 and autoscaling.grpc_host == "0.0.0.0"
    assert autoscaling.tls is not None and autoscaling.tls.client_ca_file == "/etc/extproc/keda-tls/ca.crt"


def test_the_trigger_authentication_hands_keda_its_client_certificate(chart: Chart) -> None:
    objects = chart.template(values())
    (auth,) = [o for o in objects if o["kind"] == "TriggerAuthentication"]
    check = validator(AUTH_SCHEMA, "TriggerAuthentication")
    check.validate(auth)
    for broken in ({"secretTargetRef": [{"parameter": "caCert", "name": "x"}]}, {"secretTargetRefs": []}):
        with pytest.raises(jsonschema.ValidationError):
            check.validate({**auth, "spec": broken})
    assert auth["metadata"]["name"] == f"{FULLNAME}-keda-tls"
    assert {(r["parameter"], r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]} == {
        ("caCert", "keda-client-tls", "ca.crt"), ("tlsClientCert", "keda-client-tls", "tls.crt"),
        ("tlsClientKey", "keda-client-tls", "tls.key")}
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "extproc"]
    assert {"name": "keda", "containerPort": 9004, "protocol": "TCP"} in container["ports"]
    assert {"name": "keda-tls", "mountPath": "/etc/extproc/keda-tls", "readOnly": True} in container["volumeMounts"]
    assert {"name": "keda-tls", "secret": {"secretName": "scaler-tls", "defaultMode": 0o440}} in pod["volumes"]
    services = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == FULLNAME]
    assert any(p["name"] == "grpc-keda" and p["port"] == 9004 for p in services[0]["spec"]["ports"])
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == FULLNAME]
    (rule,) = [r for r in policy["spec"]["ingress"] if r["ports"] == [{"port": "keda", "protocol": "TCP"}]]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}}]


def test_without_tls_only_an_explicit_opt_out_renders(chart: Chart) -> None:
    assert "keda.allowUnauthenticated" in chart.template_error(values(tls={"secretName": ""}))
    assert "clientSecretName" in chart.template_error(values(tls={"secretName": "scaler-tls"}))
    objects = chart.template(values(allowUnauthenticated=True))
    assert "TriggerAuthentication" not in kinds(objects)
    (scaled, *_) = [o for o in objects if o["kind"] == "ScaledObject"]
    assert scaled["spec"]["triggers"][0]["metadata"]["scalerAddress"].endswith(":9002")
    assert "authenticationRef" not in scaled["spec"]["triggers"][0]
    autoscaling = parse_policy(policy_text(objects), "configmap").autoscaling
    assert autoscaling.allow_unauthenticated and autoscaling.grpc_port is None


def test_the_strict_schema_rejects_what_kedas_api_would(chart: Chart) -> None:
    obj = next(o for o in chart.template(values()) if o["kind"] == "ScaledObject")
    check = validator()
    for broken in ({"triggers": []}, {"minReplicaCount": "zero"}, {"scaleTargetRef": {"kind": "Deployment"}},
                   {"pollingIntervall": 5}):
        bad = copy.deepcopy(obj)
        bad["spec"].update(broken)
        with pytest.raises(jsonschema.ValidationError):
            check.validate(bad)
    bad = copy.deepcopy(obj)
    bad["spec"]["triggers"][0]["metadata"]["port"] = 9002  # trigger metadata values are strings
    with pytest.raises(jsonschema.ValidationError):
        check.validate(bad)


def test_misconfigurations_fail_the_render(chart: Chart) -> None:
    off = values()
    off["policy"]["autoscaling"] = {"enabled": False}
    assert "policy.autoscaling.enabled" in chart.template_error(off)
    unknown = values(pools=[{"pool": "nope", "scaleTargetRef": {"name": "x"}}])
    assert "not a pool of policy.pools" in chart.template_error(unknown)
    with pytest.raises(HelmError):
        chart.template(values(triggerType="prometheus"))


def test_lint_passes_with_keda_on(chart: Chart) -> None:
    result = chart.lint(values())
    assert result.returncode == 0, result.stdout + result.stderr
