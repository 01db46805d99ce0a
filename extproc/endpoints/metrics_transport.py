"""How the scraper fetches one endpoint's metrics page: the `MetricsTransport` port and its HTTP implementation.

The scraper (`extproc.endpoints.scraper`) owns rounds, timeouts, failure counting and adoption; a transport only
turns an address into the page's text or an error. The service uses `HttpMetricsTransport` (HTTP/1.1 on asyncio
streams, one keep-alive connection per endpoint); tests inject an in-memory transport and need no sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol

from extproc.http1 import Http1Error, keeps_alive, parse_head, read_chunks

__all__ = ["MAX_BODY_BYTES", "HttpMetricsTransport", "MetricsTransport", "ScrapeFailed", "TransportFactory"]

MAX_BODY_BYTES = 4 * 1024 * 1024  # a vLLM page is ~20-60 KB; anything this large is not one
_MAX_HEAD_BYTES = 64 * 1024  # status line and headers (the stream reader's limit)


class ScrapeFailed(Exception):
    """A reply that is not a usable metrics page; the message names the state for the log ("HTTP 503")."""


class MetricsTransport(Protocol):
    async def fetch(self, address: str) -> str:
        """The metrics page of the endpoint at `address` ("host:port"). Raises `ScrapeFailed` for an unusable
        reply; any other exception is a failure too. The caller bounds the time it may take."""
        ...

    async def close(self) -> None:
        """Release connections; `fetch` is not called afterwards."""
        ...


TransportFactory = Callable[[], MetricsTransport]  # called once per scraper start
_Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _ClosedIdle(Exception):
    """The server closed a kept-alive connection before any byte of the reply (its idle timeout)."""


class HttpMetricsTransport:
    """GET http://ADDRESS`path`: a 200 whose body is at most `max_body_bytes` (checked before reading when the
    length is declared, while reading when chunked or delimited by the close), decoded as UTF-8.

    A minimal HTTP/1.1 client instead of aiohttp's: one scrape per endpoint every 100 ms is the service's
    largest fixed CPU cost, and aiohttp's request machinery cost ~4x as much per fetch. One keep-alive
    connection per endpoint is reused round after round; one that fails or is cancelled mid-exchange (the
    scraper's timeout) is closed, never reused with a reply still unread. Uncompressed (`Accept-Encoding:
    identity`): on a LAN, gunzipping every page each 100 ms costs more CPU than the bytes are worth."""

    def __init__(self, *, max_body_bytes: int = MAX_BODY_BYTES, path: str = "/metrics") -> None:
        self._max_body_bytes = max_body_bytes
        self._path = path
        self._idle: dict[str, _Connection] = {}

    async def fetch(self, address: str) -> str:
        connection = self._idle.pop(address, None)
        if connection is not None and connection[0].at_eof():  # the server closed it while idle
            connection[1].close()
            connection = None
        reused = connection is not None
        if connection is None:
            connection = await _connect(address)
        try:
            try:
                body, keep = await self._exchange(address, connection)
            except _ClosedIdle:
                connection[1].close()
                if not reused:
                    raise ScrapeFailed("connection closed before a reply") from None
                connection = await _connect(address)  # once more on a new connection
                body, keep = await self._exchange(address, connection)
        except BaseException:
            connection[1].close()
            raise
        if keep:
            self._idle[address] = connection
        else:
            connection[1].close()
        return body.decode("utf-8", "replace")

    async def close(self) -> None:
        idle, self._idle = self._idle, {}
        for _, writer in idle.values():
            writer.close()
        for _, writer in idle.values():
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _exchange(self, address: str, connection: _Connection) -> tuple[bytes, bool]:
        """One request on `connection`: the body, and whether the connection may serve the next one."""
        reader, writer = connection
        writer.write(f"GET {self._path} HTTP/1.1\r\nHost: {address}\r\nAccept: text/plain\r\n"
                     "Accept-Encoding: identity\r\n\r\n".encode("latin-1"))
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _ClosedIdle from None
            raise ScrapeFailed("connection closed in the response headers") from None
        except ConnectionError:  # reset (or broken pipe) on a connection the server had closed
            raise _ClosedIdle from None
        except asyncio.LimitOverrunError:
            raise ScrapeFailed(f"response headers larger than {_MAX_HEAD_BYTES} bytes") from None
        try:
            version, code, headers = parse_head(head[:-4])
        except Http1Error as exc:
            raise ScrapeFailed(str(exc)) from None
        if code != 200:
            raise ScrapeFailed(f"HTTP {code}")
        limit = self._max_body_bytes
        keep = keeps_alive(version, headers)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            try:
                return b"".join([chunk async for chunk in read_chunks(reader, limit)]), keep
            except Http1Error as exc:
                raise ScrapeFailed(str(exc)) from None
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise ScrapeFailed("bad content-length")
            if int(length) > limit:
                raise ScrapeFailed(f"response larger than {limit} bytes")
            return await reader.readexactly(int(length)), keep
        body = await reader.read(limit + 1)  # delimited by the close: read up to one byte past the limit
        while body and len(body) <= limit:
            more = await reader.read(limit + 1 - len(body))
            if not more:
                break
            body += more
        if len(body) > limit:
            raise ScrapeFailed(f"response larger than {limit} bytes")
        return body, False


async def _connect(address: str) -> _Connection:
    host, _, port = address.rpartition(":")
    try:
        return await asyncio.open_connection(host.strip("[]"), int(port), limit=_MAX_HEAD_BYTES)
    except OSError as exc:
        raise ScrapeFailed(f"cannot connect: {exc.strerror or type(exc).__name__}") from exc
