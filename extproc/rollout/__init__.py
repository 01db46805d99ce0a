"""Weighted splits, sticky bucketing, progressive canary rollouts with automated analysis.

`extproc.config.schema` mounts `extproc.rollout.config`, so nothing imported here may import
`extproc.config` (a cycle). `extproc.rollout.envoy_sync` (which uses `extproc.xds`) is imported
from its module.
"""

from extproc.rollout.analysis import OutcomeWindows, PoolWindow, Verdict, analyse, tpot_seconds
from extproc.rollout.config import Backend, RolloutConfig, RolloutPolicy, SplitConfig, check_splits
from extproc.rollout.controller import RolloutError, Rollouts, Weights
from extproc.rollout.redis_store import RedisRolloutStore
from extproc.rollout.split import Selection, choose_backend, select_pool, split_weights, stable_bucket, sticky_key
from extproc.rollout.state import MemoryRolloutStore, RolloutState, RolloutStore, RolloutStoreUnavailable

__all__ = [
    "Backend",
    "MemoryRolloutStore",
    "OutcomeWindows",
    "PoolWindow",
    "RedisRolloutStore",
    "RolloutConfig",
    "RolloutError",
    "RolloutPolicy",
    "RolloutState",
    "RolloutStore",
    "RolloutStoreUnavailable",
    "Rollouts",
    "Selection",
    "SplitConfig",
    "Verdict",
    "Weights",
    "analyse",
    "check_splits",
    "choose_backend",
    "select_pool",
    "split_weights",
    "stable_bucket",
    "sticky_key",
    "tpot_seconds",
]
