"""The closed forms of event skipping against step-by-step sums."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.costs.terms import DecodeCost
from sim.engine.event_skip import JumpTimeline, decode_series_s, decode_token_weight_s, iterations_to_reach

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


@given(st.integers(1, 64), st.integers(0, 50_000), st.floats(1e-4, 1e4))
def test_iterations_to_reach_is_the_first_crossing(batch, context, budget):
    k = iterations_to_reach(DECODE, batch, context, budget)
    assert decode_series_s(DECODE, k, batch, context) >= budget
    assert k == 1 or decode_series_s(DECODE, k - 1, batch, context) < budget


def test_iterations_to_reach_unbounded():
    assert iterations_to_reach(DECODE, 4, 100, float("inf")) > 10**15


def stepped_token_weight_s(steps: int, batch: int, context: int) -> float:
    total = 0.0
    for j in range(1, steps + 1):
        total += j * DECODE.step_s(batch, context + j * batch)
    return total


@given(st.integers(0, 400), st.integers(1, 64), st.integers(0, 100_000))
def test_token_weight_equals_stepping(steps, batch, context):
    assert decode_token_weight_s(DECODE, steps, batch, context) == pytest.approx(
        stepped_token_weight_s(steps, batch, context), rel=1e-12, abs=1e-15
    )


@given(
    st.floats(0.001, 1.0),
    st.integers(0, 300),
    st.integers(1, 64),
    st.integers(0, 50_000),
    st.floats(0.0, 1.0),
    st.lists(st.floats(0.001, 0.1), max_size=20),
)
def test_jump_timeline_against_its_iterations(first_s, extra, batch, context, fraction, listed):
    """Ends of iterations, iterations ended before an instant, and the token weight of a jump,
    from its iterations one by one (decode-only series, or listed prefill durations)."""
    durations = tuple(listed) or None
    extra = len(listed) if listed else extra
    timeline = JumpTimeline(first_s, extra, DECODE, batch, context, durations)
    each = [first_s] + (
        list(listed) if listed else [DECODE.step_s(batch, context + j * batch) for j in range(1, extra + 1)]
    )
    ends = [sum(each[: n + 1]) for n in range(len(each))]
    for n in (0, 1, extra // 2, extra, extra + 1):
        assert timeline.elapsed_s(n) == pytest.approx(0.0 if n == 0 else ends[n - 1], rel=1e-12)
    assert timeline.total_s == pytest.approx(ends[-1], rel=1e-12)
    weight = sum(j * each[j] for j in range(1, extra + 1))
    assert timeline.token_weight_s(extra) == pytest.approx(weight, rel=1e-12, abs=1e-15)
    instant = fraction * ends[-1]
    expected = sum(1 for end in ends if end < instant)
    got = timeline.iterations_ended_before(instant)
    # Only an end within rounding of the instant may be counted either way.
    assert abs(got - expected) <= sum(1 for end in ends if abs(end - instant) <= 1e-12 * ends[-1])


@given(st.integers(1, 64), st.integers(0, 50_000), st.floats(1e-4, 1e4))
def test_iterations_to_reach_without_context_cost(batch, context, budget):
    flat = DecodeCost(intercept_s=0.01, per_seq_s=0.0002, per_context_token_s=0.0)
    k = iterations_to_reach(flat, batch, context, budget)
    assert decode_series_s(flat, k, batch, context) >= budget
    assert k == 1 or decode_series_s(flat, k - 1, batch, context) < budget


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
