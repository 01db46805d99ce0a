"""Responses ids that name the endpoint storing them (extproc/gateway/stateful.py)."""

from __future__ import annotations

from extproc.endpoints import Endpoint
from extproc.gateway.stateful import endpoint_tag, new_response_id, pinned_endpoint

POOL = [Endpoint("10.0.0.1:8000"), Endpoint("10.0.0.2:8000"), Endpoint("10.0.0.3:8000")]


def test_an_id_leads_back_to_its_endpoint_on_any_replica() -> None:
    for endpoint in POOL:
        response_id = new_response_id("chat", endpoint.address)
        assert response_id.startswith("resp_") and len(response_id) == 53
        assert pinned_endpoint(response_id, "chat", POOL) is endpoint
    first, second = (new_response_id("chat", POOL[0].address) for _ in range(2))
    assert first != second  # 128 random bits each: unguessable, never chosen by a client


def test_ids_that_name_no_usable_endpoint_pin_nothing() -> None:
    response_id = new_response_id("chat", POOL[0].address)
    assert pinned_endpoint(response_id, "chat", POOL[1:]) is None  # its endpoint is not usable now
    assert pinned_endpoint(new_response_id("chat", POOL[0].address, POOL[1].address), "chat", POOL[2:]) is None
    assert pinned_endpoint(response_id, "other-pool", POOL) is None  # the tag is per pool
    for forged in ("resp_" + endpoint_tag("chat", POOL[0].address), "resp_abc", "msg_" + response_id[5:], ""):
        assert pinned_endpoint(forged, "chat", POOL) is None


def test_the_first_fallback_holds_it_when_the_primary_is_not_usable() -> None:
    """Envoy retried a failed connect on the first fallback, which stored the response: while the primary is
    out of the usable endpoints, its continuation goes there."""
    response_id = new_response_id("chat", POOL[0].address, POOL[1].address)
    assert pinned_endpoint(response_id, "chat", POOL) is POOL[0]
    assert pinned_endpoint(response_id, "chat", [POOL[1], POOL[2]]) is POOL[1]


def test_ids_of_the_earlier_form_are_still_followed() -> None:
    legacy = "resp_" + endpoint_tag("chat", POOL[2].address) + "0" * 32
    assert pinned_endpoint(legacy, "chat", POOL) is POOL[2]
