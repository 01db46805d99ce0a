"""How loaded an endpoint is and when it is full: the one model the scheduler and flow control share.

Load: vLLM's running + waiting at the last scrape, plus what the service replicas sent since (minus what ended
there since: the change of their in-flight count, the others' as synced through Redis), never below what the
service replicas have in flight there (this process's count plus the others' as synced through Redis, or this
count times the replica count without that sync).

Full, when any holds:
- KV: the cache is past `max_kv_utilization` while requests wait (a preempted request waits too), until a
  request of the replicas finishes there (that frees blocks no scrape has shown yet);
- queueing: the engine's own queue has lasted `sustain_ms` (3 scrapes or more), whatever it waits for
  (seats, blocks, the step's token budget): it then gets a new request only when its queue is estimated
  empty (waiting at the scrape, plus what was sent since, minus what finished since), so it never idles and
  the rest waits in the service, where priority and fair share apply. The first scrape without a queue
  ends this;
- capacity: the load reaches the capacity less the class's reserve. The capacity is the pool's
  `max_num_seqs` when configured, lowered to what the engine was seen to sustain once that is learned;
  without either there is no limit, and flow control holds nothing on a guess.

Learning. vLLM admits only at step boundaries, so a request that arrives behind a long prefill chunk waits
even with free seats: `waiting > 0` alone means nothing. A capacity is learned only from a queue that
lasts `sustain_ms` (3 scrapes or more) while running stays on a plateau, the KV cache below `KV_BOUND` (or
requests may be waiting for blocks, which the KV rule judges) and at most `BUDGET_BOUND` of the steps heavy
(over half the largest step seen, by vllm:iteration_tokens_total: otherwise requests wait for the step's
token budget, and more seats would not help). It is then the most requests ever seen running there, never
less, and it grows by one request per `capacity_ttl_s` until such a queue confirms it again (for the top class
only: see `LoadModel.capacity`).

Stale or missing metrics (older than `scheduling.scrape.stale_after_ms`) make an endpoint's room unknown
(None): flow control then counts its pool as having room, so missing data never stalls traffic.
"""

from __future__ import annotations

import math

from extproc.endpoints.config import SaturationConfig
from extproc.endpoints.engine import MIN_QUEUED_SCRAPES
from extproc.endpoints.metrics import EndpointMetrics
from extproc.endpoints.registry import Endpoint

__all__ = ["LoadModel"]


class LoadModel:
    """Load, room and saturation of one pool's endpoints under one policy."""

    __slots__ = ("_config", "_replicas", "_seats", "_stale_s")

    def __init__(self, config: SaturationConfig, stale_after_s: float, seats: int | None = None,
                 replicas: int = 1) -> None:
        """`seats`: the engines' max_num_seqs when configured; `replicas`: multiply this process's in-flight
        count by it (1 when the replicas exchange their counts, see `extproc.server.fleet`)."""
        self._config = config
        self._seats = seats
        self._stale_s = stale_after_s
        self._replicas = max(1, replicas)

    def fresh(self, endpoint: Endpoint, now: float) -> EndpointMetrics | None:
        metrics = endpoint.metrics
        if metrics is None or now - metrics.scraped_at > self._stale_s:
            return None
        return metrics

    def in_flight(self, endpoint: Endpoint) -> float:
        """What the service replicas have in flight on the endpoint, as far as this process knows."""
        return float(endpoint.in_flight * self._replicas + endpoint.others_in_flight)

    def requests(self, endpoint: Endpoint, now: float) -> float:
        """Requests running or waiting at the engine now (the best estimate)."""
        local = self.in_flight(endpoint)
        metrics = self.fresh(endpoint, now)
        if metrics is None:
            return local
        return max(metrics.running + metrics.waiting + self.sent_since(endpoint), local)

    @staticmethod
    def sent_since(endpoint: Endpoint) -> float:
        """Requests the service replicas sent to the endpoint since its last scrape, less those that ended there
        since: the change of their in-flight count, the others' included as synced (`Endpoint.in_flight_at_scrape`).
        With several replicas, counting only this one's would keep the others' finished requests in the load
        until the next scrape: the pool would look full while seats are free, and requests held here wait for it.
        """
        return float(endpoint.fleet_in_flight - endpoint.in_flight_at_scrape)

    def capacity(self, endpoint: Endpoint, now: float, reserve: float = 0.0) -> float | None:
        """Requests the endpoint takes from a class keeping `reserve` of it free (None: no limit known).

        A learned capacity grows by one request per `capacity_ttl_s` until an engine queue confirms it again,
        for the top class only (reserve 0): only its requests probe past it, so a probe that finds the engine
        full queues a top-class request inside the engine instead of in the service (where it would wait for
        the same seat), while the lower classes keep their share below the confirmed capacity.
        """
        state = endpoint.engine
        limit: float | None = None
        if state.capacity > 0:
            limit = state.capacity
            if reserve <= 0:
                limit += math.floor(max(0.0, now - state.confirmed_at) / self._config.capacity_ttl_s)
        if self._seats is not None:
            limit = float(self._seats) if limit is None else min(float(self._seats), limit)
        # The seats the reserve keeps, rounded up (a reserve of a few millionths of a seat keeps none).
        return None if limit is None else limit - max(0, math.ceil(limit * reserve - 1e-6))

    def queueing(self, endpoint: Endpoint) -> bool:
        """Whether the engine's own queue has lasted `sustain_ms` (up to its last scrape)."""
        state = endpoint.engine
        metrics = endpoint.metrics
        return (metrics is not None and state.queued_since is not None and state.queued_scrapes >= MIN_QUEUED_SCRAPES
                and metrics.scraped_at - state.queued_since >= self._config.sustain_ms / 1000.0)

    def room(self, endpoint: Endpoint, now: float, reserve: float = 0.0) -> float | None:
        """More requests of a class keeping `reserve` of the capacity free the endpoint takes before it is
        full (math.inf: no limit); None when its metrics are missing or stale."""
        metrics = self.fresh(endpoint, now)
        if metrics is None:
            return None
        sent_since = self.sent_since(endpoint)
        if metrics.kv_usage >= self._config.max_kv_utilization and metrics.waiting > 0 and sent_since >= 0:
            return 0.0
        room = math.inf
        if self.queueing(endpoint):
            room = max(0.0, 1.0 - (metrics.waiting + sent_since))
        capacity = self.capacity(endpoint, now, reserve)
        if capacity is not None:
            room = min(room, max(0.0, capacity - self.requests(endpoint, now)))
        return room

    def saturated(self, endpoint: Endpoint, now: float) -> bool:
        room = self.room(endpoint, now)
        return room is not None and room <= 0
