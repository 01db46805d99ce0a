"""Fleet in-flight sync: each service replica publishes what it has in flight per endpoint, reads the others'.

Flow control sizes an endpoint's load from vLLM's scraped queue plus what this process sent since
(`extproc.flow.saturation`). With several replicas each sees only its own sends between two scrapes
(100 ms by default), so together they fill the slots kept free for higher classes. With Redis configured
(`limits.store: redis`), every `flow_control.fleet_sync_ms` each replica writes its in-flight counts into
one hash (field: replica id; value: wall time and non-zero counts per endpoint) and reads every other
replica's in the same script call. `Endpoint.others_in_flight` is the sum of the other replicas' counts
not older than `stale_after_s`; the saturation load is never below this replica's in-flight plus that.
Fields of replicas that stopped writing are deleted by the next exchange once stale; the hash expires
when nobody writes.
A failed exchange keeps the last counts until they are stale, then counts the others as zero (the
scrape-based estimate alone, as with one replica). With `scrapes` (`scheduling.scrape.share`) each replica also
publishes its recent endpoint scrapes as a second field in the same call and adopts the others'
(`extproc.server.scrape_share`). Nothing here runs on the request path. Cost: each
replica makes one small script call per interval, whose reply carries every replica's counts (R replicas:
R x 1000 / fleet_sync_ms calls per second on Redis, each returning R entries).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Collection
from typing import Any

from extproc.aio import Sleep
from extproc.endpoints import EndpointRegistry
from extproc.limits.cluster import RedisClient
from extproc.limits.resp import Arg, Script, ScriptCall
from extproc.limits.types import StoreUnavailable
from extproc.periodic import Periodic
from extproc.server.scrape_share import SCRAPES_SUFFIX, ScrapeShare

__all__ = ["FLEET_KEY", "FleetSync", "carried_every", "exchange_call", "other_fields", "parse_counts", "replica_name"]

_log = logging.getLogger(__name__)

FLEET_KEY = "flow:inflight"
# KEYS[1] the hash; ARGV: own field, own value, hash TTL ms, cutoff time, optionally a second own field and
# value. Fields whose time is older than the cutoff (replicas that stopped publishing) are deleted; the fresh
# ones are returned.
_EXCHANGE = Script(r"""
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[5] then redis.call('HSET', KEYS[1], ARGV[5], ARGV[6]) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local cutoff = tonumber(ARGV[4])
local all = redis.call('HGETALL', KEYS[1])
local fresh = {}
for i = 1, #all, 2 do
  local stamp = string.match(all[i + 1], '^%S+')
  local at = stamp and tonumber(stamp)
  if at == nil or at < cutoff then
    redis.call('HDEL', KEYS[1], all[i])
  else
    fresh[#fresh + 1] = all[i]
    fresh[#fresh + 1] = all[i + 1]
  end
end
return fresh
""")


def exchange_call(key: str, replica_id: str, value: str, now: float, stale_after_s: float,
                  extra: tuple[str, str] | None = None) -> ScriptCall:
    """The script call that publishes `value` ("<wall time> ...") as this replica's field of hash `key` (and
    `extra`, a second field and value of this replica, also starting with the time) and returns every field not
    older than `stale_after_s` (older fields are deleted; the hash expires when nobody writes)."""
    ttl_ms = max(1000, int(stale_after_s * 2000))
    args: list[Arg] = [replica_id, value, ttl_ms, f"{now - stale_after_s:.3f}"]
    if extra is not None:
        args += extra
    return _EXCHANGE, [key], args


def other_fields(reply: Any, own: Collection[str]) -> dict[str, bytes]:
    """An exchange's reply (field, value, ...) without this replica's `own` fields."""
    found: dict[str, bytes] = {}
    for i in range(0, len(reply) - 1, 2):
        field = reply[i].decode()
        if field not in own:
            found[field] = reply[i + 1]
    return found


def replica_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ReplicaExchange:
    """Runs a round every `interval_s` (a `Periodic`) on its own Redis connection: `request` builds its script
    call, `settle` takes the reply in (`sync_once`: both). A failed exchange is counted (`failures_total`), logged
    once per state change (and the recovery), and never ends the loop."""

    SCRIPTS = (_EXCHANGE,)  # what the client must load (`exchange_call` names it)
    WHAT = "replica exchange"  # for task names and log lines

    def __init__(self, client: RedisClient, interval_s: float, *, sleep: Sleep = asyncio.sleep) -> None:
        self._client = client
        self.interval_s = interval_s
        self._loop = Periodic(self.WHAT, self._round, interval_s, log=_log, expected=(StoreUnavailable,),
                              sleep=sleep)
        self._carried: list[tuple[ReplicaExchange, int]] = []  # (exchange, runs every that many rounds)
        self._carrier: ReplicaExchange | None = None
        self._rounds = 0

    def carry(self, other: ReplicaExchange, every: int = 1) -> None:
        """Run `other`'s rounds with every `every`-th of this one's: one timer wake-up per round instead of two
        (e.g. an in-flight exchange every 10 ms carries a placement exchange every 20), and both script calls in
        one write on this exchange's connection. `other`'s own loop is then never started; its failures are
        counted as before, and a round waits for both, so neither overlaps itself. The first round carries it."""
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self._carried.append((other, every))
        other._carrier = self

    @property
    def failures_total(self) -> int:
        return self._loop.failures.failures_total

    async def start(self) -> None:
        if self._carrier is None:
            self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        await self._client.close()

    def request(self) -> ScriptCall:
        """This round's script call (an exchange that `carry`s another or is carried builds its round this way)."""
        raise NotImplementedError

    def settle(self, reply: Any) -> object:
        """Take this round's reply in (what it returns, `sync_once` returns)."""
        raise NotImplementedError

    async def sync_once(self) -> object:
        """One round alone, on this exchange's own connection."""
        return self.settle(await self._client.evalsha(*self.request()))

    def _failed(self) -> None:
        """After a failed exchange (Redis unreachable or late)."""

    async def _round(self) -> None:
        rounds, self._rounds = self._rounds, self._rounds + 1
        due = [other for other, every in self._carried if rounds % every == 0]
        try:
            if due:
                await self._together(due)
            else:
                await self.sync_once()
        except Exception:
            self._failed()
            raise

    async def _together(self, due: list[ReplicaExchange]) -> None:
        """This round and the carried exchanges' in one write on this connection (their script calls pipelined:
        one system call, their replies usually in one read); each carried one settles (or fails) as a round of
        its own."""
        carried: list[tuple[ReplicaExchange, ScriptCall]] = []
        for other in due:
            try:
                carried.append((other, other.request()))
            except Exception as exc:  # settled as its failed round; the others go on
                await other._settled(exc)
        calls = [self.request(), *(call for _, call in carried)]
        # Each waits as long as it would alone (the placements read more than the in-flight counts).
        replies = await self._client.evalsha_batch(calls, max(e._client.timeout_s for e in (self, *due)))
        for (other, _), reply in zip(carried, replies[1:], strict=True):
            await other._settled(reply)
        if isinstance(replies[0], Exception):
            raise replies[0]
        self.settle(replies[0])

    async def _settled(self, reply: Any) -> None:
        """A carried round's end: its reply taken in, or its failure counted and handled as in a round alone."""
        async def work() -> None:
            try:
                if isinstance(reply, Exception):
                    raise reply
                self.settle(reply)
            except Exception:
                self._failed()
                raise

        await self._loop.run_once(work)

    async def run_round(self) -> bool:
        """One round with this exchange's failure handling (never raises); True if it worked."""
        return await self._loop.run_once()


def carried_every(carrier: ReplicaExchange, other: ReplicaExchange) -> int:
    """N when `other`'s interval is N times `carrier`'s (N >= 1): `carrier` can run it with every N-th round
    (`ReplicaExchange.carry`); 0 when it is not a whole multiple, and each keeps its own timer."""
    if carrier.interval_s <= 0 or other.interval_s < carrier.interval_s:
        return 0
    every = round(other.interval_s / carrier.interval_s)
    return every if abs(every * carrier.interval_s - other.interval_s) < 1e-9 else 0


def parse_counts(value: bytes | str) -> tuple[float, dict[str, int]]:
    """A published value "<wall time> <address> <count> ..." -> (time, counts). Raises ValueError."""
    text = value.decode() if isinstance(value, bytes) else value
    parts = text.split()
    if not parts or len(parts) % 2 != 1:
        raise ValueError(f"malformed fleet value {text[:80]!r}")
    return float(parts[0]), {parts[i]: int(parts[i + 1]) for i in range(1, len(parts), 2)}


class FleetSync(ReplicaExchange):
    WHAT = "fleet in-flight sync"

    def __init__(self, client: RedisClient, endpoints: EndpointRegistry, interval_s: float, *,
                 stale_after_s: float | None = None, on_sync: Callable[[], None] | None = None,
                 replica_id: str | None = None, clock: Callable[[], float] = time.time,
                 scrapes: ScrapeShare | None = None) -> None:
        """`scrapes`: share endpoint scrapes through the same exchange (its replica id is this one's)."""
        super().__init__(client, interval_s)
        self._endpoints = endpoints
        self._stale_after_s = stale_after_s if stale_after_s is not None else max(1.0, 10.0 * interval_s)
        self._on_sync = on_sync
        self.scrapes = scrapes
        self.replica_id = scrapes.replica_id if scrapes is not None else replica_id or replica_name()
        self._clock = clock
        self._others: dict[str, tuple[float, dict[str, int]]] = {}  # replica -> (time, counts)
        self.syncs_total = 0
        self.replicas = 1  # replicas heard from within stale_after_s, this one included
        self._asked_at = 0.0  # the wall time the round in progress was built at

    def request(self) -> ScriptCall:
        """Publish this replica's counts (and scrapes), read the others'."""
        now = self._clock()
        mine = " ".join(f"{ep.address} {ep.in_flight}" for ep in self._endpoints.endpoints() if ep.in_flight > 0)
        value = f"{now:.3f} {mine}" if mine else f"{now:.3f}"
        share = self.scrapes
        published = share.payload(now, self._stale_after_s) if share is not None else None
        extra = (share.field, published) if share is not None and published is not None else None
        self._asked_at = now
        return exchange_call(FLEET_KEY, self.replica_id, value, now, self._stale_after_s, extra)

    def settle(self, reply: Any) -> None:
        """The others' counts (and scrapes): every endpoint's `others_in_flight` updated."""
        now, share = self._asked_at, self.scrapes
        values = other_fields(reply, (self.replica_id, share.field if share is not None else self.replica_id))
        others: dict[str, tuple[float, dict[str, int]]] = {}
        scrapes: dict[str, bytes] = {}
        for field, raw in values.items():
            if field.endswith(SCRAPES_SUFFIX):
                scrapes[field] = raw
                continue
            try:
                others[field] = parse_counts(raw)
            except ValueError as exc:
                _log.debug("ignoring fleet entry of %s: %s", field, exc)
        self._others = others
        self.syncs_total += 1
        if share is not None:
            share.adopt(scrapes, now)
        self._apply(now)

    def slot(self) -> tuple[int, int]:
        """(This replica's index, live replicas) with the replica ids in sorted order: the same numbering in every
        replica that heard the same others (those heard from within `stale_after_s`); (0, 1) alone."""
        now = self._clock()
        live = sorted([self.replica_id, *(r for r, (at, _) in self._others.items() if now - at <= self._stale_after_s)])
        return live.index(self.replica_id), len(live)

    def _apply(self, now: float) -> None:
        totals: dict[str, int] = {}
        fresh = 0
        for at, counts in self._others.values():
            if now - at <= self._stale_after_s:
                fresh += 1
                for address, count in counts.items():
                    totals[address] = totals.get(address, 0) + count
        self.replicas = 1 + fresh
        if self.scrapes is not None:
            self.scrapes.live([self.replica_id, *(r for r, (at, _) in self._others.items()
                                                  if now - at <= self._stale_after_s)])
        for endpoint in self._endpoints.endpoints():
            endpoint.others(totals.get(endpoint.address, 0))
        if self._on_sync is not None:
            self._on_sync()

    def _failed(self) -> None:
        self._apply(self._clock())  # counts age out: the others count as zero once stale
