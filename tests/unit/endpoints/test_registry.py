from __future__ import annotations

from extproc.endpoints import EndpointRegistry, Lease


def test_sync_keeps_state_of_known_endpoints() -> None:
    registry = EndpointRegistry()
    registry.sync([("a", ["1.1.1.1:1", "1.1.1.2:1"])])
    pool = registry.pool("a")
    assert pool is not None
    lease = Lease(pool.endpoints[0])
    registry.sync([("a", ["1.1.1.1:1", "1.1.1.3:1"]), ("b", ["1.1.1.2:1"])])
    kept = registry.pool("a")
    assert kept is not None and kept.endpoints[0].in_flight == 1
    assert [ep.address for ep in kept.endpoints] == ["1.1.1.1:1", "1.1.1.3:1"]
    lease.release()
    lease.release()
    assert registry.total_in_flight() == 0
    assert registry.pool("missing") is None
