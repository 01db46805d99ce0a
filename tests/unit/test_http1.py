"""HTTP/1.x response framing: heads, keep-alive and chunked bodies, including malformed and oversized input."""

from __future__ import annotations

import asyncio

import pytest

from extproc.http1 import Http1Error, keeps_alive, parse_head, read_chunks


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def _chunks(data: bytes, limit: int | None = None) -> tuple[list[bytes], bytes]:
    reader = _reader(data)
    chunks = [chunk async for chunk in read_chunks(reader, limit)]
    return chunks, await reader.read()


def test_head_names_are_lower_case_and_repeats_are_joined() -> None:
    version, status, headers = parse_head(b"HTTP/1.1 404 Not Found\r\nX-A: 1\r\nx-a: 2\r\nContent-Type:  text/plain ")
    assert (version, status) == ("HTTP/1.1", 404)
    assert headers == {"x-a": "1, 2", "content-type": "text/plain"}


@pytest.mark.parametrize(("head", "message"), [
    (b"SSH-2.0-OpenSSH", "bad status line"),
    (b"HTTP/2 200", "bad status line"),
    (b"HTTP/1.1 2x0 OK", "bad status line"),
    (b"HTTP/1.1 200 OK\r\nno colon here", "bad header line"),
])
def test_a_malformed_head_is_an_error_naming_the_line(head: bytes, message: str) -> None:
    with pytest.raises(Http1Error, match=message):
        parse_head(head)


@pytest.mark.parametrize(("version", "connection", "keep"), [
    ("HTTP/1.1", "", True), ("HTTP/1.1", "close", False), ("HTTP/1.1", "Keep-Alive, Close", False),
    ("HTTP/1.0", "", False), ("HTTP/1.0", "keep-alive", True),
])
def test_keep_alive_follows_version_and_connection(version: str, connection: str, keep: bool) -> None:
    assert keeps_alive(version, {"connection": connection} if connection else {}) is keep


async def test_chunks_are_yielded_and_trailers_consumed() -> None:
    chunks, rest = await _chunks(b"5;ext=1\r\nhello\r\n1\r\n!\r\n0\r\nX-T: 1\r\n\r\nNEXT")
    assert chunks == [b"hello", b"!"]
    assert rest == b"NEXT"  # the next response on the connection is untouched


@pytest.mark.parametrize(("body", "message"), [
    (b"-1\r\n", "bad chunk size"), (b"+1\r\n", "bad chunk size"), (b"1_0\r\n", "bad chunk size"),
    (b"zz\r\n", "bad chunk size"), (b"3\r\nabcXY", "not terminated by CRLF"),
])
async def test_a_malformed_chunk_is_an_error(body: bytes, message: str) -> None:
    with pytest.raises(Http1Error, match=message):
        await _chunks(body)


async def test_the_limit_fails_before_the_oversized_chunk_is_read() -> None:
    reader = _reader(b"4\r\nabcd\r\n8\r\n12345678\r\n0\r\n\r\n")
    seen = []
    with pytest.raises(Http1Error, match="larger than 10 bytes"):
        async for chunk in read_chunks(reader, 10):
            seen.append(chunk)
    assert seen == [b"abcd"]
    assert await reader.read() == b"12345678\r\n0\r\n\r\n"  # never read: the bound came first
    assert await _chunks(b"4\r\nabcd\r\n6\r\n123456\r\n0\r\n\r\n", 10) == ([b"abcd", b"123456"], b"")
