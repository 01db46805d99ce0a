from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from extproc.bench import routing_suite
from extproc.bench.routing_pool import TTFTS
from extproc.bench.routing_report import aggregate
from extproc.bench.routing_suite import CASES, summary_markdown, verdicts
from extproc.bench.stats import percentiles


def row(strategy: str, p90: float, p99: float, hit: float, *, load: float = 0.8, peer_ok: bool | None = None,
        p90_range: str | None = None, p99_range: str | None = None) -> dict[str, Any]:
    """A summary row whose pooled figures and seed medians are the same (what one seed gives)."""
    found: dict[str, Any] = {"strategy": strategy, "load": load, "qps": 70.0, "ttft_p50_ms": 30.0,
                             "ttft_p90_ms": p90, "ttft_p99_ms": p99, "hit_rate": hit, "peer_ok": peer_ok,
                             "pooled": {"ttft_p50_ms": 30.0, "ttft_p90_ms": p90, "ttft_p99_ms": p99, "hit_rate": hit}}
    if p90_range:
        found["ttft_p90_ms_range"] = p90_range
    if p99_range:
        found["ttft_p99_ms_range"] = p99_range
    return found


def test_verdicts_compare_ours_with_the_best_peer_in_effect() -> None:
    summary = [
        row("default", 50.0, 90.0, 0.90, p90_range="48-55", p99_range="80-120"),
        row("sglang-cache-aware", 52.0, 85.0, 0.91, peer_ok=True, p90_range="50-53", p99_range="82-95"),
        row("vllm-router-cache-aware", 10.0, 10.0, 0.99, peer_ok=False),  # fell back: excluded
        row("envoy-least-request", 5.0, 5.0, 0.2),  # not a peer
        row("default@3", 54.0, 95.0, 0.88),
    ]
    (line,) = verdicts("uniform", summary)
    assert "PASS p90 50 <= 52 (sglang-cache-aware; seed medians 50.0 [48-55] vs 52.0 [50-53])" in line
    assert "FAIL p99 90 > 85" in line  # even though our best seed (80) beat their worst (95)
    assert "PASS hit 0.9 vs 0.91" in line and "excluded): vllm-router-cache-aware" in line
    assert "PASS default@3: hit 0.88 (-0.020), p90 x1.08" in line and "engines' own" not in line
    summary[0]["engine_ttft_ms"] = {"p90": 40.0}
    summary[4]["engine_ttft_ms"] = {"p90": 41.0}
    (line,) = verdicts("uniform", summary)
    assert "PASS default@3: hit 0.88 (-0.020), p90 x1.08 (engines' own p90 x1.02)" in line
    summary[0] = row("default", 60.0, 130.0, 0.85, p90_range="58-62", p99_range="120-140")
    summary[4] = row("default@3", 70.0, 130.0, 0.84)
    (line,) = verdicts("uniform", summary)
    assert "FAIL p90 60 > 52" in line and "FAIL p99 130 > 85" in line and "FAIL hit 0.85" in line
    assert "FAIL default@3" in line


def test_zipf_at_80_percent_needs_a_fifth_of_sglangs_p90() -> None:
    summary = [row("default", 50.0, 200.0, 0.9), row("sglang-cache-aware", 1000.0, 2000.0, 0.9, peer_ok=True),
               row("default", 45.0, 200.0, 0.9, load=0.4),
               row("sglang-cache-aware", 48.0, 210.0, 0.9, load=0.4, peer_ok=True)]
    low, high = verdicts("zipf", summary)
    assert low.startswith("- zipf @ 0.4") and "sglang's" not in low
    assert "PASS p90 / sglang's p90 = 0.050" in high
    assert verdicts("zipf", [row("default", 50.0, 90.0, 0.9)]) == [
        "- zipf @ 0.8: not measured (ours present, pooled peers 0)"]


def point(strategy: str, seed: int, ttfts: list[float], hits: int = 900, queries: int = 1000) -> dict[str, Any]:
    """A point row as `bench routing` keeps it during a run: its own percentiles, its TTFTs, its cache counters."""
    own = percentiles(ttfts, (50, 90, 99))
    return {"strategy": strategy, "qps": 70.0, "load": 0.4, "seed": seed, "ok": len(ttfts), "errors": 0,
            **{f"ttft_{k}_ms": v for k, v in own.items()}, "hit_rate": round(hits / queries, 4),
            "cache": {"hit_tokens": hits, "query_tokens": queries}, TTFTS: ttfts, "cores": {}, "saturated": [],
            **({"peer": {"policy_check": {"ok": True}}} if strategy != "default" else {})}


# A peer whose every seed has 2 of 100 requests at 600 ms: p99 600 per seed and pooled.
PEER = [point("sglang-cache-aware", seed, [10.0] * 98 + [600.0] * 2) for seed in (0, 1)]


def test_seed_medians_that_pass_do_not_hide_a_pooled_p99_that_fails() -> None:
    # Seed 0 has 3 requests of 100 at 1 s (p99 1000), seed 1 none (p99 10): the median of the two p99s is 505,
    # under the peer's 600, but 3 slow requests of 200 are 1.5%: the pooled p99 is 1000.
    ours = [point("default", 0, [10.0] * 97 + [1000.0] * 3), point("default", 1, [10.0] * 100)]
    summary = aggregate(ours + PEER)
    mine = next(r for r in summary if r["strategy"] == "default")
    assert mine["ttft_p99_ms"] == 505.0 and mine["pooled"]["ttft_p99_ms"] == 1000.0
    (line,) = verdicts("uniform", summary)
    assert "FAIL p99 1000 > 600 (sglang-cache-aware; seed medians 505.0 [10-1000] vs 600.0" in line
    assert "PASS p90 10 <= 10" in line


def test_seed_medians_that_fail_do_not_hide_a_pooled_p99_that_passes() -> None:
    # Two seeds of 100 requests with 2 at 1 s each (p99 1000) and one of 300 with none (p99 10): the median p99 is
    # 1000, but 4 slow requests of 500 are 0.8%, under 1%: the pooled p99 is 10.
    ours = [point("default", 0, [10.0] * 98 + [1000.0] * 2), point("default", 1, [10.0] * 98 + [1000.0] * 2),
            point("default", 2, [10.0] * 300)]
    summary = aggregate(ours + PEER)
    mine = next(r for r in summary if r["strategy"] == "default")
    assert mine["ttft_p99_ms"] == 1000.0 and mine["pooled"] == {
        "requests": 500, "hit_rate": 0.9, "ttft_p50_ms": 10.0, "ttft_p90_ms": 10.0, "ttft_p99_ms": 10.0}
    (line,) = verdicts("uniform", summary)
    assert "PASS p99 10 <= 600" in line


def test_the_hit_rate_is_pooled_by_tokens_not_by_seeds() -> None:
    # Seed 0: 90 of 100 tokens hit (0.9); seed 1, a far busier window: 5,000 of 10,000 (0.5). The seeds' median is
    # 0.7, above the peer's 0.6 - 0.02; over every token it is 5,090 / 10,100 = 0.504: a fail.
    ours = [point("default", 0, [10.0] * 100, hits=90, queries=100),
            point("default", 1, [10.0] * 100, hits=5000, queries=10000)]
    peer = [point("sglang-cache-aware", seed, [10.0] * 100, hits=600, queries=1000) for seed in (0, 1)]
    summary = aggregate(ours + peer)
    mine = next(r for r in summary if r["strategy"] == "default")
    assert mine["hit_rate"] == 0.7 and mine["pooled"]["hit_rate"] == 0.504
    (line,) = verdicts("uniform", summary)
    assert "FAIL hit 0.504 vs 0.6 (sglang-cache-aware) - 0.02" in line


def test_rows_without_pooled_figures_are_not_judged_on_medians() -> None:
    old = row("default", 50.0, 90.0, 0.9)
    del old["pooled"]  # a results.json from before pooling
    assert verdicts("uniform", [old, row("sglang-cache-aware", 52.0, 95.0, 0.9, peer_ok=True)]) == [
        "- uniform @ 0.8: not measured (ours not pooled, pooled peers 1)"]
    half = aggregate([point("default", 0, [10.0] * 100), {**point("default", 1, [10.0] * 100), TTFTS: None}])
    assert half[0]["pooled"]["ttft_p99_ms"] is None  # never pooled from part of the seeds


def test_case_arguments_and_summary(tmp_path: Path) -> None:
    args = argparse.Namespace(strategies="default,sglang-cache-aware", loads="0.4,0.8", repeat=2, duration=10.0,
                              warmup=2.0, stream_chunk_tokens=16, scheduling=None, samples=False, isolate="off")
    uniform = next(c for c in CASES if c.name == "uniform")
    parsed = routing_suite._case_args(uniform, args, tmp_path)
    assert parsed.strategies == "default,sglang-cache-aware,default@3" and parsed.workload == "shared-prefix"
    assert parsed.groups == 48 and parsed.popularity == "uniform" and parsed.repeat == 2
    assert parsed.stream_chunk_tokens == 16 and parsed.scheduling is None and not parsed.samples
    args.samples = True  # per-request samples for diagnosis reach the case's run
    assert routing_suite._case_args(uniform, args, tmp_path).samples
    args.samples = False
    args.scheduling = "variants.yaml"  # extra profiles reach every case
    assert routing_suite._case_args(uniform, args, tmp_path).scheduling == "variants.yaml"
    args.scheduling = None
    assert parsed.isolate == "off"
    args.isolate = "0"  # the CPU split reaches every case
    assert routing_suite._case_args(uniform, args, tmp_path).isolate == "0"
    args.isolate = "off"
    assert parsed.command.startswith("extproc bench routing --workload shared-prefix --groups 48")
    assert routing_suite._case_args(next(c for c in CASES if c.name == "mixed"), args, tmp_path).strategies == \
        "default,sglang-cache-aware"
    (tmp_path / "uniform").mkdir()
    (tmp_path / "uniform" / "results.json").write_text(json.dumps({
        "capacity": {"rps": 88.2}, "seeds": [0, 1], "duration_s": 10.0,
        "summary": [row("default", 50.0, 90.0, 0.9), row("sglang-cache-aware", 52.0, 95.0, 0.9, peer_ok=True)]}))
    text = summary_markdown(tmp_path, CASES[:2])
    assert "## uniform (`--workload shared-prefix --groups 48" in text and "Capacity 88.2 req/s" in text
    assert "| default | 0.80 | 70.00 | - | 0.90 | 0.90 |" in text and "PASS p90 50 <= 52" in text
    assert "## zipf\n\nnot run" in text
