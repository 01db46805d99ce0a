from __future__ import annotations

import json

import pytest

from extproc.bench.loadgen import Sample
from extproc.bench.stats import percentiles, share_by, shares, summarize, summarize_by


def _ok(i: int, *, start: float, ttft: float | None, e2e: float, tokens: int | None, chunks: int = 0,
        pool: str = "a", replica: str | None = None) -> Sample:
    headers = {"x-sim-replica": replica} if replica else {}
    return Sample(
        i, {"pool": pool}, start, 0.0, 200, None, ttft, e2e, 10, tokens, chunks, True, False, headers
    )


def test_percentiles_linear_interpolation() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentiles(values) == pytest.approx({"p50": 50.5, "p95": 95.05, "p99": 99.01})
    assert percentiles([3.0], qs=(50, 99.9)) == {"p50": 3.0, "p99.9": 3.0}
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None}


def _samples() -> list[Sample]:
    return [
        _ok(0, start=0.0, ttft=0.1, e2e=1.0, tokens=10, replica="r1"),      # tpot 0.1
        _ok(1, start=0.5, ttft=0.2, e2e=0.6, tokens=5, replica="r2"),       # tpot 0.1
        _ok(2, start=1.0, ttft=0.3, e2e=3.3, tokens=None, chunks=11, pool="b", replica="r1"),  # tpot 0.3
        _ok(3, start=1.5, ttft=None, e2e=0.5, tokens=1, pool="b"),          # no ttft: non-stream
        Sample(4, {"pool": "a"}, 2.0, 0.0, 503, "http_5xx", None, 0.01),
        Sample(5, {"pool": "b"}, 2.5, 0.05, 0, "dropped"),
        Sample(6, {"pool": "a"}, 3.0, 0.0, 200, None, 0.1, 0.2, None, None, 2, True, True),
    ]


def test_summarize_counts_errors_and_latencies() -> None:
    summary = summarize(_samples())
    assert summary["total"] == 7
    assert summary["ok"] == 4
    assert summary["aborted"] == 1
    assert summary["errors"] == {"http_5xx": 1, "dropped": 1}
    assert summary["status"] == {"200": 5, "503": 1}
    assert summary["error_rate"] == pytest.approx(2 / 7, abs=1e-6)
    assert summary["late"] == 1
    assert summary["duration_s"] == pytest.approx(4.3)  # first send 0.0 .. last byte 1.0 + 3.3
    assert summary["achieved_rps"] == pytest.approx(4 / 4.3, abs=1e-3)
    assert summary["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert summary["ttft_ms"]["n"] == 3
    assert summary["e2e_ms"]["p50"] == pytest.approx(800.0)
    assert summary["e2e_ms"]["mean"] == pytest.approx(1350.0)
    assert summary["tpot_ms"]["p50"] == pytest.approx(100.0)
    assert summary["tpot_ms"]["p99"] == pytest.approx(296.0)
    assert summary["completion_tokens"] == 10 + 5 + 11 + 1
    assert summary["prompt_tokens"] == 40
    assert summary["output_tokens_per_s"] == pytest.approx(27 / 4.3, abs=1e-3)
    json.dumps(summary, allow_nan=False)


def test_summarize_with_explicit_duration_and_empty_input() -> None:
    assert summarize(_samples(), duration_s=2.0)["achieved_rps"] == 2.0
    empty = summarize([])
    assert empty["total"] == 0 and empty["achieved_rps"] == 0.0 and empty["e2e_ms"]["p99"] is None
    json.dumps(empty, allow_nan=False)


def test_share_by_label_and_header() -> None:
    samples = _samples()
    assert share_by(samples, "pool") == {"a": 4, "b": 3}
    assert share_by(samples, "pool", only_ok=True) == {"a": 2, "b": 2}
    assert share_by(samples, "X-Sim-Replica") == {"-": 4, "r1": 2, "r2": 1}
    assert list(share_by(samples, "X-Sim-Replica")) == ["-", "r1", "r2"]  # most frequent first
    assert shares({"a": 1, "b": 3}) == {"a": 0.25, "b": 0.75}
    assert shares({}) == {}


def test_summarize_by_uses_whole_run_window() -> None:
    groups = summarize_by(_samples(), "pool")
    assert list(groups) == ["a", "b"]
    assert groups["a"]["ok"] == 2 and groups["b"]["ok"] == 2
    assert groups["b"]["duration_s"] == pytest.approx(4.3)
