"""One Redis connection of the lean RESP client (`extproc.limits.resp`): the asyncio Protocol that writes commands
and hands each reply, in order, to the FIFO of whoever waits for it; and what travels through it (`Script`,
`Posted` calls, and the replies that are not answers: NOSCRIPT, MOVED / ASK).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

import hiredis

from extproc.limits.types import StoreUnavailable

__all__ = ["NOSCRIPT", "Arg", "Connection", "Expired", "NoScript", "Posted", "Redirected", "Script", "expire",
           "is_redirection", "pack"]

Arg = str | bytes | int
NOSCRIPT = "NOSCRIPT"
_log = logging.getLogger(__name__)
# RESP array of bulk strings, packed in C (hiredis' stub types the argument as a 1-tuple).
pack: Callable[[tuple[Arg, ...]], bytes] = hiredis.pack_command  # type: ignore[assignment]


class Script:
    """A Lua script and its SHA-1 (what EVALSHA names it by)."""

    __slots__ = ("body", "sha")

    def __init__(self, body: str) -> None:
        self.body = body
        self.sha = hashlib.sha1(body.encode()).hexdigest()


class NoScript(StoreUnavailable):
    """EVALSHA named a script the server does not have (cache flushed or server restarted)."""


class Redirected(StoreUnavailable):
    """A Redis Cluster node does not serve the key's slot: MOVED (for good) or ASK (this once) to host:port."""

    def __init__(self, message: str) -> None:
        super().__init__(f"redis: {message}")
        kind, slot, target = message.split()[:3]
        host, _, port = target.rpartition(":")
        self.ask, self.slot, self.host, self.port = kind == "ASK", int(slot), host, int(port)


def is_redirection(message: str) -> bool:
    return message.startswith(("MOVED ", "ASK "))


class Expired(Exception):
    """No reply within the call's deadline."""


def expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(Expired())


def expire_all(waiters: Sequence[asyncio.Future[Any]]) -> None:
    for waiter in waiters:
        expire(waiter)


# One script call: the script, its keys, its arguments (`RespClient.evalsha_batch`).
ScriptCall = tuple[Script, Sequence[Arg], Sequence[Arg]]


class Posted:
    """A posted call in the FIFO: its operation name, its command (to send again: EVAL on NOSCRIPT, or to
    another node on MOVED/ASK), its script if it is an EVALSHA (cleared once retried with EVAL), and who
    wants its reply (given the reply, or `StoreUnavailable` if it failed)."""

    __slots__ = ("command", "on_reply", "op", "script")

    def __init__(self, op: str, command: tuple[Arg, ...], script: Script | None = None,
                 on_reply: Callable[[Any], None] | None = None) -> None:
        self.op, self.command, self.script, self.on_reply = op, command, script, on_reply

    def deliver(self, reply: Any) -> None:
        if self.on_reply is not None:
            try:
                self.on_reply(reply)
            except Exception:  # a bad callback must not desynchronise the connection
                _log.exception("redis: reply callback of posted %s failed", self.op)


class Connection(asyncio.Protocol):
    """One socket: writes commands, resolves the FIFO of waiters as replies are parsed."""

    def __init__(self, on_posted_failure: Callable[[Posted, str], None],
                 resend: Callable[[bytes, Posted], None],
                 on_redirect: Callable[[Posted, str], None] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._reader = hiredis.Reader()
        self._transport: asyncio.Transport | None = None
        self._on_posted_failure = on_posted_failure
        self._resend = resend
        self._on_redirect = on_redirect
        self.pending: deque[asyncio.Future[Any] | Posted] = deque()
        self._unsent: list[bytes] = []  # posted commands waiting for the next write
        self._flush_scheduled = False
        self.waiting_since = 0.0  # loop time since when the oldest pending call has had no reply
        self.closed = False
        self.lost = self._loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def send(self, command: bytes, waiter: asyncio.Future[Any] | Posted) -> None:
        """Write `command` now (after any posted commands not written yet)."""
        transport = self._enqueue(waiter)
        if self._unsent:
            self._unsent.append(command)
            self._flush()
        else:
            transport.write(command)

    def send_many(self, commands: Sequence[bytes], waiters: Sequence[asyncio.Future[Any]]) -> None:
        """Write `commands` now in one system call (after any posted commands not written yet); replies resolve
        `waiters` in order."""
        for waiter in waiters:
            self._enqueue(waiter)
        self._unsent.extend(commands)
        self._flush()

    def post(self, command: bytes, posted: Posted) -> None:
        """Write `command` with the next write, at the latest at the end of this event loop iteration:
        posts made together (an access log batch settling many requests) share one system call."""
        self._enqueue(posted)
        self._unsent.append(command)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _enqueue(self, waiter: asyncio.Future[Any] | Posted) -> asyncio.Transport:
        if self.closed or self._transport is None:
            raise StoreUnavailable("redis: connection closed")
        if not self.pending:
            self.waiting_since = self._loop.time()
        self.pending.append(waiter)
        return self._transport

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._unsent and not self.closed and self._transport is not None:
            self._transport.write(b"".join(self._unsent))
        self._unsent.clear()

    def data_received(self, data: bytes) -> None:
        reader, pending = self._reader, self.pending
        reader.feed(data)
        try:
            while (reply := reader.gets()) is not False:
                waiter = pending.popleft()
                if isinstance(waiter, Posted):
                    if isinstance(reply, hiredis.ReplyError):
                        self._posted_error(waiter, str(reply))
                    else:
                        waiter.deliver(reply)
                elif not waiter.done():
                    waiter.set_result(reply)
        except (hiredis.ProtocolError, IndexError) as exc:  # garbage, or a reply nobody asked for
            self.abort(f"redis: protocol error: {exc!r}")
            return
        self.waiting_since = self._loop.time()

    def _posted_error(self, posted: Posted, message: str) -> None:
        if posted.script is not None and message.startswith(NOSCRIPT):
            body, posted.script = posted.script.body, None
            posted.command = ("EVAL", body, *posted.command[2:])
            self._resend(pack(posted.command), posted)
        elif self._on_redirect is not None and is_redirection(message):
            self._on_redirect(posted, message)
        else:
            self._on_posted_failure(posted, message)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_pending(f"redis: connection lost ({exc or 'closed by the server'})")

    def abort(self, reason: str) -> None:
        if self._transport is not None:
            self._transport.abort()
        self._fail_pending(reason)

    def _fail_pending(self, reason: str) -> None:
        self.closed = True
        self._unsent.clear()
        if not self.lost.done():
            self.lost.set_result(None)
        while self.pending:
            waiter = self.pending.popleft()
            if isinstance(waiter, Posted):
                self._on_posted_failure(waiter, reason)
            elif not waiter.done():
                waiter.set_exception(StoreUnavailable(reason))
