"""The step-cost model: a step's time predicted from its shape (backends/step_shape.py), refitted online.

The fit is least squares over a sliding window of measured steps, with three guards:
- relative residuals (each step weighted by 1 / its time), so that the short decode steps an ITL target is
  about count as much as long prefills;
- recent steps weigh more (a half-life in steps), so a machine that slows down is followed within a few dozen
  steps;
- Huber weights: a step the fit misses by far (a noisy neighbour, a page-fault storm) counts less.
It is pulled toward the backend's guess (the prior) by a few pseudo-observations, which decide the coefficients
the window cannot (a feature that never varied), and coefficients stay non-negative.

`headroom` is how much longer than predicted the recent steps that mixed prefill into decoding ran (a high
quantile of measured / predicted, at least 1): the planner divides its target by it, so a model that has
drifted low costs chunk size, not stalls.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from backends.step_shape import FEATURES, CostCoefficients, StepShape

FloatArray = np.ndarray


class StepCostModel:
    def __init__(self, prior: CostCoefficients, *, window: int = 256, refit_every: int = 16,
                 half_life: float = 64.0, prior_weight: float = 2.0, headroom_quantile: float = 0.98,
                 max_headroom: float = 2.0) -> None:
        self.prior = prior
        self.coefficients = prior
        self._named = tuple(zip(FEATURES, prior.values(), strict=True))
        self.refit_every, self.half_life, self.prior_weight = refit_every, half_life, prior_weight
        self.headroom_quantile, self.max_headroom = headroom_quantile, max_headroom
        self._features: deque[tuple[float, ...]] = deque(maxlen=window)
        self._seconds: deque[float] = deque(maxlen=window)
        self._ratios: deque[float] = deque(maxlen=100)  # measured / predicted, steps that mixed prefill in
        self._since_fit = 0
        self.observed = 0

    @property
    def named_coefficients(self) -> tuple[tuple[str, float], ...]:
        return self._named

    def predict(self, shape: StepShape) -> float:
        return self.coefficients.seconds(shape)

    def observe(self, shape: StepShape, seconds: float, predicted: float = 0.0, mixed: bool = False) -> None:
        """A measured step. `predicted`: what this model said when it was planned; `mixed`: it carried
        prefill tokens beside decoding sequences (the steps an ITL target sizes)."""
        if not (seconds > 0 and np.isfinite(seconds)):
            return
        self._features.append(shape.features(self.prior.large_above))
        self._seconds.append(seconds)
        self.observed += 1
        if mixed and predicted > 0:
            self._ratios.append(seconds / predicted)
        self._since_fit += 1
        if self._since_fit >= self.refit_every:
            self.refit()

    def refit(self) -> None:
        self._since_fit = 0
        if len(self._seconds) >= 2:
            x, y = np.array(self._features), np.array(self._seconds)
            self.coefficients = fit(x, y, self.prior, self.prior_weight, self.half_life)
            self._named = tuple(zip(FEATURES, self.coefficients.values(), strict=True))

    @property
    def headroom(self) -> float:
        if len(self._ratios) < 4:
            return 1.0
        return min(self.max_headroom, max(1.0, float(np.quantile(self._ratios, self.headroom_quantile))))


def fit(x: FloatArray, y: FloatArray, prior: CostCoefficients, prior_weight: float,
        half_life: float) -> CostCoefficients:
    """Coefficients for steps x (n, len(FEATURES)) that took y seconds (oldest first)."""
    age = np.arange(len(y) - 1, -1, -1, dtype=np.float64)
    weights = 0.5 ** (age / half_life) / y
    p = np.array(prior.values())
    coef = _solve(x, y, weights, p, prior_weight)
    for _ in range(2):
        residuals = np.abs(x @ coef - y) / y
        spread = 1.4826 * float(np.median(residuals)) + 1e-6
        coef = _solve(x, y, weights * np.minimum(1.0, 1.345 * spread / np.maximum(residuals, 1e-12)), p,
                      prior_weight)
    return prior.with_values(coef.tolist())


def _solve(x: FloatArray, y: FloatArray, weights: FloatArray, prior: FloatArray, prior_weight: float
           ) -> FloatArray:
    """Weighted least squares, each coefficient pulled toward the prior as by `prior_weight` steps of the
    window's typical size in its feature; a coefficient that comes out negative is held at 0 and the rest
    refitted (at most once per coefficient)."""
    wx, wy = x * weights[:, None], y * weights
    scale = np.sqrt(np.mean(wx * wx, axis=0))  # 0 for a feature the window never had
    coef = prior.copy()
    free = scale > 0
    for _ in range(len(prior)):
        a = np.vstack([wx[:, free], np.sqrt(prior_weight) * np.diag(scale[free])])
        b = np.concatenate([wy - wx[:, ~free] @ coef[~free], np.sqrt(prior_weight) * scale[free] * prior[free]])
        coef[free] = np.linalg.lstsq(a, b, rcond=None)[0]
        negative = free & (coef < 0)
        if not negative.any():
            return coef
        coef[negative], free = 0.0, free & ~negative
    return np.maximum(coef, 0.0)
