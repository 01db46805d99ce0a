"""Per-request timestamps of one replica, for splitting a client's TTFT into the hops before and after the engine.

Every streamed generation gets an id (`x-sim-request: <port>-<n>` on its response) and four stamps on the
replica's clock (`time.monotonic`: CLOCK_MONOTONIC, the clock `time.perf_counter` also reads on Linux, so a
client on the same machine can subtract its own stamps): `arrive` (the handler starts, request headers parsed),
`submit` (body read and tokenized, handed to the engine), `token` (the end of the step that sampled the first
token) and `written` (the first chunk handed to the transport). `GET /sim/timings` returns them. The store is a
bounded ring (the newest `LIMIT` requests), so a long run cannot grow the process.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["HEADER", "LIMIT", "Stamp", "Timings"]

HEADER = "x-sim-request"
LIMIT = 65_536


class Stamp:
    __slots__ = ("arrive", "id", "submit", "token", "written")

    def __init__(self, request_id: str, arrive: float) -> None:
        self.id = request_id
        self.arrive = arrive
        self.submit = self.token = self.written = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "arrive": self.arrive, "submit": self.submit, "token": self.token,
                "written": self.written}


class Timings:
    def __init__(self, limit: int = LIMIT) -> None:
        self._count = 0
        self._stamps: deque[Stamp] = deque(maxlen=limit)

    def start(self, arrive: float, port: int) -> Stamp:
        """A new request's stamp; `port` (the replica's, known once it listens) makes the id unique in a fleet."""
        self._count += 1
        stamp = Stamp(f"{port}-{self._count}", arrive)
        self._stamps.append(stamp)
        return stamp

    def dump(self) -> list[dict[str, Any]]:
        return [stamp.as_dict() for stamp in self._stamps]
