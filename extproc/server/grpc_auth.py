"""Only Envoy may open ext_proc and access-log streams: a shared secret in gRPC metadata.

The secret comes from `service.grpc_token_file`; the rendered Envoy config (and the Helm chart's
EnvoyFilter) sends it as `initial_metadata` on both gRPC services. Streams without it are refused with
UNAUTHENTICATED before any message is read. grpc.health.v1 stays open (probes carry no secret, and it only
tells whether the service is serving). Without a token file the gRPC port must be reachable by Envoy alone
(a loopback address, a pod-local listener, a NetworkPolicy or mTLS): see the README's "Security model".
"""

from __future__ import annotations

import hmac
from typing import Any

import grpc

from extproc.config.secrets import GRPC_TOKEN_METADATA as TOKEN_METADATA
from extproc.config.secrets import read_secret as read_token

__all__ = ["TOKEN_METADATA", "authorized", "read_token", "refuse"]


def authorized(context: grpc.aio.ServicerContext[Any, Any], token: str) -> bool:
    """The call carries `token` (compared in constant time)."""
    expected = token.encode()
    for key, value in context.invocation_metadata() or ():
        if key == TOKEN_METADATA:
            presented = value if isinstance(value, bytes) else str(value).encode()
            return hmac.compare_digest(presented, expected)
    return False


async def refuse(context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"missing or wrong {TOKEN_METADATA}")
