"""The servers of the service's gRPC port (`service.front_end`): the lean one (extproc/server/h2/, the default) or
grpc.aio's. Both serve the same servicer objects: ext_proc, access logs, grpc.health.v1 and, when autoscaling is
on without a port of its own, KEDA's external scaler. With several workers (`serve --workers N`) both age their
connections out after CONNECTION_AGE_S (extproc/server/workers.py)."""

from __future__ import annotations

import ssl
from typing import Any

import grpc
from envoy.service.accesslog.v3 import als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health_pb2_grpc

from extproc.server.h2 import LeanServer
from extproc.server.h2.lifetime import Lifetime
from extproc.server.scaler import ScalerService
from extproc.server.workers import CONNECTION_AGE_GRACE_S, CONNECTION_AGE_S

__all__ = ["grpc_options", "grpcio_server", "lean_server"]

_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 80 * 1024 * 1024),
    ("grpc.max_send_message_length", 80 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.so_reuseport", 1),
]
_WORKER_GRPC_OPTIONS = [
    ("grpc.max_connection_age_ms", int(CONNECTION_AGE_S * 1000)),
    ("grpc.max_connection_age_grace_ms", int(CONNECTION_AGE_GRACE_S * 1000)),
]


def grpc_options(worker: bool) -> list[tuple[str, Any]]:
    return _GRPC_OPTIONS + (_WORKER_GRPC_OPTIONS if worker else [])


def grpcio_server(worker: bool, processor: Any, access_log: Any, health: Any,
                  scaler: ScalerService | None) -> grpc.aio.Server:
    server = grpc.aio.server(options=grpc_options(worker))
    ext_grpc.add_ExternalProcessorServicer_to_server(processor, server)
    als_pb2_grpc.add_AccessLogServiceServicer_to_server(access_log, server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    if scaler is not None and scaler.port is None:
        server.add_generic_rpc_handlers((scaler.handler(),))
    return server


def lean_server(worker: bool, max_body_bytes: int, processor: Any, access_log: Any, health: Any,
                scaler: ScalerService | None, tls: ssl.SSLContext | None) -> LeanServer:
    lifetime = Lifetime(max_age_s=CONNECTION_AGE_S, age_grace_s=CONNECTION_AGE_GRACE_S) if worker else None
    return LeanServer(processor, access_log, health, max_body_bytes + (1 << 20),
                      scaler=scaler if scaler is not None and scaler.port is None else None, tls=tls,
                      lifetime=lifetime)
