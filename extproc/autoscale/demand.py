"""`DemandTracker`: a pool's demand over time, and the figure an autoscaler should act on. Sans-IO.

Demand at a sample is what the pool carries and waits for: its engines' running + waiting requests (the load
model's estimate, `extproc.endpoints.load`), plus the requests this service holds for it in flow control's
queue, held cold-start requests included. The figure reported to KEDA adds two things to it:

- a trend: the least-squares slope of demand over `trend_window_s`, projected `predict_s` ahead when it rises
  (never when it falls: a forecast may bring capacity early, never take it away);
- scale-down stabilisation: never less than the highest demand of the last `scale_down_stabilization_s`, so
  a rise is reported at once and a fall only once it has lasted the window (no flapping on a noisy load).
  Only the present sample is projected: a window of past projections would keep the noisiest slope's
  forecast for the whole window.

With `smoothing_s`, "demand" in both is the mean of the samples of the last `smoothing_s` (a rise then shows in
full within it): the highest of many instantaneous samples of a busy pool is a high quantile of its in-flight
count, not the load it carries (measured: a window's highest raw sample near twice the mean, `extproc bench
autoscale`), and the HPA would buy replicas for that noise.

The pool is active (KEDA scales it from zero) while that figure is above zero or a request is held for it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from extproc.autoscale.config import AutoscalingConfig

__all__ = ["DemandTracker", "Estimate"]

MAX_SAMPLES = 100_000  # per pool: 3600 s of stabilisation at a 0.05 s interval is 72,000


@dataclass(frozen=True, slots=True)
class Estimate:
    demand: float  # requests now: engines' running + waiting, and queued here
    held: int  # of which held because the pool has no ready endpoint
    trend_per_s: float  # fitted over trend_window_s
    value: float  # reported: the projected demand, never below the window's highest

    @property
    def active(self) -> bool:
        return self.value > 0 or self.held > 0


@dataclass(slots=True)
class _Sample:
    at: float
    demand: float  # as sampled
    level: float  # the mean of the samples of the last smoothing_s, this one included


def slope(points: Iterable[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y); 0 with fewer than two distinct times."""
    xs: list[float] = []
    ys: list[float] = []
    for x, y in points:
        xs.append(x)
        ys.append(y)
    if len(xs) < 2:
        return 0.0
    mean_x = sum(xs) / len(xs)
    mean_y = sum(ys) / len(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx <= 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx


class DemandTracker:
    def __init__(self, config: Callable[[], AutoscalingConfig]) -> None:
        """`config()`: the current policy's autoscaling section, read at every sample."""
        self._config = config
        self._samples: dict[str, deque[_Sample]] = {}
        self._last: dict[str, Estimate] = {}

    def observe(self, pool: str, now: float, demand: float, held: int = 0) -> Estimate:
        """Record a sample of `pool`'s demand; returns the estimate it makes."""
        config = self._config()
        samples = self._samples.get(pool)
        if samples is None:
            samples = self._samples[pool] = deque(maxlen=MAX_SAMPLES)
        horizon = max(config.trend_window_s, config.scale_down_stabilization_s, config.smoothing_s)
        while samples and samples[0].at < now - horizon:
            samples.popleft()
        trend = 0.0
        if config.predict_s > 0:
            window = now - config.trend_window_s
            trend = slope([(s.at, s.demand) for s in samples if s.at >= window] + [(now, demand)])
        recent = [s.demand for s in samples if s.at > now - config.smoothing_s] if config.smoothing_s > 0 else []
        level = (sum(recent) + demand) / (len(recent) + 1)
        projected = max(0.0, level + max(0.0, trend) * config.predict_s)
        samples.append(_Sample(now, demand, level))
        since = now - config.scale_down_stabilization_s
        value = max(projected, max(s.level for s in samples if s.at >= since))
        estimate = self._last[pool] = Estimate(demand, held, trend, value)
        return estimate

    def estimate(self, pool: str) -> Estimate | None:
        """The last sample's estimate (None: never sampled)."""
        return self._last.get(pool)

    def keep(self, pools: Iterable[str]) -> None:
        """Forget pools no longer in the policy."""
        wanted = set(pools)
        for name in [n for n in self._samples if n not in wanted]:
            del self._samples[name]
            self._last.pop(name, None)
