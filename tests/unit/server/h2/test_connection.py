"""The lean front end's HTTP/2 connection, driven frame by frame with a recording transport: the protocol's
handshake, gRPC calls, flow control both ways, and every bound against a hostile peer."""

from __future__ import annotations

import asyncio
import gc
import struct
import weakref
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf import wrappers_pb2
from hpack import Decoder, Encoder

from extproc.server.h2 import frames as f
from extproc.server.h2.calls import EOF, Call
from extproc.server.h2.connection import MAX_HEADER_BLOCK, MAX_STREAMS, GrpcConnection
from extproc.server.h2.lifetime import Lifetime

Bytes = wrappers_pb2.BytesValue


class Transport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class Peer:
    """Envoy's side: builds frames with its own HPACK state, reads ours back."""

    def __init__(self, methods: dict[bytes, Any], max_message: int = 1 << 20, lifetime: Lifetime | None = None,
                 preface: bool = True) -> None:
        self.connection = GrpcConnection(methods, max_message, lifetime=lifetime)
        self.transport = Transport()
        self.connection.connection_made(self.transport)  # type: ignore[arg-type]
        self.encoder = Encoder()
        self.decoder = Decoder()
        self.read_at = 0
        if preface:
            self.connection.data_received(f.PREFACE + f.settings({}))

    def send(self, data: bytes) -> None:
        self.connection.data_received(data)

    def open(self, stream: int, path: bytes, *, end: bool = False, extra: tuple[tuple[str, str], ...] = ()) -> None:
        block = self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path.decode()),
                                     (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers"),
                                     *extra])
        self.send(f.frame(f.HEADERS, f.END_HEADERS | (f.END_STREAM if end else 0), stream, block))

    def message(self, stream: int, payload: bytes, *, end: bool = False, compressed: bool = False) -> None:
        data = bytes((1 if compressed else 0,)) + struct.pack(">I", len(payload)) + payload
        pieces = [data[at:at + f.DEFAULT_MAX_FRAME] for at in range(0, len(data), f.DEFAULT_MAX_FRAME)]
        for index, piece in enumerate(pieces):
            last = index == len(pieces) - 1
            self.send(f.frame(f.DATA, f.END_STREAM if end and last else 0, stream, piece))

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        """Every frame written since the last call: (type, flags, stream, payload)."""
        self.connection.flush()
        data, out = bytes(self.transport.written[self.read_at:]), []
        self.read_at = len(self.transport.written)
        at = 0
        while at < len(data):
            length = int.from_bytes(data[at:at + 3], "big")
            kind, flags = data[at + 3], data[at + 4]
            stream = int.from_bytes(data[at + 5:at + 9], "big") & 0x7FFFFFFF
            out.append((kind, flags, stream, data[at + 9:at + 9 + length]))
            at += 9 + length
        return out

    def headers(self, payload: bytes) -> dict[str, str]:
        return {k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
                for k, v in self.decoder.decode(payload)}

    def goaway_code(self) -> int | None:
        codes = [struct.unpack(">II", p[:8])[1] for kind, _, _, p in self.frames() if kind == f.GOAWAY]
        return codes[-1] if codes else None


async def echo(call: Call) -> None:
    """Answers every message with itself; ends when the peer does."""
    while (message := await call.read()) is not grpc.aio.EOF:  # type: ignore[attr-defined]
        await call.write(message)


def methods(handler: Callable[[Call], Any] = echo) -> dict[bytes, Any]:
    return {b"/t/Echo": (Bytes.FromString, handler)}


async def settle() -> None:
    """Let the calls' tasks run: a few turns of the loop (no wall clock)."""
    loop = asyncio.get_running_loop()
    for _ in range(5):
        turn = loop.create_future()
        loop.call_soon(turn.set_result, None)
        await turn


async def test_the_handshake_grants_our_windows_and_answers_settings_and_ping() -> None:
    peer = Peer(methods())
    frames = peer.frames()
    ours = dict(struct.unpack(">HI", frames[0][3][i:i + 6]) for i in range(0, len(frames[0][3]), 6))
    assert frames[0][0] == f.SETTINGS and ours[f.MAX_CONCURRENT_STREAMS] == MAX_STREAMS
    assert frames[1][0] == f.WINDOW_UPDATE and (f.SETTINGS, f.ACK) in [(k, fl) for k, fl, _, _ in frames]
    peer.send(f.frame(f.PING, 0, 0, b"12345678"))
    assert peer.frames() == [(f.PING, f.ACK, 0, b"12345678")]


async def test_a_call_is_answered_message_by_message_then_with_its_status() -> None:
    peer = Peer(methods())
    peer.frames()
    peer.open(1, b"/t/Echo")
    peer.message(1, Bytes(value=b"one").SerializeToString())
    await settle()
    frames = peer.frames()
    assert [k for k, *_ in frames] == [f.HEADERS, f.DATA]
    assert peer.headers(frames[0][3]) == {":status": "200", "content-type": "application/grpc"}
    assert Bytes.FromString(frames[1][3][5:]).value == b"one"
    peer.message(1, Bytes(value=b"two").SerializeToString(), end=True)
    await settle()
    data, trailers = peer.frames()
    assert Bytes.FromString(data[3][5:]).value == b"two"
    assert trailers[1] & f.END_STREAM and peer.headers(trailers[3]) == {"grpc-status": "0"}
    assert peer.connection.calls == {}


async def test_a_large_reply_is_split_into_frames_the_peer_accepts() -> None:
    peer = Peer(methods())
    peer.frames()
    big = Bytes(value=b"x" * 40_000).SerializeToString()
    peer.open(1, b"/t/Echo")
    for at in range(0, len(big) + 5, 16_000):  # the request spans frames too
        chunk = (b"\x00" + struct.pack(">I", len(big)) + big)[at:at + 16_000]
        peer.send(f.frame(f.DATA, 0, 1, chunk))
    await settle()
    data = [p for k, _, _, p in peer.frames() if k == f.DATA]
    assert max(len(p) for p in data) <= f.DEFAULT_MAX_FRAME and b"".join(data)[5:] == big


async def test_replies_wait_for_the_peer_s_windows_and_leave_in_order() -> None:
    peer = Peer(methods())
    peer.send(f.settings({f.INITIAL_WINDOW_SIZE: 10}))
    peer.frames()
    peer.open(1, b"/t/Echo")
    peer.message(1, Bytes(value=b"0123456789abcdef").SerializeToString())
    await settle()
    assert [k for k, *_ in peer.frames()] == [f.HEADERS]  # 23 bytes of DATA do not fit a window of 10
    peer.send(f.window_update(1, 100))
    await settle()
    data = [p for k, _, _, p in peer.frames() if k == f.DATA]
    assert Bytes.FromString(b"".join(data)[5:]).value == b"0123456789abcdef"


@pytest.mark.parametrize(("hostile", "code"), [
    (b"GET / HTTP/1.1\r\nhost: x\r\n\r\n", f.PROTOCOL_ERROR),
    (f.frame(f.DATA, 0, 1, b"x" * (f.DEFAULT_MAX_FRAME + 1)), f.FRAME_SIZE_ERROR),
    (f.frame(f.HEADERS, f.END_HEADERS, 1, b"\xff\xff\xff\xff\xff\xff"), f.COMPRESSION_ERROR),
    (f.frame(f.HEADERS, 0, 1, b"") + b"".join(f.frame(f.CONTINUATION, 0, 1, b"\x00" * 16_000) for _ in range(5)),
     f.ENHANCE_YOUR_CALM),
    (f.frame(f.CONTINUATION, f.END_HEADERS, 1, b""), f.PROTOCOL_ERROR),
    (f.frame(f.PUSH_PROMISE, 0, 1, b"\x00\x00\x00\x02"), f.PROTOCOL_ERROR),
    (f.frame(f.PING, 0, 0, b"short"), f.FRAME_SIZE_ERROR),
    (f.frame(f.SETTINGS, 0, 0, b"\x00\x04\xff\xff\xff\xff"), f.FLOW_CONTROL_ERROR),
    (f.frame(f.WINDOW_UPDATE, 0, 0, struct.pack(">I", f.MAX_WINDOW)), f.FLOW_CONTROL_ERROR),
])
async def test_a_hostile_peer_gets_the_protocol_s_error_and_the_connection_closes(hostile: bytes, code: int) -> None:
    peer = Peer(methods()) if not hostile.startswith(b"GET") else None
    if peer is None:
        connection = GrpcConnection(methods(), 1 << 20)
        transport = Transport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        connection.data_received(hostile)
        connection.flush()
        assert transport.closed and struct.pack(">I", code) in bytes(transport.written)
        return
    peer.frames()
    peer.send(hostile)
    assert peer.goaway_code() == code and peer.transport.closed


async def test_data_beyond_a_stream_s_window_is_a_flow_control_error() -> None:
    async def never_reads(call: Call) -> None:
        await asyncio.Event().wait()

    # A stream's window is given back only as its servicer reads: a peer that keeps sending to one that does not
    # read is held to one window of buffered messages, then cut off. The connection's window keeps moving.
    peer = Peer(methods(never_reads))
    peer.frames()
    peer.open(1, b"/t/Echo")
    message = Bytes(value=b"x" * (f.DEFAULT_MAX_FRAME - 9)).SerializeToString()
    piece = b"\x00" + struct.pack(">I", len(message)) + message
    for _ in range(peer.connection.window // f.DEFAULT_MAX_FRAME + 2):
        peer.send(f.frame(f.DATA, 0, 1, piece))
        if peer.transport.closed:
            break
    frames = peer.frames()
    assert not [s for k, _, s, _ in frames if k == f.WINDOW_UPDATE and s == 1]  # nothing given back to stream 1
    assert [struct.unpack(">II", p[:8])[1] for k, _, _, p in frames if k == f.GOAWAY] == [f.FLOW_CONTROL_ERROR]


async def test_a_stream_s_window_comes_back_as_its_servicer_reads() -> None:
    peer = Peer(methods(), max_message=100_000)
    peer.frames()
    peer.open(1, b"/t/Echo")
    message = Bytes(value=b"y" * 90_000).SerializeToString()  # over half the stream's window of ~165 KB
    peer.message(1, message)
    await settle()
    updates = [struct.unpack(">I", p)[0] for k, _, s, p in peer.frames() if k == f.WINDOW_UPDATE and s == 1]
    assert updates == [len(message) + 5] and not peer.transport.closed


async def test_an_oversized_or_compressed_message_ends_its_call_and_cancels_the_servicer() -> None:
    ended: list[str] = []

    async def waits(call: Call) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("cleanup ran")

    peer = Peer(methods(waits), max_message=100)
    peer.frames()
    peer.open(1, b"/t/Echo")
    peer.open(3, b"/t/Echo")
    await settle()
    peer.send(f.frame(f.DATA, 0, 1, b"\x00" + struct.pack(">I", 101)))  # the prefix alone is enough
    peer.message(3, b"x", compressed=True)
    await settle()
    statuses = {s: peer.headers(p)["grpc-status"] for k, _, s, p in peer.frames() if k == f.HEADERS}
    assert statuses == {1: str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]),
                        3: str(grpc.StatusCode.UNIMPLEMENTED.value[0])}
    assert ended == ["cleanup ran"] * 2 and peer.connection.calls == {} and not peer.transport.closed


async def test_a_stream_reset_by_the_peer_cancels_its_servicer_which_cleans_up() -> None:
    ended: list[str] = []

    async def waits(call: Call) -> None:
        try:
            await call.read()
            await asyncio.Event().wait()
        finally:
            ended.append("released")

    peer = Peer(methods(waits))
    peer.open(1, b"/t/Echo")
    peer.message(1, b"")
    await settle()
    peer.send(f.rst_stream(1, f.CANCEL))
    await settle()
    assert ended == ["released"] and peer.connection.calls == {}
    peer.connection.connection_made(peer.transport)  # type: ignore[arg-type]
    peer.open(3, b"/t/Echo")
    await settle()
    peer.connection.connection_lost(None)  # the connection gone: every call's cleanup runs
    await settle()
    assert ended == ["released", "released"]


async def test_a_reset_stream_ends_its_servicer_without_leaving_a_reference_cycle() -> None:
    # Envoy resets every ext_proc stream as its exchange ends, while Process waits for the next message. The
    # servicer is cancelled there and cleans up; its task then ends without keeping the CancelledError, whose
    # traceback would hold the call's frames while the call holds the task. So the whole stream is freed by
    # reference counting (with that cycle per stream the garbage collector's full collections stopped the service
    # for ~100 ms).
    read: list[bytes] = []
    ended: list[str] = []
    tasks: list[weakref.ref[asyncio.Task[Any]]] = []

    async def reads_all(call: Call) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(weakref.ref(task))
        try:
            while (message := await call.read()) is not EOF:
                read.append(message.value)
        finally:
            ended.append("released")

    gc.disable()
    try:
        peer = Peer(methods(reads_all))
        peer.open(1, b"/t/Echo")
        peer.message(1, Bytes(value=b"x").SerializeToString())
        await settle()
        peer.send(f.rst_stream(1, f.CANCEL))
        await settle()
        assert read == [b"x"] and ended == ["released"] and peer.connection.calls == {}
        assert tasks[0]() is None  # freed as soon as the connection forgot the call: nothing refers to it
    finally:
        gc.enable()


async def test_unknown_methods_aborts_and_failures_answer_with_their_status() -> None:
    async def refuses(call: Call) -> None:
        await call.abort(grpc.StatusCode.UNAUTHENTICATED, "missing token é")

    async def breaks(call: Call) -> None:
        raise RuntimeError("a bug")

    peer = Peer({b"/t/Refuse": (Bytes.FromString, refuses), b"/t/Break": (Bytes.FromString, breaks)})
    peer.frames()
    peer.open(1, b"/t/Nothing", end=True)
    peer.open(3, b"/t/Refuse")
    peer.open(5, b"/t/Break")
    await settle()
    answers = {s: peer.headers(p) for k, _, s, p in peer.frames() if k == f.HEADERS}
    assert answers[1]["grpc-status"] == str(grpc.StatusCode.UNIMPLEMENTED.value[0])
    assert answers[3]["grpc-status"] == str(grpc.StatusCode.UNAUTHENTICATED.value[0])
    assert answers[3]["grpc-message"] == "missing token %C3%A9"
    assert answers[5]["grpc-status"] == str(grpc.StatusCode.INTERNAL.value[0])
    assert all(":status" in a for a in answers.values())  # trailers-only answers carry the headers too


async def test_streams_past_the_advertised_limit_and_after_goaway_are_refused() -> None:
    async def waits(call: Call) -> None:
        await asyncio.Event().wait()

    peer = Peer(methods(waits))
    for stream in range(1, 2 * MAX_STREAMS + 2, 2):
        peer.open(stream, b"/t/Echo")
    resets = [(s, struct.unpack(">I", p)[0]) for k, _, s, p in peer.frames() if k == f.RST_STREAM]
    assert resets == [(2 * MAX_STREAMS + 1, f.REFUSED_STREAM)]
    peer.connection.goaway()
    peer.open(2 * MAX_STREAMS + 3, b"/t/Echo")
    frames = peer.frames()
    assert (f.RST_STREAM, 2 * MAX_STREAMS + 3) in [(k, s) for k, _, s, _ in frames]
    assert any(k == f.GOAWAY for k, *_ in frames)
    for call in list(peer.connection.calls.values()):
        peer.connection.drop(call)
    await settle()
    assert peer.transport.closed  # draining: the last call gone, the connection closes


async def test_a_client_stream_is_read_to_its_end_and_answered_once() -> None:
    async def total(call: Call) -> Bytes:
        return Bytes(value=b"".join([m.value async for m in call]))

    peer = Peer(methods(total))
    peer.frames()
    peer.open(1, b"/t/Echo", extra=(("x-extproc-token", "t"),))
    for part in (b"a", b"b", b"c"):
        peer.message(1, Bytes(value=part).SerializeToString())
    peer.send(f.frame(f.DATA, f.END_STREAM, 1, b""))
    await settle()
    frames = peer.frames()
    assert Bytes.FromString(next(p for k, _, _, p in frames if k == f.DATA)[5:]).value == b"abc"
    assert peer.headers(frames[-1][3]) == {"grpc-status": "0"}


def test_header_blocks_are_bounded_like_the_advertised_list_size() -> None:
    assert MAX_HEADER_BLOCK == 65_536
