from __future__ import annotations

import pytest

from extproc.scheduling.plugins import inflight, kv_utilization, latency, queue_depth
from extproc.scheduling.registry import PluginError
from tests.unit.scheduling.helpers import endpoint, request


def test_queue_scorer_min_max_and_stale_fallback() -> None:
    scorer = queue_depth.create("q", {})
    endpoints = [endpoint("a:1", waiting=0), endpoint("b:1", waiting=5), endpoint("c:1", waiting=10)]
    assert scorer.score(request(), endpoints) == [1.0, 0.5, 0.0]
    assert scorer.score(request(), [endpoint("a:1"), endpoint("b:1")]) == [1.0, 1.0]
    stale = [endpoint("a:1", waiting=50, age=10, in_flight=0), endpoint("b:1", waiting=0, age=10, in_flight=4)]
    assert scorer.score(request(), stale) == [1.0, 0.0]  # stale scrape ignored, local counts used


def test_kv_scorer() -> None:
    scorer = kv_utilization.create("kv", {})
    endpoints = [endpoint("a:1", kv=0.2), endpoint("b:1", kv=0.9), endpoint("c:1", scraped=False)]
    assert scorer.score(request(), endpoints) == pytest.approx([0.8, 0.1, 0.5])


def test_inflight_scorer_modes() -> None:
    endpoints = [endpoint("a:1", in_flight=0, scraped=False), endpoint("b:1", in_flight=3, scraped=False)]
    scores = inflight.create("i", {}).score(request(), endpoints)
    assert scores[0] == 1.0 and scores[1] < 0.5
    endpoints[0].in_flight_tokens, endpoints[1].in_flight_tokens = 5000, 100
    tokens = inflight.create("t", {"mode": "tokens"}).score(request(), endpoints)
    assert tokens[0] < tokens[1]
    with pytest.raises(PluginError):
        inflight.create("bad", {"mode": "bytes"})


def test_inflight_scorer_uses_scrape_when_it_sees_more() -> None:
    endpoints = [endpoint("a:1", running=8, in_flight=1), endpoint("b:1", running=0, in_flight=2)]
    scores = inflight.create("i", {}).score(request(), endpoints)
    assert scores[0] < scores[1]


def test_latency_scorer() -> None:
    endpoints = [endpoint("a:1"), endpoint("b:1"), endpoint("c:1")]
    endpoints[0].latency_ewma_s, endpoints[1].latency_ewma_s = 0.1, 0.4
    assert latency.create("l", {}).score(request(), endpoints) == pytest.approx([1.0, 0.25, 1.0])
