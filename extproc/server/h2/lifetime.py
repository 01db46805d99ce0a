"""How long a connection of the lean front end lives, and the timers that enforce it (the bounds grpc core keeps
for the grpcio front end, here on the event loop's own timers):

- a peer that has not sent the HTTP/2 preface within `preface_s` of connecting (after the TLS handshake, whose
  own bound is `handshake_s`) is closed;
- keepalive: a PING every `keepalive_s`; unanswered for `keepalive_timeout_s`, the peer is gone (a dead Envoy, a
  cut network path) and the connection closes, which cancels its calls and so releases their leases;
- with several workers (`max_age_s`), a connection is aged out as grpc's `max_connection_age` does: a GOAWAY
  announcing the end (last stream 2^31-1), a PING round trip so streams the peer sent meanwhile are still served,
  then the final GOAWAY; calls in flight get `age_grace_s`, then they are cut. Envoy reconnects and the kernel
  spreads the new connection over the workers (extproc/server/workers.py);
- PINGs and SETTINGS (each owed an answer) with no stream activity between them count against
  `max_control_frames`: a flood of them is a connection error (ENHANCE_YOUR_CALM), not a queue of answers.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from extproc.server.h2 import frames as f
from extproc.server.h2.calls import Call

log = logging.getLogger(__name__)

KEEPALIVE = b"keepaliv"  # the payloads of our PINGs, told apart by their ACKs
AGEING = b"ageing\x00\x00"


@dataclass(frozen=True)
class Lifetime:
    handshake_s: float = 20.0
    preface_s: float = 20.0
    keepalive_s: float = 30.0
    keepalive_timeout_s: float = 20.0
    max_age_s: float | None = None
    age_grace_s: float = 900.0
    max_control_frames: int = 1_000


class Lifecycle:
    """GrpcConnection's (connection.py) end: the timers, GOAWAY, connection errors; it owns the state declared
    here."""

    lifetime: Lifetime
    calls: dict[int, Call]
    transport: asyncio.Transport | None
    closing: bool
    timers: dict[str, asyncio.TimerHandle]
    control_frames: int

    last_stream: int
    if TYPE_CHECKING:  # Output's
        def emit(self, data: bytes) -> None: ...
        def flush(self) -> None: ...
        def drop(self, call: Call) -> None: ...

    def fail(self, code: int, why: str) -> None:
        """A connection error: GOAWAY, then close (its calls are cancelled as the connection goes)."""
        log.warning("closing an HTTP/2 connection of the lean front end: %s", why)
        self.emit(f.goaway(self.last_stream, code))
        self.flush()
        if self.transport is not None:
            self.transport.close()

    def goaway(self) -> None:
        """Drain: no new streams; those open finish."""
        if not self.closing:
            self.closing = True
            self.emit(f.goaway(self.last_stream, f.NO_ERROR))

    def schedule(self, name: str, delay_s: float, callback: Callable[[], None]) -> None:
        self.unschedule(name)
        self.timers[name] = asyncio.get_running_loop().call_later(delay_s, callback)

    def unschedule(self, name: str) -> None:
        timer = self.timers.pop(name, None)
        if timer is not None:
            timer.cancel()

    def begin(self) -> None:
        """The connection is made (TLS handshake done): the preface is due, and its age starts."""
        self.schedule("preface", self.lifetime.preface_s, self._no_preface)
        if self.lifetime.max_age_s is not None:  # +-10%, so connections made together do not all age at once
            self.schedule("age", self.lifetime.max_age_s * random.uniform(0.9, 1.1), self.age)

    def end(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()

    def preface_received(self) -> None:
        self.unschedule("preface")
        self.schedule("keepalive", self.lifetime.keepalive_s, self._ping)

    def _no_preface(self) -> None:
        self.fail(f.PROTOCOL_ERROR, f"no HTTP/2 preface within {self.lifetime.preface_s:g} s")

    def _ping(self) -> None:
        self.emit(f.frame(f.PING, 0, 0, KEEPALIVE))
        self.schedule("keepalive", self.lifetime.keepalive_timeout_s, self._peer_gone)

    def _peer_gone(self) -> None:
        self.fail(f.NO_ERROR, f"keepalive PING unanswered for {self.lifetime.keepalive_timeout_s:g} s")

    def on_ping_ack(self, payload: bytes) -> None:
        if payload == KEEPALIVE:
            self.schedule("keepalive", self.lifetime.keepalive_s, self._ping)
        elif payload == AGEING:
            self._aged()

    def counted_control_frame(self) -> bool:
        """A PING or SETTINGS owed an answer; False (and the connection failed) past the bound."""
        self.control_frames += 1
        if self.control_frames > self.lifetime.max_control_frames:
            self.fail(f.ENHANCE_YOUR_CALM, "a flood of PING or SETTINGS frames")
            return False
        return True

    def age(self) -> None:
        """Announce the end; the final GOAWAY follows the PING's answer (or its timeout)."""
        if self.closing:
            return
        self.emit(f.goaway(f.MAX_WINDOW, f.NO_ERROR))  # 2^31-1: the largest stream id
        self.emit(f.frame(f.PING, 0, 0, AGEING))
        self.schedule("age", self.lifetime.keepalive_timeout_s, self._aged)

    def _aged(self) -> None:
        if self.closing:
            return
        self.goaway()
        if not self.calls:
            self.flush()
            if self.transport is not None:
                self.transport.close()
            return
        self.schedule("age", self.lifetime.age_grace_s, self.cut)

    def cut(self) -> None:
        """Past the grace: the calls still open are cancelled (their cleanup runs), the connection closes."""
        for call in list(self.calls.values()):
            self.drop(call)
        self.flush()
        if self.transport is not None:
            self.transport.close()
