"""`SleepManager`: engines of pools with `sleep_after_idle_s` are put to sleep when idle and woken on demand.

vLLM's sleep mode (`POST /sleep`, `POST /wake_up`, `GET /is_sleeping`; the engine must run with
`--enable-sleep-mode` and its development endpoints on) frees the GPU while the process stays up; waking takes
seconds, not the minutes of a cold start. Every `interval_s` (off the request path), for each such pool:

- every endpoint's `/is_sleeping` is read, so an engine another service replica put to sleep (or woke) is
  known here within one interval;
- an endpoint idle for `sleep_after_idle_s` (nothing in flight from any replica, none running or waiting at
  its last fresh scrape) is marked asleep first (no new request is routed there), then told to sleep;
- while requests wait for the pool and no wake-up is under way, one sleeping endpoint is woken.

`wanted(pool)` wakes one at once: flow control calls it when a request is held because the pool has no
ready endpoint. An endpoint marked asleep is not ready (`Pool.ready`); once its wake-up returns it is ready
again and `on_awake(pool)` lets flow control release the held requests.

Known gap: another replica may route to an endpoint in the ~interval before it learns that the endpoint
sleeps; vLLM answers such a request 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import aiohttp

from extproc.endpoints.engine_calls import EngineCalls
from extproc.endpoints.registry import Endpoint
from extproc.periodic import Periodic

__all__ = ["SleepManager", "SleepPool"]

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 1.0
SLEEP_TIMEOUT_S = 60.0  # vLLM finishes the requests it holds before it sleeps
WAKE_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class SleepPool:
    name: str
    idle_s: float  # sleep_after_idle_s
    endpoints: Sequence[Endpoint]
    stale_after_s: float


class SleepManager:
    def __init__(self, pools: Callable[[], Iterable[SleepPool]], queued: Callable[[str], int],
                 on_awake: Callable[[str], None], *, interval_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`pools()`: the current pools with sleep on; `queued(pool)`: requests waiting for it."""
        self._pools = pools
        self._queued = queued
        self._on_awake = on_awake
        self._clock = clock
        self._idle_since: dict[Endpoint, float] = {}
        self._busy: dict[Endpoint, asyncio.Task[None]] = {}  # a sleep or wake-up call under way
        self._waking: dict[str, Endpoint] = {}
        self._calls = EngineCalls()
        self._loop = Periodic("endpoint-sleep", self._round, interval_s, log=log, what="engine sleep management")
        self.sleeps_total = self.wake_ups_total = 0

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        await self._calls.close(self._busy.values())

    def _pool(self, name: str) -> SleepPool | None:
        return next((p for p in self._pools() if p.name == name), None)

    # -- on demand ---------------------------------------------------------------------------------------
    def wanted(self, pool_name: str) -> None:
        """A request waits for `pool_name`: wake one of its sleeping endpoints unless one is waking already."""
        pool = self._pool(pool_name)
        if pool is None or pool_name in self._waking:
            return
        asleep = [e for e in pool.endpoints if e.asleep and e not in self._busy]
        if asleep:
            endpoint = asleep[0]
            self._waking[pool_name] = endpoint
            self._busy[endpoint] = asyncio.get_running_loop().create_task(self._wake(pool_name, endpoint))

    async def _wake(self, pool: str, endpoint: Endpoint) -> None:
        try:
            async with self._calls.http().post(f"http://{endpoint.address}/wake_up",
                                         timeout=aiohttp.ClientTimeout(total=WAKE_TIMEOUT_S)) as response:
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}")
            endpoint.asleep = False
            self._idle_since.pop(endpoint, None)
            self.wake_ups_total += 1
            log.info("woke %s (pool %s)", endpoint.address, pool)
            self._on_awake(pool)
        except (aiohttp.ClientError, TimeoutError, RuntimeError) as exc:
            log.warning("waking %s failed: %s", endpoint.address, exc)
        finally:
            self._busy.pop(endpoint, None)
            self._waking.pop(pool, None)

    async def _sleep(self, endpoint: Endpoint) -> None:
        endpoint.asleep = True  # no new request is routed here from now on
        try:
            async with self._calls.http().post(f"http://{endpoint.address}/sleep", params={"level": "1"},
                                         timeout=aiohttp.ClientTimeout(total=SLEEP_TIMEOUT_S)) as response:
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}")
            self.sleeps_total += 1
            log.info("put %s to sleep", endpoint.address)
        except (aiohttp.ClientError, TimeoutError, RuntimeError) as exc:
            log.warning("putting %s to sleep failed: %s", endpoint.address, exc)
            endpoint.asleep = False
        finally:
            self._busy.pop(endpoint, None)

    # -- every interval ----------------------------------------------------------------------------------
    async def _round(self) -> None:
        pools = list(self._pools())
        endpoints = {e for pool in pools for e in pool.endpoints}
        for gone in [e for e in self._idle_since if e not in endpoints]:
            del self._idle_since[gone]
        woken = set(await asyncio.gather(*(self._check(e) for e in endpoints if e not in self._busy)))
        now = self._clock()
        loop = asyncio.get_running_loop()
        for pool in pools:
            if woken.intersection(pool.endpoints):  # another replica woke it: release what waits here
                self._on_awake(pool.name)
            for endpoint in pool.endpoints:
                if endpoint.asleep or endpoint in self._busy:
                    continue
                if not self._idle(endpoint, now, pool.stale_after_s):
                    self._idle_since.pop(endpoint, None)
                    continue
                since = self._idle_since.setdefault(endpoint, now)
                if now - since >= pool.idle_s and not self._queued(pool.name):
                    self._busy[endpoint] = loop.create_task(self._sleep(endpoint))
            if self._queued(pool.name):
                self.wanted(pool.name)

    @staticmethod
    def _idle(endpoint: Endpoint, now: float, stale_after_s: float) -> bool:
        metrics = endpoint.metrics
        return (endpoint.in_flight == 0 and endpoint.others_in_flight == 0 and metrics is not None
                and now - metrics.scraped_at <= stale_after_s and metrics.running == 0 and metrics.waiting == 0)

    async def _check(self, endpoint: Endpoint) -> Endpoint | None:
        """Learn from the engine whether it sleeps (another replica may have put it to sleep, or woken it);
        returns the endpoint if it turned out awake."""
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
            async with self._calls.http().get(f"http://{endpoint.address}/is_sleeping",
                                        timeout=aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S)) as response:
                if response.status != 200:
                    return None
                sleeping = (await response.json(content_type=None))["is_sleeping"]
            if isinstance(sleeping, bool) and endpoint not in self._busy and sleeping != endpoint.asleep:
                endpoint.asleep = sleeping
                self._idle_since.pop(endpoint, None)
                return None if sleeping else endpoint
        return None
