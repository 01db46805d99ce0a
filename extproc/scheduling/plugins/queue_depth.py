"""queue-scorer: prefer endpoints with fewer requests queued and running (min-max normalised)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extproc.endpoints import Endpoint
from extproc.scheduling.framework import SchedulingRequest
from extproc.scheduling.registry import PluginRegistry, build_params

TYPE = "queue-scorer"


@dataclass(frozen=True)
class Params:
    # Running requests count this much relative to waiting ones (waiting is what hurts TTFT most).
    running_weight: float = 0.25


class QueueScorer:
    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params

    def _depth(self, endpoint: Endpoint, request: SchedulingRequest) -> float:
        local = request.load.in_flight(endpoint)
        metrics = request.load.fresh(endpoint, request.now)
        if metrics is None:
            return local * self.params.running_weight
        return metrics.waiting + self.params.running_weight * max(metrics.running, local - metrics.waiting)

    def score(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        depths = [self._depth(e, request) for e in endpoints]
        low, high = min(depths), max(depths)
        if high - low < 1e-9:
            return [1.0] * len(depths)
        return [(high - d) / (high - low) for d in depths]


def create(name: str, parameters: Mapping[str, Any]) -> QueueScorer:
    return QueueScorer(name, build_params(Params, name, parameters))


def register(registry: PluginRegistry) -> None:
    registry.register(TYPE, create)
