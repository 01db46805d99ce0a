"""An immutable routing snapshot derived from one policy; swapped whole on reload."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from extproc.config import Policy, PoolConfig
from extproc.endpoints.load import LoadModel
from extproc.guard import Guard
from extproc.rollout.config import SplitConfig


@dataclass(frozen=True)
class Snapshot:
    policy: Policy
    version: int
    by_model: dict[str, PoolConfig] = field(default_factory=dict)
    by_name: dict[str, PoolConfig] = field(default_factory=dict)
    splits: dict[str, SplitConfig] = field(default_factory=dict)  # client model -> weighted pools
    models_listing: bytes = b""
    guard: Guard | None = None  # compiled content guard rules, if the policy has any
    load: dict[str, LoadModel] = field(default_factory=dict)  # pool -> its load model (scheduler and flow control)

    @classmethod
    def build(cls, policy: Policy, version: int) -> Snapshot:
        by_model: dict[str, PoolConfig] = {}
        for pool in policy.pools:
            for name in (pool.model, *pool.aliases, *pool.lora_adapters):
                by_model[name] = pool
        splits = policy.rollout.by_model()
        names = [*by_model, *(m for m in splits if m not in by_model)]
        listing = {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "gateway"} for name in names]}
        # Without the in-flight exchange, this replica's own count stands for each replica's.
        replicas = 1 if policy.exchanges_in_flight() else max(1, len(policy.envoy.extproc_endpoints))
        stale_s = policy.scheduling.scrape.stale_after_ms / 1000.0
        load = {p.name: LoadModel(policy.saturation, stale_s, p.max_num_seqs, replicas) for p in policy.pools}
        return cls(policy, version, by_model, {p.name: p for p in policy.pools}, splits,
                   json.dumps(listing, separators=(",", ":")).encode(),
                   Guard(policy.guard) if policy.guard.rules else None, load)


class SnapshotHolder:
    """Holds the current snapshot; readers take `current` once per request and keep it."""

    def __init__(self, policy: Policy) -> None:
        self._version = 1
        self.current = Snapshot.build(policy, self._version)

    def replace(self, policy: Policy) -> Snapshot:
        self._version += 1
        self.current = Snapshot.build(policy, self._version)
        return self.current
