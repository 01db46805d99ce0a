from __future__ import annotations

import asyncio
import socket

import pytest

from extproc.config.schema import DnsDiscovery, PoolConfig
from extproc.endpoints.discovery import DnsDiscoverer, format_endpoint, getaddrinfo_resolver


def test_endpoint_formatting() -> None:
    assert format_endpoint("10.0.0.1", 80) == "10.0.0.1:80"
    assert format_endpoint("fd00::1", 80) == "[fd00::1]:80"


async def test_changes_are_published_and_failures_keep_the_last_set() -> None:
    answers: list[list[str] | Exception] = [["10.0.0.2", "10.0.0.1"], ["10.0.0.1", "10.0.0.2"], OSError("nxdomain"),
                                            ["10.0.0.3"], []]
    seen: list[tuple[str, tuple[str, ...]]] = []

    async def resolver(name: str, port: int, family: int) -> list[str]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    discoverer = DnsDiscoverer(lambda pool, addresses: seen.append((pool, addresses)), resolver)
    discovery = DnsDiscovery(dns="vllm.ns.svc.cluster.local", port=8000)
    for _ in range(5):
        await discoverer.resolve_once("chat", discovery)
    assert seen == [("chat", ("10.0.0.1:8000", "10.0.0.2:8000")), ("chat", ("10.0.0.3:8000",)), ("chat", ())]
    assert discoverer.failures_total == 1


async def test_loop_follows_pools_and_stops() -> None:
    calls = 0

    async def resolver(name: str, port: int, family: int) -> list[str]:
        nonlocal calls
        calls += 1
        return ["10.0.0.1"]

    published: dict[str, tuple[str, ...]] = {}
    discoverer = DnsDiscoverer(published.__setitem__, resolver)
    pool = PoolConfig(name="chat", model="m", discovery=DnsDiscovery(dns="svc", port=1, interval_s=0.5))
    discoverer.configure([pool])
    await asyncio.sleep(0.05)
    assert published == {"chat": ("10.0.0.1:1",)}
    discoverer.configure([])
    assert discoverer.addresses == {}
    await discoverer.stop()
    assert calls == 1


async def test_real_resolver_resolves_localhost() -> None:
    assert "127.0.0.1" in await getaddrinfo_resolver("localhost", 80, socket.AF_INET)


def test_pool_needs_exactly_one_source() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        PoolConfig(name="p", model="m")
    with pytest.raises(ValueError, match="exactly one"):
        PoolConfig(name="p", model="m", endpoints=("1.1.1.1:1",), discovery=DnsDiscovery(dns="x", port=1))
