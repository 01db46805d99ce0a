"""Report files of `extproc bench routing`: results.json, results.md and two PNG charts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from extproc.bench.report import Column, format_markdown_table, plot_lines, write_json

__all__ = ["markdown", "plot_ttft", "series", "write_reports"]


def _pairs(mapping: Mapping[str, Any]) -> str:
    return ", ".join(f"{key} {value}" for key, value in mapping.items())


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
        f"KV sizing: {sizing['rule']}. Working set (tokens): {_pairs(sizing['working_set_tokens'])}; "
        f"{sizing['kv_blocks']} blocks per replica (auto {sizing['auto_kv_blocks']}), so the working set is "
        f"({_pairs(sizing['working_set_per_replica_capacity'])}) x one replica's cache and the fleet holds "
        f"({_pairs(sizing['fleet_capacity_per_working_set'])}) x the working set.\n",
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
    paths.append(plot_ttft(out / "ttft_vs_qps.png", rows, f"TTFT vs load: {meta['workload']}"))
    paths.append(plot_lines(out / "hit_rate_vs_qps.png", series(rows, "hit_rate"), "offered QPS",
                            "prefix-cache hit rate (tokens)", f"Prefix-cache hit rate vs load: {meta['workload']}"))
    return paths


def plot_ttft(path: Path, rows: Sequence[Mapping[str, Any]], title: str) -> Path:
    """p50 (solid) and p99 (dashed) TTFT per strategy, one colour per strategy, log scale."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    p50, p99 = series(rows, "ttft_p50_ms"), series(rows, "ttft_p99_ms")
    for index, strategy in enumerate(sorted(set(p50) | set(p99))):
        colour = f"C{index % 10}"
        for points, style, label in ((p50, "-", "p50"), (p99, "--", "p99")):
            ordered = sorted(points.get(strategy, []))
            if ordered:
                ax.plot([x for x, _ in ordered], [y for _, y in ordered], style, color=colour, marker="o",
                        markersize=3, label=f"{strategy} {label}")
    ax.set_xlabel("offered QPS")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title(title)
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    if p50 or p99:
        ax.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
