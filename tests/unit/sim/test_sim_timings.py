"""The per-request stamp store of a simulated replica (extproc/sim/timings.py)."""

from __future__ import annotations

from extproc.sim.timings import Timings


def test_the_store_keeps_only_the_newest_requests() -> None:
    timings = Timings(limit=3)
    for n in range(5):
        timings.start(float(n), 8000)
    assert [item["id"] for item in timings.dump()] == ["8000-3", "8000-4", "8000-5"]
    assert [item["arrive"] for item in timings.dump()] == [2.0, 3.0, 4.0]
