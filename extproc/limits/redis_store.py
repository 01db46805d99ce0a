"""`RedisStore`: the `Store` shared by every process and replica (the README's "The limits model").

`admit` is ONE Lua script (EVALSHA, EVAL on NOSCRIPT) that checks and takes every dimension atomically;
with `slices`, a request inside this replica's slices is admitted at once and recorded by a posted
script. `release` (ZREM) and `settle` (a script) are posted: written without waiting, an error reply or a
lost connection counted in `posted_failures` and reported to `on_posted_failure(op, reason)`. `ping()`
waits for every call posted before it. Semantics are `MemoryStore`'s (same contract tests).

Keys (`prefix` "lim:" by default, each with its own expiry; every key starts with <prefix><caller key>, so
keeps the caller's hash tag: one request's keys must share one for Redis Cluster, `require_hash_tag`
checks it):
    <key>:rb  bucket {t, s}        <key>:cc  lease ZSET id -> expiry      <key>:sl  slices (claims)
    <key>:tw<W>:<index>  window     <key>:res:<id>  pending reservation    <first key>:x:<id>  tombstone
Times stored are the callers' `now` (wall clock): replicas' clocks should agree to well under a slice's ttl.

An admission that times out (or is cancelled) may have run, may still run or never run: unless the
caller `keep`s it (it admitted the request anyway), a background CANCEL (retried ~8 s) leaves a 60 s
tombstone (a late ADMIT then does nothing; that request_id is refused "cancelled"), removes its leases and
returns its tokens. One pipelined connection (`extproc.limits.resp`, or `extproc.limits.cluster`); every
awaited call bounded by `timeout_ms`, admissions by `admit_timeout_ms`; failures raise `StoreUnavailable`.
Call `warm_up()` at start (connect + SCRIPT LOAD can exceed a decision deadline).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from functools import partial

from extproc.limits import _lua
from extproc.limits._rules import EPSILON, Observed, bucket_ttl_s, decide, window_index, window_ttl_s
from extproc.limits.cluster import hash_tag, redis_client
from extproc.limits.redis_address import RedisTls
from extproc.limits.resp import Arg, Script
from extproc.limits.slices import KEEP, Slices
from extproc.limits.types import AdmitRequest, AdmitResult, Reservation, StoreUnavailable

__all__ = ["CANCELLED", "RedisStore", "hash_tag"]

_log = logging.getLogger(__name__)

CANCELLED = "cancelled"  # refused_by of a request_id whose earlier admission was abandoned
_TOMBSTONE_TTL_S = 60.0
_CANCEL_RETRY_DELAYS_S = (0.0, 0.1, 0.5, 2.0, 5.0)
_CANCEL_MIN_TIMEOUT_S = 0.25
_MAX_PENDING_CANCELS = 10_000
_WARM_UP_MIN_S = 1.0


def _ms(seconds: float) -> str:
    return str(max(1, math.ceil(seconds * 1000.0)))


class RedisStore:
    ADMIT = Script(_lua.ADMIT)
    SETTLE = Script(_lua.SETTLE)
    CANCEL = Script(_lua.CANCEL)
    SCRIPTS = (ADMIT, SETTLE, CANCEL)

    def __init__(self, url: str, *, timeout_ms: float = 50.0, admit_timeout_ms: float | None = None,
                 prefix: str = "lim:", tls: RedisTls | None = None, require_hash_tag: bool = False,
                 slices: Slices | None = None, cluster: bool = False) -> None:
        """`url`: redis://[user:password@]host:port[/db] or rediss:// for TLS (`tls`). `timeout_ms` bounds each
        awaited call (waiting for a connect included); `admit_timeout_ms` (default the same) bounds
        admissions: give it the failover's decision deadline (and the failover none of its own), so
        that a reply read in the loop iteration where the deadline passes still counts. `slices`: admit
        without waiting within this replica's slices. `cluster`: `url` names a node of a Redis Cluster (every
        key of a request must then share one hash tag)."""
        if "{" in prefix or "}" in prefix:
            raise ValueError("the key prefix must not contain a hash tag")
        self._timeout_s = timeout_ms / 1000.0
        self._admit_timeout_s = admit_timeout_ms / 1000.0 if admit_timeout_ms is not None else self._timeout_s
        self._prefix = prefix
        self._require_hash_tag = require_hash_tag or cluster
        self._client = redis_client(url, cluster=cluster, timeout_s=self._timeout_s, scripts=self.SCRIPTS,
                                    on_posted_failure=self._posted_failed, tls=tls)
        self._cancelling: dict[AdmitRequest, asyncio.Task[None]] = {}
        self.cancel_failures_total = 0  # abandoned admissions that could not be undone
        self.posted_failures: dict[str, int] = {}  # posted calls (release, settle, record) that failed, by op
        self.on_posted_failure: Callable[[str, str], None] | None = None  # (op, reason) of a failed posted call
        self.slices = slices

    async def admit(self, request: AdmitRequest) -> AdmitResult:
        if not (request.rates or request.concurrency or request.budgets):
            return AdmitResult(admitted=True)
        local = await self.admit_local(request)
        return local if local is not None else await self._decide(request)

    async def admit_local(self, request: AdmitRequest) -> AdmitResult | None:
        """The admission from this replica's slices, recorded without waiting; None if it does not fit
        (the failover layer asks this while Redis is marked down)."""
        local = self.slices.take(request) if self.slices is not None else None
        if local is not None:
            await self._record_local(request)
        return local

    async def _record_local(self, request: AdmitRequest) -> None:
        try:
            await self._record(request)
        except StoreUnavailable as exc:  # the claim covers it; Redis will not see the recording
            self._posted_failed("record", str(exc))

    async def _decide(self, request: AdmitRequest) -> AdmitResult:
        slices = self.slices
        wants = slices.wants(request) if slices is not None else None
        keys, args = self._admit_call(request, wants, forced=False)
        reply: list[bytes | int] = [-1]
        try:
            reply = await self._client.evalsha(self.ADMIT, keys, args, self._admit_timeout_s)
        except (StoreUnavailable, asyncio.CancelledError):
            self._abandon(request)
            raise
        finally:
            if slices is not None and wants is not None and int(reply[0]) < 0:
                slices.failed(request, wants)  # no answer, or cancelled: the slices asked for are not granted
        if int(reply[0]) < 0:
            return AdmitResult(admitted=False, refused_by=CANCELLED, retry_after_s=_TOMBSTONE_TTL_S)
        seen, granted = _parse(reply, request)
        result = decide(request, seen)
        if slices is not None and wants is not None:
            slices.decided(request, wants, result.states, granted)
            if not result.admitted and KEEP in wants:
                # Decided while another call replaced this replica's claim: Redis counted the new claim as
                # used, and that call's reply (the new slice) came first on the connection. A request that
                # fits in the slice is this replica's to admit, as if it had come a moment later.
                local = slices.take(request, again=True)
                if local is not None:
                    await self._record_local(request)
                    return local
        return result

    async def _record(self, request: AdmitRequest) -> None:
        """Post the admission of a request admitted from the slices (it takes every dimension)."""
        keys, args = self._admit_call(request, None, forced=True)
        await self._client.post_evalsha("record", self.ADMIT, keys, args, on_reply=partial(self._recorded, request))

    def _recorded(self, request: AdmitRequest, reply: object) -> None:
        if self.slices is not None and isinstance(reply, list) and int(reply[0]) > 0:
            self.slices.recorded(request, reply[1:])  # else failed (a posted failure) or cancelled

    def _admit_call(self, request: AdmitRequest, wants: Sequence[int] | None, forced: bool
                    ) -> tuple[list[Arg], list[Arg]]:
        """KEYS and ARGV of the ADMIT script for `request` (see `extproc.limits._lua`)."""
        now, p = request.now, self._prefix
        names = [r.key for r in request.rates] + [c.key for c in request.concurrency] + [b.key for b in request.budgets]
        if self._require_hash_tag:
            self._check_slot(names)
        slices = self.slices
        want = iter(wants if wants is not None else ())
        keep = str(KEEP)
        keys: list[Arg] = [f"{p}{r.key}:rb" for r in request.rates]
        keys += [f"{p}{c.key}:cc" for c in request.concurrency]
        args: list[Arg] = [repr(float(now)), max(0, request.tokens), request.request_id, len(request.rates),
                           len(request.concurrency), len(request.budgets), repr(EPSILON), "1" if forced else "0",
                           slices.replica if slices is not None else "", repr(slices.ttl_s if slices else 1.0)]
        for r in request.rates:
            args += [repr(float(r.rate)), repr(float(r.burst)), _ms(bucket_ttl_s(r.rate, r.burst)), next(want, keep)]
        for c in request.concurrency:
            args += [c.limit, repr(float(c.lease_ttl_s)), _ms(c.lease_ttl_s), next(want, keep)]
        marker_ttl = 0.0
        for b in request.budgets:
            index = window_index(now, b.window_s)
            keys += [f"{p}{b.key}:tw{b.window_s}:{index}", f"{p}{b.key}:tw{b.window_s}:{index - 1}"]
            ttl = window_ttl_s(index, b.window_s, now)
            marker_ttl = max(marker_ttl, ttl)
            args += [b.limit, b.window_s, index, _ms(ttl), next(want, keep)]
        keys += [f"{p}{name}:sl" for name in names]
        if request.budgets:
            keys.append(self._marker(request.budgets[0].key, request.request_id))
            args.append(_ms(marker_ttl))
        keys.append(self._tombstone(request))
        return keys, args

    async def release(self, reservation: Reservation, now: float) -> None:
        for c in reservation.concurrency:
            await self._client.post("release", "ZREM", f"{self._prefix}{c.key}:cc", reservation.request_id)

    async def settle(self, reservation: Reservation, actual_tokens: int, now: float) -> None:
        if not reservation.budgets:
            return
        keys: list[Arg] = [self._marker(reservation.budgets[0].key, reservation.request_id)]
        args: list[Arg] = [max(0, actual_tokens)]
        for b in reservation.budgets:
            charged = window_index(reservation.admitted_at, b.window_s)
            if charged < window_index(now, b.window_s) - 1:
                continue  # that window no longer counts
            keys.append(f"{self._prefix}{b.key}:tw{b.window_s}:{charged}")
            args.append(_ms(window_ttl_s(charged, b.window_s, now)))
        await self._client.post_evalsha("settle", self.SETTLE, keys, args)

    async def ping(self) -> None:
        """One round trip; it also waits for every call posted before it."""
        await self._client.call("PING")

    async def warm_up(self) -> None:
        """Connect (which loads the scripts), so that the first admissions do not pay connect +
        handshake + SCRIPT LOAD against the decision deadline. Call at start; raises
        StoreUnavailable (with a longer allowance of 1 s) if Redis cannot be reached."""
        try:
            async with asyncio.timeout(max(_WARM_UP_MIN_S, self._timeout_s)):
                await self._client.connect()
        except TimeoutError as exc:
            raise StoreUnavailable("redis: warm-up took longer than its allowance") from exc

    async def close(self) -> None:
        for task in list(self._cancelling.values()):
            task.cancel()
        await asyncio.gather(*self._cancelling.values(), return_exceptions=True)
        await self._client.close()

    def _posted_failed(self, op: str, reason: str) -> None:
        _log.debug("posted %s failed: %s", op, reason)
        self.posted_failures[op] = self.posted_failures.get(op, 0) + 1
        if self.on_posted_failure is not None:
            self.on_posted_failure(op, reason)

    def _marker(self, budget_key: str, request_id: str) -> str:
        return f"{self._prefix}{budget_key}:res:{request_id}"

    def _tombstone(self, request: AdmitRequest) -> str:
        first = [b.key for b in request.budgets] + [c.key for c in request.concurrency] + [r.key for r in request.rates]
        return f"{self._prefix}{first[0] if first else ''}:x:{request.request_id}"

    # --- undoing abandoned admissions -----------------------------------------------------------

    def keep(self, request: AdmitRequest) -> None:
        """Do not undo the admission of `request` that just timed out: the caller admitted it anyway, and
        Redis, when it runs the admission, counts it (unless it refuses it: then it is over a limit)."""
        task = self._cancelling.pop(request, None)
        if task is not None:
            task.cancel()  # before its first step: the undo is never sent

    def _abandon(self, request: AdmitRequest) -> None:
        if len(self._cancelling) >= _MAX_PENDING_CANCELS:
            self.cancel_failures_total += 1
            return
        task = asyncio.get_running_loop().create_task(self._cancel_with_retries(request))
        self._cancelling[request] = task
        task.add_done_callback(lambda done: self._cancelling.pop(request, None) if self._cancelling.get(request)
                               is done else None)

    async def _cancel_with_retries(self, request: AdmitRequest) -> None:
        p = self._prefix
        keys: list[Arg] = [self._tombstone(request), *(f"{p}{c.key}:cc" for c in request.concurrency)]
        if request.budgets:
            keys.append(self._marker(request.budgets[0].key, request.request_id))
            keys += [f"{p}{b.key}:tw{b.window_s}:{window_index(request.now, b.window_s)}" for b in request.budgets]
        args: list[Arg] = [request.request_id, _ms(_TOMBSTONE_TTL_S), len(request.concurrency)]
        for delay in _CANCEL_RETRY_DELAYS_S:
            await asyncio.sleep(delay)
            try:
                async with asyncio.timeout(max(self._timeout_s, _CANCEL_MIN_TIMEOUT_S)):
                    await self._client.evalsha(self.CANCEL, keys, args)
                return
            except (StoreUnavailable, TimeoutError):
                continue
        self.cancel_failures_total += 1
        _log.warning("could not undo abandoned admission %s; its leases expire by TTL", request.request_id)

    def _check_slot(self, keys: Sequence[str]) -> None:
        tags = {hash_tag(k) for k in keys}
        if None in tags or len(tags) > 1:
            raise ValueError(f"keys of one request must share one hash tag for Redis Cluster: {list(keys)}")


def _parse(reply: list[bytes | int], request: AdmitRequest) -> tuple[Observed, list[int]]:
    """A decided ADMIT's reply: what Redis saw and did, and per dimension the units of the new slice."""
    n_rates, n_conc, n_budgets = len(request.rates), len(request.concurrency), len(request.budgets)
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
    at += 2 * n_budgets
    n = n_rates + n_conc + n_budgets
    claimed = [float(reply[at + 2 * d]) for d in range(n)]
    seen = Observed(int(reply[0]) == 1, levels, leases_ok, live, earliest, windows, claimed=claimed)
    return seen, [int(reply[at + 2 * d + 1]) for d in range(n)]
