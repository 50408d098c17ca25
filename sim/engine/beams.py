"""Beam search's random steps: when some beam falls out of the top ``width``, which ones, and which
surviving beams the replacements fork from.

Each beam is replaced, independently, with probability ``q`` (``engine.beam_reparent_prob``) per
decode step. The engine core asks when the next replacing step comes (:meth:`BeamDraws.interval`)
and, at that step, which beams go and whose forks replace them; it does the freeing and forking.
"""

from __future__ import annotations

import math

import numpy as np

from sim.engine.decoding import NEVER


class BeamDraws:
    def __init__(self, rng: np.random.Generator, reparent_prob: float):
        # (The engine's generator, shared: the draws come in the order the run makes them.)
        self.rng = rng
        self.reparent_prob = reparent_prob

    def interval(self, width: int) -> int:
        """Decode steps to the next step at which some beam is replaced: a step replaces one or more
        of ``width`` beams with probability ``1 - (1 - q)^width``."""
        q = self.reparent_prob
        if q <= 0:
            return NEVER
        return int(self.rng.geometric(1.0 - (1.0 - q) ** width))

    def replaced(self, width: int) -> set[int]:
        """Which beams a replacing step replaces: each independently with probability q, given that
        at least one is; at most ``width - 1``, since the best candidates all continuing one beam
        leave that beam in place."""
        q = self.reparent_prob
        counts = np.arange(1, width + 1)
        weights = np.array([math.comb(width, k) for k in counts]) * q**counts * (1 - q) ** (width - counts)
        count = min(int(self.rng.choice(counts, p=weights / weights.sum())), width - 1)
        return set(self.rng.choice(width, count, replace=False).tolist())

    def parents(self, survivors: int, replacements: int) -> list[int]:
        """For each replacement, the index of the surviving beam it forks from (uniformly)."""
        return self.rng.choice(survivors, replacements).tolist()
