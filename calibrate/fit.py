"""Weighted least squares for relative error (numpy only) and fit-quality figures.

Every row ``i`` of ``X @ coef ≈ y`` is divided by ``y_i``, so the fit minimises the sum of squared
*relative* errors: a 50 µs point counts as much as a 50 ms one. Coefficients are kept non-negative
(a negative intercept or slope would give negative times for some inputs): a coefficient that comes
out negative is fixed at zero and the rest refitted (a small active-set loop; exact when the
unconstrained optimum is already non-negative).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.costs.least_squares import least_squares


@dataclass(frozen=True)
class LinearFit:
    names: tuple[str, ...]
    coef: tuple[float, ...]

    def predict(self, features: Any) -> np.ndarray:
        # (Each row's products summed exactly, not ``@``: BLAS kernels round by CPU, sim/costs/least_squares.py.)
        terms = np.asarray(features, dtype=float) * np.asarray(self.coef, dtype=float)
        return np.array([math.fsum(row) for row in terms.reshape(-1, len(self.coef)).tolist()]).reshape(
            terms.shape[:-1]
        )

    def __getitem__(self, name: str) -> float:
        return self.coef[self.names.index(name)]

    def as_dict(self) -> dict[str, float]:
        return dict(zip(self.names, self.coef, strict=True))


def fit_relative(features: Any, y: Any, names: Sequence[str], *, nonnegative: bool = True) -> LinearFit:
    """Fit ``y ≈ features @ coef`` minimising squared relative error. ``y`` must be positive."""
    x = np.asarray(features, dtype=float)
    target = np.asarray(y, dtype=float)
    if x.ndim != 2 or x.shape[0] != target.shape[0] or x.shape[1] != len(names):
        raise ValueError(f"features {x.shape} do not match y {target.shape} and names {list(names)}")
    if np.any(target <= 0):
        raise ValueError("relative-error fit needs positive targets")
    if x.shape[0] < x.shape[1]:
        raise ValueError(f"{x.shape[0]} points cannot determine {x.shape[1]} coefficients {list(names)}")
    weighted_x = x / target[:, None]
    ones = np.ones_like(target)
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        solution = least_squares(weighted_x[:, active], ones)  # (the same bits on every machine)
        coef[:] = 0.0
        coef[active] = solution
        negative = [index for index in active if coef[index] < 0]
        if not nonnegative or not negative:
            break
        worst = min(negative, key=lambda index: coef[index])
        active.remove(worst)
        coef[worst] = 0.0
    return LinearFit(tuple(names), tuple(float(value) for value in coef))


def quality(y: Any, predicted: Any) -> dict[str, float | int]:
    """R² (of the absolute values), mean and max relative error, the signed extremes of the relative
    error (negative: predicted too fast), number of points."""
    target = np.asarray(y, dtype=float)
    guess = np.asarray(predicted, dtype=float)
    if target.size == 0:
        return {"n_points": 0}
    relative = np.abs(guess - target) / target
    result: dict[str, float | int] = {
        "n_points": int(target.size),
        "mean_rel_err": float(relative.mean()),
        "max_rel_err": float(relative.max()),
        "min_signed_rel_err": float(((guess - target) / target).min()),
        "max_signed_rel_err": float(((guess - target) / target).max()),
    }
    spread = float(np.sum((target - target.mean()) ** 2))
    if target.size >= 3 and spread > 0:
        result["r2"] = float(1.0 - np.sum((target - guess) ** 2) / spread)
    return result
