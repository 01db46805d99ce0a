"""Pure helpers of `extproc bench routing`: KV sizing, prefix-cache hit rate from vLLM /metrics text,
request spread over endpoints, CPU use and the per-point result row. No I/O here."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from extproc.bench.loadgen import Sample
from extproc.bench.stats import Summary, percentiles

__all__ = [
    "BLOCK_SIZE",
    "KV_TARGET_RATIO",
    "SATURATED_CORES",
    "cores_used",
    "counter_total",
    "endpoint_counts",
    "engine_ttft",
    "hit_rate",
    "kv_blocks_for",
    "point_row",
    "saturated",
    "spread",
]

BLOCK_SIZE = 16
# One replica holds 1/KV_TARGET_RATIO of the prefix working set: 2.5 sits inside the 2-4x band where
# spraying requests over every replica thrashes each cache while affinity can keep every prefix warm.
KV_TARGET_RATIO = 2.5
# The fleet keeps this much headroom over the working set, so affinity does not need perfect balance.
FLEET_HEADROOM = 1.25
SATURATED_CORES = 0.9
HITS = "vllm:prefix_cache_hits"
QUERIES = "vllm:prefix_cache_queries"


def kv_blocks_for(
    working_set_tokens: int, replicas: int, *, block_size: int = BLOCK_SIZE, ratio: float = KV_TARGET_RATIO,
    min_blocks: int = 8192 // BLOCK_SIZE,
) -> int:
    """KV blocks per replica: max(working set / ratio, working set x 1.25 / replicas, min_blocks).

    The first term makes the working set `ratio` times one replica's cache; the second keeps the whole set
    (plus headroom) inside the fleet when there are few replicas; `min_blocks` holds one max-length
    sequence (the simulator's profile check, max_model_len / block_size).
    """
    if replicas < 1:
        raise ValueError("replicas must be >= 1")
    blocks = math.ceil(working_set_tokens / block_size)
    return max(math.ceil(blocks / ratio), math.ceil(blocks * FLEET_HEADROOM / replicas), min_blocks)


def counter_total(metrics_text: str, name: str) -> float:
    """Sum of every sample of counter `name` (with or without `_total`) over all label sets."""
    names = {name, f"{name}_total"}
    total = 0.0
    for line in metrics_text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, rest = line.partition(" ")
        metric = head.partition("{")[0]
        if metric not in names:
            continue
        if "{" in head and "}" not in head:  # a label value with a space: the value follows the last "}"
            rest = line[line.rindex("}") + 1 :]
        try:
            total += float(rest.split()[0])
        except (IndexError, ValueError):
            continue
    return total


def hit_rate(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, Any]:
    """Prefix-cache hit rate (tokens) over a run: delta(hits) / delta(queries) summed over replicas.

    `before`/`after` map a replica address to its /metrics text; a replica missing from either is skipped
    and listed. Per-replica rates are included so a cold or idle replica shows up.
    """
    per_replica: dict[str, float | None] = {}
    hits = queries = 0.0
    for address in sorted(set(before) & set(after)):
        replica_hits = counter_total(after[address], HITS) - counter_total(before[address], HITS)
        replica_queries = counter_total(after[address], QUERIES) - counter_total(before[address], QUERIES)
        hits += replica_hits
        queries += replica_queries
        per_replica[address] = round(replica_hits / replica_queries, 4) if replica_queries > 0 else None
    return {
        "hit_rate": round(hits / queries, 4) if queries > 0 else None,
        "hit_tokens": int(hits), "query_tokens": int(queries), "per_replica": per_replica,
        "missing": sorted(set(before) ^ set(after)),
    }


def _buckets(metrics_text: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts of histogram `name` summed over all label sets: {upper bound: count}."""
    found: dict[float, float] = {}
    prefix = f"{name}_bucket{{"
    for line in metrics_text.splitlines():
        if not line.startswith(prefix):
            continue
        head, _, value = line.rpartition(" ")
        bound = head.partition('le="')[2].partition('"')[0]
        try:
            found[float(bound)] = found.get(float(bound), 0.0) + float(value)
        except ValueError:
            continue
    return found


def engine_ttft(before: Mapping[str, str], after: Mapping[str, str],
                qs: Sequence[float] = (50, 90, 99)) -> dict[str, float | None]:
    """TTFT percentiles (ms) as the engines saw them (arrival at the engine to first token: queue and prefill,
    no proxy, network or client), from the delta of vllm:time_to_first_token_seconds over the run summed over
    replicas, interpolated linearly inside a bucket as Prometheus' histogram_quantile does: coarse (vLLM's
    buckets are 40, 60, 80, 100, 250, 500 ms ...), but unaffected by the proxy path's CPU."""
    name = "vllm:time_to_first_token_seconds"
    totals: dict[float, float] = {}
    for address in set(before) & set(after):
        then = _buckets(before[address], name)
        for bound, count in _buckets(after[address], name).items():
            totals[bound] = totals.get(bound, 0.0) + count - then.get(bound, 0.0)
    bounds = sorted(totals)
    out: dict[str, float | None] = {f"p{q:g}": None for q in qs}
    if not bounds or totals[bounds[-1]] <= 0:
        return out
    total = totals[bounds[-1]]
    for q in qs:
        rank = q / 100.0 * total
        lower, below = 0.0, 0.0
        for bound in bounds:
            count = totals[bound]
            if count >= rank:
                if math.isinf(bound):
                    out[f"p{q:g}"] = round(lower * 1000.0, 1)
                else:
                    share = (rank - below) / (count - below) if count > below else 1.0
                    out[f"p{q:g}"] = round((lower + (bound - lower) * share) * 1000.0, 1)
                break
            lower, below = bound, count
    return out


def endpoint_counts(samples: Iterable[Sample], endpoints: Sequence[str]) -> dict[str, int]:
    """Successful requests per serving endpoint (Envoy's upstream host, else the simulator's replica
    header); every endpoint in `endpoints` appears, idle ones with 0, unknown hosts are added."""
    counts = dict.fromkeys(endpoints, 0)
    for sample in samples:
        if sample.error is not None or sample.aborted:
            continue
        host = sample.headers.get("x-gateway-upstream-host") or sample.headers.get("x-sim-replica") or "-"
        counts[host] = counts.get(host, 0) + 1
    return counts


def spread(counts: Mapping[str, int]) -> dict[str, float | None]:
    """How evenly requests spread: max/min (None when some endpoint got none) and the coefficient of
    variation (population std / mean, 0 = perfectly even)."""
    values = list(counts.values())
    if not values or sum(values) == 0:
        return {"max_min": None, "cv": None}
    low, high = min(values), max(values)
    mean = statistics.fmean(values)
    return {"max_min": round(high / low, 3) if low > 0 else None,
            "cv": round(statistics.pstdev(values) / mean, 4)}


def cores_used(before: Mapping[str, float], after: Mapping[str, float], wall_s: float) -> dict[str, float]:
    """CPU seconds spent per process during the run divided by wall time (1.0 = one full core)."""
    if wall_s <= 0:
        return {}
    return {name: round((after[name] - before[name]) / wall_s, 3) for name in after if name in before}


def saturated(cores: Mapping[str, float], limit: float = SATURATED_CORES) -> list[str]:
    return sorted(name for name, value in cores.items() if value > limit)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 1)


def hit_by_label(samples: Sequence[Sample], label: str) -> dict[str, float | None]:
    """Prefix-cache hit rate (tokens) per value of `label`, from each answered request's own usage (cached /
    prompt tokens): the fleet's counters cannot tell workloads that share it apart. With exactly the values
    `agents` and `chat`, also `agents_minus_chat`. Empty when no request carries the label and usage."""
    hits: dict[str, list[int]] = {}
    for s in samples:
        value = s.labels.get(label)
        if value is None or s.error is not None or s.prompt_tokens is None or s.cached_tokens is None:
            continue
        totals = hits.setdefault(value, [0, 0])
        totals[0] += s.cached_tokens
        totals[1] += s.prompt_tokens
    rates: dict[str, float | None] = {k: round(c / p, 4) if p else None for k, (c, p) in sorted(hits.items())}
    if set(rates) == {"agents", "chat"} and rates["agents"] is not None and rates["chat"] is not None:
        rates["agents_minus_chat"] = round(rates["agents"] - rates["chat"], 4)
    return rates


def point_row(
    strategy: str, qps: float, samples: Sequence[Sample], summary: Summary, cache: Mapping[str, Any],
    pool_counts: Mapping[str, Mapping[str, int]], cores: Mapping[str, float],
) -> dict[str, Any]:
    """One (strategy, qps) result: latency, throughput, errors, hit rate, spread and CPU, JSON-ready."""
    ok = [s for s in samples if s.error is None and not s.aborted]
    ttft = percentiles((s.ttft_s for s in ok if s.ttft_s is not None), (50, 90, 99))
    spreads = {pool: spread(counts) for pool, counts in pool_counts.items()}
    cvs = [v["cv"] for v in spreads.values() if v["cv"] is not None]
    ratios = [v["max_min"] for v in spreads.values()]
    worst_ratio = None if not ratios or None in ratios else max(r for r in ratios if r is not None)
    return {
        "strategy": strategy, "qps": qps, "requests": summary["total"], "ok": summary["ok"],
        "errors": sum(summary["errors"].values()), "error_kinds": summary["errors"], "status": summary["status"],
        "errors_by_model": dict(Counter(s.labels.get("model", "-") for s in samples if s.error is not None)),
        "ttft_p50_ms": _ms(ttft["p50"]), "ttft_p90_ms": _ms(ttft["p90"]), "ttft_p99_ms": _ms(ttft["p99"]),
        "tpot_p50_ms": summary["tpot_ms"]["p50"], "e2e_p50_ms": summary["e2e_ms"]["p50"],
        "e2e_p99_ms": summary["e2e_ms"]["p99"], "output_tokens_per_s": summary["output_tokens_per_s"],
        "achieved_rps": summary["achieved_rps"], "late": summary["late"],
        "hit_rate": cache.get("hit_rate"), "cache": dict(cache), "hit_by_workload": hit_by_label(samples, "workload"),
        "endpoint_requests": {pool: dict(counts) for pool, counts in pool_counts.items()},
        "spread": spreads, "spread_max_min": worst_ratio, "spread_cv": max(cvs) if cvs else None,
        "cores": dict(cores), "max_cores": max(cores.values()) if cores else None, "saturated": saturated(cores),
    }
