"""`Rollouts`: applies the stored rollout state to splits and moves rollouts along.

Every replica runs one. The request path only calls the synchronous `current_weights` (a cache)
and `record` (local counters). A background loop, every `refresh_interval_s`, flushes the local
outcome counters to the store, re-reads every rollout state (so replicas converge on the same
weights within about one interval), and every `analysis_interval_s` judges each active rollout on
the outcomes pooled from every replica. A transition (`extproc.rollout.transitions`) is a compare-and-set on
the state's version: when several replicas reach the same verdict at once, exactly one transition happens.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from extproc.aio import Sleep
from extproc.periodic import Periodic
from extproc.rollout.analysis import OutcomeWindows, PoolWindow, Verdict, analyse
from extproc.rollout.config import SplitConfig
from extproc.rollout.split import split_weights
from extproc.rollout.state import MANUAL, Command, RolloutState, RolloutStore, RolloutStoreUnavailable
from extproc.rollout.transitions import after_verdict, by_operator, started

__all__ = ["RolloutError", "Rollouts", "Weights"]

log = logging.getLogger(__name__)

Weights = dict[str, float]  # pool -> normalised weight (sum 1)
WeightsListener = Callable[[Mapping[str, Weights]], Awaitable[None]]
_CAS_ATTEMPTS = 5


class RolloutError(Exception):
    """A manual command was refused: unknown model, no rollout configured, or wrong status."""


class Rollouts:
    def __init__(self, store: RolloutStore, splits: Iterable[SplitConfig] = (), *,
                 clock: Callable[[], float] = time.time, refresh_interval_s: float = 1.0,
                 on_weights: WeightsListener | None = None,
                 on_transition: Callable[[RolloutState], None] | None = None,
                 sleep: Sleep = asyncio.sleep) -> None:
        """`clock`: wall-clock seconds (shared by replicas). `on_weights` is awaited with every model's
        weights whenever any of them changes (e.g. to rewrite Envoy's fallback route); `on_transition`
        is called with every state this replica saved (metrics, logs). `sleep` waits between refreshes."""
        self._store = store
        self._clock = clock
        # A store that cannot be reached keeps the cached weights (logged once, and its recovery).
        self._loop = Periodic("rollouts", self.tick, refresh_interval_s, log=log,
                              expected=(RolloutStoreUnavailable,), sleep=sleep)
        self._on_weights = on_weights
        self._on_transition = on_transition
        self._splits: dict[str, SplitConfig] = {}
        self._states: dict[str, RolloutState] = {}
        self._weights: dict[str, Weights] = {}
        self._published: dict[str, Weights] | None = None
        self._watched: frozenset[str] = frozenset()
        self._pending = OutcomeWindows()
        self._analysed_at: dict[str, float] = {}
        self.verdicts: dict[str, Verdict] = {}
        self.configure(splits)

    # -- request path (synchronous) -----------------------------------------------------------------
    def split(self, model: str) -> SplitConfig | None:
        return self._splits.get(model)

    def current_weights(self, model: str) -> Weights:
        """Normalised pool weights to split `model` by now (empty if `model` is not a split)."""
        return self._weights.get(model, {})

    def all_weights(self) -> dict[str, Weights]:
        return dict(self._weights)

    def state(self, model: str) -> RolloutState | None:
        return self._states.get(model)

    def record(self, pool: str, ok: bool, ttft_s: float | None, tpot_s: float | None) -> None:
        """One finished request's outcome (ok = no 5xx); pools not under analysis are ignored."""
        if pool in self._watched:
            self._pending.record(pool, ok, ttft_s, tpot_s, self._clock())

    # -- configuration --------------------------------------------------------------------------------
    def configure(self, splits: Iterable[SplitConfig]) -> None:
        """Adopt the splits of a new policy snapshot; rollouts start or restart on the next refresh."""
        self._splits = {split.model: split for split in splits}
        self._states = {m: s for m, s in self._states.items() if self._matches(s)}
        self._recompute()

    def _matches(self, state: RolloutState) -> bool:
        split = self._splits.get(state.model)
        rollout = split.rollout if split is not None else None
        return rollout is not None and (rollout.canary, rollout.baseline) == (state.canary, state.baseline)

    def _recompute(self) -> None:
        weights: dict[str, Weights] = {}
        watched: set[str] = set()
        for model, split in self._splits.items():
            if split.rollout is None:
                weights[model] = split_weights(split)
                continue
            state = self._states.get(model)
            # Unknown state (store not read yet): the baseline keeps all traffic.
            weights[model] = split_weights(split, state.weight if state is not None else 0.0)
            if state is not None and state.active:
                watched.update((state.canary, state.baseline))
        self._weights = weights
        self._watched = frozenset(watched)

    # -- background work ------------------------------------------------------------------------------
    async def start(self) -> None:
        """First refresh (errors logged, never raised), then the loop."""
        await self._loop.run_once(self.refresh)
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    @property
    def store_ok(self) -> bool:
        """Whether the last refresh worked (the store answered)."""
        return not self._loop.failures.failing

    async def tick(self) -> list[RolloutState]:
        """Flush outcomes, refresh states, analyse rollouts whose interval is due; returns the
        transitions this replica made."""
        await self.flush()
        await self.refresh()
        made: list[RolloutState] = []
        now = self._clock()
        for model, state in list(self._states.items()):
            split = self._splits.get(model)
            if split is None or split.rollout is None or not state.active:
                continue
            if now - self._analysed_at.get(model, -math.inf) < split.rollout.analysis_interval_s:
                continue
            self._analysed_at[model] = now
            verdict = await self.analyse(model)
            new = after_verdict(state, verdict, split.rollout, now)
            if new is not None and await self._commit(state, new):
                made.append(new)
        return made

    async def flush(self) -> None:
        """Send local outcome counters to the store, under each active rollout's current epoch."""
        taken = self._pending.take()
        if not taken:
            return
        try:
            for model, state in self._states.items():
                mine = {p: w for p, w in taken.items() if p in (state.canary, state.baseline)}
                if state.active and mine:
                    await self._store.add_outcomes(model, state.epoch, mine)
        except RolloutStoreUnavailable:
            self._pending.restore(taken)  # may count some twice if a partial write landed; rare
            raise

    async def refresh(self) -> None:
        """Re-read every rollout's state; start a rollout that has none (or whose pools changed)."""
        for model, split in list(self._splits.items()):
            rollout = split.rollout
            if rollout is None:
                continue
            state = await self._store.load(model)
            if state is None or (state.canary, state.baseline) != (rollout.canary, rollout.baseline):
                fresh = started(model, rollout, self._clock(), state)
                if await self._store.save(fresh, state.version if state else 0):
                    self._announce(fresh)
                    state = fresh
                else:
                    state = await self._store.load(model)
            if state is not None:
                self._states[model] = state
        self._recompute()
        await self._publish()

    async def _publish(self) -> None:
        if self._on_weights is None or self._weights == self._published:
            return
        self._published = {m: dict(w) for m, w in self._weights.items()}
        await self._on_weights(self._published)

    async def analyse(self, model: str) -> Verdict:
        """The verdict on the current step now, from every replica's pooled outcomes (no action)."""
        state = self._states.get(model)
        split = self._splits.get(model)
        if state is None or split is None or split.rollout is None:
            raise RolloutError(f"no rollout for model {model!r}")
        windows = await self._store.load_outcomes(model, state.epoch)
        verdict = analyse(windows.get(state.canary, PoolWindow()), windows.get(state.baseline, PoolWindow()),
                          split.rollout, self._clock(), state.step_started_at)
        self.verdicts[model] = verdict
        return verdict

    async def _commit(self, old: RolloutState, new: RolloutState) -> bool:
        if await self._store.save(new, old.version):
            self._states[new.model] = new
            self._announce(new)
            self._recompute()
            await self._publish()
            return True
        log.info("rollout %s: another replica changed the state first", old.model)
        latest = await self._store.load(old.model)
        if latest is not None:
            self._states[old.model] = latest
            self._recompute()
        return False

    def _announce(self, state: RolloutState) -> None:
        log.info("rollout %s: %s at %g%% (%s)", state.model, state.status, state.weight, state.reason)
        if self._on_transition is not None:
            self._on_transition(state)

    # -- manual commands (admin API / CLI) -------------------------------------------------------------
    async def promote(self, model: str, to_end: bool = False) -> RolloutState:
        """Next step now (or straight to 100% with `to_end`), without waiting for analysis."""
        return await self._command(model, "promote", to_end)

    async def pause(self, model: str) -> RolloutState:
        """Freeze the weight: no automatic promotion (a breach still rolls back)."""
        return await self._command(model, "pause")

    async def resume(self, model: str) -> RolloutState:
        """Continue a paused rollout; the current step's hold and samples start over."""
        return await self._command(model, "resume")

    async def abort(self, model: str) -> RolloutState:
        """All traffic back to the baseline; stays so until `restart` or a new canary in the policy."""
        return await self._command(model, "abort")

    async def restart(self, model: str) -> RolloutState:
        """Start the rollout again from its first step."""
        return await self._command(model, "restart")

    async def _command(self, model: str, command: Command, to_end: bool = False) -> RolloutState:
        split = self._splits.get(model)
        if split is None or split.rollout is None:
            raise RolloutError(f"no rollout configured for model {model!r}")
        for _ in range(_CAS_ATTEMPTS):
            await self.refresh()
            state = self._states.get(model)
            if state is None:
                raise RolloutError(f"rollout state of {model!r} is not in the store yet")
            if state.status not in MANUAL[command]:
                raise RolloutError(f"cannot {command} rollout {model!r}: it is {state.status}")
            new = by_operator(state, split.rollout, command, self._clock(), to_end)
            if await self._commit(state, new):
                return new
        raise RolloutError(f"rollout {model!r} kept changing; try again")

    def describe(self) -> list[dict[str, Any]]:
        """Every split with its weights and rollout state (for an admin endpoint)."""
        out: list[dict[str, Any]] = []
        for model, split in self._splits.items():
            state = self._states.get(model)
            verdict = self.verdicts.get(model)
            out.append({
                "model": model, "weights": self._weights.get(model, {}), "sticky_by": split.sticky_by,
                "rollout": None if state is None else {
                    "status": state.status, "step": state.step, "weight_percent": state.weight,
                    "canary": state.canary, "baseline": state.baseline, "reason": state.reason,
                    "updated_at": state.updated_at, "step_started_at": state.step_started_at,
                    "version": state.version,
                    "last_verdict": None if verdict is None else {
                        "action": verdict.action, "reason": verdict.reason, "stats": dict(verdict.stats)},
                },
            })
        return out
