"""`extproc bench autoscale`, short: a pool scaled from zero by the bench's KEDA + HPA stand-in, then back."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from extproc.bench.autoscale import configure, run_autoscale

pytestmark = pytest.mark.integration


async def test_a_short_ramp_scales_from_zero_and_back_without_errors(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    report_path = tmp_path / "autoscale.json"
    args = parser.parse_args(["--ramp", "4", "--hold", "4", "--cold-start", "1", "--poll", "0.5",
                              "--stabilization", "3", "--cooldown", "2", "--predict", "2",
                              "--json", str(report_path), "--workdir", str(tmp_path / "work")])
    await run_autoscale(args)  # its exit status also judges timing, which this shared machine may stretch
    report = json.loads(report_path.read_text())
    assert sum(sum(p["errors"].values()) for p in report["phases"].values()) == 0
    assert sum(p["total"] for p in report["phases"].values()) > 0
    ready = [n for _, n in report["ready"]]
    assert max(ready) >= 2 and ready[-1] == 0  # scaled out from zero under the peak, back to zero after it
    assert report["scale_up_lags_s"] and all(math.isfinite(lag) for lag in report["scale_up_lags_s"])
    assert report["scale_downs_before_window"] == []
    starts = report["replica_starts"]  # pre-started parked: each listens once its cold start has passed
    assert len(starts) >= 2 and all(s["cold_start_s"] >= 1.0 for s in starts)
    assert report["load_follow"] and report["command"]
    assert report["hold"]["carried_in_flight"] > 0 and report["hold"]["desired_max"] >= 1
    assert report["flow"]["classes"]["standard"]["rejected"] == {}
    assert report_path.with_suffix(".png").stat().st_size > 0
