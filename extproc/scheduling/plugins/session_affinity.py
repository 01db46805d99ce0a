"""session-affinity-scorer: keep one session (header or body `user`) on one endpoint.

Rendezvous hashing of the session key: every gateway replica agrees, and removing an endpoint moves
only its own sessions.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extproc.endpoints import Endpoint
from extproc.scheduling.framework import SchedulingRequest
from extproc.scheduling.prefix import rendezvous
from extproc.scheduling.registry import PluginRegistry, build_params

TYPE = "session-affinity-scorer"


@dataclass(frozen=True)
class Params:
    pass


class SessionAffinityScorer:
    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params

    def score(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        if request.session is None or not endpoints:
            return [0.0] * len(endpoints)
        key = zlib.crc32(request.session.encode())
        best = max(range(len(endpoints)), key=lambda i: rendezvous(key, endpoints[i].address))
        return [1.0 if i == best else 0.0 for i in range(len(endpoints))]


def create(name: str, parameters: Mapping[str, Any]) -> SessionAffinityScorer:
    return SessionAffinityScorer(name, build_params(Params, name, parameters))


def register(registry: PluginRegistry) -> None:
    registry.register(TYPE, create)
