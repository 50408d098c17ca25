"""The closed forms of event skipping against step-by-step sums."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.costs.terms import DecodeCost
from sim.engine.event_skip import (
    JumpTimeline,
    decode_series_s,
    decode_token_weight_s,
    iterations_to_reach,
    scheduled_iterations_to_reach,
)

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


@pytest.mark.parametrize(
    ("cost", "batch", "context", "growth", "series_s", "expected"),
    [
        # Context 1 + 0.5 (windows cap the growth at 0.5 a token): 2 + 0.5 x 3 + 1 x 1.5 = 5 s.
        (DecodeCost(2.0, 0.5, 1.0), 3, 1, 0.5, 5.0, 2),
        # Context 10 + 8 = 18: 1.5 + 18 = 19.5 s.
        (DecodeCost(1.5, 0.0, 1.0), 8, 10, None, 19.5, 2),
        # Contexts 5, 8, 11: 2 + 0.5 x 3 + 5 = 8.5, then 11.5, 14.5: 34.5 s in 3.
        (DecodeCost(2.0, 0.5, 1.0), 3, 2, None, 34.5, 4),
    ],
)
def test_iterations_to_reach_a_hair_over_the_series(cost, batch, context, growth, series_s, expected):
    # The budget is one ulp over the time of expected - 1 iterations: those fall short, so one more is
    # needed. The quadratic's root rounds to expected - 1 exactly here; stepping up must correct it.
    budget = math.nextafter(series_s, math.inf)
    assert iterations_to_reach(cost, batch, context, budget, growth) == expected


@pytest.mark.parametrize(
    ("cost", "batch", "context", "budget", "expected"),
    [
        # Context 1 + 1 = 2: 0.1 + 0.2 x 2 = 0.5 s, the budget exactly.
        (DecodeCost(0.1, 0.0, 0.2), 1, 1, 0.5, 1),
        # Contexts 2, 3: 1 + 0.3 x 2 = 1.6, 1 + 0.3 x 3 = 1.9; 3.5 s in 2.
        (DecodeCost(1.0, 0.0, 0.3), 1, 1, 3.5, 2),
        # Contexts 5, 9, 13: 0.2 + 0.2 x 5 = 1.2, 2.0, 2.8; 6.0 s in 3.
        (DecodeCost(0.2, 0.0, 0.2), 4, 1, 6.0, 3),
    ],
)
def test_iterations_to_reach_a_budget_met_exactly(cost, batch, context, budget, expected):
    # The iterations take the budget exactly (to the bit), so no further one is needed. The
    # quadratic's root rounds just above expected here; stepping down must correct it.
    assert iterations_to_reach(cost, batch, context, budget) == expected


class ListedSchedule:
    """A speculative schedule in which every iteration keeps one draft (two tokens each), listed
    for ``length`` iterations; ``starts`` as ``sim.engine.speculation.TokenSchedule``'s."""

    def __init__(self, length: int):
        self.first_tokens = [0] + [2 * i - 1 for i in range(1, length + 1)]

    def starts(self, first: int, count: int) -> np.ndarray:
        if first + count >= len(self.first_tokens):
            raise IndexError("past the listed schedule")
        window = np.array(self.first_tokens[first : first + count + 1], dtype=np.float64)
        return window[1:] - window[0]


FREE = DecodeCost(intercept_s=0.0, per_seq_s=0.0, per_context_token_s=0.0)


def test_free_iterations_meet_a_zero_budget_at_once():
    # Iterations that cost nothing: one of them already takes the 0 s budget (k >= 1).
    assert iterations_to_reach(FREE, 4, 100, 0.0) == 1
    assert scheduled_iterations_to_reach(FREE, 4, 100, 0.0, ListedSchedule(100), 0) == 1


def test_iterations_to_reach_beyond_stepping():
    # Attention windows cap the context (growth 0): every iteration takes 0.5 + 0.5 x 1 = 1 s, and
    # 2**63 s take more iterations than stepping is for (1 << 62): found by bisecting the series,
    # which is the float of k. Floats between 2**62 and 2**63 are 1024 apart: 2**63 - 512 is halfway
    # and rounds to even, 2**63; 2**63 - 513 rounds down to 2**63 - 1024.
    cost = DecodeCost(intercept_s=0.5, per_seq_s=0.0, per_context_token_s=0.5)
    assert iterations_to_reach(cost, 2, 1, 2.0**63, 0.0) == 2**63 - 512


def test_iterations_to_reach_a_billion_iterations():
    # The j-th iteration attends over 2j tokens and takes 2j s, so k of them take k(k + 1) s:
    # 10**9 x (10**9 + 1) = 1e18 + 1e9 >= 1e18 > (10**9 - 1) x 10**9 = 1e18 - 1e9. (Far too many
    # to step through: the closed form's root must land within a few iterations of the answer.)
    cost = DecodeCost(intercept_s=0.0, per_seq_s=0.0, per_context_token_s=1.0)
    assert iterations_to_reach(cost, 2, 0, 1e18) == 10**9


@pytest.mark.parametrize(("budget", "expected"), [(2524.5, 99), (2524.75, 100), (2575.0, 100)])
def test_scheduled_iterations_to_reach_past_the_first_window(budget, expected):
    # After iteration 3 the j-th iteration starts 2j tokens on; windows cap the context's growth at 2
    # a token, so it takes 0.5 + 0.125 x 2 x 2j = 0.5 + 0.5j s and k of them 0.5k + 0.25k(k + 1):
    # 99 -> 49.5 + 2475 = 2524.5, 100 -> 50 + 2525 = 2575 (more than the first 64 looked at).
    cost = DecodeCost(intercept_s=0.5, per_seq_s=0.0, per_context_token_s=0.125)
    assert scheduled_iterations_to_reach(cost, 4, 0, budget, ListedSchedule(1000), 3, 2.0) == expected


def test_token_weight_with_capped_growth():
    # Windows cap the growth at 1 a token: the j-th iteration attends over 10 + j, so takes
    # 0.5 + 0.25 x 2 + 0.125 x (10 + j) = 2.25 + 0.125j: 2.375, 2.5, 2.625; weighted 2.375 + 2 x 2.5 +
    # 3 x 2.625 = 15.25.
    cost = DecodeCost(intercept_s=0.5, per_seq_s=0.25, per_context_token_s=0.125)
    assert decode_token_weight_s(cost, 3, 2, 10, 1.0) == 15.25
    assert JumpTimeline(2.0, 3, cost, 2, 10, rate=1.0).token_weight_s(3) == 15.25


def test_token_weight_refuses_a_short_schedule():
    # Three listed iterations but tokens gained for only two: no weight is made up for the third.
    timeline = JumpTimeline(1.0, 3, DECODE, 2, 10, durations=(1.0, 1.0, 1.0), growth=(1.0, 2.0))
    with pytest.raises(ValueError):
        timeline.token_weight_s(3)


@pytest.mark.parametrize(
    ("instant", "expected"),
    [(0.0, 0), (1.0, 0), (1.25, 1), (1.5, 1), (1.6, 2), (1.75, 2), (2.0, 3), (100.0, 3)],
)
def test_iterations_ended_before_by_hand(instant, expected):
    # Iterations end at 1.0, 1.5 and 1.75; an iteration ending at the instant has not ended before it.
    timeline = JumpTimeline(1.0, 2, DECODE, 2, 10, durations=(0.5, 0.25))
    assert timeline.iterations_ended_before(instant) == expected
