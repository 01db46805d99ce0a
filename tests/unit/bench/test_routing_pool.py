"""Pooling `extproc bench routing`'s points over their seeds (extproc/bench/routing_pool.py)."""

from __future__ import annotations

from pathlib import Path

from extproc.bench.loadgen import Sample
from extproc.bench.routing_pool import (
    TTFTS,
    attach_ttfts,
    point_key,
    pooled,
    read_ttfts,
    ttfts_ms,
    write_ttfts,
)


def test_only_successful_requests_with_a_first_token_count() -> None:
    ok = Sample(0, {}, 0.0, 0.0, 200, None, 0.0421234, 0.5)
    failed = Sample(1, {}, 0.0, 0.0, 500, "status 500", 0.01, 0.02)
    aborted = Sample(2, {}, 0.0, 0.0, 200, None, 0.03, 0.5, aborted=True)
    no_token = Sample(3, {}, 0.0, 0.0, 200, None, None, 0.5)
    assert ttfts_ms([ok, failed, aborted, no_token]) == [42.123]


def test_one_seed_pools_to_its_own_figures_and_missing_seeds_give_none() -> None:
    seed = {"strategy": "default", "qps": 7.0, "seed": 0, TTFTS: [float(v) for v in range(1, 101)],
            "cache": {"hit_tokens": 30, "query_tokens": 40}}
    assert pooled([seed]) == {"requests": 100, "hit_rate": 0.75, "ttft_p50_ms": 50.5, "ttft_p90_ms": 90.1,
                              "ttft_p99_ms": 99.0}
    without = {"strategy": "default", "qps": 7.0, "seed": 1, "cache": {"hit_tokens": 1}}
    assert pooled([seed, without]) == {"requests": None, "hit_rate": None, "ttft_p50_ms": None,
                                       "ttft_p90_ms": None, "ttft_p99_ms": None}


def test_the_ttfts_file_round_trips_to_the_same_pooled_figures(tmp_path: Path) -> None:
    rows = [{"strategy": "default", "qps": 35.16, "seed": s, TTFTS: [10.0 + s, 20.0, 300.0 * s],
             "cache": {"hit_tokens": 9, "query_tokens": 10}} for s in (0, 1)]
    rows.append({"strategy": "default", "qps": 35.16, "seed": 2, "failed": "boom"})
    path = write_ttfts(tmp_path / "ttfts.json.gz", rows)
    assert set(read_ttfts(path)) == {"default-q35.16-s0", "default-q35.16-s1"} == {point_key(r) for r in rows[:2]}
    stripped = [{k: v for k, v in r.items() if k != TTFTS} for r in rows]
    again = attach_ttfts(stripped, read_ttfts(path))
    assert pooled(again[:2]) == pooled(rows[:2]) and TTFTS not in again[2]
