"""The lean front end's listener: Envoy's ext_proc streams, its access-log streams and grpc.health.v1 Check on the
service's gRPC port, served by the same servicer objects the grpc.aio server would use.

Why: with grpc.aio every message crosses grpc core's threads (an EventEngine thread, the poller thread, a wake-up
of the event loop), which costs more CPU than our own decision at 200 req/s. Here the event loop reads the socket
itself. Measured in reports/hotpath-s9 (same run: CPU per request and added latency, trivial floor and ours).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from envoy.service.accesslog.v3 import als_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from grpc_health.v1 import health_pb2

from extproc.server.h2.calls import Call
from extproc.server.h2.connection import GrpcConnection, Method

log = logging.getLogger(__name__)

PROCESS = b"/envoy.service.ext_proc.v3.ExternalProcessor/Process"
ACCESS_LOG = b"/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs"
HEALTH_CHECK = b"/grpc.health.v1.Health/Check"


def methods(processor: Any, access_log: Any, health: Any) -> dict[bytes, Method]:
    """The gRPC methods served, by path: how each parses its requests and which servicer method runs it."""

    async def process(call: Call) -> None:
        await processor.Process(None, call)

    async def stream_access_logs(call: Call) -> Any:
        return await access_log.StreamAccessLogs(call, call)

    async def check(call: Call) -> Any:
        return await health.Check(await call.read(), call)

    return {
        PROCESS: (ext_pb.ProcessingRequest.FromString, process),
        ACCESS_LOG: (als_pb2.StreamAccessLogsMessage.FromString, stream_access_logs),
        HEALTH_CHECK: (health_pb2.HealthCheckRequest.FromString, check),
    }


class LeanServer:
    """Listens, keeps its connections, drains them on stop (GOAWAY, then the open calls finish within a grace)."""

    def __init__(self, processor: Any, access_log: Any, health: Any, max_message: int) -> None:
        self._methods = methods(processor, access_log, health)
        self._max_message = max_message
        self._server: asyncio.Server | None = None
        self._connections: set[GrpcConnection] = set()

    def _connection(self) -> GrpcConnection:
        connection = GrpcConnection(self._methods, self._max_message, self._connections.discard)
        self._connections.add(connection)
        return connection

    async def start(self, host: str, port: int) -> int:
        """Listen (SO_REUSEPORT, as grpc.aio does, for several workers on one port); the port bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._connection, host, port, reuse_port=True)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float) -> None:
        if self._server is None:
            return
        self._server.close()
        for connection in list(self._connections):
            connection.goaway()
        running = [call.task for c in self._connections for call in c.calls.values() if call.task is not None]
        if running:  # calls end when Envoy's exchanges do, within the grace
            await asyncio.wait(running, timeout=grace_s)
        cut = []
        for connection in list(self._connections):
            for call in list(connection.calls.values()):
                connection.drop(call)  # past the grace: cancelled, their cleanup runs now
                if call.task is not None:
                    cut.append(call.task)
            if connection.transport is not None:
                connection.flush()
                connection.transport.close()
        await asyncio.gather(*cut, return_exceptions=True)
        await self._server.wait_closed()
