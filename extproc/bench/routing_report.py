"""Report files of `extproc bench routing`: results.json, results.md and two PNG charts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from extproc.bench.report import Column, format_markdown_table, plot_lines, write_json

__all__ = ["markdown", "series", "write_reports"]


def series(rows: Sequence[Mapping[str, Any]], key: str, suffix: str = "") -> dict[str, list[tuple[float, float]]]:
    """{strategy + suffix: [(qps, value), ...]} over the rows that ran and have a value for `key`."""
    lines: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        value = row.get(key)
        if "failed" in row or value is None:
            continue
        lines.setdefault(f"{row['strategy']}{suffix}", []).append((float(row["qps"]), float(value)))
    return lines


def markdown(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], meta: Mapping[str, Any]) -> str:
    sizing = meta["kv_sizing"]
    good = [r for r in rows if "failed" not in r]
    parts = [
        f"## Routing benchmark: {meta['workload']}\n",
        f"{meta['endpoints']} simulated replicas, {meta['service_replicas']} service process(es), "
        f"{meta['warmup_s']:g} s warm-up + {meta['duration_s']:g} s measured per point, Poisson arrivals, "
        f"seed {meta['seed']}; {meta['isolation']}. Wall time {meta['wall_s']} s.\n",
        f"KV sizing: {sizing['rule']}. Working set {sizing['working_set_tokens']} tokens, "
        f"{sizing['kv_blocks']} blocks per replica (auto {sizing['auto_kv_blocks']}): the working set is "
        f"{sizing['working_set_per_replica_capacity']} x one replica's cache and the fleet holds "
        f"{sizing['fleet_capacity_per_working_set']} x the working set.\n",
        "Latency in ms; hit = prefix-cache hit rate in tokens (delta of vllm:prefix_cache_hits / queries over "
        "all replicas); cv = coefficient of variation of requests per endpoint (worst pool), max/min likewise "
        f"(- when an endpoint got none); max_core = busiest process in cores (> {meta['saturation_limit_cores']} "
        "means the result may be CPU-bound).\n",
        format_markdown_table(good, columns),
    ]
    failed = [r for r in rows if "failed" in r]
    if failed:
        parts.append("\nFailed points:\n\n" + "".join(f"- {r['strategy']} @ {r['qps']:g}: {r['failed']}\n"
                                                     for r in failed))
    saturated = [f"{r['strategy']} @ {r['qps']:g}: {', '.join(r['saturated'])}" for r in good if r["saturated"]]
    if saturated:
        parts.append("\nSaturated processes: " + "; ".join(saturated) + "\n")
    return "\n".join(parts)


def write_reports(
    out: Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], meta: Mapping[str, Any]
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [write_json(out / "results.json", {**meta, "points": list(rows)})]
    md = out / "results.md"
    md.write_text(markdown(rows, columns, meta), encoding="utf-8")
    paths.append(md)
    ttft = {**series(rows, "ttft_p50_ms", " p50"), **series(rows, "ttft_p99_ms", " p99")}
    paths.append(plot_lines(out / "ttft_vs_qps.png", dict(sorted(ttft.items())), "offered QPS", "TTFT (ms)",
                            f"TTFT vs load: {meta['workload']}", logy=True))
    paths.append(plot_lines(out / "hit_rate_vs_qps.png", series(rows, "hit_rate"), "offered QPS",
                            "prefix-cache hit rate (tokens)", f"Prefix-cache hit rate vs load: {meta['workload']}"))
    return paths
