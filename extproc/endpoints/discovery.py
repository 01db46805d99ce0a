"""DNS discovery: resolve each discovering pool's name on its interval and publish the address set.

A headless Kubernetes Service answers with one A/AAAA record per ready pod, so the pool follows the
Deployment without a control plane of ours. A failed lookup keeps the last good set (a DNS blip
must not empty a pool); an empty answer empties it (the Service really has no ready pods).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable

from extproc.aio import Sleep
from extproc.config.schema import DnsDiscovery, PoolConfig

log = logging.getLogger(__name__)

Resolver = Callable[[str, int, int], Awaitable[list[str]]]


async def getaddrinfo_resolver(name: str, port: int, family: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(name, port, family=family, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _family(discovery: DnsDiscovery) -> int:
    return {"v4": socket.AF_INET, "v6": socket.AF_INET6}.get(discovery.family, socket.AF_UNSPEC)


def format_endpoint(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ipaddress.ip_address(ip).version == 6 else f"{ip}:{port}"


class DnsDiscoverer:
    """One task per discovering pool; `on_change(pool, addresses)` is called with every new set.
    `resolver` and the `sleep` between lookups are injectable (tests use neither DNS nor real time)."""

    def __init__(self, on_change: Callable[[str, tuple[str, ...]], None],
                 resolver: Resolver = getaddrinfo_resolver, *, sleep: Sleep = asyncio.sleep) -> None:
        self._on_change = on_change
        self._resolver = resolver
        self._sleep = sleep
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._configs: dict[str, DnsDiscovery] = {}
        self.addresses: dict[str, tuple[str, ...]] = {}
        self.failures_total = 0

    def configure(self, pools: Iterable[PoolConfig]) -> None:
        """Start, restart or stop resolvers so they match the pools (call again after a reload)."""
        wanted = {pool.name: pool.discovery for pool in pools if pool.discovery is not None}
        for name in list(self._tasks):
            if name not in wanted:
                self._tasks.pop(name).cancel()
                self._configs.pop(name, None)
                self.addresses.pop(name, None)
        for name, discovery in wanted.items():
            if self._configs.get(name) == discovery and not self._tasks[name].done():
                continue  # unchanged: keep resolving on its own schedule
            if name in self._tasks:
                self._tasks.pop(name).cancel()
            self._configs[name] = discovery
            self._tasks[name] = asyncio.create_task(self._loop(name, discovery), name=f"dns-{name}")

    async def resolve_once(self, name: str, discovery: DnsDiscovery) -> None:
        try:
            ips = await asyncio.wait_for(self._resolver(discovery.dns, discovery.port, _family(discovery)),
                                         timeout=max(1.0, discovery.interval_s))
        except (OSError, TimeoutError) as exc:
            self.failures_total += 1
            log.warning("pool %s: resolving %s failed (%s); keeping %d endpoints", name, discovery.dns, exc,
                        len(self.addresses.get(name, ())))
            return
        found = tuple(sorted({format_endpoint(ip, discovery.port) for ip in ips}))
        if found != self.addresses.get(name):
            self.addresses[name] = found
            log.info("pool %s: %s -> %d endpoints", name, discovery.dns, len(found))
            self._on_change(name, found)

    async def _loop(self, name: str, discovery: DnsDiscovery) -> None:
        while True:
            await self.resolve_once(name, discovery)
            await self._sleep(discovery.interval_s)

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        self._configs.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
