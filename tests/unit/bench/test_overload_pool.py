"""Pooling overload points over seeds: percentiles over every seed's requests together, not a median of p99s."""

from __future__ import annotations

from typing import Any

from extproc.bench.loadgen import Sample
from extproc.bench.overload_pool import pooled


def _served(index: int, klass: str, ttft_s: float) -> Sample:
    return Sample(index, {"tenant": "t", "class": klass}, 0.0, 0.0, status=200, ttft_s=ttft_s, e2e_s=ttft_s + 1.0)


def _row(strategy: str, seed: int, jain: float, queued: int, wait: float) -> dict[str, Any]:
    return {"strategy": strategy, "load": 0.9, "seed": seed, "fairness": {"jain": jain},
            "flow_run": {"queued": queued, "waited_over_1s": 0, "rejected": 1}, "max_queue_wait_s": {"standard": wait},
            "client_timeouts": 0}


def test_pooled_p99_is_over_every_seeds_requests_and_one_seeds_burst_counts_once() -> None:
    # Seed 0: 100 fast standard requests. Seed 1: 97 fast and 3 slow ones (a burst). The median of the per-seed
    # p99s would say 10 or 900 ms; over the 200 requests together the p99 is the 2nd slowest of them: 900 ms...
    fast = [_served(i, "standard", 0.01) for i in range(100)]
    burst = [*(_served(i, "standard", 0.01) for i in range(97)), *(_served(97 + i, "standard", 0.9) for i in range(3))]
    rows = pooled([(_row("default", 0, 1.0, 5, 0.2), fast), (_row("default", 1, 0.8, 7, 0.4), burst),
                   (_row("default+noflow", 0, 1.0, 0, 0.0), fast)], duration_s=10.0, slo_s=0.5)
    assert [(r["strategy"], r["seeds"]) for r in rows] == [("default", [0, 1]), ("default+noflow", [0])]
    on = rows[0]
    assert on["classes"]["standard"]["served"] == 200
    assert on["classes"]["standard"]["ttft_p99_ms"] == 900.0
    # ...while with one slow request among 200 it is a fast one: the tail is weighed by how often it happens.
    one = pooled([(_row("default", 0, 1.0, 0, 0.0), fast),
                  (_row("default", 1, 1.0, 0, 0.0), [*fast[:99], _served(99, "standard", 0.9)])], 10.0, 0.5)
    assert one[0]["classes"]["standard"]["ttft_p99_ms"] == 10.0
    assert on["goodput_rps"] == 9.85  # 197 within the SLO over 2 x 10 s
    assert on["fairness"]["jain"] == 0.8  # the worst seed
    assert on["flow_run"] == {"queued": 12, "waited_over_1s": 0, "rejected": 2}
    assert on["max_queue_wait_s"] == {"standard": 0.4}
    assert rows[1]["classes"]["standard"]["ttft_p99_ms"] == 10.0
