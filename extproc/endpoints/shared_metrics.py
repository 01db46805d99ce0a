"""Scrapes shared between service replicas: each endpoint's /metrics fetched once per interval for the fleet.

Every replica scraping every endpoint multiplies the scrape load on the engines by the number of replicas
(vLLM renders /metrics on the event loop of its API server, which also reads and tokenizes requests). Measured
on issue 15's multi-turn workload with the simulator: 3 replicas x 8 endpoints x 10 scrapes/s delayed the
engines' answers (request arrival to response headers) from 3-4 to 8-14 ms on average. So each endpoint has one
owner among the live replicas (rendezvous hashing of the endpoint's address over the replica ids, the same
answer in every replica that knows the same replicas), which scrapes it and publishes the result in the fleet
exchange (`extproc.server.fleet`); the others adopt it. A replica scrapes an endpoint it does not own whenever
no fresh copy came (the owner is gone, slow or not yet agreed on), so the active check and the metrics never
depend on another replica being alive.

This module is the pure part: who owns what, and the wire form of one scrape (a JSON list, every field checked
on the way in: Redis is shared, a bad entry must not break a replica).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Any

from extproc.endpoints.metrics import EndpointMetrics

__all__ = ["FIELDS", "decode", "encode", "owner"]

FIELDS = 16  # of one encoded scrape
_MAX_BUCKETS = 64
_MAX_LORAS = 64
_MAX_NAME = 256


def owner(address: str, replicas: Iterable[str]) -> str:
    """The replica (by id) that scrapes `address` for the fleet: the highest rendezvous rank."""
    return max(replicas, key=lambda replica: (hashlib.blake2b(f"{replica}|{address}".encode(), digest_size=8).digest(),
                                              replica))


def encode(metrics: EndpointMetrics, age_s: float) -> list[Any]:
    """One scrape, `age_s` seconds old, as a JSON-able list."""
    m = metrics
    return [round(age_s, 4), m.running, m.waiting, m.kv_usage, sorted(m.running_loras), sorted(m.waiting_loras),
            m.max_lora, m.prefix_queries, m.prefix_hits, m.block_size, m.num_gpu_blocks,
            _flat(m.ttft_buckets), m.ttft_sum, m.ttft_count, m.preemptions, _flat(m.step_tokens_buckets)]


def _flat(buckets: tuple[tuple[float, float], ...]) -> list[float | None]:
    return [x for bound, count in buckets for x in (None if math.isinf(bound) else bound, count)]


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"expected a finite number >= 0, got {value!r}")
    return float(value)


def _names(value: Any) -> frozenset[str]:
    if not isinstance(value, list) or len(value) > _MAX_LORAS:
        raise ValueError("expected a list of at most 64 names")
    if not all(isinstance(v, str) and 0 < len(v) <= _MAX_NAME for v in value):
        raise ValueError("expected names of 1-256 characters")
    return frozenset(value)


def _buckets(value: Any) -> tuple[tuple[float, float], ...]:
    """(upper bound, cumulative count) pairs from a flat list; +Inf travels as null (JSON has no infinity)."""
    if not isinstance(value, list) or len(value) % 2 or len(value) > 2 * _MAX_BUCKETS:
        raise ValueError("expected a flat list of at most 64 (bound, count) pairs")
    given = [b for b in value[0::2] if b is not None]
    counts = value[1::2]
    numbers = given + counts
    # Checked in bulk (C loops): shares arrive every exchange. json.loads takes NaN and Infinity: a sum with
    # either is not finite.
    if not all(type(x) is float or type(x) is int for x in numbers) or (numbers and min(numbers) < 0) \
            or not math.isfinite(sum(numbers)):
        raise ValueError("expected (bound, count) pairs of finite numbers >= 0 (bound +Inf as null)")
    bounds = [math.inf if b is None else float(b) for b in value[0::2]]
    return tuple(zip(bounds, map(float, counts), strict=True))


def decode(item: Any, now: float) -> EndpointMetrics:
    """A published scrape -> EndpointMetrics stamped on this process's clock (`now` less its age). Raises
    ValueError on anything malformed."""
    if not isinstance(item, list) or len(item) != FIELDS:
        raise ValueError(f"expected a list of {FIELDS} fields")
    age = _number(item[0])
    kv = _number(item[3])
    if kv > 1.0:
        raise ValueError(f"kv usage {kv} above 1")
    return EndpointMetrics(
        scraped_at=now - age, running=_number(item[1]), waiting=_number(item[2]), kv_usage=kv,
        running_loras=_names(item[4]), waiting_loras=_names(item[5]), max_lora=int(_number(item[6])),
        prefix_queries=_number(item[7]), prefix_hits=_number(item[8]), block_size=int(_number(item[9])) or 16,
        num_gpu_blocks=int(_number(item[10])), ttft_buckets=_buckets(item[11]), ttft_sum=_number(item[12]),
        ttft_count=_number(item[13]), preemptions=_number(item[14]), step_tokens_buckets=_buckets(item[15]))
