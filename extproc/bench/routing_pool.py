"""Figures of `extproc bench routing` pooled over the seeds of a point (strategy x rate).

A seed's TTFT p99 sits on the ~1% slowest of its requests, a handful at these loads (18 of 1,760 at 70 req/s for
25 s); the median of three such p99s is one seed's handful, which moves with where a few cold prompts landed
(reports/i13-s12/README.md). The unit of comparison is therefore every seed's requests together: TTFT p50/p90/p99
over the concatenated per-request TTFTs (the same linear interpolation as a seed's own), and the hit rate as the
engines' hit tokens / query tokens summed over the seeds (each seed's rate is that ratio over its own window; the
mean of seed rates would weigh a short or idle seed like a busy one).

What pooling needs is kept per point: the TTFT (ms) of every successful request (`TTFTS` in the point row while
the run lasts; written to `TTFTS_FILE` next to results.json, about 6 KB gzipped per 1,800 requests, against ~0.6 MB
per point for `--samples`), and the row's `cache` counters, already in results.json.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from extproc.bench.loadgen import Sample
from extproc.bench.stats import percentiles

__all__ = ["TTFTS", "TTFTS_FILE", "attach_ttfts", "point_key", "pooled", "read_ttfts", "ttfts_ms", "write_ttfts"]

TTFTS = "ttfts_ms"
TTFTS_FILE = "ttfts.json.gz"


def ttfts_ms(samples: Iterable[Sample]) -> list[float]:
    """TTFT in ms of the successful requests (the ones a seed's percentiles count), to the microsecond."""
    return [round(s.ttft_s * 1000.0, 3) for s in samples if s.error is None and not s.aborted and s.ttft_s is not None]


def point_key(row: Mapping[str, Any]) -> str:
    """`<strategy>-q<rate>-s<seed>`, as the point's directory under `--samples`."""
    return f"{row['strategy']}-q{float(row['qps']):g}-s{row.get('seed', 0)}"


def _hit_rate(members: Sequence[Mapping[str, Any]]) -> float | None:
    caches = [m.get("cache") for m in members]
    if any(not isinstance(c, Mapping) or c.get("query_tokens") is None for c in caches):
        return None
    hits = sum(float(c["hit_tokens"]) for c in caches if isinstance(c, Mapping))
    queries = sum(float(c["query_tokens"]) for c in caches if isinstance(c, Mapping))
    return round(hits / queries, 4) if queries > 0 else None


def pooled(members: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """TTFT p50/p90/p99 (ms) over every member's requests and the token-weighted hit rate; a figure is None when
    some member lacks what it needs (a row from before pooling), never computed from part of the seeds."""
    lists = [m.get(TTFTS) for m in members]
    complete = bool(lists) and all(isinstance(found, list) for found in lists)
    values = [v for found in lists if isinstance(found, list) for v in found] if complete else []
    found = percentiles(values, (50, 90, 99))
    return {"requests": len(values) if complete else None, "hit_rate": _hit_rate(members),
            **{f"ttft_{k}_ms": None if v is None else round(v, 1) for k, v in found.items()}}


def write_ttfts(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """{point key: [TTFT ms, ...]} of the rows that have them, gzipped JSON."""
    found = {point_key(r): r[TTFTS] for r in rows if isinstance(r.get(TTFTS), list)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(found, separators=(",", ":")).encode(), mtime=0))
    return path


def read_ttfts(path: Path) -> dict[str, list[float]]:
    found: dict[str, list[float]] = json.loads(gzip.decompress(path.read_bytes()))
    return found


def attach_ttfts(rows: Sequence[Mapping[str, Any]], ttfts: Mapping[str, list[float]]) -> list[dict[str, Any]]:
    """The rows of results.json with their TTFTs back in (to pool them again, e.g. over several runs)."""
    return [{**r, TTFTS: ttfts[point_key(r)]} if point_key(r) in ttfts else dict(r) for r in rows]
