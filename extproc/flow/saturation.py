"""Saturation of a pool from live vLLM state: how many more requests it takes before it is full.

An endpoint's load is vLLM's running + waiting requests at the last scrape plus what this process sent
it since (minus what finished since), so dispatch never overshoots between two scrapes. Once the
endpoint was seen full (requests waiting), its batch capacity is what ran at that moment, and a class
with reserve r has room for `floor(capacity x (1 - r)) - load` more (the top class, r = 0, fills the batch;
lower classes leave slots free so it starts at once). When the batch was limited by the KV cache
(half full or more when seen full), the estimate grows by one slot per `capacity_ttl_s` without the
engine being seen full again, so a capacity that grew is found; the next time requests wait it resets
to what runs then. A batch limited by max_num_seqs is fixed. The load is never taken below what the
service replicas have in flight on the endpoint (this process's own count, plus the other replicas' as
last synced through Redis: `extproc.server.fleet`). Without a learned capacity (never seen full), room is
`max_waiting - vLLM's queue`: letting a small queue form is how it is learned. A KV cache past
`max_kv_utilization` has no room. An endpoint without fresh metrics (never scraped, or older than
`stale_after_ms`) has unlimited room: missing data never stalls traffic; it is counted instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from extproc.flow.config import SaturationConfig

if TYPE_CHECKING:  # extproc.endpoints imports the config schema, which mounts flow.config
    from extproc.endpoints import Endpoint

__all__ = ["KV_LIMITED", "Room", "endpoint_room", "pool_room"]

# KV cache use at the moment an engine was seen full above which its batch was limited by memory
# (and so may grow again), not by max_num_seqs.
KV_LIMITED = 0.5


@dataclass(frozen=True, slots=True)
class Room:
    requests: float  # more requests the pool takes before it is saturated (math.inf: unknown, go)
    stale: int  # usable endpoints whose metrics were missing or stale


def endpoint_room(endpoint: Endpoint, now: float, config: SaturationConfig, reserve: float = 0.0) -> float | None:
    """Room of one endpoint for a class keeping `reserve` of the batch free; None when its metrics are
    missing or stale."""
    metrics = endpoint.metrics
    if metrics is None or now - metrics.scraped_at > config.stale_after_ms / 1000.0:
        return None
    if metrics.kv_usage >= config.max_kv_utilization:
        return 0.0
    sent_since = endpoint.in_flight - endpoint.in_flight_at_scrape
    capacity = endpoint.batch_capacity
    if capacity > 0:
        if endpoint.batch_capacity_kv >= KV_LIMITED:
            # The KV cache, not max_num_seqs, limited the batch: probe one more slot per
            # capacity_ttl_s (a full engine resets the estimate to what runs then).
            capacity += math.floor(max(0.0, now - endpoint.batch_capacity_at) / config.capacity_ttl_s)
        # What the service replicas have in flight there (this one's, plus the others' as last synced
        # through Redis) is a floor on the load: it covers requests that finished inside vLLM but whose
        # streams are still closing (counted twice otherwise), and the other replicas' sends since the scrape.
        load = max(metrics.running + metrics.waiting + sent_since, endpoint.in_flight + endpoint.others_in_flight)
        return max(0.0, math.floor(capacity * (1.0 - reserve) + 1e-9) - load)
    queue = max(0.0, metrics.waiting + sent_since)
    return max(0.0, config.max_waiting - queue)


def pool_room(endpoints: Sequence[Endpoint], now: float, config: SaturationConfig, reserve: float = 0.0) -> Room:
    """Room of a pool's usable endpoints. No usable endpoint: unlimited (routing answers for that)."""
    if not endpoints:
        return Room(math.inf, 0)
    total = 0.0
    stale = 0
    for endpoint in endpoints:
        room = endpoint_room(endpoint, now, config, reserve)
        if room is None:
            stale += 1
        else:
            total += room
    return Room(math.inf if stale else total, stale)
