"""Report files of `extproc bench routing`: results.json (every point), results.md (per load, every strategy: TTFT
percentiles and hit rate pooled over the seeds, the seeds' median and range next to them, CPU per process), the
pooled points' TTFTs (`routing_pool.TTFTS_FILE`), and PNG charts of pooled TTFT and hit rate against load."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from extproc.bench.loadgen import Sample
from extproc.bench.report import Column, format_markdown_table, plot_lines, write_json
from extproc.bench.routing_pool import TTFTS, TTFTS_FILE, pooled, write_ttfts
from extproc.bench.stats import percentiles

__all__ = ["TABLE", "aggregate", "latency_by", "markdown", "plot_ttft", "series", "table_for", "write_reports"]

# The median over seeds of these; "_range" keys hold "min-max" when there are several seeds. TTFT percentiles and
# hit rate are also pooled over the seeds (`pooled.*`, routing_pool.py): those are the figures to compare.
_MEDIANS = ("ok", "hit_rate", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
            "e2e_p50_ms", "output_tokens_per_s", "goodput_rps", "spread_cv", "engine_ttft_ms.p50",
            "engine_ttft_ms.p90", "engine_ttft_ms.p99", "hit_by_workload.agents", "hit_by_workload.chat",
            "hit_by_workload.agents_minus_chat")
_RANGES = ("hit_rate", "ttft_p90_ms", "ttft_p99_ms", "hit_by_workload.agents_minus_chat")
# agents+chat: hit rate per workload, from each response's own cached tokens (shown when a run has them).
_BY_WORKLOAD: list[Column] = [("hit_by_workload.chat", "hit chat"), ("hit_by_workload.agents", "hit agents"),
                              ("hit_by_workload.agents_minus_chat", "agents-chat"),
                              ("hit_by_workload.agents_minus_chat_range", "a-c range")]
_SUMS = ("errors", "flow.queued", "flow.waited_over_1s", "flow.rejected")

TABLE: list[Column] = [
    ("strategy", "strategy"), ("load", "load"), ("qps", "req/s"), ("seeds", "seeds"), ("ok", "ok"),
    ("errors", "err"), ("pooled.hit_rate", "hit"), ("hit_rate", "hit med"), ("hit_rate_range", "hit range"),
    ("pooled.ttft_p50_ms", "ttft50"), ("pooled.ttft_p90_ms", "ttft90"), ("ttft_p90_ms", "ttft90 med"),
    ("ttft_p90_ms_range", "ttft90 range"), ("pooled.ttft_p99_ms", "ttft99"), ("ttft_p99_ms", "ttft99 med"),
    ("ttft_p99_ms_range", "ttft99 range"), ("tpot_p50_ms", "tpot50"), ("tpot_p99_ms", "tpot99"),
    ("goodput_rps", "goodput"), ("engine_ttft_ms.p90", "eng90"), ("engine_ttft_ms.p99", "eng99"),
    ("spread_cv", "cv"), ("flow.queued", "fc_q"), ("flow.rejected", "fc_rej"),
    ("peer_ok", "peer ok"), ("max_cores", "max_core"), ("lag_max_ms", "lag max"),
]


def latency_by(samples: Sequence[Sample], label: str) -> dict[str, dict[str, Any]]:
    """TTFT percentiles (ms) of the successful samples per value of `label` ({} when no sample has it)."""
    groups: dict[str, list[float]] = {}
    for s in samples:
        value = s.labels.get(label)
        if value is not None and s.error is None and not s.aborted and s.ttft_s is not None:
            groups.setdefault(value, []).append(s.ttft_s * 1000.0)
    out: dict[str, dict[str, Any]] = {}
    for value, ttfts in sorted(groups.items()):
        p = percentiles(ttfts, (50, 90, 99))
        out[value] = {"n": len(ttfts), **{f"ttft_{k}_ms": None if v is None else round(v, 1) for k, v in p.items()}}
    return out


def table_for(rows: Sequence[Mapping[str, Any]]) -> list[Column]:
    """TABLE, plus the per-workload hit rates when some row has them."""
    return TABLE + _BY_WORKLOAD if any(_get(r, "hit_by_workload.chat") is not None for r in rows) else TABLE


def _get(row: Mapping[str, Any], key: str) -> Any:
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _put(row: dict[str, Any], key: str, value: Any) -> None:
    *path, last = key.split(".")
    for part in path:
        row = row.setdefault(part, {})
    row[last] = value


def aggregate(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (strategy, rate) over its seeds: TTFT percentiles and hit rate pooled (`pooled`), medians,
    ranges, sums; CPU per process as medians."""
    groups: dict[tuple[str, float], list[Mapping[str, Any]]] = {}
    for row in rows:
        if "failed" not in row:
            groups.setdefault((row["strategy"], float(row["qps"])), []).append(row)
    out: list[dict[str, Any]] = []
    for (strategy, qps), members in groups.items():
        merged: dict[str, Any] = {"strategy": strategy, "qps": qps, "load": members[0].get("load"),
                                  "seeds": len(members), "pooled": pooled(members)}
        for key in _MEDIANS:
            values = [v for v in (_get(m, key) for m in members) if v is not None]
            _put(merged, key, round(statistics.median(values), 4) if values else None)
            if key in _RANGES and len(values) > 1:
                _put(merged, f"{key}_range", f"{min(values):g}..{max(values):g}" if "." in key else
                     f"{min(values):g}-{max(values):g}")
        for key in _SUMS:
            values = [v for v in (_get(m, key) for m in members) if v is not None]
            if values:
                _put(merged, key, sum(values))
        names = sorted({name for m in members for name in m.get("cores", {})})
        merged["cores"] = {name: round(statistics.median(m["cores"].get(name, 0.0) for m in members), 3)
                           for name in names}
        merged["max_cores"] = max((m.get("max_cores") or 0.0 for m in members), default=None)
        lags = [lag for lag in (_get(m, "service_loop_lag.max_ms") for m in members) if lag is not None]
        merged["lag_max_ms"] = max(lags) if lags else None
        checks = [m["peer"]["policy_check"]["ok"] for m in members if "peer" in m]
        merged["peer_ok"] = all(checks) if checks else None
        merged["saturated"] = sorted({name for m in members for name in m.get("saturated", [])})
        out.append(merged)
    return out


def series(rows: Sequence[Mapping[str, Any]], key: str, suffix: str = "") -> dict[str, list[tuple[float, float]]]:
    """{strategy + suffix: [(load or qps, value), ...]} over the rows that ran and have a value for `key`."""
    lines: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        value = _get(row, key)
        if "failed" in row or value is None:
            continue
        x = row.get("load") or row["qps"]
        lines.setdefault(f"{row['strategy']}{suffix}", []).append((float(x), float(value)))
    return lines


def _pairs(mapping: Mapping[str, Any]) -> str:
    return ", ".join(f"{key} {value}" for key, value in mapping.items())


def _cpu_table(rows: Sequence[Mapping[str, Any]]) -> str:
    names = sorted({name for row in rows for name in row.get("cores", {})})
    columns: list[Column] = [("strategy", "strategy"), ("load", "load"), *((f"cores.{n}", n) for n in names)]
    return format_markdown_table(rows, columns)


def _breakdown(rows: Sequence[Mapping[str, Any]], key: str, title: str) -> str:
    """TTFT p90/p99 per label value (drift phase, mixed kind), seed 0's run of each point."""
    lines = []
    for row in rows:
        parts = row.get(key) or {}
        if parts:
            cells = "; ".join(f"{value}: n {p['n']}, p90 {p['ttft_p90_ms']}, p99 {p['ttft_p99_ms']}"
                              for value, p in parts.items())
            lines.append(f"- {row['strategy']} @ {row.get('load') or row['qps']:g}: {cells}")
    return f"\n{title} (ms):\n\n" + "\n".join(lines) + "\n" if lines else ""


def markdown(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> str:
    sizing, capacity = meta["kv_sizing"], meta.get("capacity") or {}
    good = [r for r in rows if "failed" not in r]
    merged = aggregate(good)
    seeds = meta.get("seeds", [0])
    parts = [
        f"## Routing benchmark: {meta['workload']}\n",
        f"{meta['endpoints']} simulated replicas, {meta['service_replicas']} service process(es), "
        f"{meta['warmup_s']:g} s warm-up + {meta['duration_s']:g} s measured per point, Poisson arrivals, "
        f"seeds {', '.join(map(str, seeds))}; {meta['isolation']}. Wall time {meta['wall_s']} s.\n",
    ]
    if meta.get("command"):
        parts.append(f"Command: `{meta['command']}`\n")
    if capacity:
        parts.append(f"Capacity {capacity['rps']} req/s ({capacity['rule']}): "
                     + "; ".join(f"{pool}: {_pairs(shape)}" for pool, shape in capacity["pools"].items()) + ".\n")
    parts += [
        f"KV sizing: {sizing['rule']}. Working set (tokens): {_pairs(sizing['working_set_tokens'])}; "
        f"{sizing['kv_blocks']} blocks per replica (auto {sizing['auto_kv_blocks']}), so the working set is "
        f"({_pairs(sizing['working_set_per_replica_capacity'])}) x one replica's cache and the fleet holds "
        f"({_pairs(sizing['fleet_capacity_per_working_set'])}) x the working set.\n",
        "ttft50 / ttft90 / ttft99 = TTFT percentiles over every seed's requests together (pooled); hit = "
        "prefix-cache hit rate in tokens (delta of vllm:prefix_cache_hits / queries over all replicas, summed over "
        "the seeds); med = the median of the seeds' own values, range = their min-max; other columns are medians "
        "over the seeds. Latency in ms; goodput = requests/s served with TTFT <= "
        f"{meta.get('slo_ttft_s', '-')} s; eng90 / eng99 = TTFT p90 / p99 as the engines saw it (queue and prefill, "
        "interpolated in vLLM's histogram buckets: coarse, but free of the proxy path's CPU); "
        "cv = coefficient of variation of requests per endpoint (worst pool); "
        "fc_q / fc_rej = requests flow control queued / refused; peer ok = the peer's own counters show its "
        f"policy decided; max_core = busiest process in cores (> {meta['saturation_limit_cores']} means the "
        "result may be CPU-bound); lag max = the service's longest event-loop stall in a measured run (ms, the "
        "worst seed and replica: a garbage collection, a blocking call or a starved CPU shows here).\n",
    ]
    for load in dict.fromkeys(r.get("load") or r["qps"] for r in merged):
        at = [r for r in merged if (r.get("load") or r["qps"]) == load]
        parts.append(f"### Load {load:g}" + (f" ({at[0]['qps']:g} req/s)" if at[0].get("load") else "") + "\n")
        parts.append(format_markdown_table(at, table_for(at)))
    parts.append("\nCPU per process (cores, median over seeds):\n\n" + _cpu_table(merged))
    first = [r for r in good if r.get("seed") == seeds[0]]
    parts.append(_breakdown(first, "by_phase", "TTFT by drift phase, first seed"))
    parts.append(_breakdown(first, "by_kind", "TTFT by request kind, first seed"))
    failed = [r for r in rows if "failed" in r]
    if failed:
        parts.append("\nFailed points:\n\n" + "".join(
            f"- {r['strategy']} @ {r['qps']:g}, seed {r.get('seed')}: {r['failed']}\n" for r in failed))
    saturated = [f"{r['strategy']} @ {r['qps']:g}: {', '.join(r['saturated'])}" for r in merged if r["saturated"]]
    if saturated:
        parts.append("\nSaturated processes: " + "; ".join(saturated) + "\n")
    return "\n".join(parts)


def write_reports(out: Path, rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> list[Path]:
    """results.json (points without their TTFTs, which go to TTFTS_FILE), results.md and the charts."""
    out.mkdir(parents=True, exist_ok=True)
    merged = aggregate(rows)
    points = [{k: v for k, v in r.items() if k != TTFTS} for r in rows]
    paths = [write_json(out / "results.json", {**meta, "points": points, "summary": merged})]
    md = out / "results.md"
    md.write_text(markdown(rows, meta), encoding="utf-8")
    paths.append(md)
    paths.append(write_ttfts(out / TTFTS_FILE, rows))
    axis = "offered load (share of capacity)" if any(r.get("load") for r in merged) else "offered QPS"
    paths.append(plot_ttft(out / "ttft_vs_load.png", merged, f"TTFT vs load: {meta['workload']}", axis))
    paths.append(plot_lines(out / "hit_rate_vs_load.png", series(merged, "pooled.hit_rate"), axis,
                            "prefix-cache hit rate (tokens)", f"Prefix-cache hit rate vs load: {meta['workload']}"))
    return paths


def plot_ttft(path: Path, rows: Sequence[Mapping[str, Any]], title: str, axis: str = "offered QPS") -> Path:
    """Pooled p50 (dotted), p90 (solid) and p99 (dashed) TTFT per strategy, one colour per strategy, log scale."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    lines = {name: series(rows, f"pooled.ttft_{name}_ms") for name in ("p50", "p90", "p99")}
    strategies = sorted({s for found in lines.values() for s in found})
    for index, strategy in enumerate(strategies):
        colour = f"C{index % 10}"
        for name, style in (("p50", ":"), ("p90", "-"), ("p99", "--")):
            ordered = sorted(lines[name].get(strategy, []))
            if ordered:
                ax.plot([x for x, _ in ordered], [y for _, y in ordered], style, color=colour, marker="o",
                        markersize=3, label=f"{strategy} {name}")
    ax.set_xlabel(axis)
    ax.set_ylabel("TTFT (ms)")
    ax.set_title(title)
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    if strategies:
        ax.legend(fontsize="x-small", ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
