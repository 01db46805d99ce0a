"""Policy models of the `scheduling:` section (mounted by `extproc.config.schema`) and the built-in profiles.

The built-in plugins and profiles are data in the policy's own shape, defined here once: the schema checks
`pools[].profile` against their names, and `extproc.scheduling.profiles` builds them with the policy's own.
`extproc.config` mounts this module, so nothing in `extproc.scheduling` may import `extproc.config` (a cycle).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from extproc.endpoints.config import ScrapeConfig
from extproc.policy_types import Strict

__all__ = ["BUILTIN_PLUGINS", "BUILTIN_PROFILES", "BUILTIN_PROFILE_CONFIGS", "PluginConfig", "PluginRef",
           "ProfileConfig", "SchedulingConfig"]


class PluginConfig(Strict):
    """One configured scheduling plugin instance: `type` names a registered plugin factory."""

    name: str
    type: str
    parameters: dict[str, Any] = Field(default_factory=dict)


class PluginRef(Strict):
    pluginRef: str
    weight: float = Field(default=1.0, ge=0.0)


class ProfileConfig(Strict):
    """Filters run in order, scorers are summed with their weights, one picker decides."""

    name: str
    plugins: tuple[PluginRef, ...] = Field(min_length=1)


class SchedulingConfig(Strict):
    plugins: tuple[PluginConfig, ...] = ()
    profiles: tuple[ProfileConfig, ...] = ()
    scrape: ScrapeConfig = ScrapeConfig()
    placement_sync_ms: int = Field(default=10, ge=0, le=10_000,
                                   description="with limits.store redis: how often service replicas exchange where "
                                               "they placed prompt prefixes and the requests they routed "
                                               "(extproc/server/placements.py); 0 = never")
    push_requests: bool = Field(default=True,
                                description="with placements shared: each replica sends the requests it routed to "
                                            "the others as it routes them (a Redis stream read blocking), not with "
                                            "the next placement exchange (extproc/server/request_push.py)")
    # A pool larger than this is scheduled over its nominated endpoints plus a random sample (0: never).
    max_candidates: int = Field(default=16, ge=0)

    @model_validator(mode="after")
    def _references(self) -> SchedulingConfig:
        names = [p.name for p in self.plugins]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ValueError(f"duplicate plugin name(s): {sorted(duplicates)}")
        profiles = [p.name for p in self.profiles]
        if len(set(profiles)) != len(profiles):
            raise ValueError("duplicate profile name")
        for profile in self.profiles:
            for ref in profile.plugins:
                if ref.pluginRef not in names:
                    raise ValueError(f"profile {profile.name!r} references unknown plugin {ref.pluginRef!r}")
        return self


def _plugins(*items: tuple[str, str]) -> tuple[PluginConfig, ...]:
    return tuple(PluginConfig(name=name, type=kind) for name, kind in items)


def _profile(name: str, *refs: tuple[str, float]) -> ProfileConfig:
    return ProfileConfig(name=name, plugins=tuple(PluginRef(pluginRef=ref, weight=w) for ref, w in refs))


# Plugin instances of the built-in profiles (default parameters); a policy's own plugins may not reuse their names.
BUILTIN_PLUGINS = _plugins(
    ("saturation", "saturation-filter"),
    ("prefix", "prefix-affinity-scorer"),
    ("queue", "queue-scorer"),
    ("kv", "kv-cache-utilization-scorer"),
    ("lora", "lora-affinity-scorer"),
    ("inflight", "inflight-scorer"),
    ("max-score", "max-score-picker"),
    ("random", "random-picker"),
)
# Profiles every service knows without configuration.
BUILTIN_PROFILE_CONFIGS = (
    # Prefix affinity dominates (weight 3; its home outscores its spill by 2.4, more than queue and KV can add)
    # while its hot threshold and the saturation filter keep a hot prefix from overloading one endpoint; queue
    # and KV scores order the other endpoints (fallbacks, and requests without a prefix).
    _profile("default", ("saturation", 1), ("prefix", 3), ("queue", 1), ("kv", 1), ("lora", 1), ("max-score", 1)),
    _profile("load-only", ("saturation", 1), ("queue", 1), ("kv", 1), ("inflight", 1), ("lora", 1),
             ("max-score", 1)),
    _profile("least-inflight", ("inflight", 1), ("max-score", 1)),
    _profile("random", ("random", 1)),
)
BUILTIN_PROFILES = tuple(profile.name for profile in BUILTIN_PROFILE_CONFIGS)
