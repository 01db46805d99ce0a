"""lora-affinity-scorer: prefer endpoints that already hold the request's LoRA adapter.

From vllm:lora_requests_info: adapter running there -> 1.0, waiting there -> 0.8, room to load one
more adapter (fewer than max_lora active) -> 0.5, otherwise 0. Requests without an adapter score 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extproc.endpoints import Endpoint
from extproc.scheduling.framework import SchedulingRequest
from extproc.scheduling.registry import PluginRegistry, build_params

TYPE = "lora-affinity-scorer"


@dataclass(frozen=True)
class Params:
    unknown_score: float = 0.5


class LoraAffinityScorer:
    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params

    def score(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        adapter = request.lora
        if adapter is None:
            return [1.0] * len(endpoints)
        scores = []
        for endpoint in endpoints:
            metrics = request.load.fresh(endpoint, request.now)
            if metrics is None:
                scores.append(self.params.unknown_score)
            elif adapter in metrics.running_loras:
                scores.append(1.0)
            elif adapter in metrics.waiting_loras:
                scores.append(0.8)
            elif len(metrics.running_loras | metrics.waiting_loras) < metrics.max_lora:
                scores.append(0.5)
            else:
                scores.append(0.0)
        return scores


def create(name: str, parameters: Mapping[str, Any]) -> LoraAffinityScorer:
    return LoraAffinityScorer(name, build_params(Params, name, parameters))


def register(registry: PluginRegistry) -> None:
    registry.register(TYPE, create)
