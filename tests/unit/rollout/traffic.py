"""Simulated traffic for rollout tests: a fake wall clock and pools with chosen health."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from extproc.rollout import RolloutConfig, Rollouts, SplitConfig, choose_backend
from extproc.rollout.config import Backend

MODEL = "chat"


class FakeClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def split(**rollout: object) -> SplitConfig:
    settings: dict[str, object] = {"canary": "v2", "baseline": "v1", "hold_s": 60.0, "min_samples": 200,
                                   "analysis_interval_s": 10.0}
    settings.update(rollout)
    return SplitConfig(model=MODEL, backends=(Backend(pool="v1", weight=1.0), Backend(pool="v2", weight=0.0)),
                       sticky_by="user", rollout=RolloutConfig.model_validate(settings))


@dataclass
class PoolHealth:
    error_rate: float = 0.01
    ttft_s: float = 0.2
    tpot_s: float = 0.02


@dataclass
class Traffic:
    """`rate` requests per simulated second, spread over `users`, outcome by the chosen pool's health."""

    health: dict[str, PoolHealth]
    rate: int = 100
    users: int = 5000
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    sent: dict[str, int] = field(default_factory=dict)

    def second(self, replicas: list[Rollouts]) -> None:
        for index in range(self.rate):
            replica = replicas[index % len(replicas)]
            config = replica.split(MODEL)
            assert config is not None
            user = f"user-{self.rng.randrange(self.users)}"
            pool = choose_backend(config, f"user:{user}", replica.current_weights(MODEL))
            self.sent[pool] = self.sent.get(pool, 0) + 1
            health = self.health[pool]
            ok = self.rng.random() >= health.error_rate
            jitter = self.rng.uniform(0.8, 1.25)
            replica.record(pool, ok, health.ttft_s * jitter if ok else None, health.tpot_s * jitter if ok else None)
