"""The engines' lifecycle the service drives for pools that ask for it: sleep and wake-up
(`pools[].sleep_after_idle_s`, `extproc.endpoints.sleep`) and LoRA adapters loaded on demand (`pools[].lora_paths`,
`extproc.endpoints.adapters`). Both read the current runtime at each round, so they follow policy reloads."""

from __future__ import annotations

import time
from collections.abc import Sequence

from extproc.endpoints import Endpoint
from extproc.endpoints.adapters import AdapterManager, AdapterPool
from extproc.endpoints.health import HealthTracker
from extproc.endpoints.sleep import SleepManager, SleepPool
from extproc.gateway import Parts, RuntimeHolder
from extproc.gateway.runtime import Pool

__all__ = ["build_adapter_manager", "build_sleep_manager"]


def build_sleep_manager(runtimes: RuntimeHolder, parts: Parts) -> SleepManager:
    """Sleep and wake-up of the engines of pools with `sleep_after_idle_s`."""

    def pools() -> list[SleepPool]:
        runtime = runtimes.current
        stale_s = runtime.policy.scheduling.scrape.stale_after_ms / 1000
        return [SleepPool(p.name, p.config.sleep_after_idle_s, p.endpoints, stale_s)
                for p in runtime.pools.values() if p.config.sleep_after_idle_s > 0]

    flow = parts.flow
    manager = SleepManager(pools, flow.queued, flow.kick)
    flow.cold_listeners.append(manager.wanted)
    return manager


def _ready(pool: Pool, health: HealthTracker) -> Sequence[Endpoint]:
    return pool.ready(health.usable(pool.endpoints, time.monotonic()))


def _busy_adapters(pool: Pool, endpoint: Endpoint) -> frozenset[str]:
    """Adapters running or waiting at `endpoint`, as its last fresh metrics say."""
    metrics = pool.load.fresh(endpoint, time.monotonic())
    return frozenset() if metrics is None else metrics.running_loras | metrics.waiting_loras


def build_adapter_manager(runtimes: RuntimeHolder, parts: Parts) -> AdapterManager:
    """Adapters loaded on demand in the pools with `lora_paths`; the gate asks it when a request needs one."""

    def pools() -> list[AdapterPool]:
        health = parts.health
        return [AdapterPool(p.name, p.config.model, p.config.lora_paths, p.config.max_adapters_per_endpoint,
                            p.config.lora_load_timeout_s, lambda p=p: _ready(p, health),  # type: ignore[misc]
                            p.config.lora_idle_unload_s, frozenset(p.config.lora_prewarm),
                            lambda e, p=p: _busy_adapters(p, e))  # type: ignore[misc]
                for p in runtimes.current.pools.values() if p.config.lora_paths]

    manager = AdapterManager(pools)
    parts.gateway.stages.gate.adapters = manager
    return manager
