"""DNS discovery: resolve each discovering pool's name on its interval and publish the address set.

A headless Kubernetes Service answers with one A/AAAA record per ready pod, so the pool follows the
Deployment without a control plane of ours. A failed lookup keeps the last good set (a DNS blip
must not empty a pool); an empty answer empties it (the Service really has no ready pods).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Protocol

from extproc.aio import Sleep
from extproc.endpoints.config import DnsDiscovery
from extproc.periodic import FailureLog, Periodic

log = logging.getLogger(__name__)

Resolver = Callable[[str, int, int], Awaitable[list[str]]]


class DiscoveringPool(Protocol):
    """What discovery reads of a pool's configuration (`extproc.config.schema.PoolConfig`)."""

    @property
    def name(self) -> str: ...

    @property
    def discovery(self) -> DnsDiscovery | None: ...


async def getaddrinfo_resolver(name: str, port: int, family: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(name, port, family=family, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _family(discovery: DnsDiscovery) -> int:
    return {"v4": socket.AF_INET, "v6": socket.AF_INET6}.get(discovery.family, socket.AF_UNSPEC)


def format_endpoint(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ipaddress.ip_address(ip).version == 6 else f"{ip}:{port}"


class DnsDiscoverer:
    """One loop (`Periodic`) per discovering pool; `on_change(pool, addresses)` is called with every new set.
    A failing lookup is logged once per state change (and its recovery). `resolver` and the `sleep` between
    lookups are injectable (tests use neither DNS nor real time)."""

    def __init__(self, on_change: Callable[[str, tuple[str, ...]], None],
                 resolver: Resolver = getaddrinfo_resolver, *, sleep: Sleep = asyncio.sleep) -> None:
        self._on_change = on_change
        self._resolver = resolver
        self._sleep = sleep
        self._loops: dict[str, Periodic] = {}
        self._configs: dict[str, DnsDiscovery] = {}
        self._failures: dict[str, FailureLog] = {}
        self.addresses: dict[str, tuple[str, ...]] = {}
        self.failures_total = 0

    def configure(self, pools: Iterable[DiscoveringPool]) -> None:
        """Start, restart or stop resolvers so they match the pools (call again after a reload)."""
        wanted = {pool.name: pool.discovery for pool in pools if pool.discovery is not None}
        for name in list(self._loops):
            if name not in wanted:
                self._loops.pop(name).cancel()
                self._configs.pop(name, None)
                self._failures.pop(name, None)
                self.addresses.pop(name, None)
        for name, discovery in wanted.items():
            if self._configs.get(name) == discovery and self._loops[name].running:
                continue  # unchanged: keep resolving on its own schedule
            if name in self._loops:
                self._loops.pop(name).cancel()
                self._failures.pop(name, None)
            self._configs[name] = discovery
            self._loops[name] = loop = Periodic(f"dns-{name}", partial(self.resolve_once, name, discovery),
                                                discovery.interval_s, log=log, immediate=True, sleep=self._sleep)
            loop.start()

    async def resolve_once(self, name: str, discovery: DnsDiscovery) -> None:
        failures = self._failures.setdefault(name, FailureLog(f"pool {name}: resolving {discovery.dns}", log))
        try:
            ips = await asyncio.wait_for(self._resolver(discovery.dns, discovery.port, _family(discovery)),
                                         timeout=max(1.0, discovery.interval_s))
        except (OSError, TimeoutError) as exc:
            self.failures_total += 1
            failures.failed(f"{str(exc) or type(exc).__name__}; keeping {len(self.addresses.get(name, ()))} endpoints")
            return
        failures.recovered()
        found = tuple(sorted({format_endpoint(ip, discovery.port) for ip in ips}))
        if found != self.addresses.get(name):
            self.addresses[name] = found
            log.info("pool %s: %s -> %d endpoints", name, discovery.dns, len(found))
            self._on_change(name, found)

    async def stop(self) -> None:
        loops = list(self._loops.values())
        self._loops.clear()
        self._configs.clear()
        for loop in loops:
            await loop.stop()
