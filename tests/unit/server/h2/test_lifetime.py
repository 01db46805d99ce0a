"""The lean front end's connection lifetimes (extproc/server/h2/lifetime.py), with short timers on the real loop:
the preface deadline, keepalive PINGs and a dead peer, a flood of PINGs and SETTINGS, and connection ageing for
`--workers` (GOAWAY, a PING round trip, the final GOAWAY; calls in flight finish, or are cut after the grace)."""

from __future__ import annotations

import asyncio
import struct

import pytest

from extproc.server.h2 import frames as f
from extproc.server.h2.calls import Call
from extproc.server.h2.lifetime import AGEING, KEEPALIVE, Lifetime
from tests.support import eventually
from tests.unit.server.h2.test_connection import Bytes, Peer, methods, settle

pytestmark = pytest.mark.asyncio


class Held:
    """A servicer that holds its call until released, and records that its cleanup ran."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.cleaned = 0

    async def __call__(self, call: Call) -> None:
        try:
            await call.read()
            await self.release.wait()
            await call.write(Bytes(value=b"done"))
        finally:
            self.cleaned += 1


def goaways(frames: list[tuple[int, int, int, bytes]]) -> list[tuple[int, int]]:
    return [struct.unpack(">II", p[:8]) for kind, _, _, p in frames if kind == f.GOAWAY]


async def test_a_peer_that_never_sends_the_preface_is_closed() -> None:
    peer = Peer(methods(), lifetime=Lifetime(preface_s=0.05), preface=False)
    await eventually(lambda: peer.transport.closed, "the connection closed")
    assert goaways(peer.frames()) == [(0, f.PROTOCOL_ERROR)]


async def test_keepalive_pings_and_a_silent_peer_loses_its_calls() -> None:
    held = Held()
    peer = Peer({b"/t/Hold": (Bytes.FromString, held)}, lifetime=Lifetime(keepalive_s=0.05, keepalive_timeout_s=0.1))
    peer.open(1, b"/t/Hold")
    peer.message(1, Bytes(value=b"x").SerializeToString())
    seen: list[tuple[int, int, int, bytes]] = []

    def pinged() -> bool:
        seen.extend(peer.frames())
        return (f.PING, 0, 0, KEEPALIVE) in seen

    await eventually(pinged, "a keepalive PING")
    peer.send(f.frame(f.PING, f.ACK, 0, KEEPALIVE))  # answered: the connection lives, another PING follows
    seen.clear()
    await eventually(pinged, "the next keepalive PING")
    assert not peer.transport.closed
    # Unanswered now: the peer is gone, the connection closes; connection_lost cancels the call (cleanup runs).
    await eventually(lambda: peer.transport.closed, "the connection closed for the unanswered PING")
    peer.connection.connection_lost(None)
    await eventually(lambda: held.cleaned == 1, "the held call's cleanup")
    assert peer.connection.timers == {}


@pytest.mark.parametrize("control", [f.frame(f.PING, 0, 0, b"12345678"), f.settings({})])
async def test_a_flood_of_frames_owed_an_answer_is_a_connection_error(control: bytes) -> None:
    peer = Peer(methods(), lifetime=Lifetime(max_control_frames=10))
    peer.frames()
    for _ in range(8):  # the handshake's SETTINGS counted one
        peer.send(control)
    peer.open(1, b"/t/Echo", end=True)  # stream activity resets the count
    for _ in range(10):
        peer.send(control)
    assert not peer.transport.closed
    peer.send(control)
    assert peer.transport.closed and goaways(peer.frames())[-1][1] == f.ENHANCE_YOUR_CALM


async def test_an_aged_connection_serves_what_was_sent_before_the_final_goaway() -> None:
    held = Held()
    peer = Peer({b"/t/Hold": (Bytes.FromString, held)}, lifetime=Lifetime(max_age_s=0.05))
    peer.open(1, b"/t/Hold")
    peer.message(1, Bytes(value=b"x").SerializeToString())
    seen: list[tuple[int, int, int, bytes]] = []

    def announced() -> bool:
        seen.extend(peer.frames())
        return (f.PING, 0, 0, AGEING) in seen

    await eventually(announced, "the ageing GOAWAY and PING")
    assert goaways(seen) == [(f.MAX_WINDOW, f.NO_ERROR)]
    peer.open(3, b"/t/Hold")  # sent before the peer saw the GOAWAY: still served
    peer.message(3, Bytes(value=b"y").SerializeToString())
    peer.send(f.frame(f.PING, f.ACK, 0, AGEING))
    assert goaways(peer.frames()) == [(3, f.NO_ERROR)]  # the final one: streams up to 3 are served
    peer.open(5, b"/t/Hold")
    assert (f.RST_STREAM, 0, 5, struct.pack(">I", f.REFUSED_STREAM)) in peer.frames()
    held.release.set()
    await settle()
    replies = [s for kind, _, s, _ in peer.frames() if kind == f.DATA]
    assert sorted(replies) == [1, 3] and held.cleaned == 2
    assert peer.transport.closed  # the last call done: the connection closes


async def test_calls_on_an_aged_connection_are_cut_after_the_grace() -> None:
    held = Held()
    peer = Peer({b"/t/Hold": (Bytes.FromString, held)},
                lifetime=Lifetime(max_age_s=0.05, keepalive_timeout_s=0.05, age_grace_s=0.1))
    peer.open(1, b"/t/Hold")
    peer.message(1, Bytes(value=b"x").SerializeToString())
    # No answer to the ageing PING: the final GOAWAY follows its timeout, then the grace, then the cut.
    await eventually(lambda: peer.transport.closed, "the aged connection cut")
    await eventually(lambda: held.cleaned == 1, "the cut call's cleanup")
    assert [code for _, code in goaways(peer.frames())] == [f.NO_ERROR, f.NO_ERROR]
    assert peer.connection.calls == {}
