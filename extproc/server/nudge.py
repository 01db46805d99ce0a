"""The upload nudge of a STREAMED exchange whose headers reply is held (extproc/server/processor.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from extproc.server import protocol

__all__ = ["UploadNudge"]


class UploadNudge:
    """A client pausing mid-upload while the headers reply is held (STREAMED) would meet Envoy's per-message
    timer (message_timeout: failure mode, a 500) before its request timeout (408). When nothing arrives for half
    that timer, the stream asks Envoy for more time (override_message_timeout, capped by the rendered
    max_message_timeout), once per message Envoy sent. Never fires for a body that arrives with its headers."""

    __slots__ = ("context", "writing")

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self.context = context
        self.writing: asyncio.Future[None] | None = None

    def fire(self, seconds: float) -> None:
        self.writing = asyncio.ensure_future(self.context.write(protocol.extend_message_timeout(seconds)))

    async def settle(self) -> None:
        """Before the stream writes again: the override in flight goes first (one write at a time)."""
        if self.writing is not None:
            writing, self.writing = self.writing, None
            await writing
