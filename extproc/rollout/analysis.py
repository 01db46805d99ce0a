"""Canary analysis: outcome windows per pool and the verdict of one step. Pure, clock injected.

Latencies go into fixed geometric histogram buckets (10 % wide, 0.5 ms .. ~10 min), so windows from
several replicas merge exactly by adding counts (the store keeps them as counters) and memory stays
bounded whatever the traffic. A p99 read from them is the upper edge of its bucket: within 10 %,
and the same rounding on both sides of a ratio.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from extproc.rollout.config import RolloutConfig

__all__ = [
    "Histogram",
    "OutcomeWindows",
    "PoolWindow",
    "Verdict",
    "analyse",
    "bucket_index",
    "bucket_upper",
    "tpot_seconds",
]

_MIN_S = 0.0005
_GROWTH = 1.1
_BUCKETS = 150  # 0.0005 * 1.1**150 ~ 800 s; larger values land in the last bucket
_LOG_GROWTH = math.log(_GROWTH)


def bucket_index(seconds: float) -> int:
    if seconds <= _MIN_S:
        return 0
    return min(_BUCKETS, math.ceil(math.log(seconds / _MIN_S) / _LOG_GROWTH - 1e-9))


def bucket_upper(index: int) -> float:
    return float(_MIN_S * _GROWTH**index)


def tpot_seconds(first_byte_s: float, last_byte_s: float, completion_tokens: int) -> float | None:
    """Time per output token after the first, from upstream byte timings; None when undefined."""
    if completion_tokens < 2 or last_byte_s < first_byte_s:
        return None
    return (last_byte_s - first_byte_s) / (completion_tokens - 1)


@dataclass(slots=True)
class Histogram:
    buckets: dict[int, int] = field(default_factory=dict)
    count: int = 0
    total: float = 0.0

    def add(self, seconds: float) -> None:
        index = bucket_index(seconds)
        self.buckets[index] = self.buckets.get(index, 0) + 1
        self.count += 1
        self.total += seconds

    def merge(self, other: Histogram) -> None:
        for index, count in other.buckets.items():
            self.buckets[index] = self.buckets.get(index, 0) + count
        self.count += other.count
        self.total += other.total

    def quantile(self, q: float) -> float:
        if self.count == 0:
            return 0.0
        rank = q * self.count
        seen = 0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen >= rank:
                return bucket_upper(index)
        return bucket_upper(max(self.buckets))

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


@dataclass(slots=True)
class PoolWindow:
    """Outcomes of one pool during one rollout step (or the deltas one replica has not flushed yet)."""

    requests: int = 0
    errors: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    tpot: Histogram = field(default_factory=Histogram)
    last_at: float | None = None

    def record(self, ok: bool, ttft_s: float | None, tpot_s: float | None, now: float | None = None) -> None:
        self.requests += 1
        if not ok:
            self.errors += 1
        if ttft_s is not None and ttft_s >= 0.0:
            self.ttft.add(ttft_s)
        if tpot_s is not None and tpot_s >= 0.0:
            self.tpot.add(tpot_s)
        if now is not None:
            self.last_at = now if self.last_at is None else max(self.last_at, now)

    def merge(self, other: PoolWindow) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.ttft.merge(other.ttft)
        self.tpot.merge(other.tpot)
        if other.last_at is not None:
            self.last_at = other.last_at if self.last_at is None else max(self.last_at, other.last_at)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def to_counters(self) -> dict[str, float]:
        """Flat additive counters (how the store keeps a window; adding two of these merges them)."""
        out: dict[str, float] = {"n": self.requests, "e": self.errors, "tn": self.ttft.count,
                                 "ts": self.ttft.total, "pn": self.tpot.count, "ps": self.tpot.total}
        out.update({f"t{i}": c for i, c in self.ttft.buckets.items()})
        out.update({f"p{i}": c for i, c in self.tpot.buckets.items()})
        return out

    @classmethod
    def from_counters(cls, counters: Mapping[str, float]) -> PoolWindow:
        window = cls(requests=int(counters.get("n", 0)), errors=int(counters.get("e", 0)))
        window.ttft.count, window.ttft.total = int(counters.get("tn", 0)), float(counters.get("ts", 0.0))
        window.tpot.count, window.tpot.total = int(counters.get("pn", 0)), float(counters.get("ps", 0.0))
        for name, value in counters.items():
            if name[:1] in ("t", "p") and name[1:].isdigit():
                target = window.ttft if name[0] == "t" else window.tpot
                target.buckets[int(name[1:])] = int(value)
        return window


class OutcomeWindows:
    """Per-pool windows fed on the request path (synchronous, no I/O); `take` hands them over."""

    def __init__(self) -> None:
        self._pools: dict[str, PoolWindow] = {}

    def record(self, pool: str, ok: bool, ttft_s: float | None, tpot_s: float | None, now: float) -> None:
        window = self._pools.get(pool)
        if window is None:
            window = self._pools[pool] = PoolWindow()
        window.record(ok, ttft_s, tpot_s, now)

    def take(self) -> dict[str, PoolWindow]:
        taken, self._pools = self._pools, {}
        return taken

    def restore(self, windows: Mapping[str, PoolWindow]) -> None:
        """Put back windows that could not be flushed (store down), so no sample is lost."""
        for pool, window in windows.items():
            self._pools.setdefault(pool, PoolWindow()).merge(window)

    def get(self, pool: str) -> PoolWindow:
        return self._pools.get(pool) or PoolWindow()


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Literal["wait", "promote", "rollback"]
    reason: str
    stats: Mapping[str, float] = field(default_factory=dict)


def _stats(canary: PoolWindow, baseline: PoolWindow) -> dict[str, float]:
    return {
        "canary_requests": canary.requests, "baseline_requests": baseline.requests,
        "canary_error_rate": canary.error_rate, "baseline_error_rate": baseline.error_rate,
        "canary_ttft_p99_s": canary.ttft.quantile(0.99), "baseline_ttft_p99_s": baseline.ttft.quantile(0.99),
        "canary_tpot_mean_s": canary.tpot.mean, "baseline_tpot_mean_s": baseline.tpot.mean,
    }


def _breaches(canary: PoolWindow, baseline: PoolWindow, config: RolloutConfig) -> list[str]:
    need = config.min_samples
    found: list[str] = []
    if canary.requests >= need and baseline.requests >= need:
        delta = canary.error_rate - baseline.error_rate
        if delta > config.max_error_rate_delta:
            found.append(f"error rate {canary.error_rate:.2%} vs baseline {baseline.error_rate:.2%} "
                         f"(+{delta:.2%} > {config.max_error_rate_delta:.2%})")
    if canary.ttft.count >= need and baseline.ttft.count >= need:
        ratio = canary.ttft.quantile(0.99) / baseline.ttft.quantile(0.99)
        if ratio > config.max_ttft_p99_ratio:
            found.append(f"TTFT p99 {canary.ttft.quantile(0.99):.3f}s vs baseline "
                         f"{baseline.ttft.quantile(0.99):.3f}s (x{ratio:.2f} > x{config.max_ttft_p99_ratio:g})")
    if canary.tpot.count >= need and baseline.tpot.count >= need:
        ratio = canary.tpot.mean / max(baseline.tpot.mean, 1e-9)
        if ratio > config.max_tpot_ratio:
            found.append(f"TPOT {canary.tpot.mean * 1000:.1f}ms vs baseline {baseline.tpot.mean * 1000:.1f}ms "
                         f"(x{ratio:.2f} > x{config.max_tpot_ratio:g})")
    return found


def analyse(canary: PoolWindow, baseline: PoolWindow, config: RolloutConfig, now: float,
            step_started_at: float) -> Verdict:
    """Rollback as soon as any bound is breached with `min_samples` on both sides; promote once the
    step was held `hold_s` with enough samples and no breach; otherwise wait.

    A latency metric neither side reported (e.g. no streamed responses) is not compared; one that
    only some requests report must still reach `min_samples` per side before promotion.
    """
    stats = _stats(canary, baseline)
    breaches = _breaches(canary, baseline, config)
    if breaches:
        return Verdict("rollback", "; ".join(breaches), stats)
    need = config.min_samples
    if canary.requests < need or baseline.requests < need:
        return Verdict("wait", f"need {need} requests per side (canary {canary.requests}, "
                               f"baseline {baseline.requests})", stats)
    for name, c, b in (("TTFT", canary.ttft, baseline.ttft), ("TPOT", canary.tpot, baseline.tpot)):
        if (c.count or b.count) and (c.count < need or b.count < need):
            return Verdict("wait", f"need {need} {name} samples per side (canary {c.count}, baseline {b.count})",
                           stats)
    held = now - step_started_at
    if held < config.hold_s:
        return Verdict("wait", f"holding step: {held:.0f}s of {config.hold_s:g}s", stats)
    return Verdict("promote", f"healthy for {held:.0f}s: error rate {canary.error_rate:.2%} vs "
                              f"{baseline.error_rate:.2%}, {canary.requests}/{baseline.requests} requests", stats)
