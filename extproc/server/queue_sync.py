"""Admission-queue lengths shared between service replicas through Redis, for the autoscaler.

Each replica holds its own admission queue, so a KEDA call answered by one replica would see only that
replica's held requests. With `limits.store: redis`, every `autoscaling.sample_interval_s` each replica
publishes its queued requests per pool into one hash (`QUEUE_KEY`, field: replica id, value: "<wall time>
<pool> <count> ...") and reads the others' in the same script call (`extproc.server.fleet.exchange`); the
scaler adds the other fresh replicas' counts to its own. One small script call per replica and interval,
never on the request path; a failed exchange keeps the last counts until they are stale, then counts the
others as zero (each replica's own queue, as without Redis).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from extproc.limits.cluster import RedisClient
from extproc.limits.resp import ScriptCall
from extproc.server.fleet import ReplicaExchange, exchange_call, other_fields, parse_counts, replica_name

__all__ = ["QUEUE_KEY", "QueueSync"]

_log = logging.getLogger(__name__)

QUEUE_KEY = "autoscale:queued"


class QueueSync(ReplicaExchange):
    WHAT = "autoscale queue sync"

    def __init__(self, client: RedisClient, queued: Callable[[], Mapping[str, int]], interval_s: float, *,
                 stale_after_s: float | None = None, replica_id: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """`queued()`: this replica's queued requests per pool."""
        super().__init__(client, interval_s)
        self._queued = queued
        self._stale_after_s = stale_after_s if stale_after_s is not None else max(2.0, 5.0 * interval_s)
        self.replica_id = replica_id or replica_name()
        self._clock = clock
        self._others: dict[str, tuple[float, dict[str, int]]] = {}  # replica -> (time, pool -> queued)

    def request(self) -> ScriptCall:
        now = self._clock()
        mine = " ".join(f"{pool} {count}" for pool, count in self._queued().items() if count > 0)
        value = f"{now:.3f} {mine}" if mine else f"{now:.3f}"
        return exchange_call(QUEUE_KEY, self.replica_id, value, now, self._stale_after_s)

    def settle(self, reply: Any) -> None:
        others: dict[str, tuple[float, dict[str, int]]] = {}
        for field, raw in other_fields(reply, (self.replica_id,)).items():
            try:
                others[field] = parse_counts(raw)
            except ValueError as exc:
                _log.debug("ignoring queue entry of %s: %s", field, exc)
        self._others = others

    def others(self, pool: str) -> int:
        """The other replicas' queued requests for `pool`, as last heard (stale entries count zero)."""
        now = self._clock()
        return sum(counts.get(pool, 0) for at, counts in self._others.values() if now - at <= self._stale_after_s)
