"""Unit tests open no network sockets: a piece that talks to the network takes an injected transport (see
tests/support.py and the fakes next to each test), and what needs a real server is an integration test."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

# Known exceptions, to be moved to tests/integration (each named with its reason).
ALLOWED = {
    # Builds the Redis store behind the failover and lets it try 127.0.0.1:1. tests/unit/limits is being
    # rewritten in a parallel change; moving this test is left to it.
    "tests/unit/limits/test_build_store.py::test_redis_behind_a_failover_with_this_replicas_share",
}


@pytest.fixture(autouse=True)
def no_network_sockets(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.node.nodeid in ALLOWED:
        yield
        return

    def refuse(original: Any) -> Any:
        def guarded(self: socket.socket, *args: Any) -> Any:
            if self.family in (socket.AF_INET, socket.AF_INET6):
                raise AssertionError(f"{request.node.nodeid} opened a network socket: a unit test injects its "
                                     "transport; one that needs a real server belongs in tests/integration")
            return original(self, *args)

        return guarded

    for name in ("bind", "connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, refuse(getattr(socket.socket, name)))
    yield
