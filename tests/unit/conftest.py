"""Unit tests open no network sockets: a piece that talks to the network takes an injected transport (see
tests/support.py and the fakes next to each test), and what needs a real server is an integration test."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def no_network_sockets(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
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
