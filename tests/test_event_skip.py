"""The closed forms of event skipping against step-by-step sums."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.costs import DecodeCost
from sim.event_skip import decode_series_s, iterations_to_reach

DECODE = DecodeCost(intercept_s=0.01, per_seq_s=0.0002, per_context_token_s=3e-7)


def stepped_s(steps: int, batch: int, context: int) -> float:
    total = 0.0
    for _ in range(steps):
        context += batch
        total += DECODE.step_s(batch, context)
    return total


@given(st.integers(1, 400), st.integers(1, 64), st.integers(0, 100_000))
def test_series_equals_stepping(steps, batch, context):
    assert decode_series_s(DECODE, steps, batch, context) == pytest.approx(
        stepped_s(steps, batch, context), rel=1e-9
    )


@given(st.integers(1, 64), st.integers(0, 50_000), st.floats(1e-4, 50.0))
def test_iterations_to_reach_is_the_first_crossing(batch, context, budget):
    k = iterations_to_reach(DECODE, batch, context, budget)
    assert decode_series_s(DECODE, k, batch, context) >= budget
    assert k == 1 or decode_series_s(DECODE, k - 1, batch, context) < budget


def test_iterations_to_reach_unbounded():
    assert iterations_to_reach(DECODE, 4, 100, float("inf")) > 10**15


ONE_SECOND = DecodeCost(intercept_s=1.0, per_seq_s=0.0, per_context_token_s=0.0)


@pytest.mark.parametrize(
    ("budget", "expected"),
    [(-1.0, 1), (0.0, 1), (0.5, 1), (1.0, 1), (2.0, 2), (3.0, 3), (4.0, 4), (4.5, 5), (7.0, 7), (8.0, 8)],
)
def test_iterations_to_reach_exact_boundaries(budget, expected):
    # Every iteration takes exactly 1 s, so k iterations take k s: the smallest k >= 1 with k >= budget
    # is max(1, ceil(budget)); a budget met exactly (2.0, 3.0, ...) needs no extra iteration.
    assert iterations_to_reach(ONE_SECOND, 3, 100, budget) == expected


def test_series_by_hand():
    # 3 iterations of 2 sequences holding 10 tokens: contexts 12, 14, 16 (each iteration adds one
    # token per sequence first). Step = 0.5 + 0.25 x 2 + 0.125 x context: 2.5, 2.75, 3.0 = 8.25 s.
    cost = DecodeCost(intercept_s=0.5, per_seq_s=0.25, per_context_token_s=0.125)
    assert decode_series_s(cost, 3, 2, 10) == 8.25
