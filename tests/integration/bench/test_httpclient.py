from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable

import pytest

from extproc.bench.httpclient import HttpClient, RequestError
from tests.support import eventually

from .conftest import RawHandler, Server

pytestmark = pytest.mark.integration

RawServer = Callable[[RawHandler], Awaitable[int]]
HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


async def test_json_body_and_usage(server: Server) -> None:
    async with HttpClient() as client:
        resp = await client.request("GET", HOST, server.port, "/json")
    assert resp.status == 200
    assert resp.headers["x-sim-replica"] == "r1"
    assert json.loads(resp.body)["choices"][0]["message"]["content"] == "hi"
    assert (resp.prompt_tokens, resp.completion_tokens) == (7, 3)
    assert resp.ttft_s is None and resp.chunks == 0 and not resp.aborted
    assert resp.e2e_s > 0


async def test_request_body_and_headers_are_sent(server: Server) -> None:
    payload = b'{"model": "m", "x": "' + b"y" * 20000 + b'"}'
    async with HttpClient() as client:
        resp = await client.request(
            "POST", HOST, server.port, "/echo", {"x-test": "1", "Content-Type": "application/json"}, payload
        )
    assert json.loads(resp.body) == {"len": len(payload), "x-test": "1"}
    assert server.state.bodies == [payload]


async def test_chunked_json_body_is_reassembled(server: Server) -> None:
    async with HttpClient() as client:
        resp = await client.request("GET", HOST, server.port, "/chunked-json")
    assert resp.headers["transfer-encoding"] == "chunked"
    assert json.loads(resp.body)["pad"] == "z" * 5000
    assert (resp.prompt_tokens, resp.completion_tokens) == (1, 2)


async def test_sse_stream_counts_content_and_orders_ttft_before_end(server: Server) -> None:
    async with HttpClient() as client:
        resp = await client.request("GET", HOST, server.port, "/sse?n=4&delay=0.03")
    assert resp.status == 200
    assert resp.chunks == 4  # the role-only first event carries no content
    assert (resp.prompt_tokens, resp.completion_tokens) == (11, 4)
    assert resp.ttft_s is not None
    assert 0 < resp.ttft_s < resp.e2e_s
    assert resp.body.startswith(b"data: ")


async def test_sse_body_is_truncated_to_keep_limit(server: Server) -> None:
    async with HttpClient(stream_body_keep=100) as client:
        resp = await client.request("GET", HOST, server.port, "/sse?n=10&delay=0")
    assert len(resp.body) == 100
    assert resp.chunks == 10 and resp.completion_tokens == 10


async def test_stream_without_usage_leaves_tokens_unknown(server: Server) -> None:
    async with HttpClient() as client:
        resp = await client.request("GET", HOST, server.port, "/sse?n=2&delay=0&usage=0")
    assert resp.chunks == 2
    assert resp.completion_tokens is None and resp.prompt_tokens is None


async def test_keep_alive_reuses_one_connection(server: Server) -> None:
    async with HttpClient() as client:
        for _ in range(5):
            assert (await client.request("GET", HOST, server.port, "/json")).status == 200
        await client.request("GET", HOST, server.port, "/sse?n=1&delay=0")
        assert client.connections_opened == 1
    assert len(server.state.peers) == 1
    assert server.state.requests == 6


async def test_connection_close_response_is_not_reused(server: Server) -> None:
    async with HttpClient() as client:
        for _ in range(3):
            resp = await client.request("GET", HOST, server.port, "/close")
            assert resp.body == b"bye"
        assert client.connections_opened == 3
    assert len(server.state.peers) == 3


async def test_concurrent_requests_use_separate_connections_then_pool_them(server: Server) -> None:
    async with HttpClient() as client:
        slow = [client.request("GET", HOST, server.port, "/json?together=3") for _ in range(3)]
        await asyncio.gather(*slow)
        await asyncio.gather(*(client.request("GET", HOST, server.port, "/json") for _ in range(3)))
        assert client.connections_opened == 3


async def test_timeout_raises_and_closes_connection(server: Server) -> None:
    async with HttpClient() as client:
        with pytest.raises(RequestError) as info:
            await client.request("GET", HOST, server.port, "/hang", timeout_s=0.1)
        assert info.value.kind == "timeout"
        await eventually(lambda: server.state.disconnects == 1, "the server to see the client leave")
        # The pool must not hand out the timed-out connection again.
        assert (await client.request("GET", HOST, server.port, "/json")).status == 200
        assert client.connections_opened == 2


async def test_abort_after_closes_mid_stream(server: Server) -> None:
    async with HttpClient() as client:
        resp = await client.request(
            "GET", HOST, server.port, "/sse?n=50&hang_after=3", timeout_s=5, abort_after_s=0.15
        )
        assert resp.aborted
        assert resp.status == 200
        assert resp.chunks == 3  # what arrived before the stream stalled and the client gave up on it
        assert resp.completion_tokens is None
        await eventually(lambda: server.state.disconnects == 1, "the server to see the client leave")
        resp = await client.request("GET", HOST, server.port, "/sse?n=1&delay=0", abort_after_s=2)
        assert not resp.aborted and resp.chunks == 1


async def test_cancellation_closes_the_connection(server: Server) -> None:
    async with HttpClient() as client:
        task = asyncio.create_task(client.request("GET", HOST, server.port, "/hang"))
        await eventually(lambda: server.state.in_flight == 1, "the request to reach the server")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await eventually(lambda: server.state.disconnects == 1, "the server to see the client leave")


async def test_connect_error_kind() -> None:
    async with HttpClient() as client:
        with pytest.raises(RequestError) as info:
            await client.request("GET", HOST, _free_port(), "/")
    assert info.value.kind == "connect"


async def test_stale_keep_alive_connection_is_retried_once(raw_server: RawServer) -> None:
    async def one_response_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")  # the next request on this connection gets no answer
        writer.close()

    port = await raw_server(one_response_per_connection)
    async with HttpClient() as client:
        first = await client.request("GET", HOST, port, "/")
        second = await client.request("GET", HOST, port, "/")
        assert (first.body, second.body) == (b"ok", b"ok")
        assert client.connections_opened == 2


async def test_reset_after_partial_response_is_reported(raw_server: RawServer) -> None:
    async def truncated(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly-part")
        await writer.drain()
        writer.close()

    port = await raw_server(truncated)
    async with HttpClient() as client:
        with pytest.raises(RequestError) as info:
            await client.request("GET", HOST, port, "/")
    assert info.value.kind == "reset"


async def test_body_until_eof_for_http10(raw_server: RawServer) -> None:
    async def http10(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nhello world")
        await writer.drain()
        writer.close()

    port = await raw_server(http10)
    async with HttpClient() as client:
        resp = await client.request("GET", HOST, port, "/")
        assert resp.body == b"hello world"
        await client.request("GET", HOST, port, "/")
        assert client.connections_opened == 2


async def test_oversized_header_block_is_a_protocol_error(raw_server: RawServer) -> None:
    async def big_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 10000 + b"\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        await reader.read()  # the connection stays open until the client gives up on it by itself
        writer.close()

    port = await raw_server(big_headers)
    async with HttpClient(max_header_bytes=4096) as client:
        with pytest.raises(RequestError) as info:
            await client.request("GET", HOST, port, "/")
    assert info.value.kind == "protocol"


@pytest.mark.parametrize(
    "reply", [b"HTTP/2 200\r\n\r\n", b"garbage\r\n\r\n", b"HTTP/1.1 200 OK\r\nbad\r\n\r\n"]
)
async def test_malformed_head_is_a_protocol_error(raw_server: RawServer, reply: bytes) -> None:
    async def bad(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(reply)
        await writer.drain()
        writer.close()

    port = await raw_server(bad)
    async with HttpClient() as client:
        with pytest.raises(RequestError) as info:
            await client.request("GET", HOST, port, "/")
    assert info.value.kind == "protocol"
