from __future__ import annotations

import math

import pytest

from extproc.bench.loadgen import Sample
from extproc.bench.routing_metrics import (
    cores_used,
    counter_total,
    endpoint_counts,
    engine_ttft,
    hit_by_label,
    hit_rate,
    kv_blocks_for,
    saturated,
    spread,
)
from extproc.sim.metrics import Counters, Gauges, render_metrics


def _metrics(queries: int, hits: int, model: str = "m") -> str:
    counters = Counters()
    counters.prefix_queries_tokens, counters.prefix_hits_tokens = queries, hits
    gauges = Gauges(running=0, waiting=0, kv_usage=0.0, running_loras=(), waiting_loras=(), max_loras=4,
                    block_size=16, num_gpu_blocks=100, timestamp=0.0)
    return render_metrics(model, counters, gauges)


def test_counter_total_sums_label_sets_and_ignores_other_families() -> None:
    text = "\n".join([
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        'vllm:prefix_cache_hits_total{model_name="a"} 10.0',
        'vllm:prefix_cache_hits_total{model_name="b b"} 5',
        'vllm:prefix_cache_hits_created{model_name="a"} 1.7e9',
        'vllm:prefix_cache_hits_totalx{model_name="a"} 99',
        "vllm:prefix_cache_hits 2.5",
        "garbage line",
    ])
    assert counter_total(text, "vllm:prefix_cache_hits") == 17.5
    assert counter_total(text, "vllm:prefix_cache_queries") == 0.0
    assert counter_total(_metrics(120, 30), "vllm:prefix_cache_queries") == 120.0


def test_hit_rate_is_delta_hits_over_delta_queries_summed_over_replicas() -> None:
    before = {"r1": _metrics(1000, 500), "r2": _metrics(0, 0), "gone": _metrics(5, 5)}
    after = {"r1": _metrics(3000, 1500), "r2": _metrics(1000, 100), "new": _metrics(1, 1)}
    result = hit_rate(before, after)
    # (1000 + 100) / (2000 + 1000): counters from before the run do not count.
    assert result["hit_rate"] == round(1100 / 3000, 4)
    assert (result["hit_tokens"], result["query_tokens"]) == (1100, 3000)
    assert result["per_replica"] == {"r1": 0.5, "r2": 0.1}
    assert result["missing"] == ["gone", "new"]
    idle = hit_rate({"r1": _metrics(10, 5)}, {"r1": _metrics(10, 5)})
    assert idle["hit_rate"] is None and idle["per_replica"] == {"r1": None}


def test_spread_figures() -> None:
    assert spread({"a": 10, "b": 10, "c": 10}) == {"max_min": 1.0, "cv": 0.0}
    uneven = spread({"a": 30, "b": 10})
    assert uneven["max_min"] == 3.0
    assert uneven["cv"] == pytest.approx(0.5)  # std 10 / mean 20
    assert spread({"a": 5, "b": 0})["max_min"] is None  # an idle endpoint: max/min is infinite
    assert spread({"a": 0, "b": 0}) == {"max_min": None, "cv": None}
    assert spread({}) == {"max_min": None, "cv": None}


def test_endpoint_counts_include_idle_endpoints_and_skip_failures() -> None:
    def sample(host: str | None, error: str | None = None, sim: str | None = None) -> Sample:
        headers = {k: v for k, v in (("x-gateway-upstream-host", host), ("x-sim-replica", sim)) if v}
        return Sample(0, {}, 0.0, 0.0, 200 if error is None else 503, error, headers=headers)

    samples = [sample("h1"), sample("h1"), sample("h2"), sample("h1", "http_5xx"), sample(None, sim="h3"),
               sample(None)]
    assert endpoint_counts(samples, ["h1", "h2", "h3", "h4"]) == {"h1": 2, "h2": 1, "h3": 1, "h4": 0, "-": 1}


def test_kv_sizing_rule() -> None:
    # 32 groups x ~2,250 tokens = 72,000 tokens = 4,500 blocks: one replica holds 1/2.5 of it, the fleet
    # of 8 holds 3.2x.
    assert kv_blocks_for(72_000, 8) == 1800
    assert 2 <= 4500 / kv_blocks_for(72_000, 8) <= 4
    assert 8 * kv_blocks_for(72_000, 8) >= 4500
    # Few replicas: the fleet must still hold the working set with 25% headroom.
    assert kv_blocks_for(72_000, 2) == math.ceil(4500 * 1.25 / 2)
    # Small working sets never go below one max_model_len sequence (8192 tokens = 512 blocks).
    assert kv_blocks_for(1_000, 8) == 512
    assert kv_blocks_for(72_000, 8, ratio=3.0) == 1500
    with pytest.raises(ValueError):
        kv_blocks_for(100, 0)


def test_cores_used_and_saturation() -> None:
    cores = cores_used({"sim": 1.0, "envoy": 2.0, "client": 0.5}, {"sim": 10.5, "envoy": 3.0, "extra": 4.0}, 10.0)
    assert cores == {"sim": 0.95, "envoy": 0.1}
    assert saturated(cores) == ["sim"]
    assert cores_used({"a": 1.0}, {"a": 2.0}, 0.0) == {}


def _ttft_text(counts: dict[str, float]) -> str:
    bounds = ["0.04", "0.06", "0.08", "0.1", "0.25", "+Inf"]
    total, lines = 0.0, []
    for bound in bounds:
        total += counts.get(bound, 0.0)
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{le="{bound}",model_name="m"}} {total}')
    return "\n".join(lines) + "\nvllm:time_to_first_token_seconds_count 1\n"


def test_engine_ttft_interpolates_the_runs_histogram_over_replicas() -> None:
    before = {"a": _ttft_text({"0.04": 50}), "b": _ttft_text({})}
    # Over the run: 80 requests under 40 ms, 10 in (40, 60], 10 in (100, 250] on the two replicas together.
    after = {"a": _ttft_text({"0.04": 100, "0.06": 10}), "b": _ttft_text({"0.04": 30, "0.25": 10}),
             "gone": _ttft_text({"0.25": 99})}
    ttft = engine_ttft(before, after)
    assert ttft["p50"] == 25.0  # rank 50 of 80 in [0, 40 ms]
    assert ttft["p90"] == 60.0  # rank 90: the top of (40, 60]
    assert ttft["p99"] == 235.0  # rank 99: 9 of 10 into (100, 250]
    assert engine_ttft(before, before) == {"p50": None, "p90": None, "p99": None}


def test_hit_by_label_uses_each_answer_s_cached_tokens() -> None:
    def sample(workload: str, prompt: int | None, cached: int | None, error: str | None = None) -> Sample:
        return Sample(0, {"workload": workload}, 0.0, 0.0, 200, error, prompt_tokens=prompt, cached_tokens=cached)

    rates = hit_by_label([sample("chat", 100, 50), sample("chat", 100, 70), sample("agents", 200, 180),
                          sample("agents", 100, None), sample("agents", 100, 100, "http_5xx")], "workload")
    assert rates == {"agents": 0.9, "chat": 0.6, "agents_minus_chat": 0.3}
    assert hit_by_label([sample("chat", 10, 5)], "other") == {}
