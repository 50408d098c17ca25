"""Speculative decoding on the decode clock: how many tokens each verification step accepts.

A speculative step proposes ``k`` draft tokens per decoding request and verifies them with the
target model in one forward pass: the first ``a`` drafts that match are kept, plus the token the
target samples after them, so a request gains ``1 + a`` tokens per step (``0 <= a <= k``).

The decode clock counts *tokens per sequence*, not iterations: a request synced at clock ``s`` holds
``context + (c - s)`` tokens at clock ``c`` (``sim/engine/decoding.py``). Without speculation an
iteration moves the clock by one. With it, iteration ``i`` moves it by ``1 + a_i``, where ``a_i`` is
one draw of the acceptance distribution shared by every request decoding in that iteration. That
keeps every decode aggregate (pending tokens, summed context, when a sequence needs a block or
finishes) exact and O(1) per event, and each request's own sequence of accepted lengths has exactly
the configured distribution; what it leaves out is the independence between requests in one step
(their summed tokens per step vary more than in a real batch; its mean is exact). docs/speculative.md.

:class:`TokenSchedule` keeps the clock value at which each iteration starts, ``t_i = i + A_{i-1}``
(``A_i`` the accepted drafts of iterations 1..i), drawn lazily in blocks from its own generator, so
a run's draws depend only on the seed.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

DRAW_BLOCK: Final = 4096  # iterations drawn at once
SPECULATION_STREAM = 0x5BEC  # with the run's seed, the seed of the acceptance draws


@dataclass(frozen=True)
class AcceptanceModel:
    """The distribution of accepted draft tokens per verification step: ``probabilities[a]`` for
    ``a = 0..k``."""

    probabilities: tuple[float, ...]
    source: str  # how it was given (for the summary and the capacity lines)

    @property
    def num_speculative_tokens(self) -> int:
        return len(self.probabilities) - 1

    @property
    def mean_accepted_drafts(self) -> float:
        return float(sum(a * p for a, p in enumerate(self.probabilities)))

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a step gives a request on average, the bonus token included (the usual 'tau')."""
        return 1.0 + self.mean_accepted_drafts

    @classmethod
    def from_rates(cls, rates: Sequence[float]) -> AcceptanceModel:
        """``rates[i]``: the share of steps whose draft ``i + 1`` was accepted (and so were the ones
        before it), non-increasing: vLLM's per-position acceptance rate
        (``num_accepted_tokens_per_pos[i] / num_drafts``), so their sum is the mean accepted drafts."""
        reach = [1.0] + [float(rate) for rate in rates]
        probabilities = [reach[a] - (reach[a + 1] if a + 1 < len(reach) else 0.0) for a in range(len(reach))]
        return cls(_normalised(probabilities), "per-position rates " + ", ".join(f"{r:g}" for r in rates))

    @classmethod
    def from_mean_length(cls, mean_length: float, num_speculative_tokens: int) -> AcceptanceModel:
        """One acceptance rate ``alpha`` at every position such that ``1 + alpha + ... + alpha^k``
        is the published mean acceptance length (bonus token included)."""
        k = num_speculative_tokens
        low, high = 0.0, 1.0
        for _ in range(200):  # bisection: the length grows with alpha, from 1 to k + 1
            middle = (low + high) / 2
            if sum(middle**i for i in range(k + 1)) < mean_length:
                low = middle
            else:
                high = middle
        alpha = (low + high) / 2
        model = cls.from_rates([alpha**position for position in range(1, k + 1)])
        return cls(model.probabilities, f"mean acceptance length {mean_length:g} (alpha {alpha:.4f})")

    @classmethod
    def from_histogram(cls, counts: Sequence[float], num_speculative_tokens: int) -> AcceptanceModel:
        """``counts[a]``: how often a measured step accepted ``a`` drafts."""
        padded = list(counts) + [0.0] * (num_speculative_tokens + 1 - len(counts))
        total = float(sum(padded))
        return cls(_normalised([c / total for c in padded]), f"histogram of {total:g} steps")


@dataclass(frozen=True)
class SpeculativeDecoding:
    """What the engine needs of ``engine.speculative``: the drafts each step proposes, how many are
    accepted, and the KV slots a decoding sequence holds beyond its tokens."""

    method: str
    num_speculative_tokens: int
    acceptance: AcceptanceModel
    # Slots held beyond a sequence's tokens for one step: its k drafts, plus vLLM's lookahead for the
    # next step's proposals (``num_lookahead_tokens``).
    lookahead_slots: int

    def schedule(self, seed: int | list[int]) -> TokenSchedule:
        return TokenSchedule(self.acceptance, seed)


def lookahead_slots(method: str, num_speculative_tokens: int) -> int:
    """Slots a decoding sequence holds past its tokens: the ``k`` drafts its step verifies, plus
    vLLM's ``num_lookahead_tokens`` (``k`` for every proposer but n-gram, whose proposals need no
    slots of their own before they are verified). docs/speculative.md."""
    k = num_speculative_tokens
    return k if method == "ngram" else 2 * k


def _normalised(probabilities: list[float]) -> tuple[float, ...]:
    cleaned = [p if p > 0 else 0.0 for p in probabilities]
    total = sum(cleaned)
    return tuple(p / total for p in cleaned)


class TokenSchedule:
    """The decode clock value at which each iteration starts, under speculative decoding.

    Iteration ``i`` (from 1) starts at ``first_token(i) = i + A_{i-1}`` and ends at
    ``last_token(i) = first_token(i + 1) - 1``: during it every decoding sequence holds its tokens up
    to ``first_token(i)`` (the step's first token, always kept), and the ``a_i`` accepted drafts join
    them when it ends."""

    def __init__(self, acceptance: AcceptanceModel, seed: int | list[int]):
        self.acceptance = acceptance
        self._rng = np.random.default_rng(seed)
        self._outcomes = np.arange(len(acceptance.probabilities))
        self._probabilities = np.array(acceptance.probabilities)
        # _starts[i] = first_token(i); index 0 is the clock before any iteration.
        self._starts: list[int] = [0, 1]

    def _draw_until(self, iteration: int) -> None:
        starts = self._starts
        while len(starts) <= iteration + 1:
            accepted = self._rng.choice(self._outcomes, size=DRAW_BLOCK, p=self._probabilities)
            steps = np.cumsum(accepted + 1) + starts[-1]
            starts.extend(steps.tolist())

    def first_token(self, iteration: int) -> int:
        if iteration + 1 >= len(self._starts):
            self._draw_until(iteration)
        return self._starts[iteration]

    def last_token(self, iteration: int) -> int:
        return self.first_token(iteration + 1) - 1

    def accepted(self, iteration: int) -> int:
        """Drafts accepted in ``iteration``."""
        return self.last_token(iteration) - self.first_token(iteration)

    def iteration_starting_at_or_after(self, token: int) -> int:
        """The first iteration whose first token is at least ``token``: when a sequence whose held
        slots end at ``token - 1`` needs more."""
        while self._starts[-1] < token:
            self._draw_until(len(self._starts))
        return bisect.bisect_left(self._starts, token)

    def iteration_ending_at_or_after(self, token: int) -> int:
        """The first iteration at whose end the clock has reached ``token``: when a request that
        finishes at ``token`` finishes."""
        return self.iteration_starting_at_or_after(token + 1) - 1

    def starts(self, first: int, count: int) -> np.ndarray:
        """``first_token(first + j) - first_token(first)`` for ``j = 1..count``, the tokens each
        sequence has gained by the start of each of the ``count`` iterations after ``first``."""
        self.first_token(first + count)
        window = np.array(self._starts[first : first + count + 1], dtype=np.float64)
        return window[1:] - window[0]
