"""Policy models of weighted splits and progressive rollouts (mounted as `Policy.rollout`).

A split maps one client-facing model name onto several pools with weights; an optional rollout moves
weight from a baseline pool to a canary pool step by step, gated by automated analysis.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator, model_validator

from extproc.policy_types import HeaderName, Strict

__all__ = [
    "Backend",
    "RolloutConfig",
    "RolloutPolicy",
    "SplitConfig",
    "StickyBy",
    "check_splits",
]

StickyBy = Literal["tenant", "session", "user", "request"]


class Backend(Strict):
    """One pool a split sends traffic to; weights are relative (normalised over the split)."""

    pool: str
    weight: float = Field(ge=0.0)


class RolloutConfig(Strict):
    """Progressive canary: weight moves from `baseline` to `canary` along `steps` (percent).

    Each step is held at least `hold_s` and needs `min_samples` requests on each side before it may be
    promoted; a breach of any bound with enough samples rolls the canary back to 0 at once.
    """

    canary: str
    baseline: str
    steps: tuple[float, ...] = Field(default=(5.0, 25.0, 50.0, 100.0), min_length=1)
    hold_s: float = Field(default=300.0, ge=0.0)
    min_samples: int = Field(default=200, ge=1)
    # canary error rate minus baseline error rate (absolute, 0.02 = two percentage points)
    max_error_rate_delta: float = Field(default=0.02, ge=0.0, le=1.0)
    max_ttft_p99_ratio: float = Field(default=1.5, ge=1.0)
    max_tpot_ratio: float = Field(default=1.3, ge=1.0)
    analysis_interval_s: float = Field(default=30.0, gt=0.0)

    @field_validator("steps")
    @classmethod
    def _increasing(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0.0 < step <= 100.0 for step in value):
            raise ValueError("rollout steps are percentages in (0, 100]")
        if any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError("rollout steps must be strictly increasing")
        if value[0] >= 100.0:
            raise ValueError("the first rollout step must be below 100 (the baseline is needed for analysis)")
        return value

    @model_validator(mode="after")
    def _distinct(self) -> RolloutConfig:
        if self.canary == self.baseline:
            raise ValueError("rollout canary and baseline must be different pools")
        return self


class SplitConfig(Strict):
    """Weighted split of one client model name over pools, sticky per user, tenant or session."""

    model: str
    backends: tuple[Backend, ...] = Field(min_length=1)
    # Bucketing key: "user" falls back to the tenant, then the request id; "session" falls back to
    # the user first; "request" is a fresh choice per request (exact split, no stickiness).
    sticky_by: StickyBy = "user"
    override_header: HeaderName | None = None
    allow_override_tiers: tuple[str, ...] = ()
    rollout: RolloutConfig | None = None

    @model_validator(mode="after")
    def _backends(self) -> SplitConfig:
        pools = [b.pool for b in self.backends]
        if len(set(pools)) != len(pools):
            raise ValueError(f"split {self.model!r}: a pool is listed twice")
        if self.rollout is not None:
            for name in (self.rollout.canary, self.rollout.baseline):
                if name not in pools:
                    raise ValueError(f"split {self.model!r}: rollout pool {name!r} is not one of its backends")
            shared = sum(b.weight for b in self.backends if b.pool in (self.rollout.canary, self.rollout.baseline))
            if shared <= 0.0:
                raise ValueError(f"split {self.model!r}: canary + baseline weight must be > 0 for a rollout")
        elif not any(b.weight > 0.0 for b in self.backends):
            raise ValueError(f"split {self.model!r}: at least one backend weight must be > 0")
        return self

    def pools(self) -> tuple[str, ...]:
        return tuple(b.pool for b in self.backends)


class RolloutPolicy(Strict):
    """The `rollout:` section of the policy file."""

    splits: tuple[SplitConfig, ...] = ()
    # How often each replica re-reads rollout state from the store (replicas converge within this).
    refresh_interval_s: float = Field(default=1.0, gt=0.0, le=60.0)
    # Envoy RDS file rewritten with matching weighted_clusters when weights change (see envoy_sync).
    fallback_route_file: str | None = None
    # Request header a client may send naming the model, for the fallback route (Envoy cannot read
    # the body when our service is bypassed). None: fallback routes match every request.
    fallback_model_header: HeaderName | None = "x-gateway-model"
    # Split used by the fallback catch-all route when a request names no model in that header.
    fallback_default_model: str | None = None

    @model_validator(mode="after")
    def _unique(self) -> RolloutPolicy:
        models = [s.model for s in self.splits]
        duplicates = sorted({m for m in models if models.count(m) > 1})
        if duplicates:
            raise ValueError(f"duplicate split model(s): {duplicates}")
        if self.fallback_default_model is not None and self.fallback_default_model not in models:
            raise ValueError(f"fallback_default_model {self.fallback_default_model!r} is not a split model")
        return self

    def by_model(self) -> dict[str, SplitConfig]:
        return {split.model: split for split in self.splits}


def check_splits(rollout: RolloutPolicy, pools: Mapping[str, object], tiers: Mapping[str, object]) -> list[str]:
    """Cross-checks against the rest of the policy (pool and tier names); one message per problem.

    `pools` and `tiers` are the policy's pools and tiers keyed by name (only the keys are read).
    """
    problems: list[str] = []
    for split in rollout.splits:
        for backend in split.backends:
            if backend.pool not in pools:
                problems.append(f"split {split.model!r}: unknown pool {backend.pool!r}")
        for tier in split.allow_override_tiers:
            if tier not in tiers:
                problems.append(f"split {split.model!r}: unknown tier {tier!r} in allow_override_tiers")
        if split.allow_override_tiers and split.override_header is None:
            problems.append(f"split {split.model!r}: allow_override_tiers needs override_header")
    return problems
