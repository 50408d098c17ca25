"""Open-loop arrival processes as lazy streams of arrival times (seconds, non-decreasing)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from workloads.config import BatchArrival, ConstantArrival, GammaArrival, PoissonArrival

OpenLoop = PoissonArrival | GammaArrival | ConstantArrival | BatchArrival


def arrival_times(arrival: OpenLoop, rng: np.random.Generator, chunk: int = 4096) -> Iterator[float]:
    """An endless stream of arrival times. The first request arrives at t=0 (``at_s`` for a batch);
    then Poisson gaps are exponential, gamma gaps have shape 1/cv² and mean 1/rate, constant gaps are
    1/rate (times are ``i / rate``, with no accumulated rounding)."""
    if isinstance(arrival, BatchArrival):
        yield from itertools.repeat(float(arrival.at_s))
        return
    if isinstance(arrival, ConstantArrival):
        period = 1.0 / arrival.rate_per_s
        for index in itertools.count():
            yield index * period
        return
    now = 0.0
    yield now
    while True:
        if isinstance(arrival, PoissonArrival):
            gaps = rng.exponential(1.0 / arrival.rate_per_s, chunk)
        else:
            shape = arrival.shape
            gaps = rng.gamma(shape, 1.0 / (arrival.rate_per_s * shape), chunk)
        times = now + np.cumsum(gaps)
        yield from times.tolist()
        now = float(times[-1])


def mean_rate_per_s(arrival: OpenLoop) -> float | None:
    """The process's long-run request rate (None for a batch)."""
    if isinstance(arrival, BatchArrival):
        return None
    return float(arrival.rate_per_s)
