from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from extproc.bench import routing_suite
from extproc.bench.routing_suite import CASES, summary_markdown, verdicts


def row(strategy: str, p90: float, p99: float, hit: float, *, load: float = 0.8, peer_ok: bool | None = None,
        p90_range: str | None = None, p99_range: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"strategy": strategy, "load": load, "qps": 70.0, "ttft_p50_ms": 30.0,
                             "ttft_p90_ms": p90, "ttft_p99_ms": p99, "hit_rate": hit, "peer_ok": peer_ok}
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
    assert "PASS p90 50 <= 52 (sglang-cache-aware)" in line
    assert "WITHIN NOISE p99 90 > 85" in line  # our best seed (80) beat their worst (95)
    assert "PASS hit 0.9 vs 0.91" in line and "excluded): vllm-router-cache-aware" in line
    assert "PASS default@3: hit 0.88 (-0.020), p90 x1.08" in line
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
        "- zipf @ 0.8: not measured (ours present, peers 0)"]


def test_case_arguments_and_summary(tmp_path: Path) -> None:
    args = argparse.Namespace(strategies="default,sglang-cache-aware", loads="0.4,0.8", repeat=2, duration=10.0,
                              warmup=2.0, stream_chunk_tokens=16, scheduling=None, samples=False)
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
    assert parsed.command.startswith("extproc bench routing --workload shared-prefix --groups 48")
    assert routing_suite._case_args(next(c for c in CASES if c.name == "mixed"), args, tmp_path).strategies == \
        "default,sglang-cache-aware"
    (tmp_path / "uniform").mkdir()
    (tmp_path / "uniform" / "results.json").write_text(json.dumps({
        "capacity": {"rps": 88.2}, "seeds": [0, 1], "duration_s": 10.0,
        "summary": [row("default", 50.0, 90.0, 0.9), row("sglang-cache-aware", 52.0, 95.0, 0.9, peer_ok=True)]}))
    text = summary_markdown(tmp_path, CASES[:2])
    assert "## uniform (`--workload shared-prefix --groups 48" in text and "Capacity 88.2 req/s" in text
    assert "| default | 0.80 | 70.00 | 0.90 |" in text and "PASS p90 50 <= 52" in text
    assert "## zipf\n\nnot run" in text
