"""Keep Envoy's fallback routes in step with the split weights (file-based RDS, atomic rewrite).

Normally our service names the pool in the cluster header and Envoy's main route follows it. When
the service is bypassed (ext_proc `failure_mode_allow: true` and the service unreachable or too
slow) no pool header is set, and Envoy routes on its own: these fallback routes then split each
split model's traffic with `weighted_clusters` carrying the same weights the service applies, so a
rollout at 25 % stays at 25 % during an outage. Envoy cannot read the body on that path, so a
model's route matches a request header naming it (`model_header`, e.g. `x-gateway-model`), and an
optional catch-all (matching every path prefix) uses the `default_model`'s split.

Route order in the rendered RouteConfiguration:
  1. the main route (cluster from our header), gated on that header being present;
  2. one route per split model: prefix "/" + `model_header` == model -> weighted_clusters;
  3. the catch-all: the default model's weighted_clusters, else whatever catch-all the base route
     configuration had (e.g. `envoy.fallback_pool`), else the main route ungated (unchanged behaviour).
Weights are integers (largest-remainder rounding) summing to `total_weight`; 0-weight pools are left out.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extproc.xds.render import dump, write_atomic

__all__ = ["FallbackRoute", "FallbackRouteWriter", "integer_weights", "render_fallback_route", "sync_fallback_route"]


@dataclass(frozen=True, slots=True)
class FallbackRoute:
    model: str
    weights: Mapping[str, float]  # pool -> relative weight


def integer_weights(weights: Mapping[str, float], total: int = 100) -> dict[str, int]:
    """Integers proportional to `weights` summing exactly to `total` (0-weight pools dropped)."""
    positive = {pool: w for pool, w in weights.items() if w > 0.0}
    mass = sum(positive.values())
    if mass <= 0.0 or total < 1:
        raise ValueError("weighted clusters need a positive weight and total")
    exact = {pool: w / mass * total for pool, w in positive.items()}
    result = {pool: int(value) for pool, value in exact.items()}
    short = total - sum(result.values())
    by_remainder = sorted(exact, key=lambda pool: (-(exact[pool] - result[pool]), pool))
    for pool in by_remainder[:short]:
        result[pool] += 1
    return {pool: n for pool, n in sorted(result.items()) if n > 0}


def _main_route(routes: Sequence[dict[str, Any]], cluster_header: str) -> dict[str, Any]:
    for route in routes:
        if route.get("route", {}).get("cluster_header") == cluster_header:
            return route
    raise ValueError(f"the base route configuration has no route on cluster_header {cluster_header!r}")


def _weighted(template: dict[str, Any], match: dict[str, Any], weights: Mapping[str, float],
              total: int) -> dict[str, Any]:
    route = copy.deepcopy(template)
    route["match"] = match
    action = {k: v for k, v in route["route"].items() if k not in ("cluster_header", "cluster")}
    clusters = [{"name": pool, "weight": n} for pool, n in integer_weights(weights, total).items()]
    route["route"] = {"weighted_clusters": {"clusters": clusters}, **action}
    return route


def render_fallback_route(base: Mapping[str, Any], *, cluster_header: str, routes: Sequence[FallbackRoute],
                          model_header: str | None = "x-gateway-model", default_model: str | None = None,
                          total_weight: int = 100) -> dict[str, Any]:
    """The RouteConfiguration `base` (e.g. `extproc.xds.render.route_config(policy)`) with fallback
    routes in sync with `routes` (see the module docstring). `base` is not modified."""
    config = copy.deepcopy(dict(base))
    host = config["virtual_hosts"][0]
    main = _main_route(host["routes"], cluster_header)
    others = [r for r in host["routes"] if r is not main]
    gated = copy.deepcopy(main)
    headers = [h for h in gated["match"].get("headers", []) if h.get("name") != cluster_header]
    gated["match"]["headers"] = [{"name": cluster_header, "present_match": True}, *headers]
    template = {k: v for k, v in main.items() if k != "match"}
    ordered: list[dict[str, Any]] = [gated]
    by_model = {route.model: route for route in routes}
    if model_header is not None:
        for route in routes:
            match = {"prefix": "/", "headers": [{"name": model_header, "string_match": {"exact": route.model}}]}
            ordered.append(_weighted(template, match, route.weights, total_weight))
    default = by_model.get(default_model) if default_model is not None else None
    if default is not None:
        ordered.append(_weighted(template, {"prefix": "/"}, default.weights, total_weight))
    elif others:
        ordered.extend(others)
    else:
        ordered.append(main)
    host["routes"] = ordered
    return config


def sync_fallback_route(path: str | Path, route_config: Mapping[str, Any]) -> bool:
    """Write `route_config` as the RDS file at `path` (atomic rename) unless it already says that.

    Returns True when the file was (re)written; Envoy's file watcher picks up the rename.
    """
    target = Path(path)
    text = dump({"resources": [dict(route_config)]})
    try:
        if target.read_text(encoding="utf-8") == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    write_atomic(target, text)
    return True


class FallbackRouteWriter:
    """An `on_weights` listener for `Rollouts`: rewrites the RDS file in a thread when weights change.

    Call `configure` after a policy reload (the base route configuration may have changed).
    """

    def __init__(self, path: str | Path, base: Mapping[str, Any], *, cluster_header: str,
                 model_header: str | None = "x-gateway-model", default_model: str | None = None,
                 total_weight: int = 100) -> None:
        self.path = Path(path)
        self.writes = 0
        self.configure(base, cluster_header=cluster_header, model_header=model_header,
                       default_model=default_model, total_weight=total_weight)

    def configure(self, base: Mapping[str, Any], *, cluster_header: str, model_header: str | None,
                  default_model: str | None, total_weight: int = 100) -> None:
        self._base = copy.deepcopy(dict(base))
        self._options: dict[str, Any] = {"cluster_header": cluster_header, "model_header": model_header,
                                         "default_model": default_model, "total_weight": total_weight}

    def render(self, weights: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
        routes = [FallbackRoute(model, w) for model, w in weights.items() if any(v > 0 for v in w.values())]
        return render_fallback_route(self._base, routes=routes, **self._options)

    async def __call__(self, weights: Mapping[str, Mapping[str, float]]) -> None:
        document = self.render(weights)
        if await asyncio.to_thread(sync_fallback_route, self.path, document):
            self.writes += 1
