"""`RedisStore`: the `Store` shared by every process and replica, one atomic round trip per call.

Semantics are `MemoryStore`'s (see `extproc.limits.memory`; the contract tests run the same cases
against both). `admit` is ONE Lua script (EVALSHA, reloaded automatically on NOSCRIPT) that checks
and takes every dimension atomically, so N replicas can never jointly overshoot a limit; `settle`
is one script; `release` is one pipelined ZREM round trip.

Keys (`prefix` defaults to "lim:"; every key expires on its own):
    <prefix><rate.key>:rb                   token bucket hash {t, s}; TTL 2 x time to refill from empty
    <prefix><conc.key>:cc                   lease ZSET request_id -> expiry; TTL lease_ttl_s
    <prefix><budget.key>:tw<W>:<index>      window counter; TTL to the end of the next window (<= 2W + 1 s)
    <prefix><budgets[0].key>:res:<id>       pending reservation (reserved tokens) until settled
    <prefix><first key>:x:<id>              tombstone of an abandoned admission (60 s, see below)
Times stored are the callers' `now` (wall clock), so replicas' clocks should agree to well under a
window; a bucket never refills backwards when one replica lags.

Redis Cluster: a script may only touch keys of one hash slot. Callers must give every key of one
request the same hash tag, e.g. "{tenant-a}" for the tenant total and "{tenant-a}:model-x" for the
tenant x model limits. Every key above starts with <prefix><caller key>, so it keeps the caller's tag
(the prefix must not contain "{"). `require_hash_tag=True` checks this on every call (ValueError).
This class talks to one endpoint (standalone Redis, a primary, or a cluster-aware proxy); it does not
route by slot itself. On a standalone Redis no tag is needed.

Abandoned admissions: when `admit` times out or is cancelled (the failover deadline), the script may
already have run, may still run later (it sits in Redis's input buffer), or never run. A background
task then runs a CANCEL script (retried with backoff for ~8 s): it leaves a tombstone
`<prefix><first key>:x:<id>` (60 s) so a late admit does nothing, removes the request's leases and
returns its reserved tokens. Without it every timed-out admission would leak a lease (lease_ttl_s)
and its reservation. A bucket token it may have taken is not refunded (the bucket refills). A
request_id cancelled this way is refused ("cancelled") if admitted again within those 60 s.

Availability: every call gets `timeout_ms` overall (socket connect/read timeouts too), no client
retries, and a blocking pool whose wait is bounded by the same deadline. Connection errors, timeouts,
refused AUTH and server errors raise `StoreUnavailable`; the failover layer turns that into a policy.
TLS: a `rediss://` URL (plus `ssl_ca_certs` / client cert options); AUTH: `redis://user:pass@host`.
Call `warm_up()` at start: a cold first call (connect, handshake, SCRIPT LOAD) can exceed 5 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from extproc.limits._lua import ADMIT, CANCEL, SETTLE
from extproc.limits._rules import EPSILON, Observed, bucket_ttl_s, decide, window_index, window_ttl_s
from extproc.limits.types import AdmitRequest, AdmitResult, Reservation, StoreUnavailable

__all__ = ["CANCELLED", "RedisStore", "hash_tag"]

_T = TypeVar("_T")
_log = logging.getLogger(__name__)

CANCELLED = "cancelled"  # refused_by of a request_id whose earlier admission was abandoned
_TOMBSTONE_TTL_S = 60.0
_CANCEL_RETRY_DELAYS_S = (0.0, 0.1, 0.5, 2.0, 5.0)
_CANCEL_MIN_TIMEOUT_S = 0.25
_MAX_PENDING_CANCELS = 10_000


def hash_tag(key: str) -> str | None:
    """The Redis Cluster hash tag of `key` (text between the first "{" and the next "}"), if any."""
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    if end <= start + 1:
        return None
    return key[start + 1:end]


def _ms(seconds: float) -> str:
    return str(max(1, math.ceil(seconds * 1000.0)))


class RedisStore:
    def __init__(self, url: str, *, timeout_ms: float = 50.0, max_connections: int = 64, prefix: str = "lim:",
                 ssl_ca_certs: str | None = None, ssl_certfile: str | None = None, ssl_keyfile: str | None = None,
                 require_hash_tag: bool = False) -> None:
        """`url`: redis://[user:password@]host:port[/db] or rediss:// for TLS. `timeout_ms` bounds each
        call (connect, pool wait, round trip); `max_connections` sizes the blocking pool."""
        if "{" in prefix or "}" in prefix:
            raise ValueError("the key prefix must not contain a hash tag")
        self._timeout_s = timeout_ms / 1000.0
        self._prefix = prefix
        self._require_hash_tag = require_hash_tag
        tls: dict[str, str] = {}
        for name, value in (("ssl_ca_certs", ssl_ca_certs), ("ssl_certfile", ssl_certfile),
                            ("ssl_keyfile", ssl_keyfile)):
            if value is not None:
                tls[name] = value
        pool = BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=self._timeout_s, socket_timeout=self._timeout_s,
            socket_connect_timeout=self._timeout_s, retry=Retry(NoBackoff(), 0), **tls)
        self._redis = Redis.from_pool(pool)
        self._admit = self._redis.register_script(ADMIT)
        self._settle = self._redis.register_script(SETTLE)
        self._cancel = self._redis.register_script(CANCEL)
        self._cancelling: set[asyncio.Task[None]] = set()
        self.cancel_failures_total = 0  # abandoned admissions that could not be undone

    @property
    def cancelling(self) -> int:
        """Abandoned admissions whose undo is still pending."""
        return len(self._cancelling)

    async def admit(self, request: AdmitRequest) -> AdmitResult:
        if not (request.rates or request.concurrency or request.budgets):
            return AdmitResult(admitted=True)
        now, p = request.now, self._prefix
        tokens = max(0, request.tokens)
        if self._require_hash_tag:
            self._check_slot([r.key for r in request.rates] + [c.key for c in request.concurrency]
                             + [b.key for b in request.budgets])
        keys: list[str] = [f"{p}{r.key}:rb" for r in request.rates]
        keys += [f"{p}{c.key}:cc" for c in request.concurrency]
        args: list[str | int | float] = [repr(float(now)), tokens, request.request_id, len(request.rates),
                                         len(request.concurrency), len(request.budgets), repr(EPSILON)]
        for r in request.rates:
            args += [repr(float(r.rate)), repr(float(r.burst)), _ms(bucket_ttl_s(r.rate, r.burst))]
        for c in request.concurrency:
            args += [c.limit, repr(float(c.lease_ttl_s)), _ms(c.lease_ttl_s)]
        marker_ttl = 0.0
        for b in request.budgets:
            index = window_index(now, b.window_s)
            keys += [f"{p}{b.key}:tw{b.window_s}:{index}", f"{p}{b.key}:tw{b.window_s}:{index - 1}"]
            ttl = window_ttl_s(index, b.window_s, now)
            marker_ttl = max(marker_ttl, ttl)
            args += [b.limit, b.window_s, index, _ms(ttl)]
        if request.budgets:
            keys.append(self._marker(request.budgets[0].key, request.request_id))
            args.append(_ms(marker_ttl))
        keys.append(self._tombstone(request))
        try:
            reply: list[bytes | int] = await self._call(self._admit(keys, args))
        except (StoreUnavailable, asyncio.CancelledError):
            self._abandon(request)
            raise
        if int(reply[0]) < 0:
            return AdmitResult(admitted=False, refused_by=CANCELLED, retry_after_s=_TOMBSTONE_TTL_S)
        return decide(request, _parse(reply, len(request.rates), len(request.concurrency), len(request.budgets)))

    async def release(self, reservation: Reservation, now: float) -> None:
        if not reservation.concurrency:
            return
        pipe = self._redis.pipeline(transaction=False)
        for c in reservation.concurrency:
            pipe.zrem(f"{self._prefix}{c.key}:cc", reservation.request_id)
        await self._call(pipe.execute())

    async def settle(self, reservation: Reservation, actual_tokens: int, now: float) -> None:
        if not reservation.budgets:
            return
        keys = [self._marker(reservation.budgets[0].key, reservation.request_id)]
        args: list[str | int] = [max(0, actual_tokens)]
        for b in reservation.budgets:
            charged = window_index(reservation.admitted_at, b.window_s)
            if charged < window_index(now, b.window_s) - 1:
                continue  # that window no longer counts
            keys.append(f"{self._prefix}{b.key}:tw{b.window_s}:{charged}")
            args.append(_ms(window_ttl_s(charged, b.window_s, now)))
        await self._call(self._settle(keys, args))

    async def ping(self) -> None:
        await self._call(self._redis.ping())

    async def warm_up(self, connections: int = 4) -> None:
        """Open `connections` pooled connections and load the scripts, so that the first admissions
        do not pay connect + handshake + SCRIPT LOAD against a 5 ms failover deadline. Call at start;
        raises StoreUnavailable (with a longer allowance of 1 s) if Redis cannot be reached."""
        async with asyncio.timeout(max(1.0, self._timeout_s)):
            try:
                await asyncio.gather(*(self._redis.ping() for _ in range(max(1, connections))))
                for script in (self._admit, self._settle, self._cancel):
                    script.sha = await self._redis.script_load(script.script)
            except (RedisError, OSError) as exc:
                raise StoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        for task in list(self._cancelling):
            task.cancel()
        await asyncio.gather(*self._cancelling, return_exceptions=True)
        await self._redis.aclose()

    def _marker(self, budget_key: str, request_id: str) -> str:
        return f"{self._prefix}{budget_key}:res:{request_id}"

    def _tombstone(self, request: AdmitRequest) -> str:
        first = [b.key for b in request.budgets] + [c.key for c in request.concurrency] + [r.key for r in request.rates]
        return f"{self._prefix}{first[0] if first else ''}:x:{request.request_id}"

    # --- undoing abandoned admissions -----------------------------------------------------------

    def _abandon(self, request: AdmitRequest) -> None:
        if len(self._cancelling) >= _MAX_PENDING_CANCELS:
            self.cancel_failures_total += 1
            return
        task = asyncio.get_running_loop().create_task(self._cancel_with_retries(request))
        self._cancelling.add(task)
        task.add_done_callback(self._cancelling.discard)

    async def _cancel_with_retries(self, request: AdmitRequest) -> None:
        p = self._prefix
        keys = [self._tombstone(request)] + [f"{p}{c.key}:cc" for c in request.concurrency]
        if request.budgets:
            keys.append(self._marker(request.budgets[0].key, request.request_id))
            keys += [f"{p}{b.key}:tw{b.window_s}:{window_index(request.now, b.window_s)}" for b in request.budgets]
        args: list[str | int] = [request.request_id, _ms(_TOMBSTONE_TTL_S), len(request.concurrency)]
        for delay in _CANCEL_RETRY_DELAYS_S:
            await asyncio.sleep(delay)
            try:
                async with asyncio.timeout(max(self._timeout_s, _CANCEL_MIN_TIMEOUT_S)):
                    await self._cancel(keys, args)
                return
            except (RedisError, OSError, TimeoutError):
                continue
        self.cancel_failures_total += 1
        _log.warning("could not undo abandoned admission %s; its leases expire by TTL", request.request_id)

    def _check_slot(self, keys: Sequence[str]) -> None:
        tags = {hash_tag(k) for k in keys}
        if None in tags or len(tags) > 1:
            raise ValueError(f"keys of one request must share one hash tag for Redis Cluster: {list(keys)}")

    async def _call(self, pending: Awaitable[_T]) -> _T:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await pending
        except (RedisConnectionError, OSError) as exc:
            # A restarted Redis leaves every pooled connection broken; drop the idle ones now so the
            # next calls reconnect instead of each failing once on its own stale socket.
            with contextlib.suppress(Exception):
                await self._redis.connection_pool.disconnect(inuse_connections=False)
            raise StoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc
        except (RedisError, TimeoutError) as exc:
            raise StoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc


def _parse(reply: list[bytes | int], n_rates: int, n_conc: int, n_budgets: int) -> Observed:
    at = 1
    levels = [float(reply[at + i]) for i in range(n_rates)]
    at += n_rates
    leases_ok: list[bool] = []
    live: list[int] = []
    earliest: list[float | None] = []
    for _ in range(n_conc):
        first = reply[at + 2]
        leases_ok.append(int(reply[at]) == 1)
        live.append(int(reply[at + 1]))
        earliest.append(float(first) if first not in (b"", "") else None)
        at += 3
    windows = [(float(reply[at + 2 * b]), float(reply[at + 2 * b + 1])) for b in range(n_budgets)]
    return Observed(int(reply[0]) == 1, levels, leases_ok, live, earliest, windows)
