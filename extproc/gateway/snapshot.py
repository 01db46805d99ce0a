"""An immutable routing snapshot derived from one policy; swapped whole on reload."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from extproc.config import Policy, PoolConfig
from extproc.endpoints.load import LoadModel
from extproc.guard import Guard
from extproc.openai import BodyLimits
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
    body_limits: BodyLimits = field(default_factory=lambda: BodyLimits(4 * 1024 * 1024))
    load: dict[str, LoadModel] = field(default_factory=dict)  # pool -> its load model (scheduler and flow control)

    def models_for(self, allowed: frozenset[str]) -> bytes:
        """The /v1/models listing a tenant allowed only `allowed` sees (all of it when empty)."""
        if not allowed:
            return self.models_listing
        listing = json.loads(self.models_listing)
        listing["data"] = [entry for entry in listing["data"] if entry["id"] in allowed]
        return json.dumps(listing, separators=(",", ":")).encode()

    @classmethod
    def build(cls, policy: Policy, version: int) -> Snapshot:
        by_model: dict[str, PoolConfig] = {}
        for pool in policy.pools:
            for name in (pool.model, *pool.aliases, *pool.lora_adapters):
                by_model[name] = pool
        splits = policy.rollout.by_model()
        names = [*by_model, *(m for m in splits if m not in by_model)]
        listing = {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "gateway"} for name in names]}
        bounds = policy.bounds
        limits = BodyLimits(bounds.max_body_bytes, bounds.max_json_depth, bounds.max_json_containers,
                            bounds.max_messages, bounds.max_choices)
        # Without the in-flight exchange, this replica's own count stands for each replica's.
        replicas = 1 if policy.exchanges_in_flight() else max(1, len(policy.envoy.extproc_endpoints))
        stale_s = policy.scheduling.scrape.stale_after_ms / 1000.0
        load = {p.name: LoadModel(policy.saturation, stale_s, p.max_num_seqs, replicas) for p in policy.pools}
        return cls(policy, version, by_model, {p.name: p for p in policy.pools}, splits,
                   json.dumps(listing, separators=(",", ":")).encode(),
                   Guard(policy.guard) if policy.guard.rules else None, limits, load)


class SnapshotHolder:
    """Holds the current snapshot; readers take `current` once per request and keep it."""

    def __init__(self, policy: Policy) -> None:
        self._version = 1
        self.current = Snapshot.build(policy, self._version)

    def replace(self, policy: Policy) -> Snapshot:
        self._version += 1
        self.current = Snapshot.build(policy, self._version)
        return self.current
