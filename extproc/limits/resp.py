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
- The connection itself (the FIFO of waiters, reply parsing, posted writes) is
  `extproc.limits.resp_connection.Connection`; this module owns connecting, deadlines and backoff.
- Connect to an `Address` (`extproc.limits.redis_address`: the URL's host, credentials and database, and
  TLS), then AUTH, SELECT and SCRIPT LOAD of the client's scripts (a posted EVALSHA stays in order with
  later calls). One connect at a time, shared by every waiter, bounded by
  `connect_timeout_s` only; after a failure calls fail at once for a backoff doubling from 50 ms to
  500 ms. A connection that dies fails all its pending calls; the next call reconnects. A caller giving
  up on a connection silent for over `stale_after_s` drops it (its pending calls fail).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import hiredis

from extproc.limits.redis_address import Address
from extproc.limits.resp_connection import (
    NOSCRIPT,
    Arg,
    Connection,
    Expired,
    NoScript,
    Posted,
    Redirected,
    Script,
    ScriptCall,
    expire,
    expire_all,
    is_redirection,
    pack,
)
from extproc.limits.types import StoreTimeout, StoreUnavailable

__all__ = ["Address", "Arg", "Posted", "Redirected", "RespClient", "Script", "ScriptCall"]

_BACKOFF_FIRST_S = 0.05
_BACKOFF_MAX_S = 0.5


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
        self._conn: Connection | None = None
        self._connecting: asyncio.Task[Connection] | None = None
        self._retry_at = 0.0
        self._backoff_s = _BACKOFF_FIRST_S
        self.posted_failures: dict[str, int] = {}  # operation -> posted calls that failed

    @property
    def timeout_s(self) -> float:
        """How long a call waits for its reply by default."""
        return self._timeout_s

    # --- calls ----------------------------------------------------------------------------------

    async def call(self, *args: Arg) -> Any:
        """Run one command and return its reply."""
        return await self._call(pack(args))

    async def call_at(self, key: Arg, *args: Arg) -> Any:
        """`call`, for a command whose key is not its first argument (one node: `key` is not used)."""
        return await self._call(pack(args))

    async def evalsha(self, script: Script, keys: Sequence[Arg], args: Sequence[Arg],
                      timeout_s: float | None = None) -> Any:
        """Run `script` (by SHA; by body after NOSCRIPT) and return its reply, waiting at most
        `timeout_s` (default: the client's) for it."""
        try:
            return await self._call(pack(("EVALSHA", script.sha, len(keys), *keys, *args)), timeout_s)
        except NoScript:
            return await self._call(pack(("EVAL", script.body, len(keys), *keys, *args)), timeout_s)

    async def evalsha_batch(self, calls: Sequence[ScriptCall], timeout_s: float | None = None) -> list[Any]:
        """Several scripts written in one system call (pipelined; their replies come in order, usually in one
        read), each waited for at most `timeout_s`: per call its reply, or the `StoreUnavailable` it failed with
        (every call's, when there is no connection to send them on)."""
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        try:
            conn = await self._ready(timeout_s)
        except StoreUnavailable as exc:
            return [exc] * len(calls)
        loop = asyncio.get_running_loop()
        waiters: list[asyncio.Future[Any]] = [loop.create_future() for _ in calls]
        conn.send_many([pack(("EVALSHA", script.sha, len(keys), *keys, *args)) for script, keys, args in calls],
                       waiters)
        expiry = loop.call_later(timeout_s, expire_all, waiters)
        results: list[Any] = []
        try:
            for (script, keys, args), waiter in zip(calls, waiters, strict=True):
                try:
                    results.append(self._interpret(await waiter))
                except Expired:
                    self._drop_if_stale(conn)
                    results.append(StoreTimeout(f"redis: no reply within {timeout_s * 1000:g} ms"))
                except NoScript:
                    try:
                        results.append(await self._call(pack(("EVAL", script.body, len(keys), *keys, *args)),
                                                        timeout_s))
                    except StoreUnavailable as exc:
                        results.append(exc)
                except StoreUnavailable as exc:
                    results.append(exc)
        except asyncio.CancelledError:
            self._drop_if_stale(conn)
            raise
        finally:
            expiry.cancel()
        return results

    async def post(self, op: str, *args: Arg) -> None:
        """Write one command without waiting for its reply (see the module docstring)."""
        conn = await self._ready()
        conn.post(pack(args), Posted(op, args))

    async def post_evalsha(self, op: str, script: Script, keys: Sequence[Arg], args: Sequence[Arg],
                           on_reply: Callable[[Any], None] | None = None) -> None:
        """`post` of a script: on NOSCRIPT it is sent again with EVAL. `on_reply` (if given) gets the
        reply when it arrives, or a `StoreUnavailable` if the call failed (also reported as a posted
        failure); it is called from the connection's callback and must not block."""
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        conn = await self._ready()
        conn.post(pack(command), Posted(op, command, script, on_reply))

    async def repost(self, posted: Posted, asking: bool = False) -> None:
        """Post `posted` here (it was redirected from another node), after ASKING if `asking`; if this
        node cannot be reached it fails as a posted call."""
        try:
            conn = await self._ready()
        except StoreUnavailable as exc:
            self._posted_failed(posted, str(exc))
            return
        if asking:
            conn.post(pack(("ASKING",)), Posted("asking", ("ASKING",)))
        conn.post(pack(posted.command), posted)

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

    async def _ready(self, timeout_s: float | None = None) -> Connection:
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
        expiry = loop.call_later(timeout_s, expire, waiter)
        try:
            reply = await waiter
        except Expired:
            self._drop_if_stale(conn)
            raise StoreTimeout(f"redis: no reply within {timeout_s * 1000:g} ms") from None
        except asyncio.CancelledError:
            self._drop_if_stale(conn)
            raise
        finally:
            expiry.cancel()
        return self._interpret(reply)

    @staticmethod
    def _interpret(reply: Any) -> Any:
        """A reply, or the exception its error stands for."""
        if isinstance(reply, hiredis.ReplyError):
            message = str(reply)
            if message.startswith(NOSCRIPT):
                raise NoScript(message)
            if is_redirection(message):
                raise Redirected(message)
            if message.startswith("TRYAGAIN"):  # a cluster slot half-migrated: like a late reply, this once
                raise StoreTimeout(f"redis: {message}")
            raise StoreUnavailable(f"redis: {message}")
        return reply

    def _check_backlog(self, conn: Connection) -> None:
        if len(conn.pending) >= self._max_pending:
            raise StoreUnavailable(f"redis: {len(conn.pending)} calls already waiting for replies")

    def _drop_if_stale(self, conn: Connection | None) -> None:
        if conn is None or conn.closed or not conn.pending:
            return
        waited = asyncio.get_running_loop().time() - conn.waiting_since
        if waited > self._stale_after_s:
            conn.abort(f"redis: no reply for {waited:.1f} s; reconnecting")

    async def _connection(self) -> Connection:
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

    def _connected(self, task: asyncio.Task[Connection]) -> None:
        self._connecting = None
        if task.cancelled():
            return
        if task.exception() is not None:  # retrieved here: waiters may all have given up already
            self._retry_at = asyncio.get_running_loop().time() + self._backoff_s
            self._backoff_s = min(_BACKOFF_MAX_S, 2.0 * self._backoff_s)
            return
        self._conn = task.result()
        self._backoff_s = _BACKOFF_FIRST_S

    async def _open(self) -> Connection:
        address, loop = self._address, asyncio.get_running_loop()
        conn: Connection | None = None
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: Connection(self._posted_failed, self._resend, self._on_redirect), address.host,
                    address.port,
                    ssl=address.tls, server_hostname=address.tls_server_name)
                waiters: list[asyncio.Future[Any]] = []
                for command in [*address.handshake(), *(("SCRIPT", "LOAD", s.body) for s in self._scripts)]:
                    waiters.append(loop.create_future())
                    conn.send(pack(command), waiters[-1])
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
