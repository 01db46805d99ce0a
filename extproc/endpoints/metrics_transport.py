"""How the scraper fetches one endpoint's metrics page: the `MetricsTransport` port and its HTTP implementation.

The scraper (`extproc.endpoints.scraper`) owns rounds, timeouts, failure counting and adoption; a transport only
turns an address into the page's text or an error. The service uses `HttpMetricsTransport` (aiohttp, one
keep-alive connection per endpoint); tests inject an in-memory transport and need no sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import aiohttp

__all__ = ["MAX_BODY_BYTES", "HttpMetricsTransport", "MetricsTransport", "ScrapeFailed", "SessionFactory",
           "TransportFactory", "default_session"]

MAX_BODY_BYTES = 4 * 1024 * 1024  # a vLLM page is ~20-60 KB; anything this large is not one
SessionFactory = Callable[[], aiohttp.ClientSession]


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


def default_session() -> aiohttp.ClientSession:
    # One keep-alive connection per endpoint is reused round after round; no pool limit, because a queue
    # for a free connection would eat into every scrape's timeout. Uncompressed: on a LAN, gunzipping
    # every page each 100 ms costs more CPU than the bytes are worth.
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0),
        headers={"Accept": "text/plain", "Accept-Encoding": "identity"},
    )


class HttpMetricsTransport:
    """GET http://ADDRESS`path`: a 200 whose body is at most `max_body_bytes` (checked while reading, so a
    chunked reply without a length cannot grow without bound), decoded as UTF-8."""

    def __init__(self, session_factory: SessionFactory = default_session, *, max_body_bytes: int = MAX_BODY_BYTES,
                 path: str = "/metrics") -> None:
        self._session = session_factory()
        self._max_body_bytes = max_body_bytes
        self._path = path

    async def fetch(self, address: str) -> str:
        limit = self._max_body_bytes
        try:
            async with self._session.get(f"http://{address}{self._path}", allow_redirects=False) as response:
                if response.status != 200:
                    raise ScrapeFailed(f"HTTP {response.status}")
                if response.content_length is not None and response.content_length > limit:
                    raise ScrapeFailed(f"response larger than {limit} bytes")
                body = bytearray()
                async for chunk in response.content.iter_any():
                    body += chunk
                    if len(body) > limit:
                        raise ScrapeFailed(f"response larger than {limit} bytes")
        except aiohttp.ClientConnectorError as exc:
            raise ScrapeFailed(f"cannot connect: {exc.os_error.strerror or type(exc.os_error).__name__}") from exc
        return body.decode("utf-8", "replace")

    async def close(self) -> None:
        await self._session.close()
