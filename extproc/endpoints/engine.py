"""What an engine's scrapes teach about its limits: the learning half of the load model (`load.py` has the rules
in words and the views derived from this state)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from extproc.endpoints.config import SaturationConfig
from extproc.endpoints.metrics import EndpointMetrics

__all__ = ["BUDGET_BOUND", "KV_BOUND", "MIN_QUEUED_SCRAPES", "EngineState", "learn"]

# A queue run counts as a plateau of the batch when the fewest running requests in it are at least this
# share of the most: a full batch only loses the few requests that finished in the last step.
_PLATEAU = 0.75
MIN_QUEUED_SCRAPES = 3
KV_BOUND = 0.8
# A queue during which more than this share of the engine's steps were heavy (over half its largest step)
# is waiting for the token budget, not for seats.
BUDGET_BOUND = 0.75


@dataclass(slots=True)
class EngineState:
    """What the scrapes taught about an engine's limits; written only by `learn`."""

    peak_running: float = 0.0  # the most requests ever seen running at once
    queued_since: float | None = None  # first scrape of the current run of scrapes with requests waiting
    queued_scrapes: int = 0
    queued_low: float = 0.0  # fewest / most running during that run
    queued_high: float = 0.0
    queued_kv: float = 0.0  # highest KV use during that run
    queued_steps: tuple[float, float] | None = None  # (steps, heavy steps) counted when that run began
    step_bound: float = 0.0  # upper bound of the histogram bucket of the largest step ever seen
    capacity: float = 0.0  # learned concurrency at which it queues (0: not learned)
    confirmed_at: float = 0.0  # scrape time the capacity was last learned or confirmed


def learn(state: EngineState, metrics: EndpointMetrics, config: SaturationConfig) -> None:
    """What one scrape says about the engine's capacity (rules: `extproc.endpoints.load`)."""
    at = metrics.scraped_at
    state.peak_running = max(state.peak_running, metrics.running)
    steps = _step_counts(metrics, state)
    if metrics.waiting <= 0:
        state.queued_since = None
        return
    if state.queued_since is None:
        state.queued_since = at
        state.queued_scrapes = 0
        state.queued_low = state.queued_high = metrics.running
        state.queued_kv = 0.0
        state.queued_steps = steps
    state.queued_scrapes += 1
    state.queued_low = min(state.queued_low, metrics.running)
    state.queued_high = max(state.queued_high, metrics.running)
    state.queued_kv = max(state.queued_kv, metrics.kv_usage)
    lasted = state.queued_scrapes >= MIN_QUEUED_SCRAPES and at - state.queued_since >= config.sustain_ms / 1000.0
    plateau = state.queued_high > 0 and state.queued_low >= _PLATEAU * state.queued_high
    if lasted and plateau and state.queued_kv < KV_BOUND and not _budget_bound(state.queued_steps, steps):
        state.capacity = state.peak_running
        state.confirmed_at = at


def _step_counts(metrics: EndpointMetrics, state: EngineState) -> tuple[float, float] | None:
    """(steps, heavy steps) so far by the step-size histogram; None when the engine does not export it."""
    buckets = metrics.step_tokens_buckets
    if not buckets:
        return None
    previous = 0.0
    for bound, cumulative in buckets:
        if math.isfinite(bound) and cumulative > previous:
            state.step_bound = max(state.step_bound, bound)
        previous = cumulative
    total = buckets[-1][1]
    light = 0.0
    for bound, cumulative in buckets:
        if bound > state.step_bound / 2:
            break
        light = cumulative
    return total, total - light


def _budget_bound(start: tuple[float, float] | None, now: tuple[float, float] | None) -> bool:
    if start is None or now is None or now[0] <= start[0]:
        return False
    return (now[1] - start[1]) / (now[0] - start[0]) > BUDGET_BOUND
