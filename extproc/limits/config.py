"""Policy models of limits (mounted by `extproc.config.schema`): the store (`limits:`) and what one scope of a
tenant may use (`tiers.<name>.limits` / `model_limits`, and the overrides of the keys file).

`extproc.config` mounts these, so nothing in `extproc.limits` may import `extproc.config` (a cycle).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from extproc.limits.redis_address import RedisTls, parse_url
from extproc.policy_types import Strict

__all__ = ["LimitsConfig", "RedisTls", "TierLimits"]


class TierLimits(Strict):
    """Limits of one scope (a tenant in total, or a tenant on one model); unset = unlimited."""

    requests_per_s: float | None = Field(default=None, gt=0)
    burst: float | None = Field(default=None, ge=1, description="bucket size; default 2 x requests_per_s")
    concurrency: int | None = Field(default=None, ge=1)
    tokens_per_min: int | None = Field(default=None, ge=1)
    tokens_per_day: int | None = Field(default=None, ge=1)


class LimitsConfig(Strict):
    store: Literal["memory", "redis"] = "memory"
    redis_url: str | None = Field(default=None, description="redis:// or rediss://; env EXTPROC_REDIS_URL wins")
    # TLS of every Redis connection (limits, fleet and calibration exchanges, rollouts): needs rediss://
    redis_tls: RedisTls | None = None
    # redis_url names any node of a Redis Cluster: commands go to the primary serving their keys' slot
    redis_cluster: bool = False
    on_store_failure: Literal["fail-open", "fail-closed"] = "fail-open"
    # How long an admission waits for Redis's decision before the failure policy decides it (a lost or
    # refused connection: at once). A replica deciding alone while Redis is only slow may admit what Redis
    # then gives to others: keep it above the silences of a busy node.
    decision_deadline_ms: float = Field(default=50.0, gt=0, le=1000)
    # Expected completion when a request sets no max_tokens: reserved, then corrected to real usage.
    default_output_tokens: int = Field(default=256, ge=1)
    # Prompt estimates (characters / 4) corrected per pool by a fit against the engines' usage.prompt_tokens
    # from the access log (extproc/gateway/calibration.py); false = the raw estimate.
    calibrate_prompt_tokens: bool = True
    # Token-budget reservations take the calibrated estimate plus this many standard deviations of its
    # recent relative error (settling gives the excess back); 0 = the estimate itself.
    prompt_reserve_sd: float = Field(default=2.0, ge=0, le=10)
    lease_ttl_s: float = Field(default=900.0, gt=0, description="a replica's leases expire if it dies")
    # Redis: each replica admits without waiting within its slices of the busy limits (leased from Redis,
    # sized by its demand, none near a limit); false = every admission waits for Redis's decision.
    slices: bool = True
    slice_ttl_ms: float = Field(default=1000.0, ge=50, le=60_000, description="a slice's lifetime")
    # Service replicas sharing the store (their share of a limit when deciding alone: fail-open);
    # default the number of envoy.extproc_endpoints (at least 1).
    replicas: int | None = Field(default=None, ge=1, le=10_000)

    @field_validator("redis_url")
    @classmethod
    def _valid_url(cls, value: str | None) -> str | None:
        if value is not None:
            parse_url(value)  # ValueError: the scheme (no unix://), port or database
        return value

    @model_validator(mode="after")
    def _tls_needs_rediss(self) -> LimitsConfig:
        if self.redis_tls is not None and self.redis_url is not None and not parse_url(self.redis_url).tls:
            raise ValueError("limits.redis_tls needs a rediss:// redis_url")
        return self
