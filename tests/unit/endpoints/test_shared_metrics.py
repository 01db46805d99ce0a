"""The wire form of a scrape shared between replicas, and who owns which endpoint."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import pytest

from extproc.endpoints import EndpointMetrics
from extproc.endpoints.shared_metrics import decode, encode, owner

SCRAPE = EndpointMetrics(
    scraped_at=100.0, running=3, waiting=2, kv_usage=0.75, running_loras=frozenset({"a"}),
    waiting_loras=frozenset({"b", "c"}), max_lora=4, prefix_queries=1000, prefix_hits=900, block_size=32,
    num_gpu_blocks=2171, ttft_buckets=((0.02, 5.0), (0.04, 9.0), (math.inf, 10.0)), ttft_sum=0.3, ttft_count=10,
    preemptions=1, step_tokens_buckets=((512.0, 3.0), (math.inf, 4.0)))


def test_a_scrape_crosses_json_unchanged_and_is_restamped_by_its_age() -> None:
    wire = json.loads(json.dumps(encode(SCRAPE, age_s=0.03)))  # strict JSON: +Inf travels as null
    got = decode(wire, now=500.0)
    assert got == EndpointMetrics(**{**{f: getattr(SCRAPE, f) for f in SCRAPE.__slots__}, "scraped_at": 499.97})


@pytest.mark.parametrize("change", [
    (0, -1.0), (1, "3"), (2, float("nan")), (3, 1.5), (4, "a"), (5, [""]), (5, ["x" * 257]), (5, ["x"] * 65),
    (6, True), (11, [0.02]), (11, [0.02, -1]), (11, [float("nan"), 1]), (15, [1, float("inf")]),
    (11, [1.0, 1.0] * 65), (15, None),
])
def test_malformed_fields_are_refused(change: tuple[int, Any]) -> None:
    wire = encode(SCRAPE, 0.0)
    index, value = change
    wire[index] = value
    with pytest.raises(ValueError):
        decode(wire, 0.0)
    shapes: tuple[Any, ...] = (None, {}, wire[:15], [*wire, 1])
    for bad in shapes:
        with pytest.raises(ValueError):
            decode(bad, 0.0)


def test_every_replica_names_the_same_owner_and_endpoints_spread_over_the_replicas() -> None:
    replicas = ["r1", "r2", "r3"]
    addresses = [f"10.0.0.{i}:8000" for i in range(300)]
    owners = [owner(a, replicas) for a in addresses]
    assert owners == [owner(a, list(reversed(replicas))) for a in addresses]
    assert all(60 <= n <= 140 for n in Counter(owners).values()), Counter(owners)
    # A replica leaving moves only its own endpoints.
    after = [owner(a, ["r1", "r2"]) for a in addresses]
    assert all(before == now for before, now in zip(owners, after, strict=True) if before != "r3")
