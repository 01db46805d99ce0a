"""One gRPC call on the lean front end, as the servicers see it: the subset of grpc.aio's ServicerContext they use
(`read`, `write`, `invocation_metadata`, `abort`; async iteration for client streams), so ExternalProcessorService,
AccessLogService and the health servicer run unchanged on either front end."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from grpc.aio import EOF  # type: ignore[attr-defined]  # missing from grpc-stubs

if TYPE_CHECKING:
    from extproc.server.h2.connection import GrpcConnection

__all__ = ["EOF", "Abort", "Call", "Handler"]


class Abort(Exception):
    """`context.abort(code, details)`: the call ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class Call:
    """A stream's state: its input (parsed messages, with their size on the wire for flow control), its output
    (response headers sent or not, data held back by the peer's flow-control windows), its task."""

    __slots__ = ("connection", "consumed", "ended", "inbox", "metadata", "parse", "pending", "pending_bytes",
                 "recv_window", "send_window", "sending", "started", "stream_id", "task", "waiters")

    def __init__(self, connection: GrpcConnection, stream_id: int, metadata: tuple[tuple[str, str], ...],
                 parse: Callable[[bytes], Any], send_window: int) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.metadata = metadata
        self.parse = parse
        self.inbox: asyncio.Queue[tuple[Any, int]] = asyncio.Queue()
        self.ended = False  # the peer ended its side (EOF queued)
        self.consumed = 0  # bytes read by the servicer and not yet given back to the peer's stream window
        self.recv_window = connection.window  # what the peer may still send on this stream
        self.started = False  # our response headers went out
        self.sending = True  # our side is open (trailers not sent)
        self.send_window = send_window
        self.pending: deque[bytes] = deque()  # DATA frames held back by flow control, in order
        self.pending_bytes = 0
        self.waiters: list[asyncio.Future[None]] = []  # writes waiting for `pending` to drain
        self.task: asyncio.Task[None] | None = None

    async def read(self) -> Any:
        if self.ended and self.inbox.empty():
            return EOF
        message, size = await self.inbox.get()
        if size:
            self.connection.credit(self, size)
        return message

    async def write(self, message: Any) -> None:
        await self.connection.send_message(self, message.SerializeToString())

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Abort(code, details)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Any]:
        while (message := await self.read()) is not EOF:
            yield message


# A service method: runs with the call and returns its single response (client streams and unary calls) or None.
Handler = Callable[[Call], Awaitable[Any]]
