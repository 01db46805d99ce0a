"""The lean front end (extproc/server/h2/) against grpc core's own HTTP/2 client (grpcio): health Check, an
ext_proc stream with a 200 KB body and a large reply, the access-log stream's token, and a drain. Envoy's client
is covered by the spine and security tests, which run on both front ends."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc.aio import EOF  # type: ignore[attr-defined]  # missing from grpc-stubs
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from extproc.config.epp import GrpcTls
from extproc.server.grpc_auth import TOKEN_METADATA, authorized, refuse
from extproc.server.h2 import LeanServer
from extproc.server.h2 import frames as f
from extproc.server.h2.lifetime import Lifetime
from extproc.server.tls import CertificateReloader
from tests.support import eventually

TOKEN = "t0ken"


class Processor:
    """Answers request headers at once and a body with the body's length in a header; records its streams' ends."""

    def __init__(self) -> None:
        self.ended = 0

    async def Process(self, request_iterator: Any, context: Any) -> None:
        try:
            while (message := await context.read()) is not EOF:
                if message.HasField("request_headers"):
                    await context.write(ext_pb.ProcessingResponse(request_headers=ext_pb.HeadersResponse()))
                else:
                    body = message.request_body.body
                    common = ext_pb.CommonResponse()
                    common.body_mutation.body = body[::-1]  # a large reply: spans many frames
                    await context.write(ext_pb.ProcessingResponse(request_body=ext_pb.BodyResponse(response=common)))
        finally:
            self.ended += 1


class AccessLog:
    def __init__(self) -> None:
        self.entries = 0

    async def StreamAccessLogs(self, request_iterator: Any, context: Any) -> als_pb2.StreamAccessLogsResponse:
        if not authorized(context, TOKEN):
            await refuse(context)
        async for message in request_iterator:
            self.entries += len(message.http_logs.log_entry)
        return als_pb2.StreamAccessLogsResponse()


@pytest.fixture
async def served() -> AsyncIterator[tuple[LeanServer, int, Processor, AccessLog, health.aio.HealthServicer]]:
    processor, access_log, checks = Processor(), AccessLog(), health.aio.HealthServicer()
    await checks.set("envoy.service.ext_proc.v3.ExternalProcessor", health_pb2.HealthCheckResponse.SERVING)
    server = LeanServer(processor, access_log, checks, max_message=1 << 20)
    port = await server.start("127.0.0.1", 0)
    try:
        yield server, port, processor, access_log, checks
    finally:
        await server.stop(0.5)


async def test_grpcio_clients_get_health_ext_proc_and_access_log(served: Any) -> None:
    _, port, processor, access_log, _ = served
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        checks = health_pb2_grpc.HealthStub(channel)
        ext_proc = "envoy.service.ext_proc.v3.ExternalProcessor"
        answer = await checks.Check(health_pb2.HealthCheckRequest(service=ext_proc))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await checks.Check(health_pb2.HealthCheckRequest(service="nothing"))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

        body = bytes(range(256)) * 800  # 200 KB each way
        call = ext_grpc.ExternalProcessorStub(channel).Process()
        await call.write(ext_pb.ProcessingRequest(request_headers=ext_pb.HttpHeaders()))
        assert (await call.read()).HasField("request_headers")
        await call.write(ext_pb.ProcessingRequest(request_body=ext_pb.HttpBody(body=body, end_of_stream=True)))
        assert (await call.read()).request_body.response.body_mutation.body == body[::-1]
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
        assert processor.ended == 1

        logs = als_pb2_grpc.AccessLogServiceStub(channel)
        message = als_pb2.StreamAccessLogsMessage()
        message.http_logs.log_entry.add()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await logs.StreamAccessLogs(iter([message]))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED and access_log.entries == 0
        await logs.StreamAccessLogs(iter([message, message]), metadata=((TOKEN_METADATA, TOKEN),))
        assert access_log.entries == 2


async def test_a_cancelled_stream_runs_the_servicer_s_cleanup_and_stop_drains(served: Any) -> None:
    server, port, processor, _, _ = served
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = ext_grpc.ExternalProcessorStub(channel).Process()
        await call.write(ext_pb.ProcessingRequest(request_headers=ext_pb.HttpHeaders()))
        await call.read()
        call.cancel()  # Envoy resets the stream when the client goes away
        await eventually(lambda: processor.ended == 1, "the reset stream's cleanup")
        open_call = ext_grpc.ExternalProcessorStub(channel).Process()
        await open_call.write(ext_pb.ProcessingRequest(request_headers=ext_pb.HttpHeaders()))
        await open_call.read()
        await server.stop(0.2)  # GOAWAY; the open stream is cut after the grace
        assert processor.ended == 2


def tls_pair(tmp_path: Path, ca: trustme.CA) -> tuple[Path, Path]:
    issued = ca.issue_cert("127.0.0.1", "localhost")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    key.write_bytes(issued.private_key_pem.bytes())
    return cert, key


async def test_tls_with_alpn_h2_and_hostile_connections_are_bounded(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, key = tls_pair(tmp_path, ca)
    reloader = CertificateReloader(GrpcTls(cert_file=str(cert), key_file=str(key)))
    processor, checks = Processor(), health.aio.HealthServicer()
    await checks.set("", health_pb2.HealthCheckResponse.SERVING)
    server = LeanServer(processor, AccessLog(), checks, max_message=1 << 20, tls=reloader.server_context(),
                        lifetime=Lifetime(handshake_s=0.3, preface_s=0.3))
    port = await server.start("127.0.0.1", 0)
    try:
        credentials = grpc.ssl_channel_credentials(ca.cert_pem.bytes())
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        # ALPN: h2 is what we offer, and what a client offering h2 gets.
        client = ssl.create_default_context()
        ca.configure_trust(client)
        client.set_alpn_protocols(["h2", "http/1.1"])
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="localhost")
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        # Handshaken, but no HTTP/2 preface: our SETTINGS, then GOAWAY (PROTOCOL_ERROR) and the close.
        received = await asyncio.wait_for(reader.read(), 10)
        assert received[3] == f.SETTINGS and received.endswith(f.goaway(0, f.PROTOCOL_ERROR))
        writer.close()
        # A client that opens TCP and never starts the handshake is closed after the handshake bound; a plaintext
        # client's bytes fail the handshake; neither leaves a connection behind.
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(idle_reader.read(), 10) == b""
        idle_writer.close()
        plain_reader, plain_writer = await asyncio.open_connection("127.0.0.1", port)
        plain_writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 64)
        assert await asyncio.wait_for(plain_reader.read(), 10) == b""
        plain_writer.close()
        await eventually(lambda: not server.connections, "no connection left behind")
    finally:
        await server.stop(0.2)


async def test_grpc_core_follows_connection_ageing_without_losing_a_call() -> None:
    """`--workers`: connections aged out (GOAWAY, PING round trip, final GOAWAY); grpc core's client reconnects
    and every call, including those sent while the GOAWAY was on its way, is answered."""
    processor, checks = Processor(), health.aio.HealthServicer()
    await checks.set("", health_pb2.HealthCheckResponse.SERVING)
    server = LeanServer(processor, AccessLog(), checks, max_message=1 << 20,
                        lifetime=Lifetime(max_age_s=0.2, age_grace_s=5))
    port = await server.start("127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            async def aged_twice() -> bool:
                answers = await asyncio.gather(*(stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
                                                 for _ in range(20)))
                assert all(a.status == health_pb2.HealthCheckResponse.SERVING for a in answers)
                return server.opened_total >= 3

            await eventually(aged_twice, "two connections aged out and replaced", timeout_s=15, interval_s=0.05)
        # A stream open across the ageing finishes on its old connection.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = ext_grpc.ExternalProcessorStub(channel).Process()
            await call.write(ext_pb.ProcessingRequest(request_headers=ext_pb.HttpHeaders()))
            await call.read()
            await eventually(lambda: server.draining == 1, "the stream's connection aged", timeout_s=5)
            await call.write(ext_pb.ProcessingRequest(request_body=ext_pb.HttpBody(body=b"late", end_of_stream=True)))
            assert (await call.read()).request_body.response.body_mutation.body == b"etal"
            await call.done_writing()
            assert await call.code() == grpc.StatusCode.OK
    finally:
        await server.stop(0.2)
