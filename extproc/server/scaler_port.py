"""The KEDA scaler on a gRPC port of its own (`autoscaling.grpc_port`), with mTLS when `autoscaling.tls` is set.

KEDA's external trigger can authenticate only with TLS: it sends the trigger's metadata in the message
(`ScaledObjectRef.scalerMetadata`, in the ScaledObject itself: no place for a secret) and no gRPC headers, but
its TriggerAuthentication gives it a CA (`caCert`) and a client certificate (`tlsClientCert`, `tlsClientKey`).
Envoy's ext_proc connections on service.grpc_port carry no client certificate, so the port that demands one is
a separate server, serving the scaler alone: a client without a certificate signed by `client_ca_file` fails
the handshake. The certificate, key and CA are reloaded when their files change (`CertificateReloader`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from extproc.autoscale import AutoscalingConfig
from extproc.server.tls import CertificateReloader

__all__ = ["ScalerPort"]


class ScalerPort:
    def __init__(self, handler: grpc.GenericRpcHandler[Any, Any], host: str, config: AutoscalingConfig,
                 options: Sequence[tuple[str, Any]] = ()) -> None:
        assert config.grpc_port is not None
        self._server = grpc.aio.server(options=list(options))
        self._server.add_generic_rpc_handlers((handler,))
        self._address = f"{host}:{config.grpc_port}"
        self.tls = CertificateReloader(config.tls) if config.tls is not None else None
        self.port = 0  # bound, once started

    async def start(self) -> None:
        if self.tls is not None:
            self.port = self._server.add_secure_port(self._address, self.tls.credentials())
            await self.tls.start()
        else:
            self.port = self._server.add_insecure_port(self._address)
        await self._server.start()

    async def stop(self, grace_s: float = 1.0) -> None:
        await self._server.stop(grace_s)
        if self.tls is not None:
            await self.tls.stop()
