"""KEDA's external scaler (`externalscaler.ExternalScaler`) on the service's gRPC port, one scaled object per pool.

A ScaledObject's external trigger names the pool in its metadata (`pool: NAME`); KEDA passes the trigger's
metadata in every call (`ScaledObjectRef.scalerMetadata`). For that pool:

- `GetMetricSpec`: one metric, `extproc-demand-<pool>`, with the policy's target demand per replica (KEDA's HPA
  divides the metric by it: replicas = ceil(demand / target)); `StreamMetricSpec` pushes it again when a policy
  reload changes it;
- `GetMetrics`: the pool's stabilised, projected demand (`extproc.autoscale.demand`);
- `IsActive`: whether the pool needs a replica at all (demand, or a request held for it);
- `StreamIsActive`: the same, sent when the stream opens and whenever it changes: at once when a request is held
  for a pool without a ready endpoint (flow control calls `wake`), else at the next sample.

Nothing here runs per request: a `Periodic` samples every pool every `autoscaling.sample_interval_s` from counts
the load model and flow control already keep (with Redis, the other replicas' queues too: `queue_sync`); KEDA's
calls read the last sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from extproc.autoscale import AutoscalingConfig, DemandTracker, Estimate
from extproc.endpoints.health import HealthTracker
from extproc.flow import FlowController
from extproc.gateway.runtime import Pool, RuntimeHolder
from extproc.periodic import Periodic
from extproc.server.keda import externalscaler as pb
from extproc.server.scaler_port import ScalerPort

__all__ = ["METRIC_PREFIX", "ScalerService", "metric_name", "pool_demand"]

log = logging.getLogger(__name__)

METRIC_PREFIX = "extproc-demand-"
_MAX_NAME_ECHO = 64  # characters of an unknown pool name quoted back in an error


def metric_name(pool: str) -> str:
    return METRIC_PREFIX + pool


def pool_demand(pool: Pool, now: float, queued: int) -> float:
    """Requests the pool's engines run or queue now (the load model's estimate per endpoint), plus `queued` here."""
    load = pool.load
    return sum(load.requests(e, now) for e in pool.endpoints) + queued


class ScalerService:
    """The ExternalScaler servicer and the sampler that feeds it."""

    def __init__(self, runtimes: RuntimeHolder, flow: FlowController, health: HealthTracker,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._runtimes = runtimes
        # The other service replicas' queued requests per pool (`extproc.server.queue_sync`, with Redis).
        self.others: Callable[[str], int] = lambda pool: 0
        self._flow = flow
        self._health = health
        self._clock = clock
        self.tracker = DemandTracker(self._config)
        self._streams: dict[str, set[asyncio.Event]] = {}
        self._open_streams = 0
        self._sampler = Periodic("autoscale-sampler", self._sample, lambda: self._config().sample_interval_s,
                                 log=log, what="demand sampling", immediate=True)
        flow.cold_listeners.append(self.wake)
        self.port: ScalerPort | None = None  # its own port (autoscaling.grpc_port), else service.grpc_port's

    def serve_alone(self, host: str, options: Any = ()) -> None:
        """Serve on autoscaling.grpc_port (with its mTLS), from `start()`, instead of on the caller's server."""
        config = self._config()
        self.port = ScalerPort(self.handler(), config.grpc_host or host, config, options)

    def _config(self) -> AutoscalingConfig:
        return self._runtimes.current.policy.autoscaling

    # -- sampling (off the request path) ---------------------------------------------------------------
    async def start(self) -> None:
        if self.port is not None:
            await self.port.start()
        self._sampler.start()

    async def stop(self) -> None:
        if self.port is not None:
            await self.port.stop()
        await self._sampler.stop()
        for events in self._streams.values():
            for event in events:
                event.set()

    async def _sample(self) -> None:
        self.sample()

    def sample(self) -> None:
        """One sample of every pool; streams of pools whose activity changed are woken."""
        now = self._clock()
        pools = self._runtimes.current.pools
        for name, pool in pools.items():
            before = self.tracker.estimate(name)
            queued = self.queued(name)
            ready = pool.ready(self._health.usable(pool.endpoints, now))
            held = queued if not ready and pool.config.cold_start_timeout_s > 0 else 0
            after = self.tracker.observe(name, now, pool_demand(pool, now, queued), held)
            if before is None or before.active != after.active:
                self.wake(name)
        self.tracker.keep(pools)

    def wake(self, pool: str) -> None:
        """Something about `pool`'s activity may have changed: its open StreamIsActive calls look again."""
        for event in self._streams.get(pool, ()):
            event.set()

    def queued(self, pool: str) -> int:
        """Requests held for `pool` by this replica and, as last heard, the others."""
        return self._flow.queued(pool) + self.others(pool)

    def active(self, pool: str) -> bool:
        estimate = self.tracker.estimate(pool)
        return (estimate is not None and estimate.active) or self.queued(pool) > 0

    # -- the gRPC service ------------------------------------------------------------------------------
    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        return grpc.method_handlers_generic_handler(pb.SERVICE, {
            "IsActive": grpc.unary_unary_rpc_method_handler(
                self.IsActive, request_deserializer=pb.ScaledObjectRef.FromString,
                response_serializer=pb.IsActiveResponse.SerializeToString),
            "StreamIsActive": grpc.unary_stream_rpc_method_handler(
                self.StreamIsActive, request_deserializer=pb.ScaledObjectRef.FromString,
                response_serializer=pb.IsActiveResponse.SerializeToString),
            "GetMetricSpec": grpc.unary_unary_rpc_method_handler(
                self.GetMetricSpec, request_deserializer=pb.ScaledObjectRef.FromString,
                response_serializer=pb.GetMetricSpecResponse.SerializeToString),
            "StreamMetricSpec": grpc.unary_stream_rpc_method_handler(
                self.StreamMetricSpec, request_deserializer=pb.ScaledObjectRef.FromString,
                response_serializer=pb.GetMetricSpecResponse.SerializeToString),
            "GetMetrics": grpc.unary_unary_rpc_method_handler(
                self.GetMetrics, request_deserializer=pb.GetMetricsRequest.FromString,
                response_serializer=pb.GetMetricsResponse.SerializeToString),
        })

    async def _pool(self, ref: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Pool:
        """The pool a ScaledObjectRef names in its metadata; aborts the call if it names none we serve."""
        name = ref.scalerMetadata.get("pool", "")
        if not name:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the trigger's metadata must name a pool: pool: NAME")
        pool = self._runtimes.current.pools.get(name)
        if pool is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no pool {name[:_MAX_NAME_ECHO]!r} in the policy")
        assert pool is not None
        return pool

    async def IsActive(self, ref: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        pool = await self._pool(ref, context)
        return pb.IsActiveResponse(result=self.active(pool.name))

    async def StreamIsActive(self, ref: Any, context: grpc.aio.ServicerContext[Any, Any]
                             ) -> AsyncIterator[Any]:
        pool = await self._pool(ref, context)
        if self._open_streams >= self._config().max_streams:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                "too many StreamIsActive calls (autoscaling.max_streams)")
        name = pool.name
        event = asyncio.Event()
        self._streams.setdefault(name, set()).add(event)
        self._open_streams += 1
        try:
            sent: bool | None = None
            while self._sampler.running or sent is None:
                active = self.active(name)
                if active != sent:
                    sent = active
                    yield pb.IsActiveResponse(result=active)
                event.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), self._config().sample_interval_s)
        finally:
            self._open_streams -= 1
            events = self._streams.get(name)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._streams[name]

    def _spec(self, pool: Pool) -> Any:
        target = pool.config.target_per_replica or self._config().target_per_replica
        return pb.GetMetricSpecResponse(metricSpecs=[pb.MetricSpec(
            metricName=metric_name(pool.name), targetSize=max(1, round(target)), targetSizeFloat=target)])

    async def GetMetricSpec(self, ref: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return self._spec(await self._pool(ref, context))

    async def StreamMetricSpec(self, ref: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        """KEDA's optional push of the metric spec: sent when the stream opens, and again when a policy reload
        changes the pool's target (looked at every sample interval); the same answer GetMetricSpec gives. Ends
        when the pool leaves the policy (KEDA opens it again, and GetMetricSpec then answers NOT_FOUND)."""
        pool = await self._pool(ref, context)
        if self._open_streams >= self._config().max_streams:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                "too many streams (autoscaling.max_streams)")
        self._open_streams += 1
        try:
            sent: Any = None
            while self._sampler.running or sent is None:
                current = self._runtimes.current.pools.get(pool.name)
                if current is None:
                    return
                spec = self._spec(current)
                if spec != sent:
                    sent = spec
                    yield spec
                await asyncio.sleep(self._config().sample_interval_s)
        finally:
            self._open_streams -= 1

    async def GetMetrics(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        pool = await self._pool(request.scaledObjectRef, context)
        expected = metric_name(pool.name)
        if request.metricName and request.metricName != expected:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"pool {pool.name!r} has one metric, {expected!r}")
        estimate = self.tracker.estimate(pool.name) or Estimate(0.0, 0, 0.0, 0.0)
        value = estimate.value
        return pb.GetMetricsResponse(metricValues=[pb.MetricValue(
            metricName=expected, metricValue=math.ceil(value), metricValueFloat=value)])
