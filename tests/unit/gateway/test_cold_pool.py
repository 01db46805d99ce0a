"""A pool that may be at zero ready endpoints: requests are held until one is ready, and only ready endpoints
(scraped once, not asleep) are ever picked."""

from __future__ import annotations

import json

from extproc.endpoints import EndpointMetrics
from extproc.endpoints.config import SaturationConfig
from extproc.flow import Ticket
from extproc.gateway import RequestHead, Route
from tests.unit.gateway.harness import Harness

POLICY = """\
pools:
  - name: chat
    model: org/chat
    endpoints: ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
    cold_start_timeout_s: 30
    fallbacks: 2
"""
HEAD = RequestHead("POST", "/v1/chat/completions", {})
BODY = json.dumps({"model": "org/chat", "messages": [{"role": "user", "content": "hi"}]}).encode()


async def test_held_until_an_endpoint_is_ready_then_only_ready_ones_are_picked() -> None:
    gateway = Harness(POLICY)
    exchange, _ = gateway.headers(HEAD)
    held = gateway.body(exchange, BODY)
    assert isinstance(held, Ticket) and held.cold and held.deadline == 30.0  # nothing scraped yet: held
    first, second, _never_scraped = gateway.pool("chat").endpoints
    for endpoint in (first, second):
        endpoint.scraped(EndpointMetrics(scraped_at=0.0), 0, SaturationConfig())
    second.asleep = True
    gateway.parts.flow.kick("chat")
    assert held.granted
    decision = gateway.send(exchange, None)
    assert isinstance(decision, Route)
    assert decision.endpoints == (first.address,)  # never scraped (3rd) or asleep (2nd): not a candidate
    exchange, _ = gateway.headers(HEAD)
    assert isinstance(gateway.body(exchange, BODY), Route)  # ready: straight on
