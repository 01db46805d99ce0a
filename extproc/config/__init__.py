"""Policy schema, loading with file:line errors, and immutable snapshots."""

from extproc.config.loader import ConfigError, ConfigProblem, load_policy, parse_policy
from extproc.config.schema import BoundsConfig, EnvoyConfig, Policy, PoolConfig, ServiceConfig

__all__ = [
    "BoundsConfig",
    "ConfigError",
    "ConfigProblem",
    "EnvoyConfig",
    "Policy",
    "PoolConfig",
    "ServiceConfig",
    "load_policy",
    "parse_policy",
]
