"""build_store's Redis store behind the failover, against a port where nothing listens (a real refused connect:
an integration test, unit tests open no sockets)."""

from __future__ import annotations

import pytest
import yaml

from extproc.config import parse_policy
from extproc.limits import AdmitRequest, FailoverStore, RedisStore, TokenBudget
from extproc.server.stores import REDIS_URL_ENV, build_store


def policy(limits: dict[str, object], extproc_endpoints: list[str]) -> str:
    return yaml.safe_dump({"pools": [{"name": "p", "model": "m", "endpoints": ["127.0.0.1:9"]}], "limits": limits,
                           "envoy": {"extproc_endpoints": extproc_endpoints}})


async def test_redis_behind_a_failover_with_this_replicas_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REDIS_URL_ENV, raising=False)
    text = policy({"store": "redis", "redis_url": "redis://127.0.0.1:1/0", "decision_deadline_ms": 7},
                  ["127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003"])
    store, redis = build_store(parse_policy(text, "p.yaml"))
    try:
        assert isinstance(store, FailoverStore) and isinstance(redis, RedisStore)
        assert redis.on_posted_failure == store.record_failure  # failed posted calls count as store failures
        # nothing listens on port 1: fail-open decides with a third of the limit
        budget = TokenBudget("t:tpm", 900, 60)
        assert (await store.admit(AdmitRequest("a", 1_699_920_000.0, 300, budgets=(budget,)))).admitted
        assert not store.primary_up and store.degraded_admits_total == 1
        assert not (await store.admit(AdmitRequest("b", 1_699_920_000.0, 1, budgets=(budget,)))).admitted
    finally:
        await store.close()
