"""One HTTP/2 connection of the lean front end: frames in, calls out (RFC 9113; gRPC over HTTP/2).

Everything runs in asyncio's `data_received` callback and the calls' tasks: no threads, and the replies a loop
iteration produces leave in one write. Bounds, each answered with the protocol's own error: frames over 16 KiB,
header blocks over 64 KiB (decoded lists over 64 KiB), more concurrent streams than advertised (REFUSED_STREAM),
gRPC messages over `max_message` (RESOURCE_EXHAUSTED), compressed messages (none were offered), data beyond the
windows we granted (FLOW_CONTROL_ERROR). A stream's window (one largest message) is given back only as its
servicer reads, so a peer buffers at most that per stream here; the connection's is given back as bytes arrive (a
connection window shared by partial messages could otherwise stall them all). What we send waits for the peer's
windows.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import grpc
from hpack import HPACKError

from extproc.server.h2 import frames as f
from extproc.server.h2.blocks import BlockDecoder
from extproc.server.h2.calls import EOF, Call, Handler
from extproc.server.h2.lifetime import Lifecycle, Lifetime
from extproc.server.h2.output import Output

MAX_STREAMS = 1024
MAX_HEADER_BLOCK = 65_536
_HEAD = struct.Struct(">IBI")
_U32 = struct.Struct(">I")
# A method: how to parse its requests, and what runs it.
Method = tuple[Callable[[bytes], Any], Handler]


class GrpcConnection(Output, Lifecycle, asyncio.Protocol):
    def __init__(self, methods: Mapping[bytes, Method], max_message: int,
                 on_close: Callable[[GrpcConnection], None] | None = None, lifetime: Lifetime | None = None) -> None:
        self.methods = methods
        self.lifetime = lifetime if lifetime is not None else Lifetime()
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self.control_frames = 0  # PINGs and SETTINGS owed an answer since the last stream activity
        self.max_message = max_message
        # What we grant, per stream and for the connection: two of the largest messages (RFC 9113 caps it).
        self.window = min(f.MAX_WINDOW, max_message + 5 + 65_536)  # per stream: one message, and the next frames
        self.connection_window = 64 << 20
        self.on_close = on_close
        self.on_open: Callable[[GrpcConnection], None] | None = None
        self.buffer = bytearray()
        self.preface = False
        self.transport: asyncio.Transport | None = None
        self.decoder = BlockDecoder(MAX_HEADER_BLOCK)
        self.calls: dict[int, Call] = {}
        self.data: dict[int, bytearray] = {}  # per stream: bytes of an incomplete gRPC message
        self.block: tuple[int, int, bytearray] | None = None  # stream, flags, fragments of an unfinished block
        self.last_stream = 0
        self.recv_window = self.connection_window
        self.consumed = 0  # connection-level bytes received, not yet given back
        self.send_window = f.DEFAULT_WINDOW  # the peer's, for the connection
        self.peer_window = f.DEFAULT_WINDOW  # the peer's initial stream window
        self.peer_frame = f.DEFAULT_MAX_FRAME
        self.out: list[bytes] = []
        self.flushing = False
        self.closing = False  # GOAWAY sent: no new streams

    # -- transport --------------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is no asyncio.Transport
        self.emit(f.settings({f.MAX_CONCURRENT_STREAMS: MAX_STREAMS, f.INITIAL_WINDOW_SIZE: self.window,
                              f.MAX_HEADER_LIST_SIZE: MAX_HEADER_BLOCK, f.ENABLE_PUSH: 0}))
        self.emit(f.window_update(0, self.connection_window - f.DEFAULT_WINDOW))
        self.begin()
        if self.on_open is not None:
            self.on_open(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.end()
        for call in list(self.calls.values()):
            self.drop(call)
        if self.on_close is not None:
            self.on_close(self)

    # -- frames in --------------------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        if not self.preface:
            if len(buffer) < len(f.PREFACE):
                if not f.PREFACE.startswith(bytes(buffer)):
                    self.fail(f.PROTOCOL_ERROR, "not HTTP/2")
                return
            if bytes(buffer[:len(f.PREFACE)]) != f.PREFACE:
                self.fail(f.PROTOCOL_ERROR, "not HTTP/2")
                return
            del buffer[:len(f.PREFACE)]
            self.preface = True
            self.preface_received()
        at, size = 0, len(buffer)
        while size - at >= f.FRAME_HEADER and self.transport is not None and not self.transport.is_closing():
            word, flags, stream = _HEAD.unpack_from(buffer, at)
            length = word >> 8
            if length > f.DEFAULT_MAX_FRAME:
                self.fail(f.FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                return
            end = at + f.FRAME_HEADER + length
            if end > size:
                break
            self.on_frame(word & 0xFF, flags, stream & 0x7FFFFFFF, bytes(buffer[at + f.FRAME_HEADER:end]))
            at = end
        del buffer[:at]

    def on_frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if self.block is not None and kind != f.CONTINUATION:
            self.fail(f.PROTOCOL_ERROR, "a header block interrupted")
        elif kind == f.DATA:
            self.control_frames = 0
            self.on_data(flags, stream, payload)
        elif kind == f.HEADERS:
            self.control_frames = 0
            self.on_headers(flags, stream, payload)
        elif kind == f.CONTINUATION:
            if self.block is None or self.block[0] != stream:
                self.fail(f.PROTOCOL_ERROR, "CONTINUATION without HEADERS")
                return
            self.block[2].extend(payload)
            if flags & f.END_HEADERS:
                stream_id, first_flags, block = self.block
                self.block = None
                self.on_block(stream_id, first_flags, bytes(block))
            elif len(self.block[2]) > MAX_HEADER_BLOCK:
                self.fail(f.ENHANCE_YOUR_CALM, "a header block over 64 KiB")
        elif kind == f.SETTINGS:
            if flags & f.ACK or self.counted_control_frame():
                self.on_settings(flags, stream, payload)
        elif kind == f.PING:
            if len(payload) != 8 or stream:
                self.fail(f.FRAME_SIZE_ERROR, "a malformed PING")
            elif flags & f.ACK:
                self.on_ping_ack(payload)
            elif self.counted_control_frame():
                self.emit(f.frame(f.PING, f.ACK, 0, payload))
        elif kind == f.WINDOW_UPDATE:
            self.on_window_update(stream, payload)
        elif kind == f.RST_STREAM:
            call = self.calls.get(stream)
            if call is not None:
                self.drop(call)
        elif kind == f.GOAWAY:
            self.closing = True
            if not self.calls and self.transport is not None:
                self.transport.close()
        elif kind == f.PUSH_PROMISE:
            self.fail(f.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # PRIORITY and unknown frame types are ignored (RFC 9113 4.1, 5.3.2)

    def on_headers(self, flags: int, stream: int, payload: bytes) -> None:
        start, end = 0, len(payload)
        if flags & f.PADDED:
            if not payload or payload[0] >= len(payload):
                self.fail(f.PROTOCOL_ERROR, "bad padding")
                return
            start, end = 1, end - payload[0]
        if flags & f.PRIORITY_FLAG:
            start += 5
        if start > end:
            self.fail(f.FRAME_SIZE_ERROR, "a short HEADERS frame")
            return
        if flags & f.END_HEADERS:
            self.on_block(stream, flags, payload[start:end])
        else:
            self.block = (stream, flags, bytearray(payload[start:end]))

    def on_block(self, stream: int, flags: int, block: bytes) -> None:
        try:  # every block is decoded: the decoder's table must follow the peer's
            headers = self.decoder.decode(block)
        except HPACKError as error:
            self.fail(f.COMPRESSION_ERROR, f"HPACK: {error}")
            return
        call = self.calls.get(stream)
        if call is not None:  # the client's trailers (gRPC sends none): the end of its input at most
            if flags & f.END_STREAM:
                self.end_input(call)
            return
        if stream % 2 == 0 or stream <= self.last_stream:
            self.fail(f.PROTOCOL_ERROR, f"a new stream {stream} after {self.last_stream}")
            return
        self.last_stream = stream
        if self.closing or len(self.calls) >= MAX_STREAMS:
            self.emit(f.rst_stream(stream, f.REFUSED_STREAM))
            return
        self.start_call(stream, headers, bool(flags & f.END_STREAM))

    def start_call(self, stream: int, headers: Iterable[tuple[bytes | str, bytes | str]], ended: bool) -> None:
        path = b""
        metadata: list[tuple[str, str]] = []
        for name, value in headers:  # raw=True: bytes
            key = name if isinstance(name, bytes) else name.encode()
            raw = value if isinstance(value, bytes) else value.encode()
            if key == b":path":
                path = raw
            elif not key.startswith(b":"):
                metadata.append((key.decode("latin-1"), raw.decode("latin-1")))
        method = self.methods.get(path)
        if method is None:
            self.emit(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream,
                              f.trailers_only(grpc.StatusCode.UNIMPLEMENTED.value[0], "unknown method")))
            return
        parse, handler = method
        call = Call(self, stream, tuple(metadata), parse, self.peer_window)
        self.calls[stream] = call
        self.data[stream] = bytearray()
        call.task = asyncio.ensure_future(self.run(call, handler))
        if ended:
            self.end_input(call)

    def on_data(self, flags: int, stream: int, payload: bytes) -> None:
        size = len(payload)
        self.recv_window -= size
        if self.recv_window < 0:
            self.fail(f.FLOW_CONTROL_ERROR, "data beyond the connection window")
            return
        self.consumed += size
        if self.consumed >= self.connection_window // 2:
            self.emit(f.window_update(0, self.consumed))
            self.recv_window += self.consumed
            self.consumed = 0
        call = self.calls.get(stream)
        if call is None or call.ended:  # a stream we reset or finished: nothing more is read from it
            return
        call.recv_window -= size
        if call.recv_window < 0:
            self.fail(f.FLOW_CONTROL_ERROR, "data beyond the stream window")
            return
        start, end = 0, size
        if flags & f.PADDED:
            if not payload or payload[0] >= size:
                self.fail(f.PROTOCOL_ERROR, "bad padding")
                return
            start, end = 1, size - payload[0]
        self.credit(call, size - (end - start))  # padding is nobody's message
        data = self.data[stream]
        data += payload[start:end]
        at = 0
        while len(data) - at >= 5:
            compressed, length = data[at], _U32.unpack_from(data, at + 1)[0]
            if compressed or length > self.max_message:
                self.refuse(call, grpc.StatusCode.RESOURCE_EXHAUSTED if length > self.max_message else
                            grpc.StatusCode.UNIMPLEMENTED, "message too large" if length > self.max_message
                            else "compressed messages are not accepted")
                return
            if len(data) - at - 5 < length:
                break
            try:
                message = call.parse(bytes(data[at + 5:at + 5 + length]))
            except Exception:  # a message that does not parse ends its call, not the connection
                self.refuse(call, grpc.StatusCode.INTERNAL, "message does not parse")
                return
            call.inbox.put_nowait((message, 5 + length))
            at += 5 + length
        del data[:at]
        if flags & f.END_STREAM:
            self.end_input(call)

    def end_input(self, call: Call) -> None:
        call.ended = True
        call.inbox.put_nowait((EOF, 0))

    def credit(self, call: Call, size: int) -> None:
        """A stream's bytes read by its servicer: given back to the peer once half a window has gathered."""
        if call.ended or not size:
            return
        call.consumed += size
        if call.consumed >= self.window // 2:
            self.emit(f.window_update(call.stream_id, call.consumed))
            call.recv_window += call.consumed
            call.consumed = 0
