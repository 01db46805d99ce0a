from __future__ import annotations

from extproc.config.schema import SaturationConfig
from extproc.endpoints import EndpointMetrics, EndpointRegistry


def test_adopt_keeps_the_state_of_known_endpoints_and_forgets_the_rest() -> None:
    registry = EndpointRegistry()
    first = registry.adopt([("a", ["1.1.1.1:1", "1.1.1.2:1"])])
    lease = first["a"][0].lease(10)
    pools = registry.adopt([("a", ["1.1.1.1:1", "1.1.1.3:1"]), ("b", ["1.1.1.1:1"])])
    kept = pools["a"][0]
    assert kept is first["a"][0] and kept.in_flight == 1 and kept.in_flight_tokens == 10
    assert pools["b"][0] is kept  # one endpoint, whichever pools name it
    assert [e.address for e in pools["a"]] == ["1.1.1.1:1", "1.1.1.3:1"]
    assert registry.find("1.1.1.2:1") is None and len(registry.endpoints()) == 2
    lease.release()
    lease.release()
    assert kept.in_flight == 0 and kept.in_flight_tokens == 0 and kept.picked_total == 1


def test_an_endpoint_is_the_one_writer_of_its_state() -> None:
    (endpoint,), = EndpointRegistry().adopt([("a", ["1.1.1.1:1"])]).values()
    endpoint.scrape_failed()
    endpoint.scraped(EndpointMetrics(5.0, running=3), 2, SaturationConfig())
    assert endpoint.scrape_failures == 0 and endpoint.in_flight_at_scrape == 2 and endpoint.engine.peak_running == 3
    endpoint.others(4)
    endpoint.served(0.2)
    endpoint.served(0.4)
    assert endpoint.others_in_flight == 4 and endpoint.latency_ewma_s is not None
    assert abs(endpoint.latency_ewma_s - 0.24) < 1e-9
