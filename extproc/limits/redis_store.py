"""`RedisStore`: the `Store` shared by every process and replica, one atomic round trip per call.

Semantics are `MemoryStore`'s (see `extproc.limits.memory`; the contract tests run the same cases
against both). `admit` is ONE Lua script (EVALSHA, run with EVAL on NOSCRIPT) that checks and takes
every dimension atomically, so N replicas can never jointly overshoot a limit. `release` (ZREM per
concurrency key) and `settle` (one script) are posted: written to the connection without waiting
for the reply (`extproc.limits.resp`), since nobody waits on them; an error reply or a connection
lost before the reply counts in `posted_failures` and calls `on_posted_failure(op, reason)`.
`ping()` waits for every call posted before it (one connection, replies in order). `charge` adds
tokens decided elsewhere (fail-open admissions, replayed by the failover layer) to the windows.

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

Optimistic admission (`headroom`, on by default from the policy): while the store's last replies for
every key of a request leave room for it (share x remaining, see `extproc.limits.headroom`), `admit`
posts the script with force=1 and returns at once with estimated states; the reply updates the
reports. Otherwise (near a limit, no recent reply) it waits for the store's decision as above.

Availability: one pipelined connection per store (`extproc.limits.resp`); every awaited call gets
`timeout_ms` (waiting for a connect included; admissions `admit_timeout_ms`), no client retries.
Connection errors, timeouts, refused AUTH and server errors raise `StoreUnavailable`; the failover
layer turns that into a policy.
TLS: a `rediss://` URL (plus `ssl_ca_certs` / client cert options); AUTH: `redis://user:pass@host`.
Call `warm_up()` at start: a cold first call (connect, handshake, SCRIPT LOAD) can exceed 5 ms.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from functools import partial

from extproc.limits import _lua
from extproc.limits._rules import EPSILON, Observed, bucket_ttl_s, decide, window_index, window_ttl_s
from extproc.limits.headroom import Headroom
from extproc.limits.resp import Address, Arg, RespClient, Script
from extproc.limits.types import AdmitRequest, AdmitResult, Reservation, StoreUnavailable, WindowCharge

__all__ = ["CANCELLED", "RedisStore", "hash_tag"]

_log = logging.getLogger(__name__)

CANCELLED = "cancelled"  # refused_by of a request_id whose earlier admission was abandoned
_TOMBSTONE_TTL_S = 60.0
_CANCEL_RETRY_DELAYS_S = (0.0, 0.1, 0.5, 2.0, 5.0)
_CANCEL_MIN_TIMEOUT_S = 0.25
_MAX_PENDING_CANCELS = 10_000
_WARM_UP_MIN_S = 1.0


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
    ADMIT = Script(_lua.ADMIT)
    SETTLE = Script(_lua.SETTLE)
    CANCEL = Script(_lua.CANCEL)
    CHARGE = Script(_lua.CHARGE)
    SCRIPTS = (ADMIT, SETTLE, CANCEL, CHARGE)

    def __init__(self, url: str, *, timeout_ms: float = 50.0, admit_timeout_ms: float | None = None,
                 prefix: str = "lim:", ssl_ca_certs: str | None = None, ssl_certfile: str | None = None,
                 ssl_keyfile: str | None = None, require_hash_tag: bool = False,
                 headroom: Headroom | None = None) -> None:
        """`url`: redis://[user:password@]host:port[/db] or rediss:// for TLS. `timeout_ms` bounds each
        awaited call (waiting for a connect included); `admit_timeout_ms` (default the same) bounds
        admissions: give it the failover's decision deadline (and the failover none of its own), so
        that a reply read in the loop iteration where the deadline passes still counts. `headroom`:
        admit without waiting while the store's last replies leave room (`extproc.limits.headroom`)."""
        if "{" in prefix or "}" in prefix:
            raise ValueError("the key prefix must not contain a hash tag")
        self._timeout_s = timeout_ms / 1000.0
        self._admit_timeout_s = admit_timeout_ms / 1000.0 if admit_timeout_ms is not None else self._timeout_s
        self._prefix = prefix
        self._require_hash_tag = require_hash_tag
        address = Address.from_url(url, ssl_ca_certs=ssl_ca_certs, ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile)
        self._client = RespClient(address, timeout_s=self._timeout_s, scripts=self.SCRIPTS,
                                  on_posted_failure=self._posted_failed)
        self._cancelling: set[asyncio.Task[None]] = set()
        self.cancel_failures_total = 0  # abandoned admissions that could not be undone
        self.on_posted_failure: Callable[[str, str], None] | None = None  # (op, reason) of a failed posted call
        self.headroom = headroom
        self._awaited_plain = 0  # admissions without a headroom (all of them wait for Redis)

    @property
    def optimistic_total(self) -> int:
        """Admissions sent without waiting for Redis (the headroom counts them)."""
        return self.headroom.optimistic_total if self.headroom is not None else 0

    @property
    def awaited_total(self) -> int:
        """Admissions that waited for Redis's decision."""
        return self.headroom.awaited_total if self.headroom is not None else self._awaited_plain

    @property
    def cancelling(self) -> int:
        """Abandoned admissions whose undo is still pending."""
        return len(self._cancelling)

    @property
    def posted_failures(self) -> dict[str, int]:
        """Posted calls (release, settle) that failed, by operation."""
        return dict(self._client.posted_failures)

    async def admit(self, request: AdmitRequest) -> AdmitResult:
        if not (request.rates or request.concurrency or request.budgets):
            return AdmitResult(admitted=True)
        now, p = request.now, self._prefix
        tokens = max(0, request.tokens)
        if self._require_hash_tag:
            self._check_slot([r.key for r in request.rates] + [c.key for c in request.concurrency]
                             + [b.key for b in request.budgets])
        keys: list[Arg] = [f"{p}{r.key}:rb" for r in request.rates]
        keys += [f"{p}{c.key}:cc" for c in request.concurrency]
        args: list[Arg] = [repr(float(now)), tokens, request.request_id, len(request.rates),
                           len(request.concurrency), len(request.budgets), repr(EPSILON), "0"]
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
        headroom = self.headroom
        if headroom is None:
            self._awaited_plain += 1
            return await self._admit(request, keys, args)
        seq, optimistic = headroom.take(request)
        if optimistic is None:
            try:
                result = await self._admit(request, keys, args)
            except BaseException:
                headroom.replied(request, seq, None)
                raise
            headroom.replied(request, seq, result.states if result.refused_by != CANCELLED else None)
            return result
        args[7] = "1"  # force: the request is admitted already
        try:
            await self._client.post_evalsha("admit", self.ADMIT, keys, args,
                                            on_reply=partial(self._forced_reply, headroom, request, seq))
        except BaseException:
            headroom.replied(request, seq, None)
            raise
        return optimistic

    async def _admit(self, request: AdmitRequest, keys: list[Arg], args: list[Arg]) -> AdmitResult:
        try:
            reply: list[bytes | int] = await self._client.evalsha(self.ADMIT, keys, args, self._admit_timeout_s)
        except (StoreUnavailable, asyncio.CancelledError):
            self._abandon(request)
            raise
        if int(reply[0]) < 0:
            return AdmitResult(admitted=False, refused_by=CANCELLED, retry_after_s=_TOMBSTONE_TTL_S)
        return decide(request, _parse(reply, len(request.rates), len(request.concurrency), len(request.budgets)))

    @staticmethod
    def _forced_reply(headroom: Headroom, request: AdmitRequest, seq: int, reply: object) -> None:
        """The reply of an optimistic (forced) admission: the newest report of its keys."""
        if isinstance(reply, StoreUnavailable) or not isinstance(reply, list) or int(reply[0]) < 0:
            headroom.replied(request, seq, None)
            return
        seen = _parse(reply, len(request.rates), len(request.concurrency), len(request.budgets))
        taken = decide(request, dataclasses.replace(seen, admitted=True))  # the state after taking it
        headroom.replied(request, seq, taken.states, overshoot=not seen.admitted)

    async def release(self, reservation: Reservation, now: float) -> None:
        if self.headroom is not None:
            self.headroom.released(reservation)
        for c in reservation.concurrency:
            await self._client.post("release", "ZREM", f"{self._prefix}{c.key}:cc", reservation.request_id)

    async def settle(self, reservation: Reservation, actual_tokens: int, now: float) -> None:
        if not reservation.budgets:
            return
        if self.headroom is not None:
            self.headroom.settled(reservation, actual_tokens)
        keys: list[Arg] = [self._marker(reservation.budgets[0].key, reservation.request_id)]
        args: list[Arg] = [max(0, actual_tokens)]
        for b in reservation.budgets:
            charged = window_index(reservation.admitted_at, b.window_s)
            if charged < window_index(now, b.window_s) - 1:
                continue  # that window no longer counts
            keys.append(f"{self._prefix}{b.key}:tw{b.window_s}:{charged}")
            args.append(_ms(window_ttl_s(charged, b.window_s, now)))
        await self._client.post_evalsha("settle", self.SETTLE, keys, args)

    async def charge(self, charges: Sequence[WindowCharge], now: float) -> None:
        """Add tokens to budget windows (one script call per hash tag, for Redis Cluster)."""
        by_tag: dict[str | None, tuple[list[Arg], list[Arg]]] = {}
        for c in charges:
            if c.index < window_index(now, c.window_s) - 1:
                continue  # that window no longer counts
            keys, args = by_tag.setdefault(hash_tag(c.key), ([], []))
            keys.append(f"{self._prefix}{c.key}:tw{c.window_s}:{c.index}")
            args += [c.tokens, _ms(window_ttl_s(c.index, c.window_s, now))]
        await asyncio.gather(*(self._client.evalsha(self.CHARGE, keys, args) for keys, args in by_tag.values()))

    async def ping(self) -> None:
        """One round trip; it also waits for every call posted before it."""
        await self._client.call("PING")

    async def warm_up(self) -> None:
        """Connect (which loads the scripts), so that the first admissions do not pay connect +
        handshake + SCRIPT LOAD against a 5 ms failover deadline. Call at start; raises
        StoreUnavailable (with a longer allowance of 1 s) if Redis cannot be reached."""
        try:
            async with asyncio.timeout(max(_WARM_UP_MIN_S, self._timeout_s)):
                await self._client.connect()
        except TimeoutError as exc:
            raise StoreUnavailable("redis: warm-up took longer than its allowance") from exc

    async def close(self) -> None:
        for task in list(self._cancelling):
            task.cancel()
        await asyncio.gather(*self._cancelling, return_exceptions=True)
        await self._client.close()

    def _posted_failed(self, op: str, reason: str) -> None:
        _log.debug("posted %s failed: %s", op, reason)
        if self.on_posted_failure is not None:
            self.on_posted_failure(op, reason)

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
