"""Prompt token estimates calibrated against the engines' own counts, per pool, without a tokenizer.

The service estimates a prompt's tokens from its characters (`extproc.openai.tokens`), which misses the
model's tokenizer and chat template (special tokens and headers per message). Every finished exchange whose
response carried usage tells the truth: the access log brings back our raw estimate (in the route's dynamic
metadata) next to `usage.prompt_tokens`. `PromptCalibration` fits real = a + b x estimate per pool by least
squares over exponentially decayed sums (recent traffic weighs most; a model swap re-learns in about
`half_life` exchanges) and answers calibrated estimates once it has seen `min_samples`.

Envoy's access log streams go to whichever replicas its gRPC connections picked, so some replicas may see
few entries. The fit's statistics are sums, so replicas sharing Redis add them up
(`extproc.server.calibration_sync`): `export` gives this replica's sums, `adopt` the others', and estimates
come from the combined fit once it has `min_samples`. Estimates feed the scheduler's load figures, and,
as an upper bound (`margin_sd`: the fit plus that many standard deviations of its recent relative errors,
measured on exchanges it had not seen; `limits.prompt_reserve_sd`), token-budget reservations: a burst
admitted on under-estimates would overshoot before usage settles, while an over-estimate is given back
when it settles.
"""

from __future__ import annotations

import math
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
    errors: float = 0.0  # decayed count of the fit's predictions checked against real counts
    squared: float = 0.0  # decayed sum of their squared relative errors
    slope: float = 1.0
    intercept: float = 0.0


class PromptCalibration:
    def __init__(self, half_life: int = 500, min_samples: int = 20) -> None:
        if half_life < 1 or min_samples < 1:
            raise ValueError("half_life and min_samples must be >= 1")
        self._decay = 0.5 ** (1.0 / half_life)
        self.min_samples = min_samples
        self._fits: dict[str, _Fit] = {}  # this replica's observations
        self._shared: dict[str, _Fit] = {}  # combined with the other replicas' (last `adopt`)

    def observe(self, pool: str, estimate: int, real: int) -> None:
        """One exchange of `pool`: our raw estimate and the engine's usage.prompt_tokens."""
        if estimate <= 0 or real <= 0:
            return
        fit = self._fits.get(pool)
        if fit is None:
            fit = self._fits[pool] = _Fit()
        d = self._decay
        x, y = float(estimate), float(real)
        in_use = self._in_use(pool)
        if in_use is not None and in_use.seen >= self.min_samples:  # a fit was in use: how far off was it
            predicted = self.tokens(pool, estimate)
            fit.errors, fit.squared = fit.errors * d + 1.0, fit.squared * d + ((y - predicted) / predicted) ** 2
        fit.n, fit.sx, fit.sy = fit.n * d + 1.0, fit.sx * d + x, fit.sy * d + y
        fit.sxx, fit.sxy = fit.sxx * d + x * x, fit.sxy * d + x * y
        fit.seen += 1
        _solve(fit)

    def tokens(self, pool: str, estimate: int, margin_sd: float = 0.0) -> int:
        """The calibrated estimate: from the fleet's combined fit, else this replica's, once it has
        `min_samples` observations; the raw estimate before. `margin_sd`: plus that many standard
        deviations of the fit's relative error."""
        fit = self._in_use(pool)
        if fit is None or fit.seen < self.min_samples or estimate <= 0:
            return estimate
        tokens = max(1, round(fit.intercept + fit.slope * estimate), round(_MIN_SLOPE * estimate))
        if margin_sd > 0.0 and fit.errors > 0.0:
            tokens = math.ceil(tokens * (1.0 + margin_sd * math.sqrt(fit.squared / fit.errors)))
        return tokens

    def export(self) -> dict[str, list[float]]:
        """This replica's sums per pool: [n, sx, sy, sxx, sxy, observations, errors, squared errors]."""
        return {pool: [f.n, f.sx, f.sy, f.sxx, f.sxy, float(f.seen), f.errors, f.squared]
                for pool, f in self._fits.items()}

    def adopt(self, others: list[dict[str, list[float]]]) -> None:
        """Combine the other replicas' exported sums with this replica's (the fleet's fit per pool)."""
        shared: dict[str, _Fit] = {}
        for sums in [self.export(), *others]:
            for pool, values in sums.items():
                if len(values) not in (6, 8) or not all(isinstance(v, int | float) for v in values):
                    continue  # 6: a replica of the previous version, without error sums
                fit = shared.setdefault(pool, _Fit())
                fit.n, fit.sx, fit.sy = fit.n + values[0], fit.sx + values[1], fit.sy + values[2]
                fit.sxx, fit.sxy, fit.seen = fit.sxx + values[3], fit.sxy + values[4], fit.seen + int(values[5])
                if len(values) == 8:
                    fit.errors, fit.squared = fit.errors + values[6], fit.squared + values[7]
        for fit in shared.values():
            if fit.n > 0:
                _solve(fit)
        self._shared = shared

    def describe(self) -> dict[str, dict[str, float]]:
        """Per pool: observations, slope, intercept of the fit in use (for /debug and tests)."""
        described = {}
        for pool in {*self._fits, *self._shared}:
            fit = self._in_use(pool)
            if fit is not None:
                described[pool] = {"observations": fit.seen, "slope": round(fit.slope, 4),
                                   "intercept": round(fit.intercept, 2), "error_sd": round(
                                       math.sqrt(fit.squared / fit.errors) if fit.errors else 0.0, 4)}
        return described

    def _in_use(self, pool: str) -> _Fit | None:
        """The fleet's combined fit once it has `min_samples`, else this replica's own (if any)."""
        shared, own = self._shared.get(pool), self._fits.get(pool)
        if shared is not None and shared.seen >= self.min_samples:
            return shared
        return own or shared


def _solve(fit: _Fit) -> None:
    mean_x, mean_y = fit.sx / fit.n, fit.sy / fit.n
    variance = fit.sxx / fit.n - mean_x * mean_x
    if variance > 1e-6 * max(1.0, mean_x * mean_x):
        slope = (fit.sxy / fit.n - mean_x * mean_y) / variance
        fit.slope = min(_MAX_SLOPE, max(_MIN_SLOPE, slope))
        fit.intercept = mean_y - fit.slope * mean_x
    else:  # prompts of one length so far: a ratio is all the data supports
        fit.slope, fit.intercept = min(_MAX_SLOPE, max(_MIN_SLOPE, mean_y / mean_x)), 0.0
