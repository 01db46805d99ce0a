from __future__ import annotations

import numpy as np
import pytest

from extproc.bench.loadgen import arrival_offsets


def test_fixed_arrivals_are_evenly_spaced_within_duration() -> None:
    offsets = arrival_offsets(50, 0.4, "fixed", seed=1)
    assert len(offsets) == 20
    assert offsets[0] == 0.0
    assert np.allclose(np.diff(offsets), 0.02)
    assert offsets[-1] < 0.4


def test_poisson_arrivals_are_reproducible_and_seed_dependent() -> None:
    a = arrival_offsets(200, 5.0, "poisson", seed=7)
    assert a == arrival_offsets(200, 5.0, "poisson", seed=7)
    assert a != arrival_offsets(200, 5.0, "poisson", seed=8)
    assert all(0 <= x < 5.0 for x in a)
    assert a == sorted(a)
    assert abs(len(a) - 1000) < 5 * np.sqrt(1000)  # ~ rate * duration


def test_no_arrivals_for_zero_rate_and_unknown_process_rejected() -> None:
    assert arrival_offsets(0, 10, "fixed", seed=0) == []
    with pytest.raises(ValueError):
        arrival_offsets(1, 1, "uniform", seed=0)  # type: ignore[arg-type]
