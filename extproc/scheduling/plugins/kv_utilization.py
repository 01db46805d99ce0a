"""kv-cache-utilization-scorer: prefer endpoints with free KV-cache (1 - vllm:kv_cache_usage_perc)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extproc.endpoints import Endpoint
from extproc.scheduling.framework import SchedulingRequest
from extproc.scheduling.registry import PluginRegistry, build_params

TYPE = "kv-cache-utilization-scorer"


@dataclass(frozen=True)
class Params:
    unknown_score: float = 0.5  # no fresh scrape: neither preferred nor avoided


class KvUtilizationScorer:
    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params

    def score(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        scores = []
        for endpoint in endpoints:
            metrics = request.load.fresh(endpoint, request.now)
            scores.append(self.params.unknown_score if metrics is None else 1.0 - metrics.kv_usage)
        return scores


def create(name: str, parameters: Mapping[str, Any]) -> KvUtilizationScorer:
    return KvUtilizationScorer(name, build_params(Params, name, parameters))


def register(registry: PluginRegistry) -> None:
    registry.register(TYPE, create)
