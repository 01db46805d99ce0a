"""Weighted, sticky choice of a pool for one request of a split model. Pure functions.

Each request key (user, session, tenant or request id) hashes, with the model name, to a bucket in
[0, 1) that every replica computes identically. Pools own consecutive ranges of [0, 1) in a fixed
order: the split's other backends first, then the canary, then the baseline. When a rollout moves
weight from baseline to canary only the canary/baseline boundary moves, so a user already on the
canary stays there as its share grows (monotone bucketing) and no user of another backend moves.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from extproc.rollout.config import SplitConfig

__all__ = [
    "Selection",
    "choose_backend",
    "ordered_pools",
    "override_pool",
    "select_pool",
    "split_weights",
    "stable_bucket",
    "sticky_key",
]

_SCALE = float(1 << 64)


def stable_bucket(model: str, key: str) -> float:
    """A uniform value in [0, 1) from (model, key); identical in every process (not Python's hash())."""
    digest = hashlib.blake2b(f"{model}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE


def ordered_pools(split: SplitConfig) -> tuple[str, ...]:
    """The order of the pools' bucket ranges (see the module docstring)."""
    if split.rollout is None:
        return split.pools()
    ends = (split.rollout.canary, split.rollout.baseline)
    return (*(p for p in split.pools() if p not in ends), *ends)


def split_weights(split: SplitConfig, canary_percent: float | None = None) -> dict[str, float]:
    """Normalised weights (sum 1). With a rollout, canary + baseline share their configured total
    `canary_percent` / rest; `None` means the configured weights as written."""
    total = sum(b.weight for b in split.backends)
    weights = {b.pool: b.weight / total for b in split.backends}
    if split.rollout is None or canary_percent is None:
        return weights
    canary, baseline = split.rollout.canary, split.rollout.baseline
    shared = weights[canary] + weights[baseline]
    share = min(100.0, max(0.0, canary_percent)) / 100.0
    weights[canary] = shared * share
    weights[baseline] = shared * (1.0 - share)
    return weights


def choose_backend(split: SplitConfig, key: str, weights: Mapping[str, float] | None = None) -> str:
    """Deterministic weighted choice: the same key gets the same pool for a fixed weight vector.

    `weights` (pool -> relative weight, e.g. `Rollouts.current_weights`) overrides the configured ones;
    pools missing from it get 0. At least one weight must be positive.
    """
    if weights is None:
        weights = split_weights(split)
    order = ordered_pools(split)
    total = sum(max(0.0, weights.get(pool, 0.0)) for pool in order)
    if total <= 0.0:
        raise ValueError(f"split {split.model!r}: every weight is 0")
    point = stable_bucket(split.model, key) * total
    edge = 0.0
    last = ""
    for pool in order:
        weight = max(0.0, weights.get(pool, 0.0))
        if weight <= 0.0:
            continue
        edge += weight
        last = pool
        if point < edge:
            return pool
    return last  # only reached through float rounding at the very top of the range


def sticky_key(split: SplitConfig, *, tenant: str | None, session: str | None, user: str | None,
               request_id: str) -> str:
    """The bucketing key by `split.sticky_by`, with its fallbacks; the kind is part of the key.

    Pass `tenant=None` for the anonymous tenant, or every anonymous caller would share one bucket.
    """
    chains: dict[str, tuple[tuple[str, str | None], ...]] = {
        "session": (("session", session), ("user", user), ("tenant", tenant)),
        "user": (("user", user), ("tenant", tenant)),
        "tenant": (("tenant", tenant),),
        "request": (),
    }
    for kind, value in chains[split.sticky_by]:
        if value:
            return f"{kind}:{value}"
    return f"request:{request_id}"


def override_pool(split: SplitConfig, headers: Mapping[str, str], tier: str) -> str | None:
    """The pool a tester asked for in `override_header`, if their tier may and it is a backend.

    A 0-weight backend may be chosen this way (testing a canary before it gets traffic).
    """
    if split.override_header is None or tier not in split.allow_override_tiers:
        return None
    wanted = headers.get(split.override_header, "").strip()
    return wanted if wanted in split.pools() else None


@dataclass(frozen=True, slots=True)
class Selection:
    pool: str
    by: Literal["override", "weight"]
    bucket_key: str


def select_pool(split: SplitConfig, weights: Mapping[str, float] | None, *, headers: Mapping[str, str], tier: str,
                tenant: str | None, session: str | None, user: str | None, request_id: str) -> Selection:
    """The pool for one request: an allowed override header wins, else the sticky weighted choice."""
    key = sticky_key(split, tenant=tenant, session=session, user=user, request_id=request_id)
    forced = override_pool(split, headers, tier)
    if forced is not None:
        return Selection(forced, "override", key)
    return Selection(choose_backend(split, key, weights), "weight", key)
