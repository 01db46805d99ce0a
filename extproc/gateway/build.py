"""Wire the decision path's stages and the long-lived state they share (one owner each)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from extproc.endpoints.health import HealthTracker
from extproc.flow import FlowController
from extproc.gateway.admission import Admit
from extproc.gateway.auth import Authenticator
from extproc.gateway.authenticate import Authenticate
from extproc.gateway.calibration import PromptCalibration
from extproc.gateway.decision import Gateway, Stages
from extproc.gateway.finish import Finish, Outcomes
from extproc.gateway.gate import Gate, pool_room
from extproc.gateway.records import RequestIds
from extproc.gateway.resolve import Resolve
from extproc.gateway.runtime import RuntimeHolder
from extproc.gateway.schedule import Schedule
from extproc.gateway.tenant_gate import TenantGate
from extproc.rollout.controller import Rollouts
from extproc.telemetry import GatewayMetrics

__all__ = ["Parts", "build_gateway"]


@dataclass(frozen=True)
class Parts:
    """The gateway and the state the rest of the service reads or feeds (admin, access log, scraper, metrics)."""

    gateway: Gateway
    flow: FlowController
    health: HealthTracker
    calibration: PromptCalibration
    authenticator: Authenticator
    outcomes: Outcomes


def build_gateway(runtimes: RuntimeHolder, metrics: GatewayMetrics, *, authenticator: Authenticator | None = None,
                  rollouts: Rollouts | None = None, clock: Callable[[], float] = time.monotonic,
                  wall_clock: Callable[[], float] = time.time, cpu_clock: Callable[[], float] = time.thread_time,
                  replica_id: str | None = None) -> Parts:
    health = HealthTracker(lambda: runtimes.current.policy.health)
    flow = FlowController(lambda: runtimes.current.policy.flow_control, pool_room(lambda: runtimes.current, health),
                          clock, lambda klass, seconds: metrics.flow_wait_seconds.labels(klass).observe(seconds))
    tenants = TenantGate()
    calibration = PromptCalibration()
    authenticator = authenticator or Authenticator()
    stages = Stages(
        authenticate=Authenticate(authenticator, tenants, metrics, clock),
        resolve=Resolve(calibration, metrics, cpu_clock, rollouts),
        admit=Admit(tenants, metrics, wall_clock, clock),
        gate=Gate(flow, metrics, health),
        schedule=Schedule(health, metrics, clock),
        finish=Finish(tenants, flow, metrics, clock),
    )
    gateway = Gateway(runtimes, stages, tenants, metrics, clock, cpu_clock, RequestIds(replica_id))
    return Parts(gateway, flow, health, calibration, authenticator,
                 Outcomes(lambda: runtimes.current, health, metrics, clock))
