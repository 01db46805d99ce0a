"""The configuration the EnvoyFilter patches in is accepted by a real Envoy (`envoy --mode validate`).

Istio is not available here, so `tests.helm.chart.istio_bootstrap` applies the patches to an Istio-shaped
listener the way istiod does: filters go in front of the router, the connection manager, listener and route
are merged, the fail-open route is inserted, clusters are added.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from extproc.config import parse_policy
from extproc.xds.render import render_static
from tests.helm.chart import Chart, istio_bootstrap, policy_text
from tests.support import envoy_binary

SCENARIOS: dict[str, dict[str, Any]] = {
    "istio-gateway": {"mode": "istio-gateway"},
    "istio-gateway+fail-open+audit+dns": {"mode": "istio-gateway", "policy": {
        "envoy": {"failure_mode_allow": True, "fallback_pool": "chat"}, "audit": {"path": "/dev/stdout"},
        "pools": [{"name": "chat", "model": "m", "discovery": {"dns": "vllm.llm.svc.cluster.local", "port": 8000}},
                  {"name": "code", "model": "c", "endpoints": ["10.0.0.9:8000"]}]},
        # The override_host policy MERGEd into Istio's own clusters of the pools' Services.
        "istio": {"routing": {"poolServices": {"chat": "vllm.llm.svc.cluster.local:8000",
                                               "code": "vllm-code.llm.svc.cluster.local:8000"}}}},
    "istio-gateway+dedicated-pool-clusters": {"mode": "istio-gateway", "istio": {
        "routing": {"poolClusters": "dedicated"}}},
    "istio-sidecar+dedicated+sse": {"mode": "istio-sidecar", "istio": {
        "extprocCluster": {"mode": "dedicated"}, "usageMetadata": {"sse": True}}},
    "istio-gateway+tracing": {"mode": "istio-gateway", "policy": {"tracing": {
        "enabled": True, "otlp_endpoint": "otel-collector.observability.svc.cluster.local:4317"}}},
}


def patched_bootstrap(objects: list[dict[str, Any]]) -> dict[str, Any]:
    policy = parse_policy(policy_text(objects))
    pool = policy.pools[0]
    routes = [{"name": "llm", "match": {"prefix": "/v1/"}, "route": {"cluster": pool.cluster or pool.name}}]
    return istio_bootstrap(objects, render_static(policy), routes, local_extproc=False)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_envoy_accepts_the_patched_configuration(chart: Chart, scenario: str, tmp_path: Path) -> None:
    bootstrap = patched_bootstrap(chart.template(SCENARIOS[scenario]))
    config = tmp_path / "envoy.yaml"
    config.write_text(yaml.safe_dump(bootstrap, sort_keys=False), encoding="utf-8")
    result = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(config)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
