"""The overload benchmark's mix of classes and tenants, and how its samples are scored: per-class TTFT and
rejections, and Jain's index over the standard tenants' service against their max-min fair shares (see
`extproc.bench.overload`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extproc.bench.loadgen import Sample
from extproc.bench.stats import percentiles

__all__ = ["CLASSES", "MIX", "Demand", "class_rows", "fairness", "jain", "max_min_shares"]


@dataclass(frozen=True)
class Demand:
    klass: str
    tenant: str
    tier: str
    share: float  # of the offered load


# Critical 15%, standard 50% over four equal-weight tenants asking 1:1:2:4, sheddable 35%. At 2x the
# capacity critical + standard ask 1.3x: the standard tenants compete for what critical leaves.
MIX: tuple[Demand, ...] = (
    Demand("critical", "crit", "gold", 0.15),
    Demand("standard", "std-1", "standard", 0.0625),
    Demand("standard", "std-2", "standard", 0.0625),
    Demand("standard", "std-3", "standard", 0.125),
    Demand("standard", "std-4", "standard", 0.25),
    Demand("sheddable", "batch", "batch", 0.35),
)
CLASSES = ("critical", "standard", "sheddable")


def max_min_shares(demands: Mapping[str, float], total: float) -> dict[str, float]:
    """Max-min fair split of `total` among `demands` (water-filling)."""
    shares: dict[str, float] = {}
    left = dict(demands)
    remaining = total
    while left:
        equal = remaining / len(left)
        satisfied = {k: d for k, d in left.items() if d <= equal}
        if not satisfied:
            shares.update({k: equal for k in left})
            break
        for key, demand in satisfied.items():
            shares[key] = demand
            remaining -= demand
            del left[key]
    return shares


def jain(values: Sequence[float]) -> float | None:
    if not values or not any(values):
        return None
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 1)


def class_rows(samples: Sequence[Sample], slo_s: float) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for klass in CLASSES:
        mine = [s for s in samples if s.labels.get("class") == klass]
        served = [s for s in mine if s.error is None and s.ttft_s is not None]
        rejected = [s for s in mine if s.status in (429, 503)]
        ttft = percentiles([s.ttft_s for s in served if s.ttft_s is not None], (50, 99))
        rows[klass] = {
            "offered": len(mine), "served": len(served), "rejected": len(rejected),
            "other_errors": len(mine) - len(served) - len(rejected),
            "ttft_p50_ms": _ms(ttft["p50"]), "ttft_p99_ms": _ms(ttft["p99"]),
            "within_slo": sum(1 for s in served if _good(s, slo_s)),
            "max_reject_s": round(max((s.e2e_s for s in rejected), default=0.0), 3),
            # When in the run, and where, the slowest first tokens came: a tail has a cause.
            "slowest": [{"at_s": round(s.start_s, 2), "ttft_ms": _ms(s.ttft_s),
                         "endpoint": s.headers.get("x-gateway-upstream-host", "-")}
                        for s in sorted(served, key=lambda s: -(s.ttft_s or 0.0))[:3]],
        }
    return rows


def _good(sample: Sample, slo_s: float) -> bool:
    return sample.error is None and sample.ttft_s is not None and sample.ttft_s <= slo_s


def _served_within(sample: Sample, window_s: float) -> bool:
    return sample.error is None and sample.ttft_s is not None and sample.start_s + sample.ttft_s <= window_s


def fairness(samples: Sequence[Sample], window_s: float, klass: str = "standard") -> dict[str, Any]:
    """Jain's index over the class's tenants of service received during the run (requests whose first
    token came within `window_s` of its start) / max-min fair share of it. A backlog that is served
    after the run (first come, first served into an unbounded queue) does not count as service."""
    tenants = sorted({d.tenant for d in MIX if d.klass == klass})
    offered = {t: sum(1 for s in samples if s.labels.get("tenant") == t) for t in tenants}
    served = {t: sum(1 for s in samples if s.labels.get("tenant") == t and _served_within(s, window_s))
              for t in tenants}
    fair = max_min_shares({t: float(offered[t]) for t in tenants}, float(sum(served.values())))
    normalised = [served[t] / fair[t] for t in tenants if fair.get(t)]
    index = jain(normalised)
    return {"offered": offered, "served": served, "fair_share": {t: round(v, 1) for t, v in fair.items()},
            "jain": None if index is None else round(index, 3)}

