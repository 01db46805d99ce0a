"""saturation-filter: drop endpoints whose vLLM queue or KV cache is saturated.

(Unhealthy endpoints never reach a profile: the gateway's circuit breakers remove them first.)

If every endpoint would be dropped the input is returned unchanged: the filter steers traffic, it
never stalls it (rejection under saturation is the admission layer's decision, not the picker's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extproc.endpoints import Endpoint
from extproc.scheduling.framework import SchedulingRequest
from extproc.scheduling.load import fresh_metrics
from extproc.scheduling.registry import PluginRegistry, build_params

TYPE = "saturation-filter"


@dataclass(frozen=True)
class Params:
    max_waiting: float = 10.0  # vLLM queue deeper than this: overload is coming
    max_kv_usage: float = 0.95
    stale_after_s: float = 1.0


class SaturationFilter:
    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params

    def _ok(self, endpoint: Endpoint, now: float) -> bool:
        metrics = fresh_metrics(endpoint, now, self.params.stale_after_s)
        if metrics is None:
            return True
        return metrics.waiting < self.params.max_waiting and metrics.kv_usage < self.params.max_kv_usage

    def filter(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        kept = [e for e in endpoints if self._ok(e, request.now)]
        return kept if kept else list(endpoints)


def create(name: str, parameters: Mapping[str, Any]) -> SaturationFilter:
    return SaturationFilter(name, build_params(Params, name, parameters))


def register(registry: PluginRegistry) -> None:
    registry.register(TYPE, create)
