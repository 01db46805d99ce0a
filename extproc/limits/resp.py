"""A lean asyncio Redis client for the limits hot path: one pipelined connection, RESP2, hiredis.

Why not redis-py: its asyncio client costs ~300 us of CPU per EVALSHA (connection pool checkout,
command objects, a reader coroutine per call); the limits store makes a few calls per request on the
service's one core. Here a call is: pack the command (`hiredis.pack_command`, C), one
`transport.write`, one future in a FIFO; replies are parsed by `hiredis.Reader` in the protocol's
`data_received` callback, which resolves the futures in order. Many calls share the connection
(pipelining): no pool, no per-call task.

- `call` waits for the reply (bounded by `timeout_s`, a timer on the reply's future: a reply parsed
  in the loop iteration where the deadline passes still counts); an error reply, a lost connection,
  a timeout or a failed connect raise `StoreUnavailable`. A caller that times out or is cancelled
  abandons its future, which stays in the FIFO and takes its reply when it comes: the FIFO never
  desynchronises.
- `post` queues a command and returns at once; posted commands are written together at the end of
  the event loop iteration (or with the next `call`, ahead of it), their replies checked when they
  arrive: an error reply (or the connection dying first) is counted in `posted_failures` and
  reported to `on_posted_failure`.
- `evalsha` / `post_evalsha` run a `Script` by SHA and, on NOSCRIPT (script cache flushed, Redis
  restarted), run it again with EVAL, which also caches it.
- A MOVED or ASK reply (Redis Cluster) raises `Redirected` for a call, and goes to `on_redirect` for a
  posted command (which may `repost` it elsewhere); `extproc.limits.cluster` follows them.
- Connect: `redis[s]://[user:password@]host[:port][/db]` (TLS: optional CA file and client
  certificate), then AUTH, SELECT and SCRIPT LOAD of the client's scripts (a posted EVALSHA stays in
  order with later calls). One connect at a time, shared by every waiter, bounded by
  `connect_timeout_s` only; after a failure calls fail at once for a backoff doubling from 50 ms to
  500 ms. A connection that dies fails all its pending calls; the next call reconnects. A caller giving
  up on a connection silent for over `stale_after_s` drops it (its pending calls fail).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import hiredis

from extproc.limits.types import StoreTimeout, StoreUnavailable

__all__ = ["Address", "Posted", "Redirected", "RespClient", "Script"]

Arg = str | bytes | int
_BACKOFF_FIRST_S = 0.05
_BACKOFF_MAX_S = 0.5
_NOSCRIPT = "NOSCRIPT"
_log = logging.getLogger(__name__)
# RESP array of bulk strings, packed in C (hiredis' stub types the argument as a 1-tuple).
_pack: Callable[[tuple[Arg, ...]], bytes] = hiredis.pack_command  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class Address:
    """Where and how to connect: parsed from a redis:// or rediss:// URL."""

    host: str
    port: int
    username: str | None = None
    password: str | None = None
    db: int = 0
    tls: ssl.SSLContext | None = None

    @classmethod
    def from_url(cls, url: str, *, ssl_ca_certs: str | None = None, ssl_certfile: str | None = None,
                 ssl_keyfile: str | None = None) -> Address:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(f"not a redis:// or rediss:// URL: {parts.scheme}://...")
        path = parts.path.strip("/")
        if path and not path.isdigit():
            raise ValueError(f"the database in a Redis URL must be a number, got {path!r}")
        tls = None
        if parts.scheme == "rediss":
            tls = ssl.create_default_context(cafile=ssl_ca_certs)
            if ssl_certfile is not None:
                tls.load_cert_chain(ssl_certfile, ssl_keyfile)
        return cls(parts.hostname or "127.0.0.1", parts.port or 6379,
                   unquote(parts.username) if parts.username else None,
                   unquote(parts.password) if parts.password is not None else None,
                   int(path) if path else 0, tls)

    def handshake(self) -> list[tuple[Arg, ...]]:
        """Commands sent on every new connection before anything else."""
        commands: list[tuple[Arg, ...]] = []
        if self.password is not None:
            commands.append(("AUTH", self.username, self.password) if self.username else ("AUTH", self.password))
        if self.db:
            commands.append(("SELECT", self.db))
        return commands


class Script:
    """A Lua script and its SHA-1 (what EVALSHA names it by)."""

    __slots__ = ("body", "sha")

    def __init__(self, body: str) -> None:
        self.body = body
        self.sha = hashlib.sha1(body.encode()).hexdigest()


class _NoScript(StoreUnavailable):
    """EVALSHA named a script the server does not have (cache flushed or server restarted)."""


class Redirected(StoreUnavailable):
    """A Redis Cluster node does not serve the key's slot: MOVED (for good) or ASK (this once) to host:port."""

    def __init__(self, message: str) -> None:
        super().__init__(f"redis: {message}")
        kind, slot, target = message.split()[:3]
        host, _, port = target.rpartition(":")
        self.ask, self.slot, self.host, self.port = kind == "ASK", int(slot), host, int(port)


def _redirection(message: str) -> bool:
    return message.startswith(("MOVED ", "ASK "))


class _Expired(Exception):
    """No reply within the call's deadline."""


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(_Expired())


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


class _Connection(asyncio.Protocol):
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
        if posted.script is not None and message.startswith(_NOSCRIPT):
            body, posted.script = posted.script.body, None
            posted.command = ("EVAL", body, *posted.command[2:])
            self._resend(_pack(posted.command), posted)
        elif self._on_redirect is not None and _redirection(message):
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


class RespClient:
    def __init__(self, address: Address, *, timeout_s: float, scripts: Sequence[Script] = (),
                 connect_timeout_s: float | None = None, stale_after_s: float | None = None,
                 max_pending: int = 10_000, on_posted_failure: Callable[[str, str], None] | None = None,
                 on_redirect: Callable[[Posted, str], None] | None = None) -> None:
        self._address = address
        self._scripts = tuple(scripts)
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s if connect_timeout_s is not None else max(1.0, timeout_s)
        self._stale_after_s = stale_after_s if stale_after_s is not None else max(1.0, 20.0 * timeout_s)
        self._max_pending = max_pending
        self._on_posted_failure = on_posted_failure
        self._on_redirect = on_redirect
        self._conn: _Connection | None = None
        self._connecting: asyncio.Task[_Connection] | None = None
        self._retry_at = 0.0
        self._backoff_s = _BACKOFF_FIRST_S
        self.posted_failures: dict[str, int] = {}  # operation -> posted calls that failed

    # --- calls ----------------------------------------------------------------------------------

    async def call(self, *args: Arg) -> Any:
        """Run one command and return its reply."""
        return await self._call(_pack(args))

    async def evalsha(self, script: Script, keys: Sequence[Arg], args: Sequence[Arg],
                      timeout_s: float | None = None) -> Any:
        """Run `script` (by SHA; by body after NOSCRIPT) and return its reply, waiting at most
        `timeout_s` (default: the client's) for it."""
        try:
            return await self._call(_pack(("EVALSHA", script.sha, len(keys), *keys, *args)), timeout_s)
        except _NoScript:
            return await self._call(_pack(("EVAL", script.body, len(keys), *keys, *args)), timeout_s)

    async def post(self, op: str, *args: Arg) -> None:
        """Write one command without waiting for its reply (see the module docstring)."""
        conn = await self._ready()
        conn.post(_pack(args), Posted(op, args))

    async def post_evalsha(self, op: str, script: Script, keys: Sequence[Arg], args: Sequence[Arg],
                           on_reply: Callable[[Any], None] | None = None) -> None:
        """`post` of a script: on NOSCRIPT it is sent again with EVAL. `on_reply` (if given) gets the
        reply when it arrives, or a `StoreUnavailable` if the call failed (also reported as a posted
        failure); it is called from the connection's callback and must not block."""
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        conn = await self._ready()
        conn.post(_pack(command), Posted(op, command, script, on_reply))

    async def repost(self, posted: Posted, asking: bool = False) -> None:
        """Post `posted` here (it was redirected from another node), after ASKING if `asking`; if this
        node cannot be reached it fails as a posted call."""
        try:
            conn = await self._ready()
        except StoreUnavailable as exc:
            self._posted_failed(posted, str(exc))
            return
        if asking:
            conn.post(_pack(("ASKING",)), Posted("asking", ("ASKING",)))
        conn.post(_pack(posted.command), posted)

    async def connect(self) -> None:
        """Connect now (if not connected), bounded by the connect timeout rather than `timeout_s`."""
        await self._connection()

    async def close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
            await asyncio.gather(self._connecting, return_exceptions=True)
            self._connecting = None
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.abort("redis: client closed")
            await conn.lost

    # --- internals ------------------------------------------------------------------------------

    async def _ready(self, timeout_s: float | None = None) -> _Connection:
        """The open connection (connecting if needed, within `timeout_s`), with room in its FIFO."""
        conn = self._conn
        if conn is None or conn.closed:
            timeout_s = self._timeout_s if timeout_s is None else timeout_s
            try:
                async with asyncio.timeout(timeout_s):
                    conn = await self._connection()
            except TimeoutError:
                raise StoreUnavailable(f"redis: not connected within {timeout_s * 1000:g} ms") from None
        self._check_backlog(conn)
        return conn

    async def _call(self, command: bytes, timeout_s: float | None = None) -> Any:
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        conn = await self._ready(timeout_s)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()
        conn.send(command, waiter)
        # The deadline is on the reply itself, not on this task: a reply parsed in the same loop
        # iteration the deadline passes (the process was descheduled meanwhile) still counts.
        expiry = loop.call_later(timeout_s, _expire, waiter)
        try:
            reply = await waiter
        except _Expired:
            self._drop_if_stale(conn)
            raise StoreTimeout(f"redis: no reply within {timeout_s * 1000:g} ms") from None
        except asyncio.CancelledError:
            self._drop_if_stale(conn)
            raise
        finally:
            expiry.cancel()
        if isinstance(reply, hiredis.ReplyError):
            message = str(reply)
            if message.startswith(_NOSCRIPT):
                raise _NoScript(message)
            if _redirection(message):
                raise Redirected(message)
            if message.startswith("TRYAGAIN"):  # a cluster slot half-migrated: like a late reply, this once
                raise StoreTimeout(f"redis: {message}")
            raise StoreUnavailable(f"redis: {message}")
        return reply

    def _check_backlog(self, conn: _Connection) -> None:
        if len(conn.pending) >= self._max_pending:
            raise StoreUnavailable(f"redis: {len(conn.pending)} calls already waiting for replies")

    def _drop_if_stale(self, conn: _Connection | None) -> None:
        if conn is None or conn.closed or not conn.pending:
            return
        waited = asyncio.get_running_loop().time() - conn.waiting_since
        if waited > self._stale_after_s:
            conn.abort(f"redis: no reply for {waited:.1f} s; reconnecting")

    async def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        if self._connecting is None:
            loop = asyncio.get_running_loop()
            if loop.time() < self._retry_at:
                raise StoreUnavailable("redis: unreachable, next connect attempt after a backoff")
            self._connecting = loop.create_task(self._open())
            self._connecting.add_done_callback(self._connected)
        return await asyncio.shield(self._connecting)

    def _connected(self, task: asyncio.Task[_Connection]) -> None:
        self._connecting = None
        if task.cancelled():
            return
        if task.exception() is not None:  # retrieved here: waiters may all have given up already
            self._retry_at = asyncio.get_running_loop().time() + self._backoff_s
            self._backoff_s = min(_BACKOFF_MAX_S, 2.0 * self._backoff_s)
            return
        self._conn = task.result()
        self._backoff_s = _BACKOFF_FIRST_S

    async def _open(self) -> _Connection:
        address, loop = self._address, asyncio.get_running_loop()
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self._posted_failed, self._resend, self._on_redirect), address.host,
                    address.port,
                    ssl=address.tls, server_hostname=address.host if address.tls else None)
                waiters: list[asyncio.Future[Any]] = []
                for command in [*address.handshake(), *(("SCRIPT", "LOAD", s.body) for s in self._scripts)]:
                    waiters.append(loop.create_future())
                    conn.send(_pack(command), waiters[-1])
                for reply in await asyncio.gather(*waiters):
                    if isinstance(reply, hiredis.ReplyError):
                        raise StoreUnavailable(f"redis: {reply}")
        except BaseException as exc:
            if conn is not None:
                conn.abort("redis: connect or handshake failed")
            if isinstance(exc, OSError | TimeoutError):  # refused, unreachable, TLS (ssl.SSLError), too slow
                raise StoreUnavailable(f"redis: cannot connect to {address.host}:{address.port}: "
                                       f"{type(exc).__name__}: {exc}") from exc
            raise
        return conn

    def _resend(self, command: bytes, posted: Posted) -> None:
        conn = self._conn
        if conn is None or conn.closed:
            self._posted_failed(posted, "redis: connection closed before a NOSCRIPT retry")
            return
        conn.send(command, posted)

    def _posted_failed(self, posted: Posted, reason: str) -> None:
        """A posted call failed: count it, report it, and give its reply callback the failure."""
        self.posted_failures[posted.op] = self.posted_failures.get(posted.op, 0) + 1
        if self._on_posted_failure is not None:
            self._on_posted_failure(posted.op, reason)
        posted.deliver(StoreUnavailable(reason))
