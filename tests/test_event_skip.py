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
