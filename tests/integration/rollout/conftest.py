from __future__ import annotations

import itertools

import pytest

from extproc.rollout import RedisRolloutStore
from tests.integration.limits.redis_server import RedisServer

_prefixes = itertools.count()


@pytest.fixture
def prefix() -> str:
    return f"ro{next(_prefixes)}:"


def redis_rollout_store(server: RedisServer, prefix: str) -> RedisRolloutStore:
    return RedisRolloutStore(server.url, prefix=prefix, timeout_ms=2000)
