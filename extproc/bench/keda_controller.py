"""What KEDA + the HPA do with our external scaler, small enough for a benchmark: `Controller`.

- KEDA's side: a gRPC client of `externalscaler.ExternalScaler` (the vendored descriptor's messages): the metric
  spec once, `IsActive` + `GetMetrics` every `poll_s`, and a `StreamIsActive` stream that activates a pool at
  zero replicas at once (KEDA's `external-push` trigger).
- The HPA's side (`desired_replicas`): ceil(metric / target) within [min, max], no change inside a 10%
  tolerance; zero replicas only after `cooldown_s` inactive (KEDA's cooldownPeriod), one at once on activation.
- The cluster's side (`Replicas`): a new replica listens `cold_start_s` after it was asked for (scheduling,
  image pull, model load), from a simulator process pre-started parked; a removed one gets SIGTERM, newest
  first, pending starts cancelled first. Its
  process group must not use a preexec hook (`ProcessGroup(die_with_parent=False)`): these processes are
  forked while gRPC's threads run in this process, and a forked child that runs Python code before exec can
  deadlock on a lock one of those threads held (seen: one replica in four never started).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from extproc.bench.procs import Child, ProcessGroup, wait_file
from extproc.server.keda import externalscaler as pb

__all__ = ["Controller", "Replicas", "ScalerClient", "desired_replicas"]

TOLERANCE = 0.1  # the HPA's default: no change while metric / (target x replicas) is within 10% of 1


def desired_replicas(value: float, target: float, current: int, active: bool, inactive_for_s: float, *,
                     minimum: int, maximum: int, cooldown_s: float) -> int:
    """The replica count KEDA + the HPA would ask for (see the module docstring)."""
    if not active:
        return current if current > minimum and inactive_for_s < cooldown_s else minimum
    if current > 0 and abs(value / (target * current) - 1.0) <= TOLERANCE:
        return current
    return max(1, minimum, min(maximum, math.ceil(value / target)))


class ScalerClient:
    """KEDA's calls, over one channel."""

    def __init__(self, channel: grpc.aio.Channel, pool: str) -> None:
        prefix = f"/{pb.SERVICE}/"
        ref_out = pb.ScaledObjectRef.SerializeToString
        self.ref = pb.ScaledObjectRef(name=f"vllm-{pool}", namespace="bench", scalerMetadata={"pool": pool})
        self._is_active = channel.unary_unary(prefix + "IsActive", request_serializer=ref_out,
                                              response_deserializer=pb.IsActiveResponse.FromString)
        self._stream = channel.unary_stream(prefix + "StreamIsActive", request_serializer=ref_out,
                                            response_deserializer=pb.IsActiveResponse.FromString)
        self._spec = channel.unary_unary(prefix + "GetMetricSpec", request_serializer=ref_out,
                                         response_deserializer=pb.GetMetricSpecResponse.FromString)
        self._metrics = channel.unary_unary(prefix + "GetMetrics",
                                            request_serializer=pb.GetMetricsRequest.SerializeToString,
                                            response_deserializer=pb.GetMetricsResponse.FromString)

    async def spec(self) -> tuple[str, float]:
        response: Any = await self._spec(self.ref, timeout=5)
        metric = response.metricSpecs[0]
        return str(metric.metricName), float(metric.targetSizeFloat or metric.targetSize)

    async def sample(self, metric: str) -> tuple[bool, float]:
        active: Any = await self._is_active(self.ref, timeout=5)
        request = pb.GetMetricsRequest(scaledObjectRef=self.ref, metricName=metric)
        response: Any = await self._metrics(request, timeout=5)
        value = response.metricValues[0]
        return bool(active.result), float(value.metricValueFloat or value.metricValue)

    def stream(self) -> Any:
        return self._stream(self.ref)


@dataclass
class Replicas:
    """Simulator processes of one pool, one per port. Each is pre-started parked (`extproc sim --park-file`: its
    Python start-up done, no port bound) and told to listen `cold_start_s` after the scale-up, so the simulated
    cold start is the only delay, as for a real replica; a stopped one is replaced by a new parked
    process (`parked[port]` is always there, maybe still starting)."""

    group: ProcessGroup
    workdir: Path
    model: str
    ports: Sequence[int]
    profile: str
    cold_start_s: float
    clock: Callable[[], float]
    running: dict[int, Child] = field(default_factory=dict)
    starting: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    ready_at: list[tuple[float, int]] = field(default_factory=list)  # (time, replicas ready) at each change
    # One per replica started: when it was asked for, told to listen, and listening; and whether its parked
    # process was not up yet at the end of the cold start (then the bench's process start-up adds to the lag).
    starts: list[dict[str, float]] = field(default_factory=list)
    parked: dict[int, asyncio.Task[Child]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.running) + len(self.starting)

    async def prestart(self) -> None:
        """A parked process on every port, up before the run starts."""
        for port in self.ports:
            self._park(port)
        await asyncio.gather(*self.parked.values())

    def _park(self, port: int) -> None:
        self.parked[port] = asyncio.create_task(self._parked_process(port))

    async def _parked_process(self, port: int) -> Child:
        park, ready = self.workdir / f"sim-{port}.parked", self.workdir / f"sim-{port}.json"
        park.unlink(missing_ok=True)
        ready.unlink(missing_ok=True)
        child = await self.group.start(f"sim-{port}", [sys.executable, "-m", "extproc", "sim", "--ready-file",
                                                       str(ready), "--park-file", str(park), "--profile",
                                                       self.profile, "--stream-chunk-tokens", "8",
                                                       "--pool", f"{self.model}={port}"])
        try:
            await wait_file(park, 60, child=child)
        except BaseException:
            await self.group.stop(child)
            raise
        return child

    def scale(self, desired: int) -> None:
        while self.count < desired:
            port = next(p for p in self.ports if p not in self.running and p not in self.starting)
            self.starting[port] = asyncio.create_task(self._start(port))
        while self.count > desired:
            if self.starting:
                port, task = self.starting.popitem()
                task.cancel()
            else:
                port = max(self.running, key=lambda p: self.running[p].pid)
                child = self.running.pop(port)
                self.ready_at.append((self.clock(), len(self.running)))
                self.parked[port] = asyncio.create_task(self._replace(child, port))

    async def _replace(self, child: Child, port: int) -> Child:
        """Stop `child`, then park a new process on its port."""
        await self.group.stop(child, grace_s=5.0)
        return await self._parked_process(port)

    async def _start(self, port: int) -> None:
        try:
            await self._launch(port)
        except Exception as exc:  # the controller asks again at its next poll
            print(f"replica on port {port} did not start: {exc}", file=sys.stderr)
            self.starting.pop(port, None)

    async def _launch(self, port: int) -> None:
        asked = self.clock()
        await asyncio.sleep(self.cold_start_s)
        parked = self.parked[port]
        late = not parked.done()
        child = await asyncio.shield(parked)
        told = self.clock()
        child.send_signal(signal.SIGUSR1)
        try:
            await wait_file(self.workdir / f"sim-{port}.json", 30, child=child)
        except BaseException:
            self.parked.pop(port, None)
            await self.group.stop(child)
            self._park(port)
            raise
        self.parked.pop(port, None)
        self.starting.pop(port, None)
        self.running[port] = child
        now = self.clock()
        self.ready_at.append((now, len(self.running)))
        self.starts.append({"asked": asked, "told": told, "ready": now, "parked_late": float(late)})

    async def close(self) -> None:
        for task in self.starting.values():
            task.cancel()
        for task in self.starting.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.gather(*self.parked.values(), return_exceptions=True)


@dataclass
class Controller:
    scaler: ScalerClient
    replicas: Replicas
    poll_s: float
    minimum: int
    maximum: int
    cooldown_s: float
    clock: Callable[[], float] = time.monotonic
    timeline: list[dict[str, float]] = field(default_factory=list)
    desired: int = 0
    _last_active: float = 0.0

    async def run(self, until: float) -> None:
        metric, target = await self.scaler.spec()
        self._last_active = self.clock()
        watcher = asyncio.create_task(self._watch_activation())
        try:
            while self.clock() < until:
                active, value = await self.scaler.sample(metric)
                now = self.clock()
                if active:
                    self._last_active = now
                self._apply(desired_replicas(value, target, self.replicas.count, active, now - self._last_active,
                                             minimum=self.minimum, maximum=self.maximum, cooldown_s=self.cooldown_s))
                self.timeline.append({"t": now, "value": value, "active": float(active), "desired": self.desired,
                                      "ready": len(self.replicas.running), "starting": len(self.replicas.starting)})
                await asyncio.sleep(self.poll_s)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await watcher

    async def _watch_activation(self) -> None:
        """KEDA's push trigger: a pool at zero replicas is scaled to one the moment it turns active."""
        async for message in self.scaler.stream():
            if message.result:
                now = self._last_active = self.clock()
                if self.replicas.count == 0:
                    self._apply(max(1, self.minimum))
                    last = self.timeline[-1]["value"] if self.timeline else 0.0
                    self.timeline.append({"t": now, "value": last, "active": 1.0, "desired": self.desired,
                                          "ready": len(self.replicas.running), "starting": len(self.replicas.starting),
                                          "pushed": 1.0})

    def _apply(self, desired: int) -> None:
        self.desired = desired
        self.replicas.scale(desired)
