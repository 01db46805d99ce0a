from __future__ import annotations

from extproc.endpoints import Endpoint, PoolState
from extproc.scheduling import LeastInFlightPicker


def test_picks_least_loaded_then_orders_fallbacks() -> None:
    pool = PoolState("p", [Endpoint("a", 3), Endpoint("b", 0), Endpoint("c", 1)])
    picked = LeastInFlightPicker().pick(pool, fallbacks=2)
    assert [ep.address for ep in picked] == ["b", "c", "a"]


def test_ties_rotate_and_empty_pool() -> None:
    pool = PoolState("p", [Endpoint("a"), Endpoint("b"), Endpoint("c")])
    picker = LeastInFlightPicker()
    firsts = {picker.pick(pool, fallbacks=0)[0].address for _ in range(3)}
    assert firsts == {"a", "b", "c"}
    assert picker.pick(PoolState("empty"), fallbacks=2) == ()
