"""saturation-filter: drop endpoints that are full, by the pool's load model (`extproc.endpoints.load`), the same
rule flow control applies: no separate thresholds to disagree with it.

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
from extproc.scheduling.registry import PluginRegistry, build_params

TYPE = "saturation-filter"


@dataclass(frozen=True)
class Params:
    pass


class SaturationFilter:
    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params

    def filter(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        load, now = request.load, request.now
        kept = [e for e in endpoints if not load.saturated(e, now)]
        return kept if kept else list(endpoints)


def create(name: str, parameters: Mapping[str, Any]) -> SaturationFilter:
    return SaturationFilter(name, build_params(Params, name, parameters))


def register(registry: PluginRegistry) -> None:
    registry.register(TYPE, create)
