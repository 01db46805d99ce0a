"""Policy models of flow control (mounted as `Policy.flow_control`): priority classes, the admission
queue and the saturation thresholds that decide when requests queue instead of going straight on."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from extproc.policy_types import ClassName, HeaderName, Strict

__all__ = ["MESSAGE_TIMEOUT_SLACK_S", "FlowControlConfig", "PriorityClass", "default_classes"]

# Envoy's ext_proc timer for a queued request is extended to its remaining wait plus this slack, so
# the service's own answer (granted, or an OpenAI-shaped rejection) always beats Envoy's timeout.
MESSAGE_TIMEOUT_SLACK_S = 1.0

class PriorityClass(Strict):
    """One priority class. Higher `priority` is served first; `max_wait_s` bounds its time in the queue
    (0: never queued, rejected at once while its pool is saturated); `reserve` is the fraction of every
    endpoint's batch this class may not fill, kept free so higher classes start at once."""

    priority: int = Field(ge=0, le=1_000_000)
    max_wait_s: float = Field(default=10.0, ge=0.0, le=300.0)
    reserve: float = Field(default=0.0, ge=0.0, lt=1.0)
    reject_status: Literal[429, 503] = Field(default=503, description="status when it cannot be served in time")


def default_classes() -> dict[str, PriorityClass]:
    return {
        "critical": PriorityClass(priority=100, max_wait_s=30.0),
        "standard": PriorityClass(priority=50, max_wait_s=10.0, reserve=0.1),
        # Waits briefly rather than being refused at once: near saturation (0.9x) a seat frees within a second,
        # and refusing while the fleet still has room is harm. It leaves the same 10% as standard for critical;
        # between the two lower classes the queue's priority decides.
        "sheddable": PriorityClass(priority=0, max_wait_s=1.0, reserve=0.1),
    }


class FlowControlConfig(Strict):
    """The admission queue in front of every pool (see README "Priority and load shedding")."""

    enabled: bool = True
    classes: dict[ClassName, PriorityClass] = Field(default_factory=default_classes)
    default_class: str = "standard"
    priority_header: HeaderName = Field(default="x-gateway-priority",
                                 description="request header naming a class, honoured up to the tier's max_priority")
    aging_per_s: float = Field(default=5.0, ge=0.0, description="priority points a queued request gains per second")
    max_queued: int = Field(default=1000, ge=1, le=1_000_000, description="queued requests per pool, all classes")
    retry_after_s: float = Field(default=1.0, ge=0.0, description="Retry-After on rejections")
    # With limits.store redis: how often service replicas exchange their in-flight counts per endpoint
    # through Redis, so each sees the others' sends between scrapes (0 = never; needs a restart). 10 ms, not 20
    # (until session 11): a replica holds requests while another's completion freed a seat until it hears of it; at
    # 0.9x with 3 replicas that cost standard/sheddable +8%/+6% TTFT p99 at 20 ms, +2%/+2% at 10 ms (virtual time,
    # 12 seeds pooled); an exchange costs ~60 us of the replica's CPU and ~40 us of Redis' (reports/i13-s11).
    # Checked again in session 20 with shared scrapes: sheddable p99 189.9 vs 169.2 ms at 20 vs 10 ms, while
    # 20 ms cut each replica's CPU ~15% and Redis' ~25% (reports/i15-s20).
    fleet_sync_ms: int = Field(default=10, ge=0, le=10_000)

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, value: object) -> object:
        if isinstance(value, dict) and "saturation" in value:
            raise ValueError("flow_control.saturation moved to the top-level `saturation` section, which the "
                             "scheduler reads too (max_waiting is gone: a queue must last saturation.sustain_ms)")
        return value

    @field_validator("classes")
    @classmethod
    def _some_class(cls, value: dict[str, PriorityClass]) -> dict[str, PriorityClass]:
        if not value:
            raise ValueError("flow_control.classes needs at least one class")
        return value

    @model_validator(mode="after")
    def _default_known(self) -> FlowControlConfig:
        if self.default_class not in self.classes:
            raise ValueError(f"flow_control.default_class {self.default_class!r} is not a class "
                             f"(classes: {sorted(self.classes)})")
        return self

    def longest_wait_s(self) -> float:
        return max(c.max_wait_s for c in self.classes.values())
