"""Closed-form arithmetic behind event skipping.

Between events every running sequence gains one token per decode iteration and an iteration costs
``intercept + per_seq * batch + per_context_token * sum_context`` (``sim.costs.DecodeCost``), so the
summed context grows by ``batch`` each iteration and ``k`` iterations cost an arithmetic series. These
pure functions let the engine find how far it can jump without stepping.
"""

from __future__ import annotations

from sim.costs import DecodeCost

UNBOUNDED_STEPS = 1 << 62


def decode_series_s(decode: DecodeCost, steps: int, batch: int, context: int) -> float:
    """Time of ``steps`` decode iterations of ``batch`` sequences holding ``context`` tokens in all
    before the first one (each iteration adds a token to every sequence, then attends over it)."""
    first = decode.step_s(batch, context + batch)
    return steps * first + decode.per_context_token_s * batch * steps * (steps - 1) / 2


def iterations_to_reach(decode: DecodeCost, batch: int, context: int, budget_s: float) -> int:
    """Smallest ``k >= 1`` such that ``k`` decode iterations take at least ``budget_s`` seconds."""
    if budget_s == float("inf"):
        return UNBOUNDED_STEPS
    high = 1
    while decode_series_s(decode, high, batch, context) < budget_s:
        high *= 2
    low = high // 2 + 1 if high > 1 else 1
    while low < high:
        middle = (low + high) // 2
        if decode_series_s(decode, middle, batch, context) >= budget_s:
            high = middle
        else:
            low = middle + 1
    return low
