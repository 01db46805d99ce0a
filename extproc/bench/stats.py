"""Latency percentiles, error breakdowns and traffic shares over load-generator samples.

Every result is made of dicts, str, int, float and None, so it can go straight to `json.dumps`.
Latency and token figures use only successful samples (no error, not aborted): a fast 503 or a
dropped arrival would otherwise make the latency look better.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import TypedDict

import numpy as np

from extproc.bench.loadgen import Sample

__all__ = [
    "Percentiles",
    "Summary",
    "label_or_header",
    "output_tokens",
    "percentiles",
    "share_by",
    "shares",
    "summarize",
    "summarize_by",
]

MISSING = "-"


class Percentiles(TypedDict):
    p50: float | None
    p95: float | None
    p99: float | None
    mean: float | None
    n: int


class Summary(TypedDict):
    total: int
    ok: int
    aborted: int
    errors: dict[str, int]
    status: dict[str, int]
    error_rate: float
    late: int
    duration_s: float
    achieved_rps: float
    ttft_ms: Percentiles
    e2e_ms: Percentiles
    tpot_ms: Percentiles
    output_tokens_per_s: float
    prompt_tokens: int
    completion_tokens: int


def percentiles(values: Iterable[float], qs: Sequence[float] = (50, 95, 99)) -> dict[str, float | None]:
    """{"p50": ..., ...} with linear interpolation; None for every key when there is no data."""
    arr = np.fromiter(values, dtype=np.float64)
    keys = [f"p{q:g}" for q in qs]
    if arr.size == 0:
        return dict.fromkeys(keys)
    return {k: float(v) for k, v in zip(keys, np.percentile(arr, list(qs)), strict=True)}


def _ms(values_s: list[float]) -> Percentiles:
    if not values_s:
        return Percentiles(p50=None, p95=None, p99=None, mean=None, n=0)
    arr = np.asarray(values_s, dtype=np.float64) * 1000.0
    p50, p95, p99 = (round(float(v), 3) for v in np.percentile(arr, [50, 95, 99]))
    return Percentiles(p50=p50, p95=p95, p99=p99, mean=round(float(arr.mean()), 3), n=int(arr.size))


def output_tokens(sample: Sample) -> int:
    """Completion tokens from `usage`, else the number of content events (one token each in vLLM)."""
    return sample.completion_tokens if sample.completion_tokens is not None else sample.chunks


def _span_s(samples: Sequence[Sample]) -> float:
    sent = [s for s in samples if s.error != "dropped"]
    if not sent:
        return 0.0
    return max(s.start_s + s.e2e_s for s in sent) - min(s.start_s for s in sent)


def summarize(
    samples: Sequence[Sample], *, duration_s: float | None = None, late_threshold_s: float = 0.01
) -> Summary:
    """Summary of a run. `duration_s` defaults to first send .. last byte; rates are per that window.

    `achieved_rps` counts successful responses only; TPOT is (e2e - ttft) / (output tokens - 1).
    """
    ok = [s for s in samples if s.error is None and not s.aborted]
    span = _span_s(samples) if duration_s is None else duration_s
    ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
    tpot = [
        (s.e2e_s - s.ttft_s) / (output_tokens(s) - 1)
        for s in ok
        if s.ttft_s is not None and output_tokens(s) > 1
    ]
    completion = sum(output_tokens(s) for s in ok)
    errors = Counter(s.error for s in samples if s.error is not None)
    status = Counter(str(s.status) for s in samples if s.status)
    return Summary(
        total=len(samples),
        ok=len(ok),
        aborted=sum(1 for s in samples if s.aborted),
        errors=dict(errors.most_common()),
        status=dict(sorted(status.items())),
        error_rate=round(sum(errors.values()) / len(samples), 6) if samples else 0.0,
        late=sum(1 for s in samples if s.late_s > late_threshold_s),
        duration_s=round(span, 6),
        achieved_rps=round(len(ok) / span, 3) if span > 0 else 0.0,
        ttft_ms=_ms(ttft),
        e2e_ms=_ms([s.e2e_s for s in ok]),
        tpot_ms=_ms(tpot),
        output_tokens_per_s=round(completion / span, 3) if span > 0 else 0.0,
        prompt_tokens=sum(s.prompt_tokens or 0 for s in ok),
        completion_tokens=completion,
    )


def label_or_header(key: str) -> Callable[[Sample], str]:
    """Key function reading a label, else a captured response header (case-insensitive), else "-"."""
    header = key.lower()

    def get(sample: Sample) -> str:
        value = sample.labels.get(key)
        if value is None:
            value = sample.headers.get(header)
        return MISSING if value is None else value

    return get


def share_by(samples: Iterable[Sample], key: str, *, only_ok: bool = False) -> dict[str, int]:
    """{value of label/header `key`: count}, most frequent first (e.g. requests per pool or replica)."""
    get = label_or_header(key)
    counts = Counter(
        get(s) for s in samples if not only_ok or (s.error is None and not s.aborted)
    )
    return dict(counts.most_common())


def shares(counts: dict[str, int]) -> dict[str, float]:
    """Counts turned into fractions of their total."""
    total = sum(counts.values())
    return {k: round(v / total, 6) if total else 0.0 for k, v in counts.items()}


def summarize_by(
    samples: Sequence[Sample], key: str, *, duration_s: float | None = None
) -> dict[str, Summary]:
    """One Summary per value of label/header `key`, all rated over the whole run's window."""
    span = _span_s(samples) if duration_s is None else duration_s
    get = label_or_header(key)
    groups: dict[str, list[Sample]] = {}
    for s in samples:
        groups.setdefault(get(s), []).append(s)
    return {k: summarize(v, duration_s=span) for k, v in sorted(groups.items())}
