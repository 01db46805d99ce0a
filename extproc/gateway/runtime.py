"""Everything one policy version decides with, built whole and swapped as one reference.

A `Runtime` holds the policy, its indexes (model -> pool, splits, the /v1/models listing), the compiled content
guard, the body limits, each pool's endpoints and load model, and the scheduler with its plugins' state. A new
policy, or a DNS answer that changes a pool's endpoints, builds a new runtime and swaps `RuntimeHolder.current`;
a request keeps the runtime it started with to its end. State that outlives a policy (endpoint counters and
scrapes, circuit breakers, admission queues) is kept by long-lived objects that read the current policy when
they need it; the I/O components that follow the policy (rollouts, DNS discovery, the fallback route file)
subscribe to new policies (`on_policy`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from extproc.config import Policy, PoolConfig
from extproc.endpoints import Endpoint, EndpointRegistry
from extproc.endpoints.load import LoadModel
from extproc.guard import Guard
from extproc.openai import BodyLimits
from extproc.rollout.config import SplitConfig
from extproc.scheduling import Scheduler

__all__ = ["Pool", "Runtime", "RuntimeHolder"]


@dataclass(frozen=True, slots=True)
class Pool:
    """One pool of a runtime: its configuration, endpoints (interned by address) and load model."""

    config: PoolConfig
    endpoints: tuple[Endpoint, ...]
    load: LoadModel

    @property
    def name(self) -> str:
        return self.config.name

    def is_ready(self, endpoint: Endpoint) -> bool:
        """For a pool with `cold_start_timeout_s`: scraped once (a starting replica refuses connections) and
        not asleep."""
        return endpoint.metrics is not None and not endpoint.asleep

    def ready(self, usable: list[Endpoint]) -> list[Endpoint]:
        """Of the usable endpoints, those that may take a request. A pool that scales from zero
        (`cold_start_timeout_s`) counts an endpoint only once a metrics scrape of it succeeded (a replica that
        is starting refuses connections, and a request sent there would fail instead of waiting) and while it
        is not asleep (`sleep_after_idle_s`)."""
        if self.config.cold_start_timeout_s > 0:
            return [e for e in usable if self.is_ready(e)]
        return usable


@dataclass(frozen=True)
class Runtime:
    policy: Policy
    version: int
    pools: Mapping[str, Pool]
    by_model: Mapping[str, Pool]  # served name, alias or LoRA adapter -> pool
    splits: Mapping[str, SplitConfig]  # client model -> weighted pools
    models_listing: bytes
    guard: Guard | None  # compiled content guard rules, if the policy has any
    body_limits: BodyLimits
    scheduler: Scheduler  # plugin state (e.g. the prefix index) lives and dies with the runtime
    discovered: Mapping[str, tuple[str, ...]]  # pool -> addresses from DNS discovery

    def models_for(self, allowed: frozenset[str]) -> bytes:
        """The /v1/models listing a tenant allowed only `allowed` sees (all of it when empty)."""
        if not allowed:
            return self.models_listing
        listing = json.loads(self.models_listing)
        listing["data"] = [entry for entry in listing["data"] if entry["id"] in allowed]
        return json.dumps(listing, separators=(",", ":")).encode()

    @classmethod
    def build(cls, policy: Policy, version: int, registry: EndpointRegistry,
              discovered: Mapping[str, tuple[str, ...]] | None = None,
              scheduler: Scheduler | None = None) -> Runtime:
        found = dict(discovered or {})
        pools = _pools(policy, registry, found)
        by_model: dict[str, Pool] = {}
        for pool in pools.values():
            for name in (pool.config.model, *pool.config.aliases, *pool.config.lora_adapters):
                by_model[name] = pool
        splits = policy.rollout.by_model()
        names = [*by_model, *(m for m in splits if m not in by_model)]
        listing = {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "gateway"} for name in names]}
        bounds = policy.bounds
        limits = BodyLimits(bounds.max_body_bytes, bounds.max_json_depth, bounds.max_json_containers,
                            bounds.max_messages, bounds.max_choices)
        return cls(policy, version, pools, by_model, splits, json.dumps(listing, separators=(",", ":")).encode(),
                   Guard(policy.guard) if policy.guard.rules else None, limits,
                   scheduler or Scheduler(policy.scheduling, unshared_replicas=policy.unshared_replicas()), found)


def _pools(policy: Policy, registry: EndpointRegistry, discovered: Mapping[str, tuple[str, ...]]) -> dict[str, Pool]:
    # Without the in-flight exchange, this replica's own count stands for each replica's.
    replicas = 1 if policy.exchanges_in_flight() else max(1, len(policy.envoy.extproc_endpoints))
    stale_s = policy.scheduling.scrape.stale_after_ms / 1000.0
    endpoints = registry.adopt((p.name, discovered.get(p.name, p.endpoints)) for p in policy.pools)
    return {p.name: Pool(p, endpoints[p.name], LoadModel(policy.saturation, stale_s, p.max_num_seqs, replicas))
            for p in policy.pools}


class RuntimeHolder:
    """The current runtime; readers take `current` once per request and keep it."""

    def __init__(self, policy: Policy, registry: EndpointRegistry | None = None) -> None:
        self.registry = registry or EndpointRegistry()
        self.current = Runtime.build(policy, 1, self.registry)
        self._listeners: list[Callable[[Runtime], None]] = []

    def on_policy(self, listener: Callable[[Runtime], None]) -> None:
        """`listener(runtime)` after every new policy (rollouts, discovery, the fallback route file, metrics)."""
        self._listeners.append(listener)

    def replace(self, policy: Policy) -> Runtime:
        """A new policy: a new runtime (the scheduler's plugin state starts over)."""
        current = self.current
        self.current = runtime = Runtime.build(policy, current.version + 1, self.registry, current.discovered)
        for listener in self._listeners:
            listener(runtime)
        return runtime

    def discovered(self, pool: str, addresses: tuple[str, ...]) -> None:
        """DNS found a new address set for `pool`: the same policy and scheduler, new endpoints."""
        current = self.current
        found = {**current.discovered, pool: addresses}
        runtime = dataclasses.replace(current, pools=_pools(current.policy, self.registry, found), discovered=found)
        by_model = {name: runtime.pools[pool.name] for name, pool in current.by_model.items()}
        self.current = dataclasses.replace(runtime, by_model=by_model)
