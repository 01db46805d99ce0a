"""HTTP/2 clients through real Envoy and our service (h2c, prior knowledge): a body of several DATA frames, with or
without content-length, ended by its last DATA frame or by request trailers, is routed on its whole body, on both
front ends.

Request trailers are tested with the buffered body modes (buffered, prebuffered: the buffer filter holds the whole
body, which reaches the service as one chunk, trailers or not, and is decided on at once). With
`envoy.request_body_mode: streamed` (Envoy 1.40, session 11, reports/i15-s11/README.md) they break: without
content-length the body's end never reaches the service (Envoy sends neither the trailers nor an end-of-stream chunk
while the headers reply is held: the request hangs, past 10 s here, as for a client still uploading), and with
content-length the engine receives the body followed by extra bytes. Streamed stays opt-in until that is fixed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import pytest
import pytest_asyncio

from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack
from tests.support import launch_stack

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAT = SimPool("chat", "org/chat-8b", 2, aliases=("chat",))


@pytest_asyncio.fixture(loop_scope="module", scope="module",
                        params=[f"{mode}/{front}" for front in ("lean", "grpcio")
                                for mode in ("buffered", "streamed", "prebuffered")])
async def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    body_mode, front_end = request.param.split("/")
    workdir: Path = tmp_path_factory.mktemp(f"h2-{body_mode}-{front_end}")
    async with ProcessGroup(workdir / "logs") as group:
        yield await launch_stack(group, workdir, [CHAT], envoy={"request_body_mode": body_mode},
                                 patch=lambda document: document["service"].update(front_end=front_end))


async def h2_post(port: int, path: str, pieces: list[bytes], trailers: list[tuple[str, str]] | None,
                  content_length: bool) -> tuple[int, dict[str, str], bytes]:
    """One request over a fresh h2c connection: the body in `pieces` (one DATA frame each), then `trailers` (or the
    last piece ends the stream). Returns (status, response headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    connection.initiate_connection()
    headers = [(":method", "POST"), (":scheme", "http"), (":authority", f"127.0.0.1:{port}"), (":path", path),
               ("content-type", "application/json")]
    if content_length:
        headers.append(("content-length", str(sum(len(piece) for piece in pieces))))
    stream = connection.get_next_available_stream_id()
    connection.send_headers(stream, headers)
    for index, piece in enumerate(pieces):
        connection.send_data(stream, piece, end_stream=trailers is None and index == len(pieces) - 1)
    if trailers is not None:
        connection.send_headers(stream, trailers, end_stream=True)
    writer.write(connection.data_to_send())
    status, answer, body = 0, {}, bytearray()
    try:
        while True:
            data = await reader.read(65_536)
            if not data:
                raise AssertionError("the connection closed before the response ended")
            for event in connection.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    answer = {str(k): str(v) for k, v in event.headers}
                    status = int(answer[":status"])
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                    connection.acknowledge_received_data(event.flow_controlled_length, stream)
                elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                    return status, answer, bytes(body)
            writer.write(connection.data_to_send())
    finally:
        writer.close()


def chat(words: int) -> bytes:
    content = " ".join(f"w{n}" for n in range(words))
    return json.dumps({"model": "chat", "messages": [{"role": "user", "content": content}], "max_tokens": 4}).encode()


@pytest.mark.parametrize("stack", [f"{mode}/{front}" for front in ("lean", "grpcio")
                                   for mode in ("buffered", "prebuffered")], indirect=True)  # streamed: see above
@pytest.mark.parametrize("content_length", [False, True])
async def test_a_body_ended_by_request_trailers_is_routed(stack: Stack, content_length: bool) -> None:
    body = chat(1_000)  # ~6 KB (under the engine's context) in two DATA frames
    pieces = [body[:3_000], body[3_000:]]
    status, headers, answer = await asyncio.wait_for(
        h2_post(stack.envoy_port, "/v1/chat/completions", pieces, [("x-checksum", "abc")], content_length), 10)
    assert status == 200, answer[:500]
    assert headers["x-gateway-upstream-host"] in {f"127.0.0.1:{p}" for p in stack.sim_ports["chat"]}
    assert json.loads(answer)["model"] == CHAT.model  # the alias rewritten: the decision read the whole body


@pytest.mark.parametrize("content_length", [False, True])
async def test_a_body_ended_by_its_last_data_frame_is_routed(stack: Stack, content_length: bool) -> None:
    body = chat(100)
    status, _, answer = await asyncio.wait_for(
        h2_post(stack.envoy_port, "/v1/chat/completions", [body[:50], body[50:]], None, content_length), 10)
    assert status == 200, answer[:500]
    assert json.loads(answer)["model"] == CHAT.model
