from __future__ import annotations

import pytest

from extproc.config.schema import DnsDiscovery, PoolConfig
from extproc.endpoints.discovery import DnsDiscoverer, format_endpoint
from tests.support import SteppedSleep


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


async def test_loop_resolves_every_interval_follows_pools_and_stops() -> None:
    calls = 0

    async def resolver(name: str, port: int, family: int) -> list[str]:
        nonlocal calls
        calls += 1
        return ["10.0.0.1"]

    published: list[tuple[str, tuple[str, ...]]] = []
    sleep = SteppedSleep()
    discoverer = DnsDiscoverer(lambda pool, addresses: published.append((pool, addresses)), resolver, sleep=sleep)
    pool = PoolConfig(name="chat", model="m", discovery=DnsDiscovery(dns="svc", port=1, interval_s=0.5))
    discoverer.configure([pool])
    await sleep.wait_parked()  # resolved at once, then waits its interval
    assert published == [("chat", ("10.0.0.1:1",))] and calls == 1
    await sleep.step()
    assert calls == 2 and len(published) == 1  # the same set is not published again
    assert sleep.delays == [0.5, 0.5]
    discoverer.configure([])
    assert discoverer.addresses == {}
    await discoverer.stop()
    assert calls == 2


def test_pool_needs_exactly_one_source() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        PoolConfig(name="p", model="m")
    with pytest.raises(ValueError, match="exactly one"):
        PoolConfig(name="p", model="m", endpoints=("1.1.1.1:1",), discovery=DnsDiscovery(dns="x", port=1))
