"""Saturation of a pool from live vLLM state: how many more requests it takes before it queues.

An endpoint has room for `max_waiting - queue` more requests, where `queue` is vLLM's
num_requests_waiting at the last scrape plus what this process sent it since (minus what finished
since): dispatch never overshoots between two scrapes. An endpoint whose KV cache is past
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

__all__ = ["Room", "pool_room"]


@dataclass(frozen=True, slots=True)
class Room:
    requests: float  # more requests the pool takes before it is saturated (math.inf: unknown, go)
    stale: int  # usable endpoints whose metrics were missing or stale


def endpoint_room(endpoint: Endpoint, now: float, config: SaturationConfig) -> float | None:
    """Room of one endpoint; None when its metrics are missing or stale."""
    metrics = endpoint.metrics
    if metrics is None or now - metrics.scraped_at > config.stale_after_ms / 1000.0:
        return None
    if metrics.kv_usage >= config.max_kv_utilization:
        return 0.0
    queue = max(0.0, metrics.waiting + endpoint.in_flight - endpoint.in_flight_at_scrape)
    return max(0.0, config.max_waiting - queue)


def pool_room(endpoints: Sequence[Endpoint], now: float, config: SaturationConfig) -> Room:
    """Room of a pool's usable endpoints. No usable endpoint: unlimited (routing answers for that)."""
    if not endpoints:
        return Room(math.inf, 0)
    total = 0.0
    stale = 0
    for endpoint in endpoints:
        room = endpoint_room(endpoint, now, config)
        if room is None:
            stale += 1
        else:
            total += room
    return Room(math.inf if stale else total, stale)
