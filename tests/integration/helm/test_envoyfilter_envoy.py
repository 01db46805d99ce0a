"""The configuration the EnvoyFilter patches in is accepted by a real Envoy (`envoy --mode validate`).

Istio is not available here, so the patches are applied by hand to the renderer's static config, the same
way Istio would apply them: the filters go in front of the router, clusters are added, the listener and
route are merged.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from extproc.config import parse_policy
from extproc.xds.render import EXTPROC_CLUSTER, render_static
from tests.helm.chart import (
    Chart,
    access_logs,
    config_patches,
    http_filter_patch,
    istio_filter_chain,
    policy_text,
)
from tests.support import envoy_binary

SCENARIOS: dict[str, dict[str, Any]] = {
    "istio-gateway": {"mode": "istio-gateway"},
    "istio-sidecar+dedicated+sse": {"mode": "istio-sidecar", "istio": {
        "extprocCluster": {"mode": "dedicated"}, "usageMetadata": {"sse": True}}},
}


def patched_bootstrap(objects: list[dict[str, Any]]) -> dict[str, Any]:
    policy = parse_policy(policy_text(objects))
    bootstrap = render_static(policy)
    static = bootstrap["static_resources"]
    listener = static["listeners"][0]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    ext_proc = http_filter_patch(objects, "envoy.filters.http.ext_proc")["patch"]["value"]
    wanted = ext_proc["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"]
    hcm["http_filters"] = istio_filter_chain(objects, wanted)
    hcm["access_log"] = access_logs(objects)
    for patch in config_patches(objects, "LISTENER"):
        listener.update(patch["patch"]["value"])
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    for patch in config_patches(objects, "HTTP_ROUTE"):
        route.update(patch["patch"]["value"]["route"])

    extproc = next(c for c in static["clusters"] if c["name"] == EXTPROC_CLUSTER)
    added = [p["patch"]["value"] for p in config_patches(objects, "CLUSTER")]
    if wanted not in {c["name"] for c in added}:
        # Istio's own outbound cluster for the extproc Service: stand in with the rendered one.
        added.append({**copy.deepcopy(extproc), "name": wanted,
                      "load_assignment": {**extproc["load_assignment"], "cluster_name": wanted}})
    static["clusters"] = added
    return bootstrap


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_envoy_accepts_the_patched_configuration(chart: Chart, scenario: str, tmp_path: Path) -> None:
    bootstrap = patched_bootstrap(chart.template(SCENARIOS[scenario]))
    config = tmp_path / "envoy.yaml"
    config.write_text(yaml.safe_dump(bootstrap, sort_keys=False), encoding="utf-8")
    result = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(config)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
