"""Least squares that give the same bits on every machine.

``numpy.linalg.lstsq`` calls LAPACK through the BLAS kernels that OpenBLAS picks for the CPU it runs
on, and they round differently (an AMD Zen and an AVX-512 Intel gave fits a few units in the last
place apart). Every cost and latency downstream of a fit moved with them: a run did not give the same
numbers on two machines, and results recorded on one (tests/golden/summaries.json) failed on another.

The fits kvsim makes are small (a handful of columns, tens to hundreds of rows), so they are solved
here by Householder QR written in elementwise IEEE arithmetic, which is correctly rounded on every
machine, with every sum rounded once from its exact value (``math.fsum``). A design whose columns are
(numerically) dependent has no unique solution; it goes to ``lstsq`` for its minimum-norm one, as
before.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["least_squares"]

# A column whose part orthogonal to the columns before it is below this share of the largest column
# norm counts as dependent on them (LAPACK's default cut-off for lstsq, rcond=None, is eps * max(m, n)
# of the largest singular value).
_DEPENDENT = np.finfo(float).eps


def least_squares(design: Any, target: Any) -> np.ndarray:
    """``x`` minimising ``|design @ x - target|`` (2-norm); ``design`` has at least as many rows as
    columns."""
    matrix = np.array(design, dtype=float)  # (copies: reduced in place)
    rhs = np.array(target, dtype=float)
    rows, columns = matrix.shape
    if rows < columns or rhs.shape != (rows,):
        raise ValueError(f"a least-squares fit of {columns} columns needs as many rows, got {matrix.shape}")
    scale = max((_norm(matrix[:, column]) for column in range(columns)), default=0.0)
    cutoff = _DEPENDENT * max(rows, columns) * scale
    for column in range(columns):
        reflector = matrix[column:, column].copy()
        norm = _norm(reflector)
        if norm <= cutoff:
            return _minimum_norm(design, target)
        alpha = -math.copysign(norm, reflector[0])
        reflector[0] -= alpha
        length2 = _dot(reflector, reflector)
        for other in range(column, columns):
            _reflect(matrix[column:, other], reflector, length2)
        _reflect(rhs[column:], reflector, length2)
    return _back_substitute(matrix[:columns, :columns], rhs[:columns])


def _reflect(vector: np.ndarray, reflector: np.ndarray, length2: float) -> None:
    """``vector -= 2 v (v . vector) / (v . v)`` in place (``v``: the Householder reflector)."""
    vector -= reflector * (2.0 * _dot(reflector, vector) / length2)


def _back_substitute(upper: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    columns = len(rhs)
    solution = np.zeros(columns)
    for row in range(columns - 1, -1, -1):
        known = math.fsum(upper[row, after] * solution[after] for after in range(row + 1, columns))
        solution[row] = (rhs[row] - known) / upper[row, row]
    return solution


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    return math.fsum((a * b).tolist())


def _norm(vector: np.ndarray) -> float:
    # (Squares below 1e-308 underflow: kvsim fits seconds and token counts, never such numbers.)
    return math.sqrt(_dot(vector, vector))


def _minimum_norm(design: Any, target: Any) -> np.ndarray:
    solution, *_ = np.linalg.lstsq(
        np.asarray(design, dtype=float), np.asarray(target, dtype=float), rcond=None
    )
    return np.asarray(solution, dtype=float)
