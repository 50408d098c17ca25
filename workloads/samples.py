"""Output lengths of a request's parallel samples (``n > 1``).

Samples of one prompt stop independently: each ends at its own end-of-sequence token. Sample 0
keeps the request's drawn (or traced) length, so ``n = 1`` streams are unchanged and a conversation's
next turn continues sample 0; the other ``n - 1`` lengths come from a generator seeded by
``(seed, request id)``, so a request's samples are the same in every variant and whatever order the
engine finishes requests in. Beams all run to the same length (beam search ends together), and
``sample_lengths: identical`` gives every sample the request's length (the model before issue 11).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from workloads.request import Request

_TAG_SAMPLE_LENS = 31

OtherLengths = Callable[[np.random.Generator, int], list[int]]
"""``(rng, count) -> count`` output lengths for samples 1..n-1."""


def with_sample_lengths(request: Request, other_lengths: OtherLengths, seed: int) -> Request:
    """``request`` with independent sample lengths when it has ``n > 1`` samples (not beams)."""
    if request.n <= 1 or request.beam_width > 1:
        return request
    rng = np.random.default_rng([seed, _TAG_SAMPLE_LENS, request.request_id])
    lengths = (request.output_len, *other_lengths(rng, request.n - 1))
    return dataclasses.replace(request, sample_output_lens=lengths)


def lognormal_spread(length: int, sigma: float, rng: np.random.Generator, count: int, cap: int) -> list[int]:
    """``count`` lengths ``length * exp(sigma * Z)`` (Z standard normal), rounded, in ``[1, cap]``:
    a lognormal whose median is the traced length (so the trace's own sample is the typical one)."""
    values = np.rint(length * rng.lognormal(0.0, sigma, count)) if sigma > 0 else np.full(count, length)
    return np.clip(values, 1, cap).astype(np.int64).tolist()
