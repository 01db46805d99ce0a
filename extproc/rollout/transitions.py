"""How a rollout's state moves: pure functions of (state, the rollout's configuration, what happened, now).

The controller (`extproc.rollout.controller`) decides *when* (an analysis verdict, an operator's command) and
saves the result by compare-and-set; this module alone says *what* the next state is. Every successor has the
version + 1; a new step, a resume or a restart also starts a new epoch (fresh outcome windows).
"""

from __future__ import annotations

from extproc.rollout.analysis import Verdict
from extproc.rollout.config import RolloutConfig
from extproc.rollout.state import Command, RolloutState

__all__ = ["after_verdict", "by_operator", "started"]


def started(model: str, rollout: RolloutConfig, now: float, replaced: RolloutState | None) -> RolloutState:
    """A rollout at its first step, for a model with no state (or whose state names other pools: `replaced`)."""
    first = rollout.steps[0]
    return RolloutState(model, rollout.canary, rollout.baseline, 0, first, "running", f"started at {first:g}%", now,
                        now, (replaced.epoch + 1) if replaced else 1, (replaced.version + 1) if replaced else 1)


def after_verdict(state: RolloutState, verdict: Verdict, rollout: RolloutConfig, now: float) -> RolloutState | None:
    """What an analysis verdict does: roll back (from running or paused), promote (running only), or nothing."""
    if verdict.action == "rollback":
        return state.next(status="rolled_back", weight=0.0, updated_at=now,
                          reason=f"rolled back at {state.weight:g}%: {verdict.reason}")
    if verdict.action == "promote" and state.status == "running":
        return _advanced(state, rollout, now, verdict.reason)
    return None


def by_operator(state: RolloutState, rollout: RolloutConfig, command: Command, now: float,
                to_end: bool = False) -> RolloutState:
    """What an operator's command does (the caller has checked it is allowed from `state.status`: `MANUAL`)."""
    if command == "promote":
        return _advanced(state, rollout, now, "by operator", to_end)
    if command == "pause":
        return state.next(status="paused", updated_at=now, reason="paused by operator")
    if command == "resume":
        return state.next(status="running", updated_at=now, step_started_at=now, epoch=state.epoch + 1,
                          reason="resumed by operator")
    if command == "abort":
        return state.next(status="aborted", weight=0.0, updated_at=now, reason="aborted by operator")
    first = rollout.steps[0]
    return state.next(status="running", step=0, weight=first, updated_at=now, step_started_at=now,
                      epoch=state.epoch + 1, reason=f"restarted by operator at {first:g}%")


def _advanced(state: RolloutState, rollout: RolloutConfig, now: float, why: str, to_end: bool = False) -> RolloutState:
    steps = rollout.steps
    step = state.step + 1
    if to_end or step >= len(steps) or steps[step] >= 100.0:
        return state.next(status="promoted", step=len(steps) - 1, weight=100.0, updated_at=now,
                          step_started_at=now, epoch=state.epoch + 1, reason=f"promoted to 100%: {why}")
    return state.next(status="running", step=step, weight=steps[step], updated_at=now, step_started_at=now,
                      epoch=state.epoch + 1, reason=f"step {step + 1}/{len(steps)} at {steps[step]:g}%: {why}")
