from __future__ import annotations

from extproc.scheduling.hot_hold import HotHold
from tests.unit.scheduling.helpers import NOW


def test_the_hot_hold_forgets_an_endpoint_not_seen_hot_within_the_hold() -> None:
    hot = HotHold(0.3)
    assert not hot.held("gone:1", True, NOW)  # hot, then it leaves the pool: never looked at again
    assert not hot.held("a:1", True, NOW + 0.1)
    assert set(hot.since) == {"gone:1", "a:1"}
    assert not hot.held("a:1", True, NOW + 0.35)  # a look within the hold keeps its start
    assert hot.held("a:1", True, NOW + 0.45)
    assert not hot.held("b:1", True, NOW + 1.0)  # a new hot endpoint: the stale entries go
    assert set(hot.since) == {"b:1"}
    assert not hot.held("a:1", True, NOW + 1.1)  # as if never seen: the hold starts over
    assert not hot.held("b:1", False, NOW + 1.2) and "b:1" not in hot.since  # no longer hot: forgotten
