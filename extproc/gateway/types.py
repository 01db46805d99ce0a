"""Plain data the decision pipeline exchanges with the server adapter; no protobufs here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class RequestHead:
    method: str
    path: str
    headers: Mapping[str, str]
    end_of_stream: bool = False
    # Endpoint-picker mode: the data plane's subset hint (`ip:port` or a bare IP for all its ports); the pick
    # must come from it. None = no hint (any endpoint of the pool).
    subset: tuple[str, ...] | None = None

    @property
    def request_id(self) -> str:
        return self.headers.get("x-request-id", "")


@dataclass(frozen=True, slots=True)
class Route:
    """Send the request on: headers to set (pool cluster, destination endpoints), optional new body."""

    pool: str
    endpoints: tuple[str, ...]
    set_headers: Headers
    body: bytes | None = None
    # Envoy dynamic metadata (namespace `extproc`), delivered back with the access log entry.
    metadata: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Respond:
    """Answer the client at once without reaching any upstream."""

    status: int
    body: bytes
    headers: Headers = ()
    details: str = ""
    # Envoy dynamic metadata (namespace `extproc`): who was refused, for the audit log.
    metadata: Mapping[str, Any] | None = None


Decision = Route | Respond
