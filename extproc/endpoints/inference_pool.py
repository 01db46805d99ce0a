"""InferencePool discovery: a pool's endpoints from a watched `InferencePool` (inference.networking.k8s.io/v1) and
the ready pods its selector matches, `podIP:port` for every one of its `targetPorts`.

Each collection (the pool object, the pods) is mirrored by a `Reflector`, the pattern of client-go's informers:
list, then watch from the list's resourceVersion (bookmarks advance it while nothing changes); a watch the server
ends is re-opened from the last version seen; `410 Gone` (the version is older than the server keeps) lists again;
any other failure is retried after a backoff doubling up to a bound, with jitter. A pool's address set is published
(`on_change(pool, addresses)`, the same call DNS discovery makes) whenever it changes; a failing API server keeps
the last good set. The Kubernetes API itself is a port (`Api`, `ListWatch`): `extproc.endpoints.kube` adapts the
maintained `kubernetes_asyncio` client to it (the service imports it only once a pool is watched); unit tests use
an in-memory one.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from extproc.aio import Sleep, cancel_and_wait
from extproc.endpoints.config import InferencePoolSource
from extproc.endpoints.discovery import format_endpoint
from extproc.periodic import FailureLog

__all__ = ["Gone", "InferencePoolDiscovery", "ListWatch", "PoolSpec", "Reflector", "pod_addresses", "pool_spec",
           "ready_ip"]

log = logging.getLogger(__name__)

class WatchedPool(Protocol):
    """What InferencePool discovery reads of a pool's configuration (`extproc.config.schema.PoolConfig`)."""

    @property
    def name(self) -> str: ...

    @property
    def inference_pool(self) -> InferencePoolSource | None: ...


class Gone(Exception):
    """The watch's resourceVersion is older than the API server keeps (HTTP 410): list again."""


class ListWatch(Protocol):
    """One collection of the Kubernetes API (objects as the API's JSON, decoded)."""

    async def list(self) -> tuple[list[dict[str, Any]], str]:
        """The objects and the collection's resourceVersion."""
        ...

    def watch(self, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Events (ADDED, MODIFIED, DELETED, BOOKMARK) after `resource_version`, until the server ends the watch;
        raises `Gone` for a version too old."""
        ...


@dataclass(frozen=True)
class PoolSpec:
    selector: tuple[tuple[str, str], ...]  # spec.selector.matchLabels, sorted
    ports: tuple[int, ...]  # spec.targetPorts[].number


def pool_spec(pool: Mapping[str, Any]) -> PoolSpec | None:
    """The part of an InferencePool that names its endpoints; None when it names none (malformed)."""
    spec = pool.get("spec") or {}
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    ports = tuple(sorted({int(p["number"]) for p in spec.get("targetPorts") or []
                          if isinstance(p, Mapping) and isinstance(p.get("number"), int) and 0 < p["number"] < 65536}))
    if not labels or not ports or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        return None
    return PoolSpec(tuple(sorted(labels.items())), ports)


def ready_ip(pod: Mapping[str, Any]) -> str | None:
    """The pod's IP if it may serve: Ready, not terminating."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    status = pod.get("status") or {}
    ip = status.get("podIP")
    conditions = status.get("conditions") or []
    if not ip or not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
        return None
    return str(ip)


def pod_addresses(pods: Iterable[Mapping[str, Any]], ports: tuple[int, ...]) -> tuple[str, ...]:
    """Every ready pod's `ip:port` for each target port (a port is an endpoint of its own: data-parallel ranks)."""
    ips = {ip for pod in pods if (ip := ready_ip(pod)) is not None}
    return tuple(sorted(format_endpoint(ip, port) for ip in ips for port in ports))


def _key(item: Mapping[str, Any]) -> str:
    metadata = item.get("metadata") or {}
    return str(metadata.get("uid") or f"{metadata.get('namespace')}/{metadata.get('name')}")


class Backoff:
    """Delays between retries: doubling from `initial_s` to `max_s`, each drawn in [half, whole] (jitter)."""

    def __init__(self, initial_s: float, max_s: float, rand: Callable[[], float] = random.random) -> None:
        self._initial, self._max, self._rand = initial_s, max_s, rand
        self._next = initial_s

    def reset(self) -> None:
        self._next = self._initial

    def delay(self) -> float:
        delay = self._next
        self._next = min(self._max, self._next * 2)
        return delay * (0.5 + 0.5 * self._rand())


class Reflector:
    """A local mirror of one collection; `on_change(items)` after the first list and after every change."""

    def __init__(self, name: str, source: ListWatch, on_change: Callable[[Mapping[str, dict[str, Any]]], None],
                 backoff: Backoff, sleep: Sleep = asyncio.sleep) -> None:
        self.name = name
        self._source = source
        self._on_change = on_change
        self._backoff = backoff
        self._sleep = sleep
        self.items: dict[str, dict[str, Any]] = {}
        self.resource_version = ""
        self.lists_total = 0
        self._failures = FailureLog(name, log)  # logged once per state change, like every background loop

    @property
    def failures_total(self) -> int:
        return self._failures.failures_total

    async def run(self) -> None:
        while True:
            try:
                await self._list()
                while True:  # re-watch from the last version when the server ends a watch
                    await self._watch()
            except Gone:
                log.info("%s: resourceVersion %s expired (410); listing again", self.name, self.resource_version)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server unreachable, refusing, or answering garbage
                self._failures.failed(f"{exc or type(exc).__name__}; retrying with backoff (keeping the last "
                                      f"{len(self.items)} objects)")
                await self._sleep(self._backoff.delay())

    async def _list(self) -> None:
        items, version = await self._source.list()
        self.items = {_key(item): item for item in items}
        self.resource_version = version
        self.lists_total += 1
        self._backoff.reset()
        self._failures.recovered()
        self._on_change(self.items)

    async def _watch(self) -> None:
        async for kind, item in self._source.watch(self.resource_version):
            version = (item.get("metadata") or {}).get("resourceVersion")
            if kind in ("ADDED", "MODIFIED"):
                self.items[_key(item)] = item
            elif kind == "DELETED":
                self.items.pop(_key(item), None)
            elif kind != "BOOKMARK":
                continue
            if version:
                self.resource_version = str(version)
            if kind != "BOOKMARK":
                self._on_change(self.items)


class Api(Protocol):
    """The two collections a pool needs (extproc.endpoints.kube.KubernetesApi)."""

    def pools(self, name: str) -> ListWatch: ...

    def pods(self, selector: tuple[tuple[str, str], ...]) -> ListWatch: ...

    async def close(self) -> None: ...


class PoolWatch:
    """One pool: the InferencePool object's spec, and the pods of its current selector."""

    def __init__(self, pool: str, source: InferencePoolSource, api: Api,
                 on_change: Callable[[str, tuple[str, ...]], None], sleep: Sleep = asyncio.sleep) -> None:
        self.pool = pool
        self._source = source
        self._api = api
        self._on_change = on_change
        self._sleep = sleep
        self.spec: PoolSpec | None = None
        self.addresses: tuple[str, ...] | None = None  # None until the first list of pods
        self._pods: Reflector | None = None
        self._pods_task: asyncio.Task[None] | None = None

    def _backoff(self) -> Backoff:
        return Backoff(self._source.backoff_initial_s, self._source.backoff_max_s)

    async def run(self) -> None:
        reflector = Reflector(f"InferencePool {self._source.name}", self._api.pools(self._source.name),
                              self._pool_changed, self._backoff(), self._sleep)
        try:
            await reflector.run()
        finally:
            await cancel_and_wait(self._pods_task)
            await self._api.close()

    def _pool_changed(self, items: Mapping[str, dict[str, Any]]) -> None:
        found = [pool_spec(item) for item in items.values()]
        spec = next((s for s in found if s is not None), None)
        if items and spec is None:
            log.error("pool %s: InferencePool %s names no selector or target port; keeping %d endpoints",
                      self.pool, self._source.name, len(self.addresses or ()))
            return
        if spec == self.spec:
            return
        if spec is None:  # the InferencePool is gone: nothing to route to
            log.warning("pool %s: InferencePool %s not found", self.pool, self._source.name)
        self.spec = spec
        if self._pods_task is not None:
            self._pods_task.cancel()
            self._pods_task = None
        if spec is None:
            self._publish(())
            return
        self._pods = pods = Reflector(f"pods of InferencePool {self._source.name}", self._api.pods(spec.selector),
                                      lambda found: self._pods_changed(spec, found), self._backoff(), self._sleep)
        self._pods_task = asyncio.create_task(pods.run(), name=f"pods-{self.pool}")

    def _pods_changed(self, spec: PoolSpec, pods: Mapping[str, dict[str, Any]]) -> None:
        if spec == self.spec:
            self._publish(pod_addresses(pods.values(), spec.ports))

    def _publish(self, addresses: tuple[str, ...]) -> None:
        if addresses != self.addresses:
            self.addresses = addresses
            log.info("pool %s: InferencePool %s -> %d endpoints", self.pool, self._source.name, len(addresses))
            self._on_change(self.pool, addresses)


ApiFactory = Callable[[InferencePoolSource], Api]


class InferencePoolDiscovery:
    """One `PoolWatch` per pool whose endpoints come from an InferencePool; `synced` once each has listed."""

    def __init__(self, on_change: Callable[[str, tuple[str, ...]], None], api: ApiFactory,
                 sleep: Sleep = asyncio.sleep) -> None:
        self._on_change = on_change
        self._api = api
        self._sleep = sleep
        self._watches: dict[str, tuple[InferencePoolSource, PoolWatch, asyncio.Task[None]]] = {}
        self._synced = asyncio.Event()

    def _changed(self, pool: str, addresses: tuple[str, ...]) -> None:
        self._on_change(pool, addresses)
        if self.synced:
            self._synced.set()

    async def wait_synced(self) -> None:
        """Until every watched pool has listed its pods once (at once when none is watched)."""
        if not self.synced:
            await self._synced.wait()

    @property
    def synced(self) -> bool:
        return all(watch.addresses is not None for _, watch, _ in self._watches.values())

    def watches(self) -> dict[str, PoolWatch]:
        return {name: watch for name, (_, watch, _) in self._watches.items()}

    def configure(self, pools: Iterable[WatchedPool]) -> None:
        """Start, restart or stop watches so they match the pools (call again after a reload)."""
        wanted = {pool.name: pool.inference_pool for pool in pools if pool.inference_pool is not None}
        for name in list(self._watches):
            if wanted.get(name) != self._watches[name][0]:
                self._watches.pop(name)[2].cancel()
        for name, source in wanted.items():
            if name in self._watches:
                continue
            api = self._api(source)
            watch = PoolWatch(name, source, api, self._changed, self._sleep)
            self._synced.clear()
            self._watches[name] = (source, watch, asyncio.create_task(watch.run(), name=f"inferencepool-{name}"))

    async def stop(self) -> None:
        tasks = [task for _, _, task in self._watches.values()]
        self._watches.clear()
        for task in tasks:
            await cancel_and_wait(task)
