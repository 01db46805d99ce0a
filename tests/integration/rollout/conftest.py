from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from extproc.rollout import RedisRolloutStore
from tests.integration.limits.redis_server import RedisServer

_prefixes = itertools.count()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server on a free 127.0.0.1 port (the test FAILS if redis-server is missing)."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def prefix() -> str:
    return f"ro{next(_prefixes)}:"


def redis_rollout_store(server: RedisServer, prefix: str) -> RedisRolloutStore:
    return RedisRolloutStore(server.url, prefix=prefix, timeout_ms=2000)
