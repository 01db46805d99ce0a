"""The pure parts of `extproc bench canary`: timeline, min-samples time, error shares, exit logic."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from extproc.bench.canary import (
    Snapshot,
    TimelineEntry,
    configure,
    error_shares,
    exit_problems,
    expected_status,
    extract_timeline,
    min_samples_from_samples,
    min_samples_from_verdicts,
    parse_steps,
    rollout_policy,
    sample_pool,
    served_after,
)
from extproc.bench.loadgen import Sample
from extproc.rollout.config import RolloutPolicy

T0 = 1_700_000_000.0
POOLS = {"127.0.0.1:8001": "v1", "127.0.0.1:8002": "v1", "127.0.0.1:9001": "v2"}


def entry(version: int, status: str, weight: float, reason: str, updated: float,
          verdict: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"model": "m", "weights": {"v1": 1 - weight / 100, "v2": weight / 100}, "sticky_by": "request",
            "rollout": {"status": status, "step": 0, "weight_percent": weight, "canary": "v2", "baseline": "v1",
                        "reason": reason, "updated_at": T0 + updated, "step_started_at": T0 + updated,
                        "version": version, "last_verdict": verdict}}


def verdict(action: str, canary: int, baseline: int) -> dict[str, Any]:
    return {"action": action, "reason": "r", "stats": {"canary_requests": canary, "baseline_requests": baseline}}


def sample(start: float, address: str | None, error: str | None = None, e2e: float = 0.05,
           header: str = "x-sim-replica") -> Sample:
    headers = {header: address} if address is not None else {}
    status = 0 if error in ("dropped", "timeout") else (500 if error else 200)
    return Sample(0, {}, start, 0.0, status=status, error=error, e2e_s=e2e, headers=headers)


def test_timeline_keeps_each_distinct_state_once() -> None:
    snapshots = [
        Snapshot(T0 + 0.1, {"model": "m", "weights": {}, "rollout": None}),  # not started yet
        Snapshot(T0 + 0.5, entry(1, "running", 5, "started at 5%", -0.2)),
        Snapshot(T0 + 0.75, entry(1, "running", 5, "started at 5%", -0.2, verdict("wait", 3, 50))),
        Snapshot(T0 + 10.2, entry(2, "running", 25, "step 2/4 at 25%", 10.0)),
        Snapshot(T0 + 10.45, entry(2, "running", 25, "step 2/4 at 25%", 10.0)),
        Snapshot(T0 + 20.3, entry(3, "rolled_back", 0, "rolled back at 25%: error rate", 20.1)),
    ]
    timeline = extract_timeline(snapshots, T0)
    assert timeline == [
        TimelineEntry(-0.2, 5.0, "running", 0, "started at 5%", 0.5),
        TimelineEntry(10.0, 25.0, "running", 0, "step 2/4 at 25%", 10.2),
        TimelineEntry(20.1, 0.0, "rolled_back", 0, "rolled back at 25%: error rate", 20.3),
    ]
    assert extract_timeline([], T0) == []


def test_min_samples_time_from_verdicts() -> None:
    snapshots = [
        Snapshot(T0 + 1.0, entry(1, "running", 5, "s", 0.0, verdict("wait", 40, 900))),
        Snapshot(T0 + 2.0, entry(1, "running", 5, "s", 0.0, verdict("wait", 99, 1900))),
        # The rollback verdict is the first to see enough samples: its transition time is exact.
        Snapshot(T0 + 3.0, entry(2, "rolled_back", 0, "rolled back", 2.6, verdict("rollback", 101, 2000))),
    ]
    assert min_samples_from_verdicts(snapshots, 100) == pytest.approx(T0 + 2.6)
    # A waiting verdict (holding the step) with enough samples: the poll that showed it.
    holding = [Snapshot(T0 + 5.0, entry(1, "running", 5, "s", 0.0, verdict("wait", 150, 150)))]
    assert min_samples_from_verdicts(holding, 100) == pytest.approx(T0 + 5.0)
    # An old transition (before the previous poll) is not the verdict's time.
    stale = [Snapshot(T0 + 1.0, entry(2, "running", 25, "s", 0.5, verdict("wait", 1, 1))),
             Snapshot(T0 + 2.0, entry(2, "running", 25, "s", 0.5, verdict("promote", 120, 130)))]
    assert min_samples_from_verdicts(stale, 100) == pytest.approx(T0 + 2.0)
    assert min_samples_from_verdicts(snapshots[:2], 100) is None
    assert min_samples_from_verdicts([Snapshot(T0, entry(1, "running", 5, "s", 0.0))], 100) is None


def test_min_samples_time_from_served_responses() -> None:
    samples = [sample(0.1 * i, "127.0.0.1:8001", e2e=0.05) for i in range(5)]
    samples += [sample(1.0, "127.0.0.1:9001", e2e=0.2), sample(2.0, "127.0.0.1:9001", "http_5xx", e2e=0.1),
                sample(0.0, None, "dropped")]
    # v1's 3rd response ended at 0.25, v2's at 2.1 (errors count: the service records them too).
    assert min_samples_from_samples(samples, POOLS, 2) == pytest.approx(2.1)
    assert min_samples_from_samples(samples, POOLS, 3) is None  # the canary served only two


def test_sample_pool_reads_simulator_then_envoy_header() -> None:
    assert sample_pool(sample(0, "127.0.0.1:9001"), POOLS) == "v2"
    assert sample_pool(sample(0, "127.0.0.1:8002", header="x-gateway-upstream-host"), POOLS) == "v1"
    assert sample_pool(sample(0, "10.0.0.1:1"), POOLS) is None
    assert sample_pool(sample(0, None, "timeout"), POOLS) is None


def test_error_shares_overall_and_per_pool() -> None:
    samples = [sample(float(i), "127.0.0.1:8001") for i in range(14)]
    samples += [sample(float(i), "127.0.0.1:8002") for i in range(2)]
    samples += [sample(1.0, "127.0.0.1:9001"), sample(2.0, "127.0.0.1:9001", "http_5xx"),
                sample(3.0, "127.0.0.1:9001"), sample(30.0, "127.0.0.1:9001", "http_5xx")]  # after the end
    samples += [sample(5.0, None, "dropped"), sample(6.0, None, "timeout")]
    shares = error_shares(samples, POOLS, fault_start_s=-0.01, faulty_until_s=20.0)
    assert shares["requests"] == 22 and shares["errors"] == 4
    assert shares["error_share"] == pytest.approx(4 / 22, abs=1e-5)
    assert shares["canary_while_faulty"] == 3
    assert shares["canary_share_while_faulty"] == pytest.approx(3 / 22, abs=1e-5)
    v1, v2, lost = (shares["per_pool"][p] for p in ("v1", "v2", "unattributed"))
    assert (v1["requests"], v1["errors"], v1["error_rate"]) == (16, 0, 0.0)
    assert (v2["requests"], v2["errors"], v2["error_rate"]) == (4, 2, 0.5)
    assert v2["share_of_requests"] == pytest.approx(4 / 22, abs=1e-5)
    assert v2["errors_share_of_requests"] == pytest.approx(2 / 22, abs=1e-5)
    assert (lost["requests"], lost["errors"]) == (2, 2)
    healthy = error_shares(samples[:16], POOLS)
    assert healthy["canary_while_faulty"] is None and healthy["canary_share_while_faulty"] is None
    assert error_shares([], POOLS)["error_share"] == 0.0


def test_served_after_counts_requests_sent_after_the_end() -> None:
    samples = [sample(9.9, "127.0.0.1:9001"), sample(10.0, "127.0.0.1:9001"), sample(10.01, "127.0.0.1:8001"),
               sample(11.0, "127.0.0.1:8002"), sample(12.0, None, "dropped")]
    assert served_after(samples, POOLS, 10.0) == {"unattributed": 1, "v1": 2}


def shares_with(v1_errors: int = 0, v2_errors: int = 0, lost: int = 0) -> dict[str, Any]:
    per_pool = {"v1": {"requests": 100, "errors": v1_errors}, "v2": {"requests": 10, "errors": v2_errors}}
    if lost:
        per_pool["unattributed"] = {"requests": lost, "errors": lost}
    return {"per_pool": per_pool}


def test_exit_logic() -> None:
    assert expected_status("error") == expected_status("slow") == "rolled_back"
    assert expected_status("none") == "promoted"
    assert exit_problems("error", "rolled_back", shares_with(v2_errors=7), {"v1": 300}) == []
    assert exit_problems("none", "promoted", shares_with(), {"v2": 300}) == []
    assert exit_problems("slow", "rolled_back", shares_with(), {"v1": 5, "v2": 0}) == []
    assert exit_problems("error", "promoted", shares_with(v2_errors=7), {}) == [
        "rollout ended promoted, expected rolled_back"]
    assert exit_problems("none", "rolled_back", shares_with(), {}) == ["rollout ended rolled_back, expected promoted"]
    assert exit_problems("error", None, shares_with(), None) == ["rollout ended never, expected rolled_back"]
    assert exit_problems("error", "rolled_back", shares_with(v1_errors=1), {"v1": 10}) == ["1 errors on v1"]
    assert exit_problems("none", "promoted", shares_with(lost=2), {}) == ["2 errors on unattributed"]
    assert exit_problems("error", "rolled_back", shares_with(), {"v1": 10, "v2": 3}) == [
        "3 requests sent after the rollback were served by the canary"]


def test_options_and_policy() -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args([])
    assert (args.fault, args.steps, args.hold, args.min_samples, args.interval) == (
        "error", (5.0, 25.0, 50.0, 100.0), 5.0, 100, 1.0)
    assert (args.rate, args.error_rate, args.duration, args.json) == (60.0, 0.1, 90.0, "reports/canary.json")
    assert parser.parse_args(["--steps", "10, 50,100"]).steps == (10.0, 50.0, 100.0)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_steps("a,b")
    section = RolloutPolicy.model_validate(rollout_policy(args)["rollout"])
    rollout = section.splits[0].rollout
    assert rollout is not None
    assert (rollout.canary, rollout.baseline, rollout.steps) == ("v2", "v1", (5.0, 25.0, 50.0, 100.0))
    assert (rollout.hold_s, rollout.min_samples, rollout.analysis_interval_s) == (5.0, 100, 1.0)
    assert section.refresh_interval_s == 0.25
