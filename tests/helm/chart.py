"""Run the real `helm` binary against the chart in helm/ and hand back the rendered objects."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm"
RELEASE = "llm"
NAMESPACE = "ai"
FULLNAME = f"{RELEASE}-extproc"
MODES = ("istio-gateway", "istio-sidecar", "standalone", "epp")
INSTALL_HINT = "install it with `helm/tools/install-helm.sh` (puts it at .venv/bin/helm)"


def find_helm() -> str | None:
    """The repo's .venv/bin/helm, then next to this Python, then PATH."""
    for candidate in (REPO / ".venv" / "bin" / "helm", Path(sys.executable).parent / "helm"):
        if candidate.is_file():
            return str(candidate)
    return shutil.which("helm")


def require_chart() -> Chart:
    """The real helm binary is required: a missing one fails the tests instead of skipping them."""
    helm = find_helm()
    if helm is None:
        pytest.fail(f"helm binary not found (.venv/bin/helm or PATH): {INSTALL_HINT}", pytrace=False)
    return Chart(helm)


class HelmError(Exception):
    pass


class Chart:
    """`helm template` / `helm lint` for the chart; renders are cached by their values."""

    def __init__(self, helm: str) -> None:
        self.helm = helm
        self._cache: dict[str, list[dict[str, Any]]] = {}

    def _run(self, *args: str, values: Mapping[str, Any] | None) -> subprocess.CompletedProcess[str]:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", encoding="utf-8") as handle:
            yaml.safe_dump(dict(values or {}), handle)
            handle.flush()
            return subprocess.run(
                [self.helm, *args, "--values", handle.name],
                capture_output=True, text=True, timeout=60, check=False,
            )

    def template(self, values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        key = json.dumps(values or {}, sort_keys=True)
        if key not in self._cache:
            result = self._run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, values=values)
            if result.returncode != 0:
                raise HelmError(result.stderr.strip() or result.stdout.strip())
            self._cache[key] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
        return self._cache[key]

    def template_error(self, values: Mapping[str, Any]) -> str:
        """The error message of a render that must fail."""
        result = self._run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, values=values)
        assert result.returncode != 0, f"helm template unexpectedly succeeded with {values}"
        return result.stderr

    def lint(self, values: Mapping[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
        return self._run("lint", "--strict", str(CHART), values=values)


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def kinds(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objects)


def containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = deployment["spec"]["template"]["spec"]
    return {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}


def policy_text(objects: list[dict[str, Any]]) -> str:
    text = find(objects, "ConfigMap", f"{FULLNAME}-policy")["data"]["policy.yaml"]
    assert isinstance(text, str)
    return text


def config_patches(objects: list[dict[str, Any]], apply_to: str) -> Iterator[dict[str, Any]]:
    for patch in find(objects, "EnvoyFilter")["spec"]["configPatches"]:
        if patch["applyTo"] == apply_to:
            yield patch


def http_filter_patch(objects: list[dict[str, Any]], filter_name: str) -> dict[str, Any]:
    found = [p for p in config_patches(objects, "HTTP_FILTER") if p["patch"]["value"]["name"] == filter_name]
    assert len(found) == 1, f"expected one HTTP_FILTER patch adding {filter_name}"
    return found[0]


ROUTER = "envoy.filters.http.router"


def istio_filter_chain(objects: list[dict[str, Any]], local_cluster: str) -> list[dict[str, Any]]:
    """Apply the EnvoyFilter's HTTP_FILTER patches, in order, to a chain holding only the router, as Istio
    does: INSERT_BEFORE goes in front of the first filter named by subFilter; a missing anchor skips the
    patch. The ext_proc cluster is renamed to `local_cluster` to compare with the renderer."""
    chain: list[dict[str, Any]] = [{"name": ROUTER, "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
    for patch in config_patches(objects, "HTTP_FILTER"):
        assert patch["patch"]["operation"] == "INSERT_BEFORE"
        anchor = patch["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"]
        names = [f["name"] for f in chain]
        if anchor in names:
            chain.insert(names.index(anchor), json.loads(json.dumps(patch["patch"]["value"])))
    for item in chain:
        service = item["typed_config"].get("grpc_service")
        if service is not None:
            service["envoy_grpc"]["cluster_name"] = local_cluster
    return chain


def access_logs(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    for patch in config_patches(objects, "NETWORK_FILTER"):
        assert patch["patch"]["operation"] == "MERGE"
        assert patch["match"]["listener"]["filterChain"]["filter"]["name"] == \
            "envoy.filters.network.http_connection_manager"
        merged += patch["patch"]["value"]["typed_config"].get("access_log", [])
    return merged


def chart_values() -> dict[str, Any]:
    loaded = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


# One member of a oneof replaces the others when merged (protobuf semantics); the route action's cluster
# specifier is the only oneof the chart's MERGE patches touch.
ONEOFS = ({"cluster", "cluster_header", "weighted_clusters", "cluster_specifier_plugin"},)


def merge_patch(target: dict[str, Any], value: Mapping[str, Any]) -> None:
    """Istio's MERGE, i.e. a protobuf merge: messages merge field by field, repeated fields append, scalars
    (and oneof members, clearing the others) replace."""
    for key, item in value.items():
        for oneof in ONEOFS:
            if key in oneof:
                for other in oneof - {key}:
                    target.pop(other, None)
        if isinstance(item, Mapping) and isinstance(target.get(key), dict):
            merge_patch(target[key], item)
        elif isinstance(item, list) and isinstance(target.get(key), list):
            target[key] += copy.deepcopy(item)
        else:
            target[key] = copy.deepcopy(item)


def istio_hcm(objects: list[dict[str, Any]], base: Mapping[str, Any]) -> dict[str, Any]:
    """`base` (an HTTP connection manager's typed_config) with the EnvoyFilter's NETWORK_FILTER MERGEs."""
    hcm = copy.deepcopy(dict(base))
    for patch in config_patches(objects, "NETWORK_FILTER"):
        assert patch["patch"]["operation"] == "MERGE"
        merge_patch(hcm, patch["patch"]["value"]["typed_config"])
    return hcm


def istio_routes(objects: list[dict[str, Any]], routes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One virtual host's routes with the EnvoyFilter's HTTP_ROUTE patches applied as Istio applies them:
    first every MERGE into the routes named by the match, then the inserts next to them."""
    routes = copy.deepcopy(routes)
    patches = list(config_patches(objects, "HTTP_ROUTE"))
    for patch in patches:
        name = patch["match"]["routeConfiguration"]["vhost"]["route"]["name"]
        if patch["patch"]["operation"] == "MERGE":
            for route in routes:
                if route.get("name") == name:
                    merge_patch(route, patch["patch"]["value"])
    for patch in patches:
        name = patch["match"]["routeConfiguration"]["vhost"]["route"]["name"]
        operation = patch["patch"]["operation"]
        if operation in ("INSERT_BEFORE", "INSERT_AFTER"):
            names = [route.get("name") for route in routes]
            if name in names:
                at = names.index(name) + (operation == "INSERT_AFTER")
                routes.insert(at, copy.deepcopy(patch["patch"]["value"]))
        else:
            assert operation == "MERGE", operation
    return routes


_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"


def istio_outbound_cluster(rendered: Mapping[str, Any]) -> dict[str, Any]:
    """What istiod generates for a Service port (`outbound|PORT||HOST`): its endpoints (EDS there, the rendered
    cluster's STATIC ones or DNS name here), LEAST_REQUEST, 10 s connect timeout, Istio's default circuit
    breakers; none of our own outlier detection or load balancing policy (the mesh's TLS is left out: plaintext on
    127.0.0.1)."""
    return {
        "name": rendered["name"], "type": "STRICT_DNS" if rendered.get("type") == "STRICT_DNS" else "STATIC",
        "connect_timeout": "10s", "lb_policy": "LEAST_REQUEST",
        "circuit_breakers": {"thresholds": [{"max_connections": 4294967295, "max_pending_requests": 4294967295,
                                             "max_requests": 4294967295, "max_retries": 4294967295,
                                             "track_remaining": True}]},
        "common_lb_config": {},
        "metadata": {"filter_metadata": {"istio": {"services": [{"host": rendered["name"].rpartition("||")[2]}]}}},
        "load_assignment": copy.deepcopy(rendered["load_assignment"]),
    }


def istio_bootstrap(objects: list[dict[str, Any]], policy_bootstrap: dict[str, Any], routes: list[dict[str, Any]],
                    *, local_extproc: bool) -> dict[str, Any]:
    """`policy_bootstrap` (render_static of the chart's policy) with its listener replaced by what Istio would
    generate for one virtual host of VirtualService `routes` (HTTP connection manager with the router only),
    and the EnvoyFilter's patches applied as istiod applies them (filter inserts, protobuf MERGEs, route
    inserts, added clusters).

    local_extproc: ext_proc and access-log traffic goes to the renderer's ext_proc cluster (to run it);
    otherwise the patches keep their cluster names and the renderer's cluster stands in for Istio's own
    outbound cluster of the extproc Service when the chart does not add one."""
    from extproc.xds.render import EXTPROC_CLUSTER

    bootstrap = copy.deepcopy(policy_bootstrap)
    static = bootstrap["static_resources"]
    ext_proc = http_filter_patch(objects, "envoy.filters.http.ext_proc")["patch"]["value"]
    wanted = ext_proc["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"]
    if local_extproc:
        objects = json.loads(json.dumps(objects).replace(json.dumps(wanted), json.dumps(EXTPROC_CLUSTER)))
        wanted = EXTPROC_CLUSTER
    listener = static["listeners"][0]
    del listener["per_connection_buffer_limit_bytes"]  # Istio's listener has none until the chart's MERGE
    hcm = istio_hcm(objects, {
        "@type": _HCM, "stat_prefix": "outbound_0.0.0.0_8080", "codec_type": "AUTO",
        "route_config": {"name": "http.8080", "virtual_hosts": [
            {"name": "llm", "domains": ["*"], "routes": istio_routes(objects, routes)}]},
    })
    hcm["http_filters"] = istio_filter_chain(objects, wanted)
    listener["filter_chains"] = [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                               "typed_config": hcm}]}]
    for patch in config_patches(objects, "LISTENER"):
        merge_patch(listener, patch["patch"]["value"])
    extproc = next(c for c in static["clusters"] if c["name"] == EXTPROC_CLUSTER)
    rendered = {c["name"]: c for c in static["clusters"]}
    added = [patch["patch"]["value"] for patch in config_patches(objects, "CLUSTER")
             if patch["patch"]["operation"] == "ADD"]
    for patch in config_patches(objects, "CLUSTER"):  # MERGE into Istio's own cluster of the pool's Service
        if patch["patch"]["operation"] == "MERGE":
            match = patch["match"]["cluster"]
            cluster = istio_outbound_cluster(rendered[f"outbound|{match['portNumber']}||{match['service']}"])
            merge_patch(cluster, patch["patch"]["value"])
            added.append(cluster)
    if wanted not in {c["name"] for c in added}:
        added.append({**copy.deepcopy(extproc), "name": wanted,
                      "load_assignment": {**extproc["load_assignment"], "cluster_name": wanted}})
    static["clusters"] = added
    return bootstrap
