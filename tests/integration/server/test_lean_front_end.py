"""The lean front end (extproc/server/h2/) against grpc core's own HTTP/2 client (grpcio): health Check, an
ext_proc stream with a 200 KB body and a large reply, the access-log stream's token, and a drain. Envoy's client
is covered by the spine and security tests, which run on both front ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc.aio import EOF  # type: ignore[attr-defined]  # missing from grpc-stubs
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from extproc.server.grpc_auth import TOKEN_METADATA, authorized, refuse
from extproc.server.h2 import LeanServer
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
