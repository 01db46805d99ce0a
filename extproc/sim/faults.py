"""Fault settings of one replica and the per-request decisions they imply (sans-IO).

`POST /sim/faults` takes a JSON object with any of these keys (absent keys keep their value;
`"clear": true` first resets everything):

  error_rate        fraction in [0, 1] of inference requests answered with `error_status` (default 500)
  error_status      status for error_rate failures: 429 or 5xx
  burst             {"count": N, "status": 503}: the next N inference requests fail with that status
  slow_factor       >= 0.01, multiplies prefill time and inter-token latency of newly scheduled work
  hang              true: requests (and /health, /metrics) are accepted and not answered until cleared
  crash_mid_stream  K (or null): cut the connection after K chunks of every generation response
  refuse            true: stop listening (connection refused) and drop idle connections until cleared
  refuse_for_s      with refuse: start listening again by itself after this many seconds
  unhealthy         true: GET /health answers 503
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["FaultError", "FaultSettings", "Faults"]


class FaultError(ValueError):
    """A fault update that is not valid; the settings stay unchanged."""


@dataclass(frozen=True, slots=True)
class FaultSettings:
    error_rate: float = 0.0
    error_status: int = 500
    burst_count: int = 0
    burst_status: int = 503
    slow_factor: float = 1.0
    hang: bool = False
    crash_mid_stream: int | None = None
    refuse: bool = False
    refuse_for_s: float | None = None
    unhealthy: bool = False

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["burst"] = {"count": data.pop("burst_count"), "status": data.pop("burst_status")}
        return data


def _status(value: Any, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not (value == 429 or 500 <= value <= 599):
        raise FaultError(f"{key} must be 429 or a 5xx status")
    return value


def _number(value: Any, key: str, low: float, high: float | None = None) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise FaultError(f"{key} must be a number")
    if value < low or (high is not None and value > high):
        raise FaultError(f"{key} must be in [{low}, {high if high is not None else 'inf'}]")
    return float(value)


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise FaultError(f"{key} must be true or false")
    return value


def apply_update(current: FaultSettings, update: Mapping[str, Any]) -> FaultSettings:
    """The settings after a `POST /sim/faults` body; raises FaultError on any bad key or value."""
    allowed = {"clear", "error_rate", "error_status", "burst", "slow_factor", "hang", "crash_mid_stream",
               "refuse", "refuse_for_s", "unhealthy"}
    unknown = sorted(set(update) - allowed)
    if unknown:
        raise FaultError(f"unknown fault keys {unknown}")
    base = FaultSettings() if update.get("clear") is True else current
    changes: dict[str, Any] = {}
    for key, value in update.items():
        if key == "clear":
            _flag(value, key)
        elif key == "error_rate":
            changes[key] = _number(value, key, 0.0, 1.0)
        elif key == "error_status":
            changes[key] = _status(value, key)
        elif key == "burst":
            if not isinstance(value, Mapping):
                raise FaultError('burst must be {"count": N, "status": S}')
            changes["burst_count"] = int(_number(value.get("count", 0), "burst.count", 0))
            changes["burst_status"] = _status(value.get("status", 503), "burst.status")
        elif key == "slow_factor":
            changes[key] = _number(value, key, 0.01)
        elif key == "crash_mid_stream":
            changes[key] = None if value is None else int(_number(value, key, 0))
        elif key == "refuse_for_s":
            changes[key] = None if value is None else _number(value, key, 0.0)
        else:
            changes[key] = _flag(value, key)
    return dataclasses.replace(base, **changes)


class Faults:
    """Current settings plus the seeded random source that error_rate draws from."""

    def __init__(self, settings: FaultSettings, seed: int) -> None:
        self.settings = settings
        self._rng = random.Random(seed)

    def update(self, update: Mapping[str, Any]) -> FaultSettings:
        self.settings = apply_update(self.settings, update)
        return self.settings

    def inference_error(self) -> int | None:
        """Status to fail this inference request with, or None to serve it; consumes one burst slot."""
        settings = self.settings
        if settings.burst_count > 0:
            self.settings = dataclasses.replace(settings, burst_count=settings.burst_count - 1)
            return settings.burst_status
        if settings.error_rate > 0.0 and self._rng.random() < settings.error_rate:
            return settings.error_status
        return None
