from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.limits.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One real redis-server on a free 127.0.0.1 port for the session (FAILS if redis-server is missing);
    tests keep apart by key prefix."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.kill()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.path):
            item.add_marker(pytest.mark.integration)
