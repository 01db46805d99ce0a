"""latency-scorer: prefer endpoints whose recent time-to-response-headers (EWMA) is lowest.

The gateway updates `Endpoint.latency_ewma_s` when response headers arrive; endpoints without a
sample yet score like the best one, so a new endpoint is tried rather than starved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extproc.endpoints import Endpoint
from extproc.scheduling.framework import SchedulingRequest
from extproc.scheduling.registry import PluginRegistry, build_params

TYPE = "latency-scorer"


@dataclass(frozen=True)
class Params:
    pass


class LatencyScorer:
    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params

    def score(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        known = [e.latency_ewma_s for e in endpoints if e.latency_ewma_s is not None]
        if not known:
            return [1.0] * len(endpoints)
        best = min(known)
        return [1.0 if e.latency_ewma_s is None else best / max(e.latency_ewma_s, 1e-6) for e in endpoints]


def create(name: str, parameters: Mapping[str, Any]) -> LatencyScorer:
    return LatencyScorer(name, build_params(Params, name, parameters))


def register(registry: PluginRegistry) -> None:
    registry.register(TYPE, create)
