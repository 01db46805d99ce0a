"""DNS discovery's default resolver is the system's (getaddrinfo); the unit tests inject their own."""

from __future__ import annotations

import socket

import pytest

from extproc.endpoints.discovery import getaddrinfo_resolver

pytestmark = pytest.mark.integration


async def test_real_resolver_resolves_localhost() -> None:
    assert "127.0.0.1" in await getaddrinfo_resolver("localhost", 80, socket.AF_INET)
