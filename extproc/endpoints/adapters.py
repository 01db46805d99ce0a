"""`AdapterManager`: LoRA adapters loaded on demand (`pools[].lora_paths`) through vLLM's runtime LoRA API.

vLLM (with `VLLM_ALLOW_RUNTIME_LORA_UPDATING`) loads an adapter with `POST /v1/load_lora_adapter
{"lora_name", "lora_path"}` and drops it with `POST /v1/unload_lora_adapter {"lora_name"}`; `/v1/models` lists
what is loaded. For the pools with `lora_paths`:

- every `interval_s` (off the request path) each endpoint's `/v1/models` says what it has loaded
  (`Endpoint.adapters`), so loads by another replica, or an engine restarted without them, are known here;
- a request for an adapter loaded on no ready endpoint waits (`wait`: a ticket the server awaits like a queued
  request, up to `lora_load_timeout_s`) while the adapter is loaded on one endpoint: a ready one below
  `max_adapters_per_endpoint` with the fewest adapters loaded on demand (then the fewest requests in flight),
  else the one holding the least recently used adapter, which it unloads first (requests running with it
  finish);
- requests for an adapter that is loaded go on as usual, to the endpoints that have it (`touch` marks it used);
- upkeep, each round, one call at a time per endpoint: an adapter of `lora_paths` that nothing used for
  `lora_idle_unload_s` is unloaded. "Used" is a request sent here, or the adapter running or waiting in the
  engine's own metrics (`vllm:lora_requests_info`, so use through another service replica counts too); one
  found loaded by someone else counts as used when first seen. The `lora_prewarm` adapters are loaded on every
  ready endpoint that lacks them, and never unloaded (not for idleness, not to make room).

One load per (pool, adapter) at a time; every request waiting for it is released when it completes, or refused
(503 `overloaded_adapter_unavailable`) when it fails or takes too long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from extproc.endpoints.engine_calls import EngineCalls
from extproc.endpoints.registry import Endpoint
from extproc.flow import Rejected, Ticket
from extproc.periodic import Periodic

__all__ = ["AdapterManager", "AdapterPool"]

log = logging.getLogger(__name__)

LIST_TIMEOUT_S = 1.0
LOAD_TIMEOUT_S = 120.0
MAX_WAITING = 1000  # requests waiting for one adapter; more are refused at once
RETRY_AFTER_S = 1.0


@dataclass(frozen=True, slots=True)
class AdapterPool:
    name: str
    model: str  # the served base model (not an adapter in /v1/models)
    paths: Mapping[str, str]
    max_per_endpoint: int
    timeout_s: float
    ready: Callable[[], Sequence[Endpoint]]  # its endpoints that may take a request now
    idle_unload_s: float = 0.0  # 0: never
    prewarm: frozenset[str] = frozenset()
    busy: Callable[[Endpoint], frozenset[str]] = lambda endpoint: frozenset()  # running or waiting, per its metrics


class AdapterManager:
    def __init__(self, pools: Callable[[], Iterable[AdapterPool]], *, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._pools = pools
        self._clock = clock
        self._waiting: dict[tuple[str, str], list[Ticket]] = {}
        self._loads: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._used: dict[tuple[str, str], float] = {}  # (endpoint address, adapter) -> last use
        self._changed: dict[Endpoint, float] = {}  # when this process last loaded or unloaded there
        self._upkeep: dict[Endpoint, asyncio.Task[None]] = {}  # an idle unload or a prewarm load under way
        self._calls = EngineCalls()
        self._loop = Periodic("lora-adapters", self._round, interval_s, log=log, what="adapter listing",
                              immediate=True)
        self.loads_total = self.unloads_total = self.failures_total = 0
        self.idle_unloads_total = self.prewarm_loads_total = 0

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        await self._calls.close([*self._loads.values(), *self._upkeep.values()])

    def _pool(self, name: str) -> AdapterPool | None:
        return next((p for p in self._pools() if p.name == name), None)

    # -- the request path (a dynamic adapter's requests only) --------------------------------------------
    def touch(self, endpoints: Iterable[Endpoint], adapter: str) -> None:
        now = self._clock()
        for endpoint in endpoints:
            self._used[(endpoint.address, adapter)] = now

    def wait(self, pool_name: str, adapter: str, tenant: str, klass: str, tokens: int) -> Ticket | Rejected:
        """A ticket released once `adapter` is loaded in `pool_name` (a load starts unless one runs)."""
        pool = self._pool(pool_name)
        waiting = self._waiting.setdefault((pool_name, adapter), [])
        if pool is None or len(waiting) >= MAX_WAITING:
            return Rejected(klass, "adapter_unavailable", 503, RETRY_AFTER_S)
        now = self._clock()
        ticket = Ticket(pool_name, tenant, klass, 0, 1.0, max(1, tokens), now, now + pool.timeout_s)
        ticket.consumed = True  # never in flow control's queue: nothing to give back there
        ticket.arm(lambda delay, callback: asyncio.get_running_loop().call_later(delay, callback),
                   pool.timeout_s, self._expire)
        waiting.append(ticket)
        key = (pool_name, adapter)
        if key not in self._loads:
            self._loads[key] = asyncio.get_running_loop().create_task(self._load(pool, adapter))
        return ticket

    def _expire(self, ticket: Ticket) -> None:
        for waiting in self._waiting.values():
            if ticket in waiting:
                waiting.remove(ticket)
        ticket.settle(Rejected(ticket.klass, "adapter_unavailable", 503, RETRY_AFTER_S,
                               self._clock() - ticket.enqueued))

    def _release(self, key: tuple[str, str], outcome: Rejected | None) -> None:
        for ticket in self._waiting.pop(key, []):
            waited = self._clock() - ticket.enqueued
            ticket.settle(None if outcome is None else Rejected(outcome.klass or ticket.klass, outcome.reason,
                                                                outcome.status, outcome.retry_after_s, waited))

    # -- loading -------------------------------------------------------------------------------------------
    async def _load(self, pool: AdapterPool, adapter: str) -> None:
        key = (pool.name, adapter)
        outcome: Rejected | None = Rejected("", "adapter_unavailable", 503, RETRY_AFTER_S)
        chosen: Endpoint | None = None
        try:
            ready = list(pool.ready())
            if any(adapter in e.adapters for e in ready):
                outcome = None  # loaded meanwhile (another replica, or the listing)
                return
            if not ready:
                log.warning("no ready endpoint in pool %s to load adapter %s on", pool.name, adapter)
                return
            endpoint = chosen = self._choose(pool, ready)
            self._changed[endpoint] = math.inf  # until the calls are over, listings started meanwhile are stale
            held = endpoint.adapters & pool.paths.keys()
            loaded = sorted(held - pool.prewarm, key=lambda name: self._used.get((endpoint.address, name), 0.0))
            for victim in loaded[: max(0, len(held) - pool.max_per_endpoint + 1)]:
                await self._call(endpoint, "/v1/unload_lora_adapter", {"lora_name": victim}, ok=(200, 404))
                endpoint.adapters = endpoint.adapters - {victim}
                self.unloads_total += 1
            await self._call(endpoint, "/v1/load_lora_adapter",
                             {"lora_name": adapter, "lora_path": pool.paths[adapter]}, ok=(200,))
            endpoint.adapters = endpoint.adapters | {adapter}
            self.touch((endpoint,), adapter)
            self.loads_total += 1
            log.info("loaded adapter %s on %s (pool %s)", adapter, endpoint.address, pool.name)
            outcome = None
        except (aiohttp.ClientError, TimeoutError, RuntimeError) as exc:
            self.failures_total += 1
            log.warning("loading adapter %s in pool %s failed: %s", adapter, pool.name, exc)
        finally:
            if chosen is not None:
                self._changed[chosen] = self._clock()
            self._loads.pop(key, None)
            self._release(key, outcome)

    def _choose(self, pool: AdapterPool, ready: Sequence[Endpoint]) -> Endpoint:
        """Where to load: the endpoint with room and the fewest adapters loaded on demand (then the fewest
        requests in flight); when all are full, the one holding the least recently used adapter (global LRU)."""
        paths = pool.paths.keys()
        with_room = [e for e in ready if len(e.adapters & paths) < pool.max_per_endpoint]
        if with_room:
            return min(with_room, key=lambda e: (len(e.adapters & paths), e.in_flight))

        def oldest_use(endpoint: Endpoint) -> float:
            return min((self._used.get((endpoint.address, name), 0.0)
                        for name in (endpoint.adapters & paths) - pool.prewarm), default=math.inf)

        return min(ready, key=lambda e: (oldest_use(e), e.in_flight))

    async def _call(self, endpoint: Endpoint, path: str, body: Mapping[str, str], ok: tuple[int, ...]) -> None:
        async with self._calls.http().post(f"http://{endpoint.address}{path}", json=dict(body),
                                     timeout=aiohttp.ClientTimeout(total=LOAD_TIMEOUT_S)) as response:
            if response.status not in ok:
                text = (await response.text())[:200]
                raise RuntimeError(f"{path} answered {response.status}: {text}")

    # -- every interval ------------------------------------------------------------------------------------
    async def _round(self) -> None:
        pools = list(self._pools())
        seen: dict[Endpoint, str] = {}
        for pool in pools:
            for endpoint in pool.ready():
                seen.setdefault(endpoint, pool.model)
        await asyncio.gather(*(self._list(e, model) for e, model in seen.items()))
        for pool in pools:
            if pool.idle_unload_s > 0 or pool.prewarm:
                self._tend(pool)

    def _tend(self, pool: AdapterPool) -> None:
        """Start one upkeep call per endpoint that needs one and has no load or unload under way."""
        now = self._clock()
        for endpoint in pool.ready():
            for name in pool.busy(endpoint) & endpoint.adapters:
                self._used[(endpoint.address, name)] = now
            if endpoint in self._upkeep or self._changed.get(endpoint, 0.0) == math.inf:
                continue
            missing = sorted(pool.prewarm - endpoint.adapters)
            idle = sorted(name for name in (endpoint.adapters & pool.paths.keys()) - pool.prewarm
                          if pool.idle_unload_s > 0
                          and now - self._used.setdefault((endpoint.address, name), now) >= pool.idle_unload_s)
            if missing:
                call = self._prewarm(pool, endpoint, missing[0])
            elif idle:
                call = self._unload_idle(pool, endpoint, idle[0])
            else:
                continue
            task = self._upkeep[endpoint] = asyncio.get_running_loop().create_task(call)
            task.add_done_callback(lambda _, e=endpoint: self._upkeep.pop(e, None))  # type: ignore[misc]

    async def _prewarm(self, pool: AdapterPool, endpoint: Endpoint, name: str) -> None:
        await self._upkeep_call(pool, endpoint, name, "/v1/load_lora_adapter",
                                {"lora_name": name, "lora_path": pool.paths[name]}, (200,))

    async def _unload_idle(self, pool: AdapterPool, endpoint: Endpoint, name: str) -> None:
        await self._upkeep_call(pool, endpoint, name, "/v1/unload_lora_adapter", {"lora_name": name}, (200, 404))

    async def _upkeep_call(self, pool: AdapterPool, endpoint: Endpoint, name: str, path: str,
                           body: Mapping[str, str], ok: tuple[int, ...]) -> None:
        load = path == "/v1/load_lora_adapter"
        self._changed[endpoint] = math.inf
        try:
            await self._call(endpoint, path, body, ok)
            if load:
                endpoint.adapters = endpoint.adapters | {name}
                self.loads_total += 1
                self.prewarm_loads_total += 1
            else:
                endpoint.adapters = endpoint.adapters - {name}
                self._used.pop((endpoint.address, name), None)
                self.unloads_total += 1
                self.idle_unloads_total += 1
            log.info("%s adapter %s on %s (pool %s)", "prewarmed" if load else "unloaded idle", name,
                     endpoint.address, pool.name)
        except (aiohttp.ClientError, TimeoutError, RuntimeError) as exc:
            self.failures_total += 1
            log.warning("%s adapter %s on %s failed: %s", "prewarming" if load else "unloading idle", name,
                        endpoint.address, exc)
        finally:
            self._changed[endpoint] = self._clock()

    async def _list(self, endpoint: Endpoint, model: str) -> None:
        started = self._clock()
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
            async with self._calls.http().get(f"http://{endpoint.address}/v1/models",
                                        timeout=aiohttp.ClientTimeout(total=LIST_TIMEOUT_S)) as response:
                if response.status != 200:
                    return
                listing = await response.json(content_type=None)
            names = frozenset(str(card["id"]) for card in listing["data"] if card["id"] != model)
            if self._changed.get(endpoint, -1.0) < started:  # a load or unload since the call: that is newer
                endpoint.adapters = names
