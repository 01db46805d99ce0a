"""What the lean front end sends on a connection: the calls' replies in DATA frames no larger than the peer
accepts (its SETTINGS), held back by its flow-control windows (its WINDOW_UPDATEs) and released in order, then
each call's status; and the write that carries everything one loop iteration produced."""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import TYPE_CHECKING

import grpc

from extproc.server.h2 import frames as f
from extproc.server.h2.calls import Abort, Call, Handler

log = logging.getLogger(__name__)
_U32 = struct.Struct(">I")


class Output:
    """The sending half of GrpcConnection (connection.py), which owns the state declared here."""

    calls: dict[int, Call]
    data: dict[int, bytearray]
    out: list[bytes]
    flushing: bool
    closing: bool
    send_window: int
    peer_window: int
    peer_frame: int
    transport: asyncio.Transport | None

    if TYPE_CHECKING:  # Lifecycle's (lifetime.py)
        def fail(self, code: int, why: str) -> None: ...

    def on_settings(self, flags: int, stream: int, payload: bytes) -> None:
        if stream or len(payload) % 6:
            self.fail(f.FRAME_SIZE_ERROR, "a malformed SETTINGS frame")
            return
        if flags & f.ACK:
            return
        for at in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, at)
            if key == f.INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    self.fail(f.FLOW_CONTROL_ERROR, "an initial window over 2^31-1")
                    return
                for call in self.calls.values():
                    call.send_window += value - self.peer_window
                self.peer_window = value
            elif key == f.MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= 16_777_215:
                    self.fail(f.PROTOCOL_ERROR, "a bad max frame size")
                    return
                self.peer_frame = value
        self.emit(f.frame(f.SETTINGS, f.ACK, 0))
        self.pump()

    def on_window_update(self, stream: int, payload: bytes) -> None:
        if len(payload) != 4:
            self.fail(f.FRAME_SIZE_ERROR, "a malformed WINDOW_UPDATE")
            return
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream == 0:
            self.send_window += increment
            if self.send_window > f.MAX_WINDOW:
                self.fail(f.FLOW_CONTROL_ERROR, "the connection window over 2^31-1")
                return
        elif (call := self.calls.get(stream)) is not None:
            call.send_window += increment
        self.pump()

    def emit(self, data: bytes) -> None:
        """Queue bytes; everything one loop iteration produces leaves in one write."""
        self.out.append(data)
        if not self.flushing:
            self.flushing = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flushing = False
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()

    async def run(self, call: Call, handler: Handler) -> None:
        try:
            response = await handler(call)
            if response is not None:
                await self.send_message(call, response.SerializeToString())
            status, message = grpc.StatusCode.OK, ""
        except asyncio.CancelledError:
            if call.sending:  # not by `drop`: whoever cancelled the task waits for that
                raise
            # The stream is gone (drop cancelled us; Envoy resets every ext_proc stream as its exchange ends) and its
            # cleanup ran: end without the error. A task that ends cancelled keeps its CancelledError, whose
            # traceback holds the call's frames while the call holds the task: a cycle per stream that only the
            # garbage collector frees (its full collections then stopped the service for ~100 ms).
            return
        except Abort as abort:
            status, message = abort.code, abort.details
        except Exception:
            log.exception("a call on the lean front end failed")
            status, message = grpc.StatusCode.INTERNAL, "internal error"
        await self.drained(call)
        self.finish(call, status.value[0], message)

    async def send_message(self, call: Call, payload: bytes) -> None:
        if not call.sending:
            return
        if not call.started:
            call.started = True
            self.emit(f.frame(f.HEADERS, f.END_HEADERS, call.stream_id, f.RESPONSE_HEADERS))
        data = b"\x00" + _U32.pack(len(payload)) + payload
        step = self.peer_frame
        for at in range(0, len(data), step):
            piece = data[at:at + step]
            call.pending.append(piece)
            call.pending_bytes += len(piece)
        self.pump(call)
        await self.drained(call)

    async def drained(self, call: Call) -> None:
        """Until what the call wrote left (the peer's windows may hold it back)."""
        while call.pending and call.sending:
            waiter = asyncio.get_running_loop().create_future()
            call.waiters.append(waiter)
            await waiter

    def pump(self, only: Call | None = None) -> None:
        """Send held DATA frames as the windows allow, in order per stream."""
        for call in (only,) if only is not None else tuple(self.calls.values()):
            while call.pending and min(call.send_window, self.send_window) >= len(call.pending[0]):
                piece = call.pending.popleft()
                call.pending_bytes -= len(piece)
                call.send_window -= len(piece)
                self.send_window -= len(piece)
                self.emit(f.frame(f.DATA, 0, call.stream_id, piece))
            if not call.pending:
                for waiter in call.waiters:
                    if not waiter.done():
                        waiter.set_result(None)
                call.waiters.clear()

    def finish(self, call: Call, status: int, message: str = "") -> None:
        if not call.sending:
            return
        call.sending = False
        block = f.trailers(status, message) if call.started else f.trailers_only(status, message)
        self.emit(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, call.stream_id, block))
        self.forget(call)
        if not call.ended:  # we are done before the peer: it need not send the rest (RFC 9113 8.1)
            self.emit(f.rst_stream(call.stream_id, f.NO_ERROR))

    def refuse(self, call: Call, code: grpc.StatusCode, message: str) -> None:
        """End a call whose input broke a bound: status to the peer, the servicer's task cancelled."""
        self.finish(call, code.value[0], message)
        self.drop(call)

    def drop(self, call: Call) -> None:
        """The stream is gone (reset by the peer, refused, or the connection lost): its servicer is cancelled,
        which runs its cleanup (leases released)."""
        call.sending = False
        self.forget(call)
        for waiter in call.waiters:
            if not waiter.done():
                waiter.set_result(None)
        if call.task is not None and not call.task.done():
            call.task.cancel()

    def forget(self, call: Call) -> None:
        self.calls.pop(call.stream_id, None)
        self.data.pop(call.stream_id, None)
        if self.closing and not self.calls and self.transport is not None:
            self.flush()
            self.transport.close()
