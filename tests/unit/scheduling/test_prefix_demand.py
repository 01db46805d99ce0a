from __future__ import annotations

import math

import pytest

from extproc.scheduling.prefix_demand import PrefixDemand


def test_shares_count_every_request_and_decay_with_time() -> None:
    demand = PrefixDemand(decay_s=2.0, capacity=8)
    for _ in range(10):
        demand.count(1, 0.0)
    assert demand.share(1, 0.0) == 1.0
    for _ in range(10):
        demand.count(None, 0.0)  # requests with no known prefix: in the total only
    assert demand.share(1, 0.0) == pytest.approx(0.5)
    assert demand.requests(1, 2.0) == pytest.approx(10 / math.e)
    for _ in range(20):
        demand.count(2, 2.0)  # the total decayed alike: the older requests weigh less
    assert demand.share(2, 2.0) == pytest.approx(20 / (20 + 20 / math.e))
    assert demand.share(3, 2.0) == 0.0 and demand.requests(3, 2.0) == 0.0


def test_keys_are_bounded_least_recently_counted_first() -> None:
    demand = PrefixDemand(decay_s=1.0, capacity=2)
    for key in (1, 2, 1, 3):
        demand.count(key, 0.0)
    assert len(demand) == 2 and demand.requests(2, 0.0) == 0.0 and demand.requests(1, 0.0) == 2.0
    with pytest.raises(ValueError):
        PrefixDemand(decay_s=0.0, capacity=1)
