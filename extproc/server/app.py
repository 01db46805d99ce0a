"""Application factory and runner for `extproc serve`: gRPC (ext_proc + health) and admin HTTP."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from aiohttp import web
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer
from prometheus_client import CollectorRegistry

from extproc.aio import cancel_and_wait
from extproc.config import Policy, load_policy
from extproc.config.watch import PolicyWatcher
from extproc.endpoints import Endpoint, EndpointRegistry, MetricsScraper
from extproc.endpoints.adapters import AdapterManager
from extproc.endpoints.config import InferencePoolSource
from extproc.endpoints.discovery import DnsDiscoverer
from extproc.endpoints.inference_pool import Api, InferencePoolDiscovery
from extproc.endpoints.sleep import SleepManager
from extproc.gateway import Gateway, Parts, RuntimeHolder, build_gateway
from extproc.gateway.auth import Authenticator
from extproc.limits.failover import FailoverStore
from extproc.limits.redis_store import RedisStore
from extproc.limits.types import Store, StoreUnavailable
from extproc.rollout.controller import Rollouts
from extproc.server.access_log import AccessLogService
from extproc.server.admin import build_admin_app
from extproc.server.calibration_sync import CalibrationSync
from extproc.server.engines import build_adapter_manager, build_sleep_manager
from extproc.server.fleet import FleetSync, carried_every
from extproc.server.front_ends import grpc_options, grpcio_server, lean_server
from extproc.server.grpc_auth import read_token
from extproc.server.h2 import LeanServer
from extproc.server.keys_watch import KeysWatcher, load_keys
from extproc.server.lifecycle import Reloader, build_rollouts
from extproc.server.placements import PlacementSync
from extproc.server.processor import ExternalProcessorService
from extproc.server.queue_sync import QueueSync
from extproc.server.scaler import ScalerService
from extproc.server.stores import (
    build_calibration_sync,
    build_fleet_sync,
    build_placement_sync,
    build_queue_sync,
    build_store,
)
from extproc.server.tls import CertificateReloader
from extproc.server.workers import worker_admin_port
from extproc.telemetry import GatewayMetrics
from extproc.telemetry.flow import FlowCollector
from extproc.telemetry.gc_pauses import GcPauseCollector
from extproc.telemetry.loop_lag import LoopLag
from extproc.telemetry.pool_ttft import PoolTtftCollector
from extproc.telemetry.pools import PoolCollector

if TYPE_CHECKING:  # imported only when tracing is on
    from extproc.telemetry.tracing import DecisionTracer

log = logging.getLogger(__name__)

# gRPC health services: liveness answers while the process does; the others (readiness, the Inference
# Extension's probe name, the ext_proc service Envoy health-checks, and the server as a whole) once the service
# is ready to decide (its InferencePools listed) and until it drains.
LIVENESS = "liveness"
READY_SERVICES = ("", "readiness", "inference-extension", "envoy.service.ext_proc.v3.ExternalProcessor")


@dataclass
class Service:
    """Everything one service process owns; built by `build_service`, run by `run`."""

    policy_path: Path | None
    runtimes: RuntimeHolder
    endpoints: EndpointRegistry
    metrics: GatewayMetrics
    parts: Parts
    grpc_server: grpc.aio.Server | None  # service.front_end grpcio's; lean's is built at start
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
    pool_discovery: InferencePoolDiscovery
    tls: CertificateReloader | None = None
    fleet: FleetSync | None = None
    calibration_sync: CalibrationSync | None = None
    placements: PlacementSync | None = None
    tracer: DecisionTracer | None = None  # policy tracing.enabled
    scaler: ScalerService | None = None  # KEDA's external scaler, with autoscaling.enabled (read at start)
    queue_sync: QueueSync | None = None  # the replicas' queue lengths for it, with Redis
    sleep: SleepManager | None = None  # engines of pools with sleep_after_idle_s
    adapters: AdapterManager | None = None  # LoRA adapters of pools with lora_paths
    processor: ExternalProcessorService | None = None
    lean: LeanServer | None = None  # service.front_end lean, once started
    loop_lag: LoopLag | None = None  # the event loop's own lag (/debug/loop, extproc_event_loop_lag_seconds)
    gc_pauses: GcPauseCollector | None = None  # the collector's stops (extproc_gc_pause_seconds)
    worker: bool = False  # one of `serve --workers N`: connections aged out (workers.py)
    grpc_port: int = 0
    admin_port: int = 0
    draining: bool = False
    _readiness: asyncio.Task[None] | None = None

    @property
    def gateway(self) -> Gateway:
        return self.parts.gateway

    async def start(self) -> None:
        service = self.runtimes.current.policy.service
        address = f"{service.grpc_host}:{service.grpc_port}"
        if self.grpc_server is None:  # lean: every gRPC method on the event loop, no grpc core
            self.lean = lean_server(self.worker, self.runtimes.current.policy.bounds.max_body_bytes, self.processor,
                                    self.access_log, self.health, self.scaler,
                                    self.tls.server_context() if self.tls is not None else None)
            self.grpc_port = await self.lean.start(service.grpc_host, service.grpc_port)
            if self.tls is not None:
                await self.tls.start()
        elif self.tls is not None:
            self.grpc_port = self.grpc_server.add_secure_port(address, self.tls.credentials())
            await self.tls.start()
        else:
            self.grpc_port = self.grpc_server.add_insecure_port(address)
        await self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        for name in READY_SERVICES:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.loop_lag is not None:
            self.loop_lag.start()
        if self.gc_pauses is not None:
            self.gc_pauses.start()
        if self.grpc_server is not None:
            await self.grpc_server.start()
        await self.admin_runner.setup()
        site = web.TCPSite(self.admin_runner, service.admin_host, service.admin_port, reuse_port=True)
        await site.start()
        sockets = self.admin_runner.addresses
        self.admin_port = int(sockets[0][1]) if sockets else service.admin_port
        self.discovery.configure(self.runtimes.current.policy.pools)
        self.pool_discovery.configure(self.runtimes.current.policy.pools)
        await self.scraper.start()
        if self.scaler is not None:
            await self.scaler.start()
        if self.sleep is not None:
            await self.sleep.start()
        if self.adapters is not None:
            await self.adapters.start()
        if self.queue_sync is not None:
            await self.queue_sync.start()
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
        self._readiness = asyncio.create_task(self._serving_once_synced(), name="readiness")
        log.info("serving ext_proc on %s:%d, admin on %s:%d",
                 service.grpc_host, self.grpc_port, service.admin_host, self.admin_port)

    async def _serving_once_synced(self) -> None:
        await self.pool_discovery.wait_synced()
        if not self.draining:
            for name in READY_SERVICES:
                await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def ready(self) -> bool:
        # Ready once the policy is loaded and every InferencePool listed; a pool whose DNS answers nothing yet
        # still gets fast 503s.
        return not self.draining and self.pool_discovery.synced

    async def stop(self, grace_s: float = 10.0, drain_delay_s: float = 0.0) -> None:
        """Drain: report NOT_SERVING, keep serving new streams for `drain_delay_s` while Envoy's health
        check takes this replica out, then stop taking streams and let in-flight ones finish for `grace_s`."""
        self.draining = True
        await cancel_and_wait(self._readiness)
        for name in READY_SERVICES:  # liveness stays SERVING: the process is alive while it drains
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if drain_delay_s > 0:
            await asyncio.sleep(drain_delay_s)
        if self.lean is not None:
            await self.lean.stop(grace_s)
        if self.grpc_server is not None:
            await self.grpc_server.stop(grace_s)
        await self.scraper.stop()
        if self.scaler is not None:
            await self.scaler.stop()
        if self.sleep is not None:
            await self.sleep.stop()
        if self.adapters is not None:
            await self.adapters.stop()
        if self.queue_sync is not None:
            await self.queue_sync.stop()
        if self.fleet is not None:
            await self.fleet.stop()
        if self.calibration_sync is not None:
            await self.calibration_sync.stop()
        if self.placements is not None:
            await self.placements.stop()
        await self.discovery.stop()
        await self.pool_discovery.stop()
        if self.tls is not None:
            await self.tls.stop()
        await self.keys_watcher.stop()
        await self.rollouts.stop()
        if self.policy_watcher is not None:
            await self.policy_watcher.stop()
        await self.store.close()
        await self.admin_runner.cleanup()
        if self.loop_lag is not None:
            self.loop_lag.stop()
        if self.gc_pauses is not None:
            self.gc_pauses.stop()
        if self.tracer is not None:  # flushes spans still queued for export (blocking: off the loop)
            await asyncio.to_thread(self.tracer.shutdown)


def build_service(policy: Policy, policy_path: Path | None = None, worker: tuple[int, int] | None = None) -> Service:
    """`worker`: (index, count) when this process is one of `serve --workers N` (see workers.py)."""
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    endpoints = EndpointRegistry()
    runtimes = RuntimeHolder(policy, endpoints)

    def pools() -> list[tuple[str, tuple[Endpoint, ...]]]:
        return [(pool.name, pool.endpoints) for pool in runtimes.current.pools.values()]

    registry.register(PoolTtftCollector(pools))
    authenticator = Authenticator(load_keys(policy, policy_path))
    rollouts, writer = build_rollouts(policy, policy_path)
    parts = build_gateway(runtimes, metrics, authenticator=authenticator, rollouts=rollouts)
    gateway = parts.gateway
    discovery = DnsDiscoverer(runtimes.discovered)
    pool_discovery = InferencePoolDiscovery(runtimes.discovered, _kubernetes_api)
    reloader = Reloader(runtimes, rollouts, writer, metrics, discovery, pool_discovery)
    watcher = (PolicyWatcher(policy_path, reloader.apply, reloader.rejected, current=policy)
               if policy_path is not None else None)
    metrics.config_version.set(runtimes.current.version)
    store, redis = build_store(policy)
    grpc_token = read_token(policy.service.grpc_token_file)
    tracer = None
    if policy.tracing.enabled:  # the SDK is imported only then; read at start
        from extproc.telemetry.tracing import DecisionTracer

        tracer = DecisionTracer(policy.tracing)
    processor = ExternalProcessorService(gateway, store, grpc_token, metrics, tracer)
    access_log = AccessLogService(store, metrics, parts.outcomes, rollouts.record,
                                  on_prompt_usage=parts.calibration.observe, token=grpc_token,
                                  decided_here=gateway.request_ids.mine,
                                  on_usage=tracer.usage if tracer is not None else None)
    health_servicer = HealthServicer()
    scaler = None
    if policy.autoscaling.enabled:
        scaler = ScalerService(runtimes, parts.flow, parts.health)
        if policy.autoscaling.grpc_port is not None:
            scaler.serve_alone(policy.service.grpc_host, grpc_options(worker is not None))
    server = (grpcio_server(worker is not None, processor, access_log, health_servicer, scaler)
              if policy.service.front_end == "grpcio" else None)
    scraper = MetricsScraper(endpoints, policy.scheduling.scrape, saturation=lambda: runtimes.current.policy.saturation)
    scraper.on_scrape = parts.flow.kick_all  # fresh metrics may show room for queued requests
    registry.register(FlowCollector(parts.flow))
    registry.register(PoolCollector(
        pools, parts.health, lambda: runtimes.current.policy.scheduling.scrape.stale_after_ms / 1000))
    service = Service(policy_path, runtimes, endpoints, metrics, parts, server, health_servicer,
                      web.AppRunner(web.Application()), scraper, store, redis,
                      KeysWatcher(policy, policy_path, authenticator), access_log, rollouts, watcher, discovery,
                      pool_discovery, CertificateReloader(policy.service.tls) if policy.service.tls else None)
    service.tracer = tracer
    service.processor = processor
    service.worker = worker is not None
    service.scaler = scaler
    service.sleep = build_sleep_manager(runtimes, parts)
    service.adapters = build_adapter_manager(runtimes, parts)
    if scaler is not None:
        flow = parts.flow
        service.queue_sync = queue_sync = build_queue_sync(
            policy, lambda: {name: flow.queued(name) for name in runtimes.current.pools})
        if queue_sync is not None:
            scaler.others = queue_sync.others
    service.calibration_sync = build_calibration_sync(policy, parts.calibration)
    service.fleet = fleet = build_fleet_sync(policy, endpoints, parts.flow.kick_all,
                                             lambda: runtimes.current.policy.saturation)
    metrics.scrapes.labels("own").set_function(lambda: float(scraper.scrapes_total - scraper.failures_total))
    if fleet is not None and fleet.scrapes is not None:
        shared = fleet.scrapes
        scraper.on_metrics, scraper.should_scrape = shared.scraped, shared.should_scrape
        metrics.scrapes.labels("shared").set_function(lambda: float(shared.adopted_total))
    service.placements = placements = build_placement_sync(policy, lambda: runtimes.current.scheduler,
                                                           fleet.slot if fleet is not None else None)
    if placements is not None:
        metrics.placement_sync_failures.set_function(lambda: float(placements.failures_total))
        if (push := placements.push) is not None:
            metrics.request_push_failures.set_function(lambda: float(push.failures_total))
    if fleet is not None and placements is not None and (every := carried_every(fleet, placements)):
        fleet.carry(placements, every)  # both every 10 ms by default: one wake-up per round
    if fleet is not None:
        parts.flow.replicas = lambda: fleet.replicas
        metrics.fleet_replicas.set_function(lambda: float(fleet.replicas))
        metrics.fleet_sync_failures.set_function(lambda: float(fleet.failures_total))
    if isinstance(store, FailoverStore):
        failover = store
        metrics.store_up.set_function(lambda: 1.0 if failover.primary_up else 0.0)
        metrics.store_degraded_admits.set_function(lambda: float(failover.degraded_admits_total))
        metrics.store_primary_failures.set_function(lambda: float(failover.failures_total))
    if redis is not None and redis.slices is not None:
        slices = redis.slices
        metrics.store_admissions.labels("slice").set_function(lambda: float(slices.local_total))
        metrics.store_admissions.labels("awaited").set_function(lambda: float(slices.awaited_total))
        metrics.store_uncovered.set_function(lambda: float(slices.uncovered_total))
    service.loop_lag = LoopLag(metrics.event_loop_lag_seconds.observe)
    service.gc_pauses = GcPauseCollector()
    registry.register(service.gc_pauses)
    service.admin_runner = web.AppRunner(
        build_admin_app(registry, runtimes, service.ready, parts, rollouts,
                        read_token(policy.service.admin_token_file), redis.slices if redis is not None else None,
                        service.loop_lag),
        access_log=None
    )
    return service


def _kubernetes_api(source: InferencePoolSource) -> Api:
    from extproc.endpoints.kube import KubernetesApi  # the client is imported only where a pool is watched

    return KubernetesApi(source)


def endpoint_picker_policy(policy: Policy, inference_pool: str | None) -> Policy:
    """`serve --epp [--inference-pool [NAMESPACE/]NAME]`: the policy in endpoint-picker mode, its one pool's endpoints
    from that InferencePool if named. Raises ValueError (pydantic's) when the policy cannot be one."""
    document = policy.model_dump(mode="json", exclude_unset=True)
    document["mode"] = "endpoint-picker"
    if inference_pool is not None:
        namespace, _, name = inference_pool.rpartition("/")
        for pool in document.get("pools", []):
            pool.pop("endpoints", None)
            pool.pop("discovery", None)
            pool["inference_pool"] = {**pool.get("inference_pool", {}), "name": name, "namespace": namespace}
    return Policy.model_validate(document)


async def run(policy_path: Path, grace_s: float = 10.0, grpc_port: int | None = None,
              admin_port: int | None = None, drain_delay_s: float = 3.0, worker: tuple[int, int] | None = None,
              epp: bool = False, inference_pool: str | None = None) -> int:
    policy = load_policy(policy_path)
    if epp or inference_pool is not None:
        try:
            policy = endpoint_picker_policy(policy, inference_pool)
        except ValueError as exc:
            log.error("%s cannot run as an endpoint picker: %s", policy_path, exc)
            return 2
    if worker is not None:  # one of `serve --workers N`: its own admin port next to the supervisor's
        admin_port = worker_admin_port(admin_port if admin_port is not None else policy.service.admin_port, worker[0])
    overrides = {k: v for k, v in (("grpc_port", grpc_port), ("admin_port", admin_port)) if v is not None}
    if overrides:
        policy = policy.model_copy(update={"service": policy.service.model_copy(update=overrides)})
    service = build_service(policy, policy_path, worker)
    await service.start()
    # Everything built so far lives as long as the process: out of the collector's sight, a full collection
    # walks only what requests allocate (86,000 startup objects made each one a ~25 ms pause).
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("draining: NOT_SERVING for %.1fs, then in-flight streams get %.0fs", drain_delay_s, grace_s)
    await service.stop(grace_s, drain_delay_s)
    return 0
