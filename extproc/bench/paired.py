"""Paired per-round differences between two variants of one alternating run (`extproc bench overhead`): each
round runs every variant back to back, so a round's difference of p50s cancels most of the machine's drift;
their median and spread say whether a small cost is real or noise."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from extproc.bench.loadgen import Sample
from extproc.bench.stats import summarize

__all__ = ["TRACED_SUFFIXES", "TWIN", "paired_difference", "round_p50", "tracing_report"]

# `bench overhead --tracing-envoy`: the traced variants, by name suffix (ours alone; ours and Envoy's tracer).
OURS_ONLY, TRACED = "+tracing-ours-only", "+tracing"
TRACED_SUFFIXES = {"on": (TRACED,), "off": (OURS_ONLY,), "both": (OURS_ONLY, TRACED)}
# The control of the traced variants: tracing off, its own service and Envoy like them. The first variant is no
# fair control: its Envoy also serves the backend (one process, no hop between Envoys), theirs does not.
TWIN = "+tracing-off"


def round_p50(samples: Sequence[Sample]) -> float | None:
    """p50 end-to-end latency (ms) of one round's samples."""
    p50 = summarize(list(samples))["e2e_ms"]["p50"]
    return None if p50 is None else float(p50)


def paired_difference(treated: Sequence[float | None], control: Sequence[float | None]) -> dict[str, Any]:
    """treated - control per round (ms), and their median, mean, standard deviation, min and max."""
    diffs = [round(a - b, 4) for a, b in zip(treated, control, strict=True) if a is not None and b is not None]
    if not diffs:
        return {"rounds": 0}
    return {"rounds": len(diffs), "per_round_ms": diffs, "median_ms": round(statistics.median(diffs), 4),
            "mean_ms": round(statistics.fmean(diffs), 4),
            "stdev_ms": round(statistics.stdev(diffs), 4) if len(diffs) > 1 else None,
            "min_ms": min(diffs), "max_ms": max(diffs),
            "rounds_positive": sum(d > 0 for d in diffs)}


def tracing_report(report: dict[str, Any], added: dict[str, dict[str, float]],
                   rounds_p50: dict[str, list[float | None]], control: str, spans: int, ratio: float) -> None:
    """Each traced variant (`<first>+tracing...`) over tracing off (its twin `<first>+tracing-off`, else the first
    variant), same run: pooled and per round. The first one present also fills the top-level `tracing_minus_off_*`
    keys; the twin over the first variant is reported too (`twin_minus_first_ms`: the topology's own cost)."""
    report["spans_exported"] = spans
    first, control = control, control + TWIN if control + TWIN in added else control
    if control != first and first in added:
        report["twin_minus_first_ms"] = {"p50": round(added[control]["p50"] - added[first]["p50"], 3),
                                         "p50_per_round": paired_difference(rounds_p50[control], rounds_p50[first])}
        print(f"tracing-off twin over the first variant (same configuration, an Envoy of its own in front of the "
              f"first's backend): p50 {report['twin_minus_first_ms']['p50']} ms")
    for suffix in (TRACED, OURS_ONLY):
        traced = first + suffix
        if traced not in added or control not in added:
            continue
        pooled = {q: round(added[traced][q] - added[control][q], 3) for q in ("p50", "p99")}
        paired = paired_difference(rounds_p50[traced], rounds_p50[control])
        report.setdefault("tracing_minus_off_ms", pooled)
        report.setdefault("tracing_minus_off_p50_per_round", paired)
        report.setdefault("tracing_variants", {})[suffix] = {"minus_off_ms": pooled, "p50_per_round": paired}
        who = "ours and Envoy's tracer" if suffix == TRACED else "ours only, Envoy's tracer off"
        print(f"tracing ({who}) at ratio {ratio} over tracing off, same run: pooled p50 {pooled['p50']} ms, p99 "
              f"{pooled['p99']} ms; p50 difference per round: median {paired.get('median_ms')} ms, stdev "
              f"{paired.get('stdev_ms')} ms, range [{paired.get('min_ms')}, {paired.get('max_ms')}], "
              f"{paired.get('rounds_positive')} of {paired['rounds']} rounds above 0")
    print(f"{spans} spans received by the collector (ours and Envoy's, warm-up and max-throughput runs included)")
