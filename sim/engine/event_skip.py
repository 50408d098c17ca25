"""Closed-form arithmetic behind event skipping.

Between events every decoding sequence gains one token per iteration and a decode-only iteration
costs ``intercept + per_seq * batch + per_context_token * sum_context`` (``sim.costs.terms.DecodeCost``), so
the summed context grows by ``batch`` each iteration and ``k`` iterations cost an arithmetic series.
These pure functions let the engine find how far it can jump without stepping, when each iteration
of a jump starts, and the exact area under the tokens that grow during it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from sim.costs.terms import DecodeCost

UNBOUNDED_STEPS: Final = 1 << 61  # (below 2**62: compiled, a native int, not a boxed one)


def decode_series_s(
    decode: DecodeCost, steps: int, batch: int, context: float, growth: float | None = None
) -> float:
    """Time of ``steps`` decode iterations of ``batch`` sequences attending over ``context`` tokens in
    all before the first one (each iteration adds a token to every sequence, then attends over it:
    the context grows by ``batch``, or by ``growth`` when attention windows cap it)."""
    grows = batch if growth is None else growth
    first = decode.step_s(batch, context + grows)
    return steps * first + decode.per_context_token_s * grows * steps * (steps - 1) / 2


def decode_token_weight_s(
    decode: DecodeCost, steps: int, batch: int, context: float, growth: float | None = None
) -> float:
    """``sum(j * d_j for j in 1..steps)``, ``d_j`` the duration of the j-th of the iterations timed by
    :func:`decode_series_s`: during it every sequence holds ``j`` tokens more than before the first."""
    grows = batch if growth is None else growth
    base = decode.step_s(batch, context)
    pairs = steps * (steps + 1) / 2
    squares = steps * (steps + 1) * (2 * steps + 1) / 6
    return base * pairs + decode.per_context_token_s * grows * squares


def iterations_to_reach(
    decode: DecodeCost, batch: int, context: float, budget_s: float, growth: float | None = None
) -> int:
    """Smallest ``k >= 1`` such that ``k`` decode iterations take at least ``budget_s`` seconds.

    The series is quadratic in ``k``: its root is a guess, corrected against the series itself so
    that the answer is exactly what stepping would find."""
    if budget_s == float("inf"):
        return UNBOUNDED_STEPS
    grows = batch if growth is None else growth
    first = decode.step_s(batch, context + grows)
    half_growth = decode.per_context_token_s * grows / 2  # series(k) = k * first + half_growth * k * (k - 1)
    linear = first - half_growth
    if half_growth > 0:
        guess = (math.sqrt(linear * linear + 4 * half_growth * budget_s) - linear) / (2 * half_growth)
    else:
        guess = budget_s / first if first > 0 else float(UNBOUNDED_STEPS)
    if not guess < UNBOUNDED_STEPS:
        return first_reaching(lambda steps: decode_series_s(decode, steps, batch, context, growth), budget_s)
    steps = max(1, math.ceil(guess))
    while decode_series_s(decode, steps, batch, context, growth) < budget_s:
        steps += 1
    while steps > 1 and decode_series_s(decode, steps - 1, batch, context, growth) >= budget_s:
        steps -= 1
    return steps


def first_reaching(elapsed, budget_s: float, high: int = 1) -> int:
    """Smallest ``k >= 1`` with ``elapsed(k) >= budget_s``, for a non-decreasing ``elapsed``."""
    while elapsed(high) < budget_s:
        high *= 2
    low = high // 2 + 1 if high > 1 else 1
    while low < high:
        middle = (low + high) // 2
        if elapsed(middle) >= budget_s:
            high = middle
        else:
            low = middle + 1
    return low


def scheduled_durations(
    decode: DecodeCost, batch: int, context: float, growth, rate: float | None = None
) -> tuple[float, ...]:
    """Durations of decode iterations whose sequences have gained ``growth[j - 1]`` tokens each by
    the start of the j-th (speculative decoding: a schedule's, not ``j``); the attended context
    grows by ``rate`` per token (default: ``batch``)."""
    base = decode.step_s(batch, context)
    return tuple((base + decode.per_context_token_s * (batch if rate is None else rate) * growth).tolist())


def scheduled_iterations_to_reach(
    decode: DecodeCost,
    batch: int,
    context: float,
    budget_s: float,
    schedule,
    iteration: int,
    rate: float | None = None,
) -> int:
    """:func:`iterations_to_reach` for the iterations after ``iteration`` under a speculative
    ``schedule`` (``sim.engine.speculation.TokenSchedule``): smallest ``k >= 1`` whose first ``k``
    iterations take at least ``budget_s``."""
    if budget_s == float("inf"):
        return UNBOUNDED_STEPS
    base = decode.step_s(batch, context)
    per_token = decode.per_context_token_s * (batch if rate is None else rate)
    window = 64
    while True:
        durations = base + per_token * schedule.starts(iteration, window)
        elapsed = np.cumsum(durations)
        if elapsed[-1] >= budget_s:
            return int(np.searchsorted(elapsed, budget_s, side="left")) + 1
        window *= 2


@dataclass(frozen=True, slots=True, init=False)
class JumpTimeline:
    """When the iterations of one engine wake-up start and end.

    Iteration 1 took ``first_s`` (whatever it did). The ``extra`` iterations after it decode the same
    ``batch``, whose summed context was ``context`` during iteration 1; they are decode-only (an
    arithmetic series) unless ``durations`` lists them (prefill chunks make each one different).
    (Its constructor is written out: compiled, it runs natively, once per jump.)"""

    first_s: float
    extra: int
    decode: DecodeCost
    batch: int
    context: float
    durations: tuple[float, ...] | None
    # Speculative decoding: tokens each sequence has gained by the start of each iteration after the
    # first (else one per iteration); ``durations`` then lists every iteration.
    growth: tuple[float, ...] | None
    # Attention windows: what the attended context grows by per token (else ``batch``).
    rate: float | None

    def __init__(
        self,
        first_s: float,
        extra: int,
        decode: DecodeCost,
        batch: int,
        context: float,
        durations: tuple[float, ...] | None = None,
        growth: tuple[float, ...] | None = None,
        rate: float | None = None,
    ) -> None:
        setattr_ = object.__setattr__  # (frozen: as the dataclass's own constructor sets them)
        setattr_(self, "first_s", first_s)
        setattr_(self, "extra", extra)
        setattr_(self, "decode", decode)
        setattr_(self, "batch", batch)
        setattr_(self, "context", context)
        setattr_(self, "durations", durations)
        setattr_(self, "growth", growth)
        setattr_(self, "rate", rate)

    def after_first_s(self, steps: int) -> float:
        """Time of the first ``steps`` iterations after iteration 1."""
        if steps <= 0:
            return 0.0
        if self.durations is not None:
            return sum(self.durations[:steps])
        return decode_series_s(self.decode, steps, self.batch, self.context, self.rate)

    def elapsed_s(self, iterations: int) -> float:
        """From the start of iteration 1 to the end of iteration ``iterations`` (0: the start)."""
        return 0.0 if iterations <= 0 else self.first_s + self.after_first_s(iterations - 1)

    @property
    def total_s(self) -> float:
        return self.first_s + self.after_first_s(self.extra)

    def token_weight_s(self, steps: int) -> float:
        """``sum(j * d_j)`` over the first ``steps`` iterations after iteration 1 (``d_j``: the j-th's
        duration). Times ``batch``, the slot-seconds the tokens decoded after iteration 1 fill."""
        if steps <= 0:
            return 0.0
        if self.growth is not None and self.durations is not None:
            return sum(g * d for g, d in zip(self.growth[:steps], self.durations[:steps], strict=True))
        if self.durations is not None:
            return sum(j * d for j, d in enumerate(self.durations[:steps], start=1))
        return decode_token_weight_s(self.decode, steps, self.batch, self.context, self.rate)

    def tokens_gained(self, steps: int) -> float:
        """Tokens each sequence holds beyond iteration 1's while the ``steps``-th iteration after it
        runs (one more per iteration, unless speculative decoding's ``growth`` says otherwise)."""
        if steps <= 0:
            return 0.0
        if self.growth is not None:
            return self.growth[steps - 1]
        return float(steps)

    def iterations_ended_before(self, elapsed_s: float) -> int:
        """How many of the jump's iterations end strictly before ``elapsed_s`` (from its start); the
        next one is in progress then, unless all have ended."""
        if elapsed_s <= 0:
            return 0
        if elapsed_s > self.total_s:
            return 1 + self.extra
        # The first iteration ending at or after elapsed_s is in progress.
        return first_reaching(self.elapsed_s, elapsed_s) - 1
