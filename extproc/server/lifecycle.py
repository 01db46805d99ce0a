"""Live configuration and rollouts: policy hot reload and the rollout controller, owned by the service."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from extproc.config import ConfigError, Policy
from extproc.endpoints.discovery import DnsDiscoverer
from extproc.gateway import Gateway, SnapshotHolder
from extproc.rollout.controller import Rollouts
from extproc.rollout.envoy_sync import FallbackRouteWriter
from extproc.rollout.redis_store import RedisRolloutStore
from extproc.rollout.state import MemoryRolloutStore, RolloutStore
from extproc.server.stores import REDIS_URL_ENV
from extproc.telemetry import GatewayMetrics
from extproc.xds.render import route_config

log = logging.getLogger(__name__)


def rollout_store(policy: Policy) -> RolloutStore:
    """Rollout state goes where the limits go: Redis makes every replica apply the same weights."""
    url = os.environ.get(REDIS_URL_ENV) or policy.limits.redis_url
    if policy.limits.store == "redis" and url:
        return RedisRolloutStore(url)
    return MemoryRolloutStore()


def fallback_writer(policy: Policy, base: Path | None) -> FallbackRouteWriter | None:
    rollout = policy.rollout
    if rollout.fallback_route_file is None:
        return None
    path = Path(rollout.fallback_route_file)
    if not path.is_absolute() and base is not None:
        path = base.parent / path
    return FallbackRouteWriter(path, route_config(policy), cluster_header=policy.envoy.cluster_header,
                               model_header=rollout.fallback_model_header,
                               default_model=rollout.fallback_default_model)


def build_rollouts(policy: Policy, policy_path: Path | None) -> tuple[Rollouts, FallbackRouteWriter | None]:
    writer = fallback_writer(policy, policy_path)

    def transition(state: object) -> None:
        log.info("rollout transition: %s", state)

    rollouts = Rollouts(rollout_store(policy), policy.rollout.splits,
                        refresh_interval_s=policy.rollout.refresh_interval_s, on_weights=writer,
                        on_transition=transition)
    return rollouts, writer


class Reloader:
    """Applies a new policy from the watcher: one snapshot swap; in-flight requests keep theirs."""

    def __init__(self, snapshots: SnapshotHolder, gateway: Gateway, rollouts: Rollouts,
                 writer: FallbackRouteWriter | None, metrics: GatewayMetrics,
                 discovery: DnsDiscoverer | None = None) -> None:
        self._discovery = discovery
        self._snapshots = snapshots
        self._gateway = gateway
        self._rollouts = rollouts
        self._writer = writer
        self._metrics = metrics

    def apply(self, policy: Policy) -> None:
        current = self._snapshots.current.policy
        if policy.service != current.service or policy.limits.store != current.limits.store:
            log.warning("service ports and the limits store are not reloaded live; restart to change them")
        snapshot = self._snapshots.replace(policy)
        self._gateway.reload()
        self._rollouts.configure(policy.rollout.splits)
        if self._discovery is not None:
            self._discovery.configure(policy.pools)
        if self._writer is not None:
            rollout = policy.rollout
            self._writer.configure(route_config(policy), cluster_header=policy.envoy.cluster_header,
                                   model_header=rollout.fallback_model_header,
                                   default_model=rollout.fallback_default_model)
        self._metrics.config_loads.labels("ok").inc()
        self._metrics.config_version.set(snapshot.version)
        log.info("policy reloaded: version %d, %d pools", snapshot.version, len(policy.pools))

    def rejected(self, error: ConfigError) -> None:
        self._metrics.config_loads.labels("error").inc()
        log.error("policy file rejected, keeping version %d:\n%s", self._snapshots.current.version, error)
