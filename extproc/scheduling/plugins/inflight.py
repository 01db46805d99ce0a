"""inflight-scorer: prefer endpoints with fewer requests (or tokens) in flight.

Requests are the pool's load model's estimate (`extproc.endpoints.load`): the last scrape's running + waiting
plus what was sent since, never below the replicas' in-flight counts, so the score reacts between scrapes
without ignoring other gateway replicas' traffic. Tokens are this process's own estimates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extproc.endpoints import Endpoint
from extproc.scheduling.framework import SchedulingRequest
from extproc.scheduling.registry import PluginError, PluginRegistry, build_params

TYPE = "inflight-scorer"


@dataclass(frozen=True)
class Params:
    mode: str = "requests"  # "requests" or "tokens"

    def __post_init__(self) -> None:
        if self.mode not in ("requests", "tokens"):
            raise PluginError(f"mode must be 'requests' or 'tokens', got {self.mode!r}")


class InflightScorer:
    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params

    def score(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        if self.params.mode == "tokens":
            loads = [float(e.in_flight_tokens) for e in endpoints]
        else:
            loads = [request.load.requests(e, request.now) for e in endpoints]
        high = max(loads)
        if high <= 0:
            return [1.0] * len(loads)
        return [1.0 - load / (high + 1.0) for load in loads]


def create(name: str, parameters: Mapping[str, Any]) -> InflightScorer:
    return InflightScorer(name, build_params(Params, name, parameters))


def register(registry: PluginRegistry) -> None:
    registry.register(TYPE, create)
