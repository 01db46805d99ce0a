"""Pooling the overload benchmark's points over seeds (`--repeat`): one seed's TTFT p99 is set by the few slowest
requests of one arrival burst, and a median of per-seed p99s hides how often that happens. The honest unit is the
percentile over every seed's requests together: `pooled` gives, per strategy and load, the class rows of all the
seeds' samples, the goodput over all their measured seconds, the lowest Jain index of any seed, flow control's
counts summed and its longest queue wait per class."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from extproc.bench.loadgen import Sample
from extproc.bench.overload_mix import class_rows

__all__ = ["pooled"]


def pooled(points: Sequence[tuple[Mapping[str, Any], Sequence[Sample]]], duration_s: float,
           slo_s: float) -> list[dict[str, Any]]:
    """One row per (strategy, load) over its points (rows of `run_point` with their measured samples)."""
    groups: dict[tuple[str, float], list[tuple[Mapping[str, Any], Sequence[Sample]]]] = {}
    for row, samples in points:
        groups.setdefault((row["strategy"], row["load"]), []).append((row, samples))
    out: list[dict[str, Any]] = []
    for (strategy, load), members in groups.items():
        rows = [row for row, _ in members]
        samples = [sample for _, found in members for sample in found]
        classes = class_rows(samples, slo_s)
        within = sum(row["within_slo"] for row in classes.values())
        jains = [row["fairness"]["jain"] for row in rows if row.get("fairness", {}).get("jain") is not None]
        waits: dict[str, float] = {}
        for row in rows:
            for klass, wait in row.get("max_queue_wait_s", {}).items():
                waits[klass] = max(waits.get(klass, 0.0), wait)
        out.append({
            "strategy": strategy, "load": load, "seeds": [row.get("seed") for row in rows], "classes": classes,
            "goodput_rps": round(within / (duration_s * len(rows)), 2),
            "fairness": {"jain": min(jains) if jains else None},
            "flow_run": {key: sum(row.get("flow_run", {}).get(key, 0) for row in rows)
                         for key in ("queued", "waited_over_1s", "rejected")},
            "max_queue_wait_s": waits,
            "flow_run_reserving": {reason: sum(row.get("flow_run_reserving", {}).get(reason, 0) for row in rows)
                                   for reason in sorted({k for row in rows
                                                         for k in row.get("flow_run_reserving", {})})},
            "client_timeouts": sum(row.get("client_timeouts", 0) for row in rows),
        })
    return out
