"""A minimal keep-alive HTTP/1.1 client on asyncio streams, built for load generation.

The benchmark box has two cores shared with Envoy, the service and the simulator, so the client has to
cost little per request: one write per request, header parsing with str.partition, and SSE events scanned
for content with byte searches (JSON is only decoded for the chunk carrying `usage`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from extproc.bench.sse import SseScanner, usage_of
from extproc.http1 import Http1Error, keeps_alive, parse_head, read_chunks

__all__ = ["ErrorKind", "HttpClient", "RequestError", "Response", "SseScanner"]

ErrorKind = Literal["connect", "timeout", "reset", "protocol"]
Headers = Sequence[tuple[str, str]] | Mapping[str, str]

_NO_BODY_STATUS = frozenset({204, 304})


class RequestError(Exception):
    """A request that produced no usable HTTP response; `kind` says why."""

    def __init__(self, kind: ErrorKind, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind: ErrorKind = kind


@dataclass(frozen=True, slots=True)
class Response:
    """One finished (or deliberately aborted) exchange.

    `ttft_s` is the arrival of the first SSE event carrying content (None for non-streamed bodies);
    `e2e_s` is the arrival of the last byte read. For event streams `body` keeps only a bounded prefix.
    """

    status: int
    headers: dict[str, str]
    body: bytes
    ttft_s: float | None
    e2e_s: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int = 0
    aborted: bool = False
    cached_tokens: int | None = None


@dataclass(slots=True, eq=False)  # eq=False: pooled connections are hashed by identity
class _Conn:
    key: tuple[str, int]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


class _Exchange:
    """Mutable state of one request while it is read; kept so an abort can report what arrived."""

    __slots__ = (
        "body_len", "conn", "head_only", "headers", "keep", "last_ns", "parts", "received", "reusable",
        "sse", "start_ns", "status",
    )

    def __init__(self, start_ns: int, head_only: bool, keep: int) -> None:
        self.start_ns = start_ns
        self.last_ns = start_ns
        self.head_only = head_only
        self.keep = keep
        self.conn: _Conn | None = None
        self.status = 0
        self.headers: dict[str, str] = {}
        self.parts: list[bytes] = []
        self.body_len = 0
        self.sse: SseScanner | None = None
        self.received = False
        self.reusable = False

    def on_data(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        self.last_ns = now
        if self.sse is not None:
            self.sse.feed(data, now)
            if self.body_len < self.keep:
                self.parts.append(data[: self.keep - self.body_len])
        else:
            if self.body_len + len(data) > self.keep:
                raise RequestError("protocol", f"response body larger than {self.keep} bytes")
            self.parts.append(data)
        self.body_len += len(data)

    def response(self, end_ns: int, aborted: bool = False) -> Response:
        body = b"".join(self.parts)
        sse = self.sse
        if sse is not None:
            first = sse.first_content_ns
            ttft = None if first is None else (first - self.start_ns) / 1e9
            prompt, completion, cached, chunks = sse.prompt_tokens, sse.completion_tokens, sse.cached_tokens, sse.chunks
        else:
            ttft, chunks = None, 0
            prompt = completion = cached = None
            if not aborted and "json" in self.headers.get("content-type", ""):
                prompt, completion, cached = usage_of(body) or (None, None, None)
        return Response(
            self.status, self.headers, body, ttft, (end_ns - self.start_ns) / 1e9,
            prompt, completion, chunks, aborted, cached,
        )


class HttpClient:
    """Keep-alive connection pool per (host, port); one request per connection at a time."""

    def __init__(
        self, *, max_header_bytes: int = 65536, max_body_bytes: int = 16 << 20,
        stream_body_keep: int = 8192, max_idle_per_host: int = 1024,
    ) -> None:
        self._max_header_bytes = max_header_bytes
        self._max_body_bytes = max_body_bytes
        self._stream_body_keep = stream_body_keep
        self._max_idle = max_idle_per_host
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._open: set[_Conn] = set()
        self.connections_opened = 0

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(
        self, method: str, host: str, port: int, path: str, headers: Headers = (), body: bytes = b"",
        *, timeout_s: float = 30.0, abort_after_s: float | None = None,
    ) -> Response:
        """Send one request; raise RequestError unless a response (or a deliberate abort) happened.

        With `abort_after_s`, the socket is closed that long after the start if the response is not
        complete by then, and the partial result is returned with `aborted=True`.
        """
        start = time.perf_counter_ns()
        aborting = abort_after_s is not None and abort_after_s <= timeout_s
        limit_s = abort_after_s if aborting and abort_after_s is not None else timeout_s
        wire = self._encode(method, host, port, path, headers, body)
        ex = _Exchange(start, method.upper() == "HEAD", self._max_body_bytes)
        try:
            try:
                async with asyncio.timeout(limit_s) as deadline:
                    await self._exchange(host, port, wire, ex)
            except BaseException:
                self._discard(ex.conn)
                raise
        except TimeoutError as exc:
            if not deadline.expired():
                raise RequestError("reset", f"socket timed out: {exc}") from exc
            if aborting:
                return ex.response(time.perf_counter_ns(), aborted=True)
            raise RequestError("timeout", f"no complete response within {timeout_s}s") from None
        except asyncio.LimitOverrunError as exc:
            detail = f"header block or chunk line over {self._max_header_bytes} bytes"
            raise RequestError("protocol", detail) from exc
        except (OSError, asyncio.IncompleteReadError) as exc:
            raise RequestError("reset", f"{type(exc).__name__}: {exc}") from exc
        if ex.reusable:
            self._release(ex.conn)
        else:
            self._discard(ex.conn)
        return ex.response(ex.last_ns)

    async def close(self) -> None:
        conns = list(self._open)
        self._open.clear()
        self._idle.clear()
        for conn in conns:
            conn.writer.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                await conn.writer.wait_closed()

    @staticmethod
    def _encode(method: str, host: str, port: int, path: str, headers: Headers, body: bytes) -> bytes:
        items = headers.items() if isinstance(headers, Mapping) else headers
        lines = [f"{method} {path} HTTP/1.1"]
        has_host = False
        for name, value in items:
            low = name.lower()
            if low == "content-length":
                continue
            has_host = has_host or low == "host"
            lines.append(f"{name}: {value}")
        if not has_host:
            lines.append(f"Host: {host}:{port}")
        if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            lines.append(f"Content-Length: {len(body)}")
        lines.append("\r\n")
        return "\r\n".join(lines).encode("latin-1") + body

    async def _exchange(self, host: str, port: int, wire: bytes, ex: _Exchange) -> None:
        key = (host, port)
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.reader.at_eof() or conn.writer.is_closing():
                self._discard(conn)
                continue
            ex.conn = conn
            try:
                await self._roundtrip(conn, wire, ex)
                return
            except (ConnectionError, asyncio.IncompleteReadError):
                # The server closed an idle keep-alive connection as we reused it: nothing of the
                # response arrived, so the request is resent once on a fresh connection.
                if ex.received:
                    raise
                self._discard(conn)
                break
        try:
            reader, writer = await asyncio.open_connection(host, port, limit=self._max_header_bytes)
        except OSError as exc:
            raise RequestError("connect", f"{host}:{port}: {exc}") from exc
        conn = _Conn(key, reader, writer)
        self._open.add(conn)
        self.connections_opened += 1
        ex.conn = conn
        await self._roundtrip(conn, wire, ex)

    async def _roundtrip(self, conn: _Conn, wire: bytes, ex: _Exchange) -> None:
        conn.writer.write(wire)
        await conn.writer.drain()
        reader = conn.reader
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            ex.received = True
            ex.last_ns = time.perf_counter_ns()
            try:
                version, status, headers = parse_head(head[:-4])
            except Http1Error as exc:
                raise RequestError("protocol", str(exc)) from None
            if status >= 200 or status == 101:
                break
        ex.status, ex.headers = status, headers
        keep_alive = keeps_alive(version, headers)
        if "text/event-stream" in headers.get("content-type", ""):
            ex.sse = SseScanner()
            ex.keep = self._stream_body_keep
        if ex.head_only or status in _NO_BODY_STATUS or status < 200:
            ex.reusable = keep_alive and status >= 200
            return
        if "chunked" in headers.get("transfer-encoding", "").lower():
            try:
                async for chunk in read_chunks(reader):
                    ex.on_data(chunk)
            except Http1Error as exc:
                raise RequestError("protocol", str(exc)) from None
        elif (length := headers.get("content-length")) is not None:
            if not length.isdigit():
                raise RequestError("protocol", f"bad content-length {length!r}")
            await self._read_length(reader, int(length), ex)
        else:
            keep_alive = False
            while data := await reader.read(65536):
                ex.on_data(data)
        ex.reusable = keep_alive

    @staticmethod
    async def _read_length(reader: asyncio.StreamReader, remaining: int, ex: _Exchange) -> None:
        if ex.sse is None and remaining:
            ex.on_data(await reader.readexactly(remaining))
            return
        while remaining > 0:
            data = await reader.read(min(remaining, 65536))
            if not data:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(data)
            ex.on_data(data)

    def _release(self, conn: _Conn | None) -> None:
        if conn is None:
            return
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) < self._max_idle and conn in self._open:
            idle.append(conn)
        else:
            self._discard(conn)

    def _discard(self, conn: _Conn | None) -> None:
        if conn is not None and conn in self._open:
            self._open.discard(conn)
            conn.writer.transport.abort()
