"""sim/costs/least_squares.py: fits solved in elementwise IEEE arithmetic and exactly rounded sums,
the same bits on every machine (LAPACK's lstsq moved with the CPU's BLAS kernels)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.costs.least_squares import least_squares


def exact_normal_solution(design: list[list[float]], target: list[float]) -> list[Fraction]:
    """The least-squares solution in exact rationals: the normal equations by Gauss-Jordan."""
    rows = [[Fraction(value) for value in row] for row in design]
    rhs = [Fraction(value) for value in target]
    columns = len(rows[0])
    gram = [[sum(row[i] * row[j] for row in rows) for j in range(columns)] for i in range(columns)]
    moment = [sum(row[i] * value for row, value in zip(rows, rhs, strict=True)) for i in range(columns)]
    for pivot in range(columns):
        factor = gram[pivot][pivot]
        gram[pivot] = [value / factor for value in gram[pivot]]
        moment[pivot] /= factor
        for other in range(columns):
            if other != pivot:
                scale = gram[other][pivot]
                gram[other] = [a - scale * b for a, b in zip(gram[other], gram[pivot], strict=True)]
                moment[other] -= scale * moment[pivot]
    return moment


def test_a_line_through_three_points_by_hand():
    # y = 1, 2, 4 at x = 0, 1, 2: slope (sum (x - 1)(y - 7/3)) / 2 = 3/2, intercept 7/3 - 3/2 = 5/6.
    intercept, slope = least_squares([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]], [1.0, 2.0, 4.0])
    assert slope == pytest.approx(1.5, rel=1e-15)
    assert intercept == pytest.approx(5 / 6, rel=1e-15)


def test_a_consistent_system_is_solved_to_the_last_bits():
    design = [[1.0, 3.0], [2.0, -1.0], [4.0, 5.0], [0.5, 0.25]]
    target = [1.0 * 7 + 3.0 * -2, 2.0 * 7 + 1.0 * 2, 4.0 * 7 + 5.0 * -2, 0.5 * 7 + 0.25 * -2]
    assert least_squares(design, target).tolist() == pytest.approx([7.0, -2.0], rel=4e-16)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=1, max_value=4).flatmap(
        lambda columns: st.tuples(
            st.just(columns),
            st.lists(
                st.lists(
                    # (Measured quantities: zero, or not below a millionth; squares of 1e-160 underflow.)
                    st.floats(-1e3, 1e3, allow_nan=False).filter(
                        lambda value: value == 0 or abs(value) >= 1e-6
                    ),
                    min_size=columns,
                    max_size=columns,
                ),
                min_size=columns + 1,
                max_size=12,
            ),
        )
    ),
    st.randoms(use_true_random=False),
)
def test_the_fit_is_the_exact_least_squares_solution_within_rounding(shaped, rng):
    columns, design = shaped
    target = [rng.uniform(-100, 100) for _ in design]
    matrix = np.array(design)
    singular = np.linalg.svd(matrix, compute_uv=False)
    if singular[-1] <= 1e-6 * singular[0]:
        return  # (ill-conditioned: rounding may move the answer by more than a tolerance states)
    exact = [float(value) for value in exact_normal_solution(design, target)]
    got = least_squares(design, target)
    # The forward error bound of a backward-stable least-squares solver (Golub & Van Loan 5.3.8):
    # eps * cond * (1 + cond * |residual| / (|A| |x|)), with room for the constant.
    condition = singular[0] / singular[-1]
    residual = float(np.linalg.norm(matrix @ np.array(exact) - np.array(target)))
    scale = singular[0] * float(np.linalg.norm(exact))
    bound = 1e-13 * condition * (1 + (condition * residual / scale if scale else 0.0))
    largest = max(map(abs, exact))
    for value, expected in zip(got.tolist(), exact, strict=True):
        assert abs(value - expected) <= bound * largest + 1e-300


def test_dependent_columns_get_lstsqs_minimum_norm_solution():
    # Two equal columns: any split of the mean 2 fits; the minimum-norm one is 1 and 1.
    assert least_squares(np.ones((5, 2)), np.arange(5.0)).tolist() == pytest.approx([1.0, 1.0])


def test_fewer_rows_than_columns_is_refused():
    with pytest.raises(ValueError, match="needs as many rows"):
        least_squares([[1.0, 2.0, 3.0]], [1.0])


def test_the_inputs_are_left_as_they_were():
    design = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    target = np.array([1.0, 2.0, 4.0])
    least_squares(design, target)
    assert design.tolist() == [[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]]
    assert target.tolist() == [1.0, 2.0, 4.0]


def test_a_fits_prediction_sums_each_row_exactly():
    from calibrate.fit import LinearFit

    fit = LinearFit(("a", "b", "c"), (1.0, 1e16, -1e16))
    # 1 + 1e16 - 1e16 in that order is 0.0 in floats; summed exactly it is 1.
    assert fit.predict([[1.0, 1.0, 1.0], [2.0, 0.0, 0.0]]).tolist() == [1.0, 2.0]
    assert float(fit.predict([3.0, 0.0, 0.0])) == 3.0
