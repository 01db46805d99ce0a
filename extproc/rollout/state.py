"""Rollout state shared by every replica, the `RolloutStore` port, and its in-memory implementation.

A state changes only by compare-and-set on its `version`, so when several replicas reach the same
verdict at once exactly one transition happens. Outcome windows are kept per (model, epoch): the
epoch changes whenever the step does, so each step is judged on its own samples, pooled across
replicas. Times are wall-clock seconds (shared by every replica).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, Protocol, get_args

from extproc.rollout.analysis import PoolWindow

__all__ = [
    "MANUAL",
    "Command",
    "MemoryRolloutStore",
    "RolloutState",
    "RolloutStore",
    "RolloutStoreUnavailable",
    "Status",
]

Status = Literal["running", "paused", "promoted", "rolled_back", "aborted"]
Command = Literal["promote", "pause", "resume", "abort", "restart"]

# Which manual command is allowed from which status (anything else is refused with a reason).
MANUAL: dict[Command, frozenset[Status]] = {
    "promote": frozenset({"running", "paused"}),
    "pause": frozenset({"running"}),
    "resume": frozenset({"paused"}),
    "abort": frozenset({"running", "paused", "promoted"}),
    "restart": frozenset({"running", "paused", "promoted", "rolled_back", "aborted"}),
}


class RolloutStoreUnavailable(Exception):
    """The rollout store could not be reached; callers keep their cached state and retry later."""


@dataclass(frozen=True, slots=True)
class RolloutState:
    model: str
    canary: str
    baseline: str
    step: int  # index into the rollout's steps
    weight: float  # canary percent of the canary + baseline share
    status: Status
    reason: str
    updated_at: float
    step_started_at: float
    epoch: int  # changes with every step (and on resume/restart): names the outcome window
    version: int  # compare-and-set counter, 1 for the first saved state

    @property
    def active(self) -> bool:
        """Still under analysis (a paused rollout is watched for breaches, never promoted)."""
        return self.status in ("running", "paused")

    def next(self, **changes: Any) -> RolloutState:
        """The successor state: version + 1, plus the given changes."""
        return replace(self, version=self.version + 1, **changes)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> RolloutState:
        data = json.loads(text)
        status = data["status"]
        if status not in get_args(Status):
            raise ValueError(f"unknown rollout status {status!r}")
        return cls(model=str(data["model"]), canary=str(data["canary"]), baseline=str(data["baseline"]),
                   step=int(data["step"]), weight=float(data["weight"]), status=status,
                   reason=str(data["reason"]), updated_at=float(data["updated_at"]),
                   step_started_at=float(data["step_started_at"]), epoch=int(data["epoch"]),
                   version=int(data["version"]))


class RolloutStore(Protocol):
    async def load(self, model: str) -> RolloutState | None:
        """The current state of the model's rollout, None if none was ever saved."""
        ...

    async def save(self, state: RolloutState, expected_version: int) -> bool:
        """Store `state` only if the stored version is `expected_version` (0: nothing stored yet)."""
        ...

    async def add_outcomes(self, model: str, epoch: int, windows: Mapping[str, PoolWindow]) -> None:
        """Add a replica's outcome deltas (pool -> window) to the model's window of `epoch`."""
        ...

    async def load_outcomes(self, model: str, epoch: int) -> dict[str, PoolWindow]:
        """Every replica's outcomes of `epoch` so far, per pool."""
        ...

    async def close(self) -> None: ...


class MemoryRolloutStore:
    """One process only (the embedded default); state does not survive a restart."""

    def __init__(self) -> None:
        self._states: dict[str, RolloutState] = {}
        self._outcomes: dict[tuple[str, int], dict[str, dict[str, float]]] = {}

    async def load(self, model: str) -> RolloutState | None:
        return self._states.get(model)

    async def save(self, state: RolloutState, expected_version: int) -> bool:
        current = self._states.get(state.model)
        if (current.version if current is not None else 0) != expected_version:
            return False
        self._states[state.model] = state
        return True

    async def add_outcomes(self, model: str, epoch: int, windows: Mapping[str, PoolWindow]) -> None:
        pools = self._outcomes.setdefault((model, epoch), {})
        for pool, window in windows.items():
            counters = pools.setdefault(pool, {})
            for name, value in window.to_counters().items():
                counters[name] = counters.get(name, 0.0) + value
        for key in [k for k in self._outcomes if k[0] == model and k[1] < epoch - 1]:
            del self._outcomes[key]  # older steps are never read again

    async def load_outcomes(self, model: str, epoch: int) -> dict[str, PoolWindow]:
        pools = self._outcomes.get((model, epoch), {})
        return {pool: PoolWindow.from_counters(counters) for pool, counters in pools.items()}

    async def close(self) -> None:
        return None
