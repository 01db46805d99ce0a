"""The lean front end's listener: Envoy's ext_proc streams, its access-log streams, grpc.health.v1 Check and (with
autoscaling on the shared port) KEDA's external scaler on the service's gRPC port, served by the same servicer
objects the grpc.aio server would use; plaintext or TLS (ALPN h2, the pair reloaded as the grpcio front end's).

Why: with grpc.aio every message crosses grpc core's threads (an EventEngine thread, the poller thread, a wake-up
of the event loop), which costs more CPU than our own decision at 200 req/s. Here the event loop reads the socket
itself. Measured in reports/hotpath-s9 (same run: CPU per request and added latency, trivial floor and ours).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from envoy.service.accesslog.v3 import als_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from grpc_health.v1 import health_pb2

from extproc.server.h2.calls import EOF, Abort, Call, Handler
from extproc.server.h2.connection import GrpcConnection, Method
from extproc.server.h2.lifetime import Lifetime
from extproc.server.keda import externalscaler as keda

log = logging.getLogger(__name__)

PROCESS = b"/envoy.service.ext_proc.v3.ExternalProcessor/Process"
ACCESS_LOG = b"/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs"
HEALTH_CHECK = b"/grpc.health.v1.Health/Check"


async def request(call: Call) -> Any:
    """A unary request's one message."""
    message = await call.read()
    if message is EOF:
        raise Abort(grpc.StatusCode.INTERNAL, "the call ended before its request message")
    return message


def unary(method: Callable[[Any, Call], Awaitable[Any]]) -> Handler:
    async def run(call: Call) -> Any:
        return await method(await request(call), call)

    return run


def server_stream(method: Callable[[Any, Call], AsyncIterator[Any]]) -> Handler:
    async def run(call: Call) -> None:
        async for reply in method(await request(call), call):
            await call.write(reply)

    return run


def methods(processor: Any, access_log: Any, health: Any, scaler: Any = None) -> dict[bytes, Method]:
    """The gRPC methods served, by path: how each parses its requests and which servicer method runs it."""

    async def process(call: Call) -> None:
        await processor.Process(None, call)

    async def stream_access_logs(call: Call) -> Any:
        return await access_log.StreamAccessLogs(call, call)

    served: dict[bytes, Method] = {
        PROCESS: (ext_pb.ProcessingRequest.FromString, process),
        ACCESS_LOG: (als_pb2.StreamAccessLogsMessage.FromString, stream_access_logs),
        HEALTH_CHECK: (health_pb2.HealthCheckRequest.FromString, unary(health.Check)),
    }
    if scaler is not None:  # KEDA's external scaler (extproc/server/scaler.py), its bounds in its methods
        prefix = f"/{keda.SERVICE}/".encode()
        ref = keda.ScaledObjectRef.FromString
        served[prefix + b"IsActive"] = (ref, unary(scaler.IsActive))
        served[prefix + b"StreamIsActive"] = (ref, server_stream(scaler.StreamIsActive))
        served[prefix + b"GetMetricSpec"] = (ref, unary(scaler.GetMetricSpec))
        served[prefix + b"StreamMetricSpec"] = (ref, server_stream(scaler.StreamMetricSpec))
        served[prefix + b"GetMetrics"] = (keda.GetMetricsRequest.FromString, unary(scaler.GetMetrics))
    return served


class LeanServer:
    """Listens, keeps its connections, drains them on stop (GOAWAY, then the open calls finish within a grace)."""

    def __init__(self, processor: Any, access_log: Any, health: Any, max_message: int, *, scaler: Any = None,
                 tls: ssl.SSLContext | None = None, lifetime: Lifetime | None = None) -> None:
        self._methods = methods(processor, access_log, health, scaler)
        self._max_message = max_message
        self._tls = tls
        self._lifetime = lifetime if lifetime is not None else Lifetime()
        self._server: asyncio.Server | None = None
        self._connections: set[GrpcConnection] = set()
        self.opened_total = 0  # connections made (handshake done)

    def _connection(self) -> GrpcConnection:
        connection = GrpcConnection(self._methods, self._max_message, self._connections.discard, self._lifetime)
        # Kept from connection_made: a TLS handshake that fails never makes the connection (nor loses it).
        connection.on_open = self._opened
        return connection

    def _opened(self, connection: GrpcConnection) -> None:
        self._connections.add(connection)
        self.opened_total += 1

    async def start(self, host: str, port: int) -> int:
        """Listen (SO_REUSEPORT, as grpc.aio does, for several workers on one port); the port bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._connection, host, port, reuse_port=True, ssl=self._tls,
            ssl_handshake_timeout=self._lifetime.handshake_s if self._tls is not None else None)
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connections(self) -> int:
        """Connections open (handshake done)."""
        return len(self._connections)

    @property
    def draining(self) -> int:
        """Connections past their final GOAWAY: their open calls finish, no new ones start."""
        return sum(1 for connection in self._connections if connection.closing)

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
