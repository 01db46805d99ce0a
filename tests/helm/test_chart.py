"""The chart lints, renders in every mode, and every object is valid Kubernetes (checked offline)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from kubernetes_validate.utils import SchemaNotFoundError

from tests.helm.chart import CHART, FULLNAME, MODES, NAMESPACE, Chart, HelmError, containers, find, kinds

SCHEMAS = Path(__file__).parent / "schemas"
CRD_SCHEMAS = {
    ("networking.istio.io/v1alpha3", "EnvoyFilter"): "envoyfilter.schema.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.schema.json",
}
# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ("1.25", kubernetes_validate.latest_version())

EVERYTHING_ON = {"redis": {"enabled": True}, "serviceMonitor": {"enabled": True}, "dashboards": {"enabled": True}}
SCENARIOS: dict[str, dict[str, Any]] = {
    **{mode: {"mode": mode} for mode in MODES},
    **{f"{mode}+redis+monitoring": {"mode": mode, **EVERYTHING_ON} for mode in MODES},
    "dedicated-extproc-cluster": {"istio": {"extprocCluster": {"mode": "dedicated"}}},
    "tenants-inline+redis-url": {"tenants": {"data": {"tenants.yaml": "- name: team-a\n"}},
                                 "redis": {"url": "redis://redis.infra:6379/1"}},
    "tenants-secret+redis-secret": {"tenants": {"existingSecret": "llm-tenants"},
                                    "redis": {"existingSecret": "llm-redis"}},
    "grpc-probes+fixed-replicas": {"probes": {"grpc": True}, "autoscaling": {"enabled": False},
                                   "podDisruptionBudget": {"maxUnavailable": 1}},
    "tokens+admin-service": {"grpcAuth": {"token": "g-secret"}, "adminAuth": {"existingSecret": "llm-admin"},
                             "service": {"exposeAdmin": True}, "redis": {"enabled": True}},
    "standalone+token-secrets+policies-from": {
        "mode": "standalone", "grpcAuth": {"existingSecret": "llm-grpc", "existingSecretKey": "t"},
        "adminAuth": {"token": "a-secret"}, "networkPolicy": {
            "adminFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
            "listenerFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}},
    "no-network-policy": {"networkPolicy": {"enabled": False}},
}


def load_schema(name: str) -> dict[str, Any]:
    loaded = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def validate_object(obj: dict[str, Any], kube_version: str) -> None:
    crd = CRD_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
    if crd is not None:
        jsonschema.Draft202012Validator(load_schema(crd)).validate(obj)
        return
    try:
        kubernetes_validate.validate(obj, kube_version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} (Kubernetes {kube_version}): {path}: {exc.message}")


def test_lint_passes(chart: Chart) -> None:
    result = chart.lint()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("mode", MODES)
def test_lint_passes_in_every_mode_with_everything_on(chart: Chart, mode: str) -> None:
    result = chart.lint({"mode": mode, **EVERYTHING_ON})
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_object_validates_offline(chart: Chart, scenario: str, kube_version: str) -> None:
    objects = chart.template(SCENARIOS[scenario])
    assert objects
    for obj in objects:
        validate_object(obj, kube_version)


def test_strict_schema_validation_rejects_unknown_fields(chart: Chart) -> None:
    deployment = find(chart.template(), "Deployment")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/readyz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSIONS[-1], strict=True)
    with pytest.raises(SchemaNotFoundError):
        kubernetes_validate.validate({**deployment, "kind": "EnvoyFilter"}, KUBE_VERSIONS[-1], strict=True)


def test_crd_schemas_reject_what_istio_would() -> None:
    envoy_filter = {"apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter", "metadata": {"name": "x"},
                    "spec": {"configPatches": [{"applyTo": "HTTP_FILTER", "match": {"context": "INGRESS"},
                                                "patch": {"operation": "INSERT_BEFORE", "value": {"name": "f"}}}]}}
    with pytest.raises(jsonschema.ValidationError, match="INGRESS"):
        jsonschema.validate(envoy_filter, load_schema("envoyfilter.schema.json"))


def test_default_objects_per_mode(chart: Chart) -> None:
    common = ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "NetworkPolicy", "PodDisruptionBudget", "Service",
              "ServiceAccount"]
    assert kinds(chart.template({"mode": "istio-gateway"})) == sorted([*common, "EnvoyFilter"])
    assert kinds(chart.template({"mode": "istio-sidecar"})) == sorted([*common, "EnvoyFilter"])
    # Standalone: the only Service is Envoy's (the service's gRPC port stays inside the pod, admin is opt-in).
    standalone = chart.template({"mode": "standalone"})
    assert kinds(standalone) == sorted(common)
    assert [o["metadata"]["name"] for o in standalone if o["kind"] == "Service"] == [f"{FULLNAME}-envoy"]


def test_everything_on_adds_redis_servicemonitor_and_dashboard(chart: Chart) -> None:
    objects = chart.template({"mode": "istio-gateway", **EVERYTHING_ON})
    redis = find(objects, "Deployment", f"{FULLNAME}-redis")
    assert redis["spec"]["replicas"] == 1
    find(objects, "Service", f"{FULLNAME}-redis")
    monitor = find(objects, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "http-admin"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    dashboard = find(objects, "ConfigMap", f"{FULLNAME}-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["extproc.json"]) == json.loads(
        (CHART / "dashboards" / "extproc.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_selectors_match_their_pods(chart: Chart, scenario: str) -> None:
    objects = chart.template(SCENARIOS[scenario])
    pods = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
            for d in objects if d["kind"] == "Deployment"}
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pods[deployment["metadata"]["name"]].items()
    for service in (o for o in objects if o["kind"] == "Service"):
        selected = [name for name, labels in pods.items() if service["spec"]["selector"].items() <= labels.items()]
        expected = f"{FULLNAME}-redis" if service["metadata"]["name"].endswith("-redis") else FULLNAME
        assert selected == [expected], service["metadata"]["name"]
        ports = {p["name"]: p for c in find(objects, "Deployment", expected)["spec"]["template"]["spec"]["containers"]
                 for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, f"{service['metadata']['name']}: no container port {port['targetPort']}"
    for kind in ("PodDisruptionBudget", "ServiceMonitor"):
        for obj in (o for o in objects if o["kind"] == kind):
            assert obj["spec"]["selector"]["matchLabels"].items() <= pods[FULLNAME].items()
    for hpa in (o for o in objects if o["kind"] == "HorizontalPodAutoscaler"):
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": FULLNAME}
        assert "replicas" not in find(objects, "Deployment", FULLNAME)["spec"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pods_run_non_root_with_read_only_root(chart: Chart, scenario: str) -> None:
    for deployment in (o for o in chart.template(SCENARIOS[scenario]) if o["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        for name, container in containers(deployment).items():
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"]["drop"] == ["ALL"], name
            assert container["resources"]["requests"], name


def test_service_probes_and_ports(chart: Chart) -> None:
    deployment = find(chart.template(), "Deployment", FULLNAME)
    extproc = containers(deployment)["extproc"]
    assert extproc["args"][:3] == ["serve", "--config", "/etc/extproc/policy.yaml"]
    assert {p["name"]: p["containerPort"] for p in extproc["ports"]} == {"grpc": 9002, "admin": 9003}
    assert extproc["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert extproc["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert extproc["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    grpc = containers(find(chart.template(SCENARIOS["grpc-probes+fixed-replicas"]), "Deployment", FULLNAME))
    assert grpc["extproc"]["readinessProbe"]["grpc"] == {"port": 9002}
    service = find(chart.template(), "Service", FULLNAME)
    assert {p["name"]: (p["port"], p.get("appProtocol")) for p in service["spec"]["ports"]} == {
        "grpc": (9002, "grpc")}  # the admin port is not on a Service unless asked for (or scraped)
    for values in ({"service": {"exposeAdmin": True}}, {"serviceMonitor": {"enabled": True}}):
        ports = find(chart.template(values), "Service", FULLNAME)["spec"]["ports"]
        assert {p["name"] for p in ports} == {"grpc", "http-admin"}
    scraped = find(chart.template({"mode": "standalone", "serviceMonitor": {"enabled": True}}), "Service", FULLNAME)
    assert [p["name"] for p in scraped["spec"]["ports"]] == ["http-admin"]


def test_ports_follow_the_policy(chart: Chart) -> None:
    objects = chart.template({"policy": {"service": {"grpc_port": 7000, "admin_port": 7001}}})
    extproc = containers(find(objects, "Deployment", FULLNAME))["extproc"]
    assert {p["name"]: p["containerPort"] for p in extproc["ports"]} == {"grpc": 7000, "admin": 7001}
    assert {p["port"] for p in find(objects, "Service", FULLNAME)["spec"]["ports"]} == {7000}
    cluster = find(objects, "EnvoyFilter")["spec"]["configPatches"][0]["patch"]["value"]["typed_config"]
    expected = f"outbound|7000||{FULLNAME}.{NAMESPACE}.svc.cluster.local"
    assert cluster["grpc_service"]["envoy_grpc"]["cluster_name"] == expected


def test_workers_spread_the_dedicated_clusters_streams(chart: Chart) -> None:
    def http2(values: dict[str, Any]) -> dict[str, Any]:
        values = {"istio": {"extprocCluster": {"mode": "dedicated"}}, **values}
        patches = find(chart.template(values), "EnvoyFilter")["spec"]["configPatches"]
        cluster = next(p["patch"]["value"] for p in patches if p["applyTo"] == "CLUSTER")
        options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
        return dict(options["explicit_http_config"]["http2_protocol_options"])

    assert http2({}) == {}
    assert http2({"policy": {"service": {"workers": 2}}}) == {"max_concurrent_streams": 4}


def env_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    extproc = containers(find(objects, "Deployment", FULLNAME))["extproc"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in extproc.get("env", [])}


def test_redis_url_reaches_the_service(chart: Chart) -> None:
    assert "EXTPROC_REDIS_URL" not in env_of(chart.template())
    bundled = chart.template({"redis": {"enabled": True}})
    port = find(bundled, "Service", f"{FULLNAME}-redis")["spec"]["ports"][0]["port"]
    assert env_of(bundled)["EXTPROC_REDIS_URL"] == f"redis://{FULLNAME}-redis.{NAMESPACE}.svc.cluster.local:{port}/0"
    external = chart.template(SCENARIOS["tenants-inline+redis-url"])
    assert env_of(external)["EXTPROC_REDIS_URL"] == "redis://redis.infra:6379/1"
    assert "Deployment" not in [o["kind"] for o in external if o["metadata"]["name"].endswith("-redis")]
    secret = chart.template(SCENARIOS["tenants-secret+redis-secret"])
    assert env_of(secret)["EXTPROC_REDIS_URL"] == {"secretKeyRef": {"name": "llm-redis", "key": "url"}}


@pytest.mark.parametrize(("scenario", "secret"), [("tenants-inline+redis-url", f"{FULLNAME}-tenants"),
                                                  ("tenants-secret+redis-secret", "llm-tenants")])
def test_tenants_secret_is_mounted(chart: Chart, scenario: str, secret: str) -> None:
    objects = chart.template(SCENARIOS[scenario])
    deployment = find(objects, "Deployment", FULLNAME)
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tenants"]["secret"]["secretName"] == secret
    mounts = {m["name"]: m for m in containers(deployment)["extproc"]["volumeMounts"]}
    assert mounts["tenants"] == {"name": "tenants", "mountPath": "/etc/extproc/tenants", "readOnly": True}
    owned = [o for o in objects if o["kind"] == "Secret"]
    assert [o["metadata"]["name"] for o in owned] == ([secret] if secret.startswith(FULLNAME) else [])
    default_pod = find(chart.template(), "Deployment")["spec"]["template"]["spec"]
    assert "tenants" not in {v["name"] for v in default_pod["volumes"]}


@pytest.mark.parametrize(("values", "message"), [
    ({"mode": "ingress"}, "value must be one of"),
    ({"policy": {"pools": [{"name": "Chat", "model": "m", "endpoints": ["10.0.0.1:80"]}]}}, "/policy/pools/0/name"),
    ({"policy": {"pools": [{"name": "chat", "model": "m"}]}}, "/policy/pools/0"),  # neither endpoints nor DNS
    ({"policy": {"pools": [{"name": "chat", "model": "m", "endpoints": ["10.0.0.1:80"],
                            "discovery": {"dns": "vllm", "port": 80}}]}}, "/policy/pools/0"),  # both
    ({"policy": {"pools": [{"name": "chat", "model": "m", "discovery": {"dns": "vllm"}}]}}, "'port'"),
    ({"policy": {"service": {"admin_host": "127.0.0.1"}}}, "admin_host is a loopback address"),
    ({"policy": {"service": {"grpc_host": "127.0.0.1"}}}, "grpc_host is a loopback address"),
    ({"mode": "istio-sidecar", "istio": {"sidecar": {"port": 0}}}, "istio.sidecar.port is required"),
    ({"service": {"type": "LoadBalancer"}}, "/service/type"),  # only ClusterIP: internal ports
    ({"mode": "standalone", "probes": {"grpc": True}}, "out of the kubelet's reach"),
    ({"grpcAuth": {"existingSecret": "s"}}, "the EnvoyFilter must carry the token itself"),
])
def test_unusable_values_fail_with_a_clear_message(chart: Chart, values: dict[str, Any], message: str) -> None:
    assert message in chart.template_error(values)


def test_render_errors_surface(chart: Chart) -> None:
    with pytest.raises(HelmError, match="value must be one of"):
        chart.template({"mode": "nope"})


def test_dashboard_queries_use_the_service_metric_names() -> None:
    from prometheus_client import CollectorRegistry

    from extproc.endpoints.health import HealthTracker
    from extproc.flow import FlowControlConfig, FlowController, Room
    from extproc.telemetry import GatewayMetrics
    from extproc.telemetry.flow import FlowCollector
    from extproc.telemetry.pools import PoolCollector

    registry = CollectorRegistry()
    GatewayMetrics(registry)
    registry.register(FlowCollector(FlowController(FlowControlConfig, lambda pool, now, reserve, enough: Room(0.0, 0))))
    registry.register(PoolCollector(list, HealthTracker(), lambda: 1.0))
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    # Families with labels have no samples until used: derive the exported names from the family types.
    exported = {family.name + suffix for family in registry.collect() for suffix in suffixes[family.type]}
    dashboard = json.loads((CHART / "dashboards" / "extproc.json").read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    used = {name for expr in exprs for name in re.findall(r"\bextproc_[a-z0-9_]+", expr)}
    assert used <= exported, f"dashboard names metrics the service does not export: {sorted(used - exported)}"
    wanted = {"extproc_requests_total", "extproc_decision_seconds_bucket", "extproc_request_duration_seconds_bucket",
              "extproc_upstream_responses_total", "extproc_in_flight", "extproc_flow_queued",
              "extproc_flow_rejected_total", "extproc_flow_queue_wait_seconds_bucket", "extproc_limits_degraded_admits",
              "extproc_limits_admissions", "extproc_limits_slice_uncovered", "extproc_pool_requests_waiting",
              "extproc_pool_endpoints_ready", "extproc_guard_matches_total"}
    assert wanted <= used
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def ingress(policy: dict[str, Any]) -> dict[str, list[Any]]:
    """Port name -> the peers allowed on it (an empty list: anyone)."""
    rules = policy["spec"]["ingress"]
    return {port["port"]: rule.get("from", []) for rule in rules for port in rule["ports"]}


def test_network_policy_lets_only_envoy_reach_the_grpc_port(chart: Chart) -> None:
    gateway = find(chart.template({"istio": {"envoyFilterNamespace": "istio-system"}}), "NetworkPolicy")
    assert gateway["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "extproc"
    assert ingress(gateway) == {"grpc": [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "istio-system"}},
        "podSelector": {"matchLabels": {"istio": "ingressgateway"}}}]}  # admin: nobody but the node
    sidecar_values = {"mode": "istio-sidecar", "istio": {"sidecar": {"workloadSelector": {"app": "rag"}}}}
    sidecar = find(chart.template(sidecar_values), "NetworkPolicy")
    assert ingress(sidecar)["grpc"][0]["podSelector"] == {"matchLabels": {"app": "rag"}}
    assert ingress(sidecar)["grpc"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": NAMESPACE}
    standalone = chart.template(SCENARIOS["standalone+token-secrets+policies-from"])
    rules = ingress(find(standalone, "NetworkPolicy", FULLNAME))
    assert "grpc" not in rules  # Envoy calls 127.0.0.1 inside the pod
    assert rules["http"] == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]
    assert rules["admin"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "monitoring"
    assert [o for o in chart.template(SCENARIOS["no-network-policy"]) if o["kind"] == "NetworkPolicy"] == []


def test_bundled_redis_accepts_only_the_extproc_pods(chart: Chart) -> None:
    policy = find(chart.template({"redis": {"enabled": True}}), "NetworkPolicy", f"{FULLNAME}-redis")
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "redis"
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 6379, "protocol": "TCP"}]
    assert rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "extproc"


@pytest.mark.parametrize("scenario", ["tokens+admin-service", "standalone+token-secrets+policies-from"])
def test_token_secrets_are_mounted_where_the_policy_points(chart: Chart, scenario: str) -> None:
    from extproc.config import parse_policy
    from tests.helm.chart import policy_text

    objects = chart.template(SCENARIOS[scenario])
    service = parse_policy(policy_text(objects)).service
    deployment = find(objects, "Deployment", FULLNAME)
    volumes = {v["name"]: v["secret"]["secretName"] for v in deployment["spec"]["template"]["spec"]["volumes"]
               if "secret" in v}
    pod = containers(deployment)
    for kind, path in (("grpc-token", service.grpc_token_file), ("admin-token", service.admin_token_file)):
        mount = {m["name"]: m["mountPath"] for m in pod["extproc"]["volumeMounts"]}[kind]
        assert path is not None and path.startswith(mount + "/")
        secret = volumes[kind]
        owned = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
        if secret in owned:  # an inline token: the chart's Secret holds it under the policy's file name
            assert path.rsplit("/", 1)[1] in owned[secret]["stringData"]
    if "render-envoy-config" in pod:  # standalone: Envoy's files are rendered with the token in them
        assert "grpc-token" in {m["name"] for m in pod["render-envoy-config"]["volumeMounts"]}
