"""Pure analysis of a canary benchmark run: rollout timeline, reaction times, error shares, verdict."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extproc.bench.loadgen import Sample

BASELINE, CANARY = "v1", "v2"
FINAL_STATUSES = frozenset({"promoted", "rolled_back", "aborted"})
UNATTRIBUTED = "unattributed"  # no serving replica known: dropped, connect/timeout errors, local replies
_REPLICA_HEADERS = ("x-sim-replica", "x-gateway-upstream-host")


# -- pure analysis ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Snapshot:
    """One poll of `/debug/rollouts`: wall-clock time of the poll and the split's entry."""

    at: float
    entry: Mapping[str, Any]

    @property
    def rollout(self) -> Mapping[str, Any] | None:
        rollout = self.entry.get("rollout")
        return rollout if isinstance(rollout, Mapping) else None


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    t_s: float  # when the state changed (its updated_at), seconds from the reference time
    weight_percent: float
    status: str
    step: int
    reason: str
    observed_s: float  # when the poll first saw it, same reference


def extract_timeline(snapshots: Sequence[Snapshot], t0_wall: float) -> list[TimelineEntry]:
    """Every distinct rollout state (by version) in poll order, times relative to `t0_wall`."""
    timeline: list[TimelineEntry] = []
    seen: tuple[Any, ...] | None = None
    for snap in snapshots:
        rollout = snap.rollout
        if rollout is None:
            continue
        key = (rollout.get("version"), rollout.get("status"), rollout.get("weight_percent"))
        if key == seen:
            continue
        seen = key
        updated = float(rollout.get("updated_at", snap.at))
        timeline.append(TimelineEntry(round(updated - t0_wall, 3), float(rollout.get("weight_percent", 0.0)),
                                      str(rollout.get("status")), int(rollout.get("step", 0)),
                                      str(rollout.get("reason", "")), round(snap.at - t0_wall, 3)))
    return timeline


def min_samples_from_verdicts(snapshots: Sequence[Snapshot], min_samples: int) -> float | None:
    """Wall time of the first verdict that saw `min_samples` requests on both sides, or None.

    A verdict carries no time of its own: when it moved the rollout (promote/rollback) since the last
    poll, that transition's `updated_at` is exact; otherwise the poll that first showed it (late by at
    most one poll interval after the analysis)."""
    previous_at: float | None = None
    for snap in snapshots:
        rollout = snap.rollout
        verdict = rollout.get("last_verdict") if rollout is not None else None
        stats = verdict.get("stats") if isinstance(verdict, Mapping) else None
        if rollout is not None and isinstance(verdict, Mapping) and isinstance(stats, Mapping) and (
                stats.get("canary_requests", 0) >= min_samples and stats.get("baseline_requests", 0) >= min_samples):
            updated = rollout.get("updated_at")
            if verdict.get("action") != "wait" and updated is not None and (
                    previous_at is None or float(updated) > previous_at):
                return min(float(updated), snap.at)
            return snap.at
        previous_at = snap.at
    return None


def sample_pool(sample: Sample, pool_by_address: Mapping[str, str]) -> str | None:
    """The pool of the replica that answered (from the simulator's or Envoy's header), None if unknown."""
    for header in _REPLICA_HEADERS:
        pool = pool_by_address.get(sample.headers.get(header, ""))
        if pool is not None:
            return pool
    return None


def min_samples_from_samples(samples: Sequence[Sample], pool_by_address: Mapping[str, str], min_samples: int,
                             pools: Sequence[str] = (CANARY, BASELINE)) -> float | None:
    """Seconds from the load start at which each pool had completed `min_samples` responses (the
    service counts outcomes as they complete), or None if some pool never did."""
    done: dict[str, list[float]] = {pool: [] for pool in pools}
    for sample in samples:
        pool = sample_pool(sample, pool_by_address)
        if pool in done:
            done[pool].append(sample.start_s + sample.e2e_s)
    if min_samples < 1 or any(len(ends) < min_samples for ends in done.values()):
        return None
    return max(sorted(ends)[min_samples - 1] for ends in done.values())


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def error_shares(samples: Sequence[Sample], pool_by_address: Mapping[str, str], *, canary: str = CANARY,
                 fault_start_s: float | None = None, faulty_until_s: float | None = None) -> dict[str, Any]:
    """Requests and errors overall and per pool (`unattributed` when no replica answered).

    `canary_while_faulty` counts requests the canary served while its fault was on (sent in
    [fault_start_s, faulty_until_s)); None without a fault. Its share is of all requests."""
    per_pool: dict[str, dict[str, Any]] = {}
    faulty = 0
    for sample in samples:
        pool = sample_pool(sample, pool_by_address) or UNATTRIBUTED
        row = per_pool.setdefault(pool, {"requests": 0, "errors": 0})
        row["requests"] += 1
        if sample.error is not None:
            row["errors"] += 1
        if (pool == canary and fault_start_s is not None and sample.start_s >= fault_start_s
                and (faulty_until_s is None or sample.start_s < faulty_until_s)):
            faulty += 1
    total = len(samples)
    errors = sum(row["errors"] for row in per_pool.values())
    for row in per_pool.values():
        row["error_rate"] = round(_ratio(row["errors"], row["requests"]), 5)
        row["share_of_requests"] = round(_ratio(row["requests"], total), 5)
        row["errors_share_of_requests"] = round(_ratio(row["errors"], total), 5)
    return {
        "requests": total, "errors": errors, "error_share": round(_ratio(errors, total), 5),
        "canary_while_faulty": faulty if fault_start_s is not None else None,
        "canary_share_while_faulty": round(_ratio(faulty, total), 5) if fault_start_s is not None else None,
        "per_pool": dict(sorted(per_pool.items())),
    }


def served_after(samples: Sequence[Sample], pool_by_address: Mapping[str, str], after_s: float) -> dict[str, int]:
    """Requests sent strictly after `after_s` (seconds from the load start), by serving pool."""
    counts: dict[str, int] = {}
    for sample in samples:
        if sample.start_s > after_s:
            pool = sample_pool(sample, pool_by_address) or UNATTRIBUTED
            counts[pool] = counts.get(pool, 0) + 1
    return dict(sorted(counts.items()))


def expected_status(fault: str) -> str:
    return "promoted" if fault == "none" else "rolled_back"


def exit_problems(fault: str, final_status: str | None, shares: Mapping[str, Any],
                  after_end: Mapping[str, int] | None) -> list[str]:
    """Why the run does not match expectations (empty: exit 0): the fault's expected outcome, no error
    on the baseline pool nor without a serving replica, and nothing on the canary after a rollback."""
    problems: list[str] = []
    wanted = expected_status(fault)
    if final_status != wanted:
        problems.append(f"rollout ended {final_status or 'never'}, expected {wanted}")
    pools = shares.get("per_pool", {})
    for pool in (BASELINE, UNATTRIBUTED):
        errors = int(pools.get(pool, {}).get("errors", 0))
        if errors:
            problems.append(f"{errors} errors on {pool}")
    if final_status == "rolled_back" and after_end:
        leaked = int(after_end.get(CANARY, 0))
        if leaked:
            problems.append(f"{leaked} requests sent after the rollback were served by the canary")
    return problems
