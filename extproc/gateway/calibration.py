"""Prompt token estimates calibrated against the engines' own counts, per pool, without a tokenizer.

The service estimates a prompt's tokens from its characters (`extproc.openai.tokens`), which misses the
model's tokenizer and chat template (special tokens and headers per message). Every finished exchange whose
response carried usage tells the truth: the access log brings back our raw estimate (in the route's dynamic
metadata) next to `usage.prompt_tokens`. `PromptCalibration` fits real = a + b x estimate per pool by least
squares over exponentially decayed sums (recent traffic weighs most; a model swap re-learns in about
`half_life` exchanges) and answers calibrated estimates once it has seen `min_samples`.

Any replica may receive any exchange's access log entry, but every replica sees a sample of the same traffic,
so each learns the same relation. Estimates feed token-budget reservations (a burst admitted on
under-estimates would overshoot before usage settles) and the scheduler's load figures.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PromptCalibration"]

_MIN_SLOPE, _MAX_SLOPE = 0.25, 4.0


@dataclass(slots=True)
class _Fit:
    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    seen: int = 0
    slope: float = 1.0
    intercept: float = 0.0


class PromptCalibration:
    def __init__(self, half_life: int = 500, min_samples: int = 20) -> None:
        if half_life < 1 or min_samples < 1:
            raise ValueError("half_life and min_samples must be >= 1")
        self._decay = 0.5 ** (1.0 / half_life)
        self.min_samples = min_samples
        self._fits: dict[str, _Fit] = {}

    def observe(self, pool: str, estimate: int, real: int) -> None:
        """One exchange of `pool`: our raw estimate and the engine's usage.prompt_tokens."""
        if estimate <= 0 or real <= 0:
            return
        fit = self._fits.get(pool)
        if fit is None:
            fit = self._fits[pool] = _Fit()
        d = self._decay
        x, y = float(estimate), float(real)
        fit.n, fit.sx, fit.sy = fit.n * d + 1.0, fit.sx * d + x, fit.sy * d + y
        fit.sxx, fit.sxy = fit.sxx * d + x * x, fit.sxy * d + x * y
        fit.seen += 1
        mean_x, mean_y = fit.sx / fit.n, fit.sy / fit.n
        variance = fit.sxx / fit.n - mean_x * mean_x
        if variance > 1e-6 * max(1.0, mean_x * mean_x):
            slope = (fit.sxy / fit.n - mean_x * mean_y) / variance
            fit.slope = min(_MAX_SLOPE, max(_MIN_SLOPE, slope))
            fit.intercept = mean_y - fit.slope * mean_x
        else:  # prompts of one length so far: a ratio is all the data supports
            fit.slope, fit.intercept = min(_MAX_SLOPE, max(_MIN_SLOPE, mean_y / mean_x)), 0.0

    def tokens(self, pool: str, estimate: int) -> int:
        """The calibrated estimate (the raw one until the pool has `min_samples` observations)."""
        fit = self._fits.get(pool)
        if fit is None or fit.seen < self.min_samples or estimate <= 0:
            return estimate
        return max(1, round(fit.intercept + fit.slope * estimate), round(_MIN_SLOPE * estimate))

    def describe(self) -> dict[str, dict[str, float]]:
        """Per pool: observations, slope, intercept (for /debug and tests)."""
        return {pool: {"observations": fit.seen, "slope": round(fit.slope, 4), "intercept": round(fit.intercept, 2)}
                for pool, fit in self._fits.items()}
