"""EXPERIMENT (issue 18, session 9; not part of the package): the trivial CONTINUE-only ext_proc processor of
`extproc.bench.trivial`, served by a minimal HTTP/2 + gRPC server written on asyncio's Protocol callbacks (one
thread, no grpc core), to measure the floor of a lean front end against grpc.aio's in the same run.

Same answers as extproc/bench/trivial.py (each ProcessingRequest parsed, each reply serialised per message),
drains the access-log stream, answers grpc.health.v1 Check with SERVING. What it leaves out, and a real front end
would need: send-side flow control (its replies are small), bounds against hostile peers (frame sizes, header list
size, stream counts), TLS, GOAWAY draining, deadlines, compression. Only for `extproc bench overhead` on 127.0.0.1.

    python reports/hotpath-s9/h2_trivial.py --port 9001 --set x-gateway-pool=bench
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import struct
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from hpack import Decoder

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
WINDOW = 1 << 30  # what we grant the peer, per stream and for the connection
REFILL = 1 << 24  # consumed bytes after which the windows are topped up again
_HEADER = struct.Struct(">I B B I")  # length (24 bits, packed with type), flags, stream id


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def literal(name: bytes, value: bytes) -> bytes:
    """HPACK literal header field without indexing, new name (no Huffman): needs no encoder state."""
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes((len(name),)) + name + bytes((len(value),)) + value


RESPONSE_HEADERS = b"\x88" + literal(b"content-type", b"application/grpc")  # :status 200 (static index 8)
OK_TRAILERS = literal(b"grpc-status", b"0")
UNIMPLEMENTED_TRAILERS = b"\x88" + literal(b"content-type", b"application/grpc") + literal(b"grpc-status", b"12")
SERVING = b"\x08\x01"  # grpc.health.v1.HealthCheckResponse{status: SERVING}
PROCESS = b"/envoy.service.ext_proc.v3.ExternalProcessor/Process"
ACCESS_LOG = b"/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs"
HEALTH = b"/grpc.health.v1.Health/Check"

_HEADERS_REPLY = ext_pb.ProcessingResponse(request_headers=ext_pb.HeadersResponse())
_OTHER = {
    "response_headers": ext_pb.ProcessingResponse(response_headers=ext_pb.HeadersResponse()),
    "response_body": ext_pb.ProcessingResponse(response_body=ext_pb.BodyResponse()),
    "request_trailers": ext_pb.ProcessingResponse(request_trailers=ext_pb.TrailersResponse()),
    "response_trailers": ext_pb.ProcessingResponse(response_trailers=ext_pb.TrailersResponse()),
}


def body_answer(headers: list[tuple[str, str]]) -> ext_pb.ProcessingResponse:
    return ext_pb.ProcessingResponse(request_body=ext_pb.BodyResponse(response=ext_pb.CommonResponse(
        header_mutation=ext_pb.HeaderMutation(set_headers=[
            base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value.encode()))
            for key, value in headers]),
        clear_route_cache=True)))


class Stream:
    __slots__ = ("consumed", "data", "headers", "path", "started")

    def __init__(self) -> None:
        self.headers = b""  # header block fragments until END_HEADERS
        self.path = b""
        self.data = bytearray()  # gRPC bytes not yet a whole message
        self.started = False  # our response headers were sent
        self.consumed = 0


class H2Connection(asyncio.Protocol):
    def __init__(self, body: ext_pb.ProcessingResponse) -> None:
        self.body = body
        self.buffer = bytearray()
        self.preface = False
        self.streams: dict[int, Stream] = {}
        self.decoder = Decoder()
        self.decoder.max_allowed_table_size = 65536
        self.consumed = 0
        self.transport: Any = None
        self.out: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        settings = struct.pack(">HI", 0x4, WINDOW) + struct.pack(">HI", 0x3, 1024)  # window, max streams
        transport.write(frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0,
                                                                  struct.pack(">I", WINDOW - 65535)))

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        if not self.preface:
            if len(buffer) < len(PREFACE):
                return
            if bytes(buffer[:len(PREFACE)]) != PREFACE:
                self.transport.close()
                return
            del buffer[:len(PREFACE)]
            self.preface = True
        at = 0
        size = len(buffer)
        while size - at >= 9:
            word, flags, stream = struct.unpack_from(">IBI", buffer, at)
            length, kind = word >> 8, word & 0xFF
            end = at + 9 + length
            if end > size:
                break
            self.on_frame(kind, flags, stream & 0x7FFFFFFF, memoryview(buffer)[at + 9:end].tobytes())
            at = end
        del buffer[:at]
        if self.out:
            self.transport.write(b"".join(self.out))
            self.out.clear()

    def on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == DATA:
            self.on_data(flags, stream_id, payload)
        elif kind == HEADERS or kind == CONTINUATION:
            stream = self.streams.get(stream_id)
            if stream is None:
                stream = self.streams[stream_id] = Stream()
            if kind == HEADERS:
                start, end = 0, len(payload)
                if flags & PADDED:
                    start, end = 1, end - payload[0]
                if flags & PRIORITY:
                    start += 5
                payload = payload[start:end]
            stream.headers += payload
            if flags & END_HEADERS:
                for name, value in self.decoder.decode(stream.headers, raw=True):
                    if name == b":path":
                        stream.path = value
                stream.headers = b""
            if flags & END_STREAM:
                self.finish(stream_id, stream)
        elif kind == SETTINGS:
            if not flags & ACK:
                self.out.append(frame(SETTINGS, ACK, 0, b""))
        elif kind == PING:
            if not flags & ACK:
                self.out.append(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            self.streams.pop(stream_id, None)
        elif kind == GOAWAY:
            self.transport.close()

    def on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        stream = self.streams.get(stream_id)
        size = len(payload)
        self.consumed += size
        if self.consumed > REFILL:
            self.out.append(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.consumed)))
            self.consumed = 0
        if stream is None:
            return
        if flags & PADDED:
            payload = payload[1:len(payload) - payload[0]]
        stream.consumed += size
        if stream.consumed > REFILL:
            self.out.append(frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", stream.consumed)))
            stream.consumed = 0
        data = stream.data
        data += payload
        at = 0
        while len(data) - at >= 5:
            length = int.from_bytes(data[at + 1:at + 5], "big")
            if len(data) - at - 5 < length:
                break
            message = bytes(data[at + 5:at + 5 + length])
            at += 5 + length
            if stream.path == PROCESS:
                self.on_message(stream_id, stream, message)
        del data[:at]
        if flags & END_STREAM:
            self.finish(stream_id, stream)

    def on_message(self, stream_id: int, stream: Stream, message: bytes) -> None:
        request = ext_pb.ProcessingRequest.FromString(message)
        phase = request.WhichOneof("request")
        if phase == "request_headers":
            reply = _HEADERS_REPLY
        elif phase == "request_body":
            reply = self.body
        elif phase in _OTHER:
            reply = _OTHER[phase]
        else:
            return
        self.send(stream_id, stream, reply.SerializeToString())

    def send(self, stream_id: int, stream: Stream, payload: bytes) -> None:
        if not stream.started:
            stream.started = True
            self.out.append(frame(HEADERS, END_HEADERS, stream_id, RESPONSE_HEADERS))
        self.out.append(frame(DATA, 0, stream_id, b"\x00" + len(payload).to_bytes(4, "big") + payload))

    def finish(self, stream_id: int, stream: Stream) -> None:
        """The peer ended its side: answer what a unary call is owed, then the status."""
        self.streams.pop(stream_id, None)
        if stream.path == HEALTH:
            self.send(stream_id, stream, SERVING)
        elif stream.path == ACCESS_LOG:
            self.send(stream_id, stream, b"")
        elif stream.path != PROCESS:
            self.out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream_id, UNIMPLEMENTED_TRAILERS))
            return
        if not stream.started:
            stream.started = True
            self.out.append(frame(HEADERS, END_HEADERS, stream_id, RESPONSE_HEADERS))
        self.out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream_id, OK_TRAILERS))


async def serve(port: int, headers: list[tuple[str, str]]) -> None:
    loop = asyncio.get_running_loop()
    body = body_answer(headers)
    server = await loop.create_server(lambda: H2Connection(body), "127.0.0.1", port)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    headers = [(name, value) for name, _, value in (item.partition("=") for item in args.set)]
    import uvloop

    uvloop.run(serve(args.port, headers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# --- EXPERIMENT: our own servicers (ExternalProcessorService.Process, AccessLogService.StreamAccessLogs) on this
# front end, through a minimal stand-in for grpc.aio's ServicerContext (read/write/invocation_metadata).
from grpc.aio import EOF as _EOF  # noqa: E402


class _Context:
    __slots__ = ("als", "conn", "inbox", "stream", "stream_id")

    def __init__(self, conn: "OursConnection", stream_id: int, stream: Stream) -> None:
        self.conn, self.stream_id, self.stream = conn, stream_id, stream
        self.als = stream.path == ACCESS_LOG
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()

    async def read(self) -> Any:
        return await self.inbox.get()

    async def write(self, message: Any) -> None:
        self.conn.send(self.stream_id, self.stream, message.SerializeToString())
        self.conn.flush()

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def _iterate(self) -> Any:
        while True:
            item = await self.inbox.get()
            if item is _EOF:
                return
            yield item


class OursConnection(H2Connection):
    def __init__(self, processor: Any, access_log: Any) -> None:
        super().__init__(ext_pb.ProcessingResponse())
        self.processor, self.access_log = processor, access_log
        self.contexts: dict[int, _Context] = {}
        self.tasks: dict[int, asyncio.Task[Any]] = {}

    def flush(self) -> None:
        if self.out:
            self.transport.write(b"".join(self.out))
            self.out.clear()

    def on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == HEADERS and stream_id not in self.streams:
            super().on_frame(kind, flags & ~END_STREAM, stream_id, payload)
            stream = self.streams[stream_id]
            if stream.path in (PROCESS, ACCESS_LOG):
                context = self.contexts[stream_id] = _Context(self, stream_id, stream)
                if stream.path == PROCESS:
                    call = self.processor.Process(None, context)
                else:
                    call = self.access_log.StreamAccessLogs(context._iterate(), context)
                task = self.tasks[stream_id] = asyncio.ensure_future(call)
                task.add_done_callback(lambda _, s=stream_id, st=stream: self.done(s, st))
            if flags & END_STREAM:
                self.on_frame(DATA, END_STREAM, stream_id, b"")
            return
        if kind == RST_STREAM and stream_id in self.tasks:
            self.tasks.pop(stream_id).cancel()
        super().on_frame(kind, flags, stream_id, payload)

    def on_message(self, stream_id: int, stream: Stream, message: bytes) -> None:
        context = self.contexts.get(stream_id)
        if context is not None:
            parse = _ALS_MESSAGE if context.als else ext_pb.ProcessingRequest
            context.inbox.put_nowait(parse.FromString(message))

    def on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None and stream.path == ACCESS_LOG:  # parse its messages too
            stream.path, path = PROCESS, ACCESS_LOG
            try:
                super().on_data(flags & ~END_STREAM, stream_id, payload)
            finally:
                stream.path = path
            if flags & END_STREAM:
                self.end_of_input(stream_id)
            return
        super().on_data(flags & ~END_STREAM, stream_id, payload)
        if flags & END_STREAM:
            self.end_of_input(stream_id)

    def end_of_input(self, stream_id: int) -> None:
        context = self.contexts.get(stream_id)
        if context is not None:
            context.inbox.put_nowait(_EOF)
        else:
            stream = self.streams.get(stream_id)
            if stream is not None:
                self.finish(stream_id, stream)

    def done(self, stream_id: int, stream: Stream) -> None:
        self.contexts.pop(stream_id, None)
        task = self.tasks.pop(stream_id, None)
        if task is None or task.cancelled():
            self.streams.pop(stream_id, None)
            return
        if stream.path == ACCESS_LOG:
            self.send(stream_id, stream, b"")
        if not stream.started:
            stream.started = True
            self.out.append(frame(HEADERS, END_HEADERS, stream_id, RESPONSE_HEADERS))
        self.out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream_id, OK_TRAILERS))
        self.streams.pop(stream_id, None)
        self.flush()


from envoy.service.accesslog.v3 import als_pb2 as _als  # noqa: E402

_ALS_MESSAGE = _als.StreamAccessLogsMessage


async def serve_ours(host: str, port: int, processor: Any, access_log: Any) -> Any:
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: OursConnection(processor, access_log), host, port, reuse_port=True)
