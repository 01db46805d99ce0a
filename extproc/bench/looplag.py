"""The service replicas' event-loop lag over one measured run (`extproc.telemetry.loop_lag`): a latency tail that
the engines did not cause may come from a stalled service loop, and this says whether it did.

Read before and after the run and subtracted: the histogram `extproc_event_loop_lag_seconds` (summed over the
replicas) gives the p99 as a bucket bound; /debug/loop gives each replica's largest lag since start, which is the
run's largest lag when it grew during the run (otherwise the run's largest is bounded by the histogram's highest
non-empty bucket).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from extproc.bench.httpclient import HttpClient, RequestError

__all__ = ["LoopLagCounts", "loop_lag", "parse_lag_buckets"]

_LAG = "extproc_event_loop_lag_seconds"


@dataclass(frozen=True)
class LoopLagCounts:
    buckets: tuple[tuple[float, float], ...] = ()  # (upper bound s, cumulative count), summed over replicas
    max_s: tuple[float, ...] = ()  # per replica: its largest lag since start (/debug/loop)

    def __sub__(self, before: LoopLagCounts) -> LoopLagCounts:
        earlier = dict(before.buckets)
        buckets = tuple((bound, count - earlier.get(bound, 0.0)) for bound, count in self.buckets)
        grown = tuple(after for after, was in zip(self.max_s, before.max_s, strict=False) if after > was)
        return LoopLagCounts(buckets, grown)

    def summary(self) -> dict[str, float | bool | None]:
        """Ticks seen, the p99 lag's bucket bound and the largest lag (ms): exact if a replica's maximum grew in
        the run, else the bound of the highest bucket that counted one (None: no tick counted at all)."""
        ordered = sorted(self.buckets)
        total = ordered[-1][1] if ordered else 0.0
        if total <= 0:
            return {"ticks": 0, "p99_ms_le": None, "max_ms": None, "max_exact": False}
        p99 = next(bound for bound, count in ordered if count >= 0.99 * total)
        highest, below = ordered[0][0], 0.0
        for bound, count in ordered:
            if count > below:
                highest = bound
            below = count
        largest = max(self.max_s) if self.max_s else highest
        return {"ticks": total, "p99_ms_le": _ms(p99), "max_ms": _ms(largest), "max_exact": bool(self.max_s)}


def _ms(seconds: float) -> float | None:
    return None if math.isinf(seconds) else round(seconds * 1000.0, 1)


def parse_lag_buckets(text: str) -> dict[float, float]:
    found: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{_LAG}_bucket":
                bound = float(sample.labels["le"])
                found[bound] = found.get(bound, 0.0) + sample.value
    return found


async def loop_lag(client: HttpClient, admin_ports: Sequence[int]) -> LoopLagCounts:
    """Summed over the service replicas (an unreachable one counts nothing; its maximum counts 0)."""
    buckets: dict[float, float] = {}
    maxima: list[float] = []
    for port in admin_ports:
        largest = 0.0
        try:
            metrics = await client.request("GET", "127.0.0.1", port, "/metrics", timeout_s=5.0)
            state = await client.request("GET", "127.0.0.1", port, "/debug/loop", timeout_s=5.0)
        except RequestError:
            maxima.append(largest)
            continue
        if metrics.status == 200:
            for bound, count in parse_lag_buckets(metrics.body.decode("utf-8", "replace")).items():
                buckets[bound] = buckets.get(bound, 0.0) + count
        if state.status == 200:
            loop = json.loads(state.body).get("loop") or {}
            largest = float(loop.get("max_lag_s", 0.0))
        maxima.append(largest)
    return LoopLagCounts(tuple(sorted(buckets.items())), tuple(maxima))
