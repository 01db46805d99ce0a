"""An OTLP/gRPC trace receiver for benchmarks (the collector's TraceService from opentelemetry-proto): it accepts
and counts spans, so that a traced variant exports as it would to a real collector."""

from __future__ import annotations

from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

__all__ = ["OtlpSink"]


class OtlpSink(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans = 0
        self._server: grpc.aio.Server | None = None

    async def Export(self, request: Any, context: Any) -> Any:
        self.spans += sum(len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    async def start(self) -> int:
        """Listen on a free loopback port; returns it."""
        self._server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)  # type: ignore[no-untyped-call]
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return port

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
