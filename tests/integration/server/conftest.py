from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.limits.redis_server import RedisServer


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A redis-server of its own (a test may kill it; keys stay apart from other tests')."""
    started = RedisServer().start()
    try:
        yield started
    finally:
        started.kill()
