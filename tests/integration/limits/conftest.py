from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from extproc.limits import MemoryStore, RedisStore, Store
from tests.integration.limits.redis_server import RedisServer

_prefixes = itertools.count()


@pytest.fixture
def servers() -> Iterator[Callable[..., RedisServer]]:
    """Factory of extra redis-servers a test may kill and restart; all killed at the end."""
    started: list[RedisServer] = []

    def make(*extra: str, tls_port: int | None = None) -> RedisServer:
        server = RedisServer(*extra, tls_port=tls_port)
        started.append(server)
        return server.start()

    yield make
    for server in started:
        server.kill()


def redis_store(server: RedisServer, timeout_ms: float = 2000.0, prefix: str | None = None) -> RedisStore:
    """A client with its own key prefix, so tests sharing the session server never see each other."""
    return RedisStore(server.url, prefix=prefix or f"t{next(_prefixes)}:", timeout_ms=timeout_ms)


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, redis_server: RedisServer) -> AsyncIterator[Store]:
    made: Store = MemoryStore() if request.param == "memory" else redis_store(redis_server)
    try:
        yield made
    finally:
        await made.close()
