"""HTTP/1.1 response framing on asyncio streams, shared by the metrics scraper and the benchmark's client.

Both are minimal keep-alive clients (a general client's machinery costs several times as much per exchange on
this hot a loop); what they share is reading a response's head and a chunked body, where every malformed or
oversized input must fail the same clear way. Errors are `Http1Error`; each caller maps it to its own error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

__all__ = ["Http1Error", "keeps_alive", "parse_head", "read_chunks"]


class Http1Error(Exception):
    """A response that does not follow HTTP/1.x framing, or exceeds a caller's bound."""


def parse_head(head: bytes) -> tuple[str, int, dict[str, str]]:
    """Version, status code and headers (lower-case names; repeated ones joined by ", ") of a response head,
    given without its final blank line."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise Http1Error(f"bad status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise Http1Error(f"bad header line {line[:80]!r}")
        name = name.strip().lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return version, int(code), headers


def keeps_alive(version: str, headers: dict[str, str]) -> bool:
    """Whether the connection may carry another request after this response (RFC 9112 section 9.3)."""
    tokens = headers.get("connection", "").lower()
    return "close" not in tokens and (version == "HTTP/1.1" or "keep-alive" in tokens)


async def read_chunks(reader: asyncio.StreamReader, limit: int | None = None) -> AsyncIterator[bytes]:
    """The data of each chunk of a chunked body, then its trailers are skipped. With `limit`, a body that would
    exceed `limit` bytes fails before the chunk that exceeds it is read."""
    total = 0
    while True:
        size_text = (await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip()
        if not size_text.isalnum():  # hex digits only: int(x, 16) would also take "-1", "+1" or "1_0"
            raise Http1Error(f"bad chunk size line {size_text[:40]!r}")
        try:
            size = int(size_text, 16)
        except ValueError:
            raise Http1Error(f"bad chunk size line {size_text[:40]!r}") from None
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields are not needed
                pass
            return
        total += size
        if limit is not None and total > limit:
            raise Http1Error(f"response larger than {limit} bytes")
        data = await reader.readexactly(size + 2)
        if data[-2:] != b"\r\n":
            raise Http1Error("chunk not terminated by CRLF")
        yield data[:-2]
