"""Live configuration and rollouts: policy hot reload and the rollout controller, owned by the service."""

from __future__ import annotations

import logging
from pathlib import Path

from extproc.config import ConfigError, Policy
from extproc.endpoints.discovery import DnsDiscoverer
from extproc.gateway import Runtime, RuntimeHolder
from extproc.rollout.controller import Rollouts
from extproc.rollout.envoy_sync import FallbackRouteWriter
from extproc.server.stores import build_rollout_store
from extproc.telemetry import GatewayMetrics
from extproc.xds.render import route_config

log = logging.getLogger(__name__)


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

    rollouts = Rollouts(build_rollout_store(policy), policy.rollout.splits,
                        refresh_interval_s=policy.rollout.refresh_interval_s, on_weights=writer,
                        on_transition=transition)
    return rollouts, writer


class Reloader:
    """Applies a new policy from the watcher: one runtime swap (in-flight requests keep theirs); the I/O
    components that follow the policy hear of it as listeners of the swap."""

    def __init__(self, runtimes: RuntimeHolder, rollouts: Rollouts, writer: FallbackRouteWriter | None,
                 metrics: GatewayMetrics, discovery: DnsDiscoverer | None = None) -> None:
        self._runtimes = runtimes
        self._metrics = metrics
        runtimes.on_policy(lambda runtime: rollouts.configure(runtime.policy.rollout.splits))
        if discovery is not None:
            runtimes.on_policy(lambda runtime: discovery.configure(runtime.policy.pools))
        if writer is not None:
            runtimes.on_policy(lambda runtime: _configure_writer(writer, runtime))

    def apply(self, policy: Policy) -> None:
        current = self._runtimes.current.policy
        redis = ("store", "redis_url", "redis_tls", "redis_cluster")
        if policy.service != current.service or any(
                getattr(policy.limits, name) != getattr(current.limits, name) for name in redis):
            log.warning("service ports and the limits store (Redis URL, TLS, cluster) are not reloaded live; "
                        "restart to change them")
        runtime = self._runtimes.replace(policy)
        self._metrics.config_loads.labels("ok").inc()
        self._metrics.config_version.set(runtime.version)
        log.info("policy reloaded: version %d, %d pools", runtime.version, len(policy.pools))

    def rejected(self, error: ConfigError) -> None:
        self._metrics.config_loads.labels("error").inc()
        log.error("policy file rejected, keeping version %d:\n%s", self._runtimes.current.version, error)


def _configure_writer(writer: FallbackRouteWriter, runtime: Runtime) -> None:
    policy = runtime.policy
    rollout = policy.rollout
    writer.configure(route_config(policy), cluster_header=policy.envoy.cluster_header,
                     model_header=rollout.fallback_model_header, default_model=rollout.fallback_default_model)
