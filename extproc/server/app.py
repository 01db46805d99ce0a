"""Application factory and runner for `extproc serve`: gRPC (ext_proc + health) and admin HTTP."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

import grpc
from aiohttp import web
from envoy.service.accesslog.v3 import als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from prometheus_client import CollectorRegistry

from extproc.config import Policy, load_policy
from extproc.config.watch import PolicyWatcher
from extproc.endpoints import EndpointRegistry, MetricsScraper
from extproc.endpoints.discovery import DnsDiscoverer
from extproc.endpoints.load import observe
from extproc.gateway import Gateway, SnapshotHolder
from extproc.gateway.auth import Authenticator
from extproc.limits.failover import FailoverStore
from extproc.limits.redis_store import RedisStore
from extproc.limits.types import Store, StoreUnavailable
from extproc.rollout.controller import Rollouts
from extproc.server.access_log import AccessLogService
from extproc.server.admin import build_admin_app
from extproc.server.calibration_sync import CalibrationSync
from extproc.server.fleet import FleetSync
from extproc.server.grpc_auth import read_token
from extproc.server.keys_watch import KeysWatcher, load_keys
from extproc.server.lifecycle import Reloader, build_rollouts
from extproc.server.placements import PlacementSync
from extproc.server.processor import ExternalProcessorService
from extproc.server.stores import build_calibration_sync, build_fleet_sync, build_placement_sync, build_store
from extproc.telemetry import GatewayMetrics
from extproc.telemetry.flow import FlowCollector
from extproc.telemetry.pool_ttft import PoolTtftCollector
from extproc.telemetry.pools import PoolCollector

log = logging.getLogger(__name__)

_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 80 * 1024 * 1024),
    ("grpc.max_send_message_length", 80 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.so_reuseport", 1),
]


@dataclass
class Service:
    """Everything one service process owns; built by `build_service`, run by `run`."""

    policy_path: Path | None
    snapshots: SnapshotHolder
    endpoints: EndpointRegistry
    metrics: GatewayMetrics
    gateway: Gateway
    grpc_server: grpc.aio.Server
    health: HealthServicer
    admin_runner: web.AppRunner
    scraper: MetricsScraper
    store: Store
    redis: RedisStore | None
    keys_watcher: KeysWatcher
    access_log: AccessLogService
    rollouts: Rollouts
    policy_watcher: PolicyWatcher | None
    discovery: DnsDiscoverer
    fleet: FleetSync | None = None
    calibration_sync: CalibrationSync | None = None
    placements: PlacementSync | None = None
    grpc_port: int = 0
    admin_port: int = 0
    draining: bool = False

    async def start(self) -> None:
        service = self.snapshots.current.policy.service
        self.grpc_port = self.grpc_server.add_insecure_port(f"{service.grpc_host}:{service.grpc_port}")
        await self.grpc_server.start()
        await self.admin_runner.setup()
        site = web.TCPSite(self.admin_runner, service.admin_host, service.admin_port, reuse_port=True)
        await site.start()
        sockets = self.admin_runner.addresses
        self.admin_port = int(sockets[0][1]) if sockets else service.admin_port
        self.discovery.configure(self.snapshots.current.policy.pools)
        await self.scraper.start()
        if self.fleet is not None:
            await self.fleet.start()
        if self.calibration_sync is not None:
            await self.calibration_sync.start()
        if self.placements is not None:
            await self.placements.start()
        await self.keys_watcher.start()
        await self.rollouts.start()
        if self.policy_watcher is not None:
            await self.policy_watcher.start()
        if self.redis is not None:
            try:  # connect + load scripts now, not against the first request's 5 ms deadline
                await self.redis.warm_up()
            except StoreUnavailable:
                log.warning("Redis unreachable at start; applying limits.on_store_failure until it answers")
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set("envoy.service.ext_proc.v3.ExternalProcessor", health_pb2.HealthCheckResponse.SERVING)
        log.info("serving ext_proc on %s:%d, admin on %s:%d",
                 service.grpc_host, self.grpc_port, service.admin_host, self.admin_port)

    def ready(self) -> bool:
        # Ready once the policy is loaded; a pool whose DNS answers nothing yet still gets fast 503s.
        return not self.draining

    async def stop(self, grace_s: float = 10.0, drain_delay_s: float = 0.0) -> None:
        """Drain: report NOT_SERVING, keep serving new streams for `drain_delay_s` while Envoy's health
        check takes this replica out, then stop taking streams and let in-flight ones finish for `grace_s`."""
        self.draining = True
        await self.health.enter_graceful_shutdown()
        if drain_delay_s > 0:
            await asyncio.sleep(drain_delay_s)
        await self.grpc_server.stop(grace_s)
        await self.scraper.stop()
        if self.fleet is not None:
            await self.fleet.stop()
        if self.calibration_sync is not None:
            await self.calibration_sync.stop()
        if self.placements is not None:
            await self.placements.stop()
        await self.discovery.stop()
        await self.keys_watcher.stop()
        await self.rollouts.stop()
        if self.policy_watcher is not None:
            await self.policy_watcher.stop()
        await self.store.close()
        await self.admin_runner.cleanup()


def build_service(policy: Policy, policy_path: Path | None = None) -> Service:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    snapshots = SnapshotHolder(policy)
    endpoints = EndpointRegistry()
    registry.register(PoolTtftCollector(endpoints))
    authenticator = Authenticator(load_keys(policy, policy_path))
    rollouts, writer = build_rollouts(policy, policy_path)
    gateway = Gateway(snapshots, endpoints, metrics, authenticator=authenticator, rollouts=rollouts)
    discovery = DnsDiscoverer(gateway.discovered_endpoints)
    reloader = Reloader(snapshots, gateway, rollouts, writer, metrics, discovery)
    watcher = (PolicyWatcher(policy_path, reloader.apply, reloader.rejected, current=policy)
               if policy_path is not None else None)
    metrics.config_version.set(snapshots.current.version)
    store, redis = build_store(policy)
    server = grpc.aio.server(options=_GRPC_OPTIONS)
    grpc_token = read_token(policy.service.grpc_token_file)
    ext_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessorService(gateway, store, grpc_token, metrics),
                                                     server)
    access_log = AccessLogService(store, metrics, gateway.record_outcome, rollouts.record,
                                  on_prompt_usage=gateway.calibration.observe, token=grpc_token,
                                  decided_here=gateway.request_ids.mine)
    als_pb2_grpc.add_AccessLogServiceServicer_to_server(access_log, server)
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    scraper = MetricsScraper(endpoints, policy.scheduling.scrape,
                             observe=lambda e, m, n: observe(e, m, n, snapshots.current.policy.saturation))
    scraper.on_scrape = gateway.flow.kick_all  # fresh metrics may show room for queued requests
    registry.register(FlowCollector(gateway.flow))
    registry.register(PoolCollector(
        endpoints, gateway.health, lambda: snapshots.current.policy.scheduling.scrape.stale_after_ms / 1000))
    service = Service(policy_path, snapshots, endpoints, metrics, gateway, server, health_servicer,
                      web.AppRunner(web.Application()), scraper, store, redis,
                      KeysWatcher(policy, policy_path, authenticator), access_log, rollouts, watcher, discovery)
    service.calibration_sync = build_calibration_sync(policy, gateway.calibration)
    service.fleet = fleet = build_fleet_sync(policy, endpoints, gateway.flow.kick_all)
    service.placements = placements = build_placement_sync(policy, lambda: gateway.scheduler)
    if placements is not None:
        metrics.placement_sync_failures.set_function(lambda: float(placements.failures_total))
    if fleet is not None:
        metrics.fleet_replicas.set_function(lambda: float(fleet.replicas))
        metrics.fleet_sync_failures.set_function(lambda: float(fleet.failures_total))
    if isinstance(store, FailoverStore):
        failover = store
        metrics.store_up.set_function(lambda: 1.0 if failover.primary_up else 0.0)
        metrics.store_degraded_admits.set_function(lambda: float(failover.degraded_admits_total))
        metrics.store_primary_failures.set_function(lambda: float(failover.failures_total))
        metrics.store_replayed_tokens.set_function(lambda: float(failover.replayed_tokens_total))
    if redis is not None:
        shared = redis
        metrics.store_admissions.labels("optimistic").set_function(lambda: float(shared.optimistic_total))
        metrics.store_admissions.labels("awaited").set_function(lambda: float(shared.awaited_total))
        metrics.store_overshoots.set_function(
            lambda: float(shared.headroom.overshoots_total if shared.headroom is not None else 0))
    service.admin_runner = web.AppRunner(
        build_admin_app(registry, endpoints, snapshots, service.ready, gateway, rollouts,
                        read_token(policy.service.admin_token_file)), access_log=None
    )
    return service


async def run(policy_path: Path, grace_s: float = 10.0, grpc_port: int | None = None,
              admin_port: int | None = None, drain_delay_s: float = 3.0) -> int:
    policy = load_policy(policy_path)
    overrides = {k: v for k, v in (("grpc_port", grpc_port), ("admin_port", admin_port)) if v is not None}
    if overrides:
        policy = policy.model_copy(update={"service": policy.service.model_copy(update=overrides)})
    service = build_service(policy, policy_path)
    await service.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("draining: NOT_SERVING for %.1fs, then in-flight streams get %.0fs", drain_delay_s, grace_s)
    await service.stop(grace_s, drain_delay_s)
    return 0
