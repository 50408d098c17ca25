"""Samplers for the distributions of :mod:`workloads.config`, all driven by numpy Generators."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from workloads.base import TraceError, WorkloadError, resolve_path
from workloads.config import (
    ChoiceDist,
    ConstantDist,
    Dist,
    ExponentialDist,
    LognormalDist,
    NormalDist,
    TableDist,
    UniformDist,
)

LARGEST_COUNT = 2**53
"""The largest value of an integer quantity (tokens, turns, samples) a distribution may name."""


class Sampler:
    """Draws values of one configured quantity. ``integer`` quantities (token counts, turns, n) are
    rounded to the nearest int and clipped to ``[min, max]`` (``min`` defaults to ``floor``)."""

    def __init__(
        self,
        spec: Dist | float | int,
        *,
        what: str,
        integer: bool,
        floor: float = 0.0,
        base_dir: Path | None = None,
    ):
        self.what = what
        self.integer = integer
        if isinstance(spec, bool):
            raise WorkloadError(f"{what}: {spec!r} is not a number or a distribution")
        if isinstance(spec, int | float):
            spec = ConstantDist(kind="constant", value=float(spec))
        self.spec: Dist = spec
        low = getattr(spec, "min", None)
        self.low = float(floor if low is None else max(low, floor))
        high = getattr(spec, "max", None)
        self.high = math.inf if high is None else float(high)
        if self.low > self.high:
            raise WorkloadError(f"{what}: max={self.high} is below the smallest allowed value {self.low}")
        self._values: np.ndarray | None = None
        self._probs: np.ndarray | None = None
        if isinstance(spec, ConstantDist):
            self._check_value(spec.value)
        elif isinstance(spec, UniformDist):
            self._check_value(spec.low)
            self._check_value(spec.high)
            if integer and (spec.low != int(spec.low) or spec.high != int(spec.high)):
                raise WorkloadError(f"{what}: uniform bounds must be integers, got {spec.low}..{spec.high}")
        elif isinstance(spec, ChoiceDist):
            for value in spec.values:
                self._check_value(value)
            self._values = np.asarray(spec.values, dtype=float)
            if spec.weights is not None:
                weights = np.asarray(spec.weights, dtype=float)
                self._probs = weights / weights.sum()
        elif isinstance(spec, TableDist):
            self._values = load_column(spec.path, spec.column, base_dir, what).astype(float)
        if integer:
            for name in ("mean", "median", "std"):  # (normal, lognormal, exponential)
                parameter: float | None = getattr(spec, name, None)
                if parameter is not None and not abs(parameter) <= LARGEST_COUNT:
                    raise WorkloadError(
                        f"{what}: {name} {parameter:g} is too large for a count (at most 2**53)"
                    )
        self.constant: float | None = self._as_constant()

    def _check_value(self, value: float) -> None:
        if self.integer and not abs(value) <= LARGEST_COUNT:
            # (Counts are drawn as 64-bit integers; past 2**53 a float no longer holds every integer.)
            raise WorkloadError(f"{self.what}: {value:g} is too large for a count (at most 2**53)")
        if self.integer and value != int(value):
            raise WorkloadError(f"{self.what}: {value} is not an integer")
        if value < self.low:
            raise WorkloadError(f"{self.what}: {value} is below the smallest allowed value {self.low:g}")

    def _as_constant(self) -> float | None:
        if isinstance(self.spec, ConstantDist):
            return self._finish(np.asarray([self.spec.value]))[0].item()
        if isinstance(self.spec, UniformDist) and self.spec.low == self.spec.high:
            return self._finish(np.asarray([self.spec.low]))[0].item()
        return None

    def _finish(self, values: np.ndarray) -> np.ndarray:
        if self.integer:
            values = np.rint(values)
        if self.integer:
            # (A tail draw past any count, from a wide lognormal, stays a count: it is rejected as
            # longer than max_model_len like any other, where a cast would wrap it negative.)
            values = np.clip(values, self.low, min(self.high, LARGEST_COUNT))
            return values.astype(np.int64)
        return np.clip(values, self.low, self.high).astype(float)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        spec = self.spec
        if isinstance(spec, ConstantDist):
            raw = np.full(size, spec.value, dtype=float)
        elif isinstance(spec, UniformDist):
            if self.integer:
                raw = rng.integers(int(spec.low), int(spec.high) + 1, size).astype(float)
            else:
                raw = rng.uniform(spec.low, spec.high, size)
        elif isinstance(spec, NormalDist):
            raw = rng.normal(spec.mean, spec.std, size)
        elif isinstance(spec, LognormalDist):
            if spec.median is not None:
                mu = math.log(spec.median)
            else:
                assert spec.mean is not None
                mu = math.log(spec.mean) - spec.sigma**2 / 2
            raw = rng.lognormal(mu, spec.sigma, size)
        elif isinstance(spec, ExponentialDist):
            raw = rng.exponential(spec.mean, size)
        elif isinstance(spec, TableDist | ChoiceDist):
            assert self._values is not None
            if self._probs is None:
                raw = self._values[rng.integers(0, len(self._values), size)]
            else:
                raw = self._values[rng.choice(len(self._values), size, p=self._probs)]
        else:  # pragma: no cover - the config union is closed
            raise WorkloadError(f"{self.what}: unknown distribution {spec!r}")
        return self._finish(raw)

    def describe(self) -> object:
        if self.constant is not None:
            return self.constant
        return self.spec.model_dump(exclude_none=True)


class Draws:
    """Values of one sampler handed out one at a time from buffered vectorised draws."""

    __slots__ = ("_sampler", "_rng", "_chunk", "_buffer", "_pos", "_constant")

    def __init__(self, sampler: Sampler, rng: np.random.Generator, chunk: int = 1024):
        self._sampler = sampler
        self._rng = rng
        self._chunk = chunk
        self._buffer: list[float] | list[int] = []
        self._pos = 0
        self._constant = sampler.constant

    def next(self) -> float:
        if self._constant is not None:
            return self._constant
        if self._pos >= len(self._buffer):
            self._buffer = self._sampler.sample(self._rng, self._chunk).tolist()
            self._pos = 0
        value = self._buffer[self._pos]
        self._pos += 1
        return value

    def next_int(self) -> int:
        return int(self.next())


def zipf_probabilities(count: int, exponent: float) -> np.ndarray:
    """P(i) ∝ 1/(i+1)^exponent for i = 0..count-1 (item 0 is the most popular)."""
    with np.errstate(over="ignore"):  # (a huge exponent: every rank past the first weighs 1/inf = 0)
        weights = 1.0 / np.arange(1, count + 1, dtype=float) ** exponent
    return weights / weights.sum()


def load_column(path: str | Path, column: str, base_dir: Path | None, what: str) -> np.ndarray:
    """A positive integer column of a CSV file (lengths), with errors naming file, column and line.

    Parsed once per process for each content of the file: a capacity plan builds the same workload
    for every probe, and parsing the file each time took about a fifth of a plan's time. Keyed by the
    bytes themselves, not the modification time, which can miss a rewrite within one clock tick: the
    file is read again and compared with the bytes the column was parsed from (0.18 ms for the 950 kB
    ShareGPT table, against 0.40 ms with the hash a cache key of them needs; a probe reads it three
    times). The array is shared, so it is read-only."""
    full = resolve_path(path, base_dir, f"workload.{what}.path")
    try:
        content = full.read_bytes()
    except OSError:
        return _read_column(full, column, what)  # pandas names the problem
    key = (full, column)
    cached = _parsed_columns.get(key)
    if cached is not None and cached[0] == content:
        return cached[1]
    values = _read_column(full, column, what)
    values.setflags(write=False)
    _parsed_columns.pop(key, None)
    _parsed_columns[key] = (content, values)
    while len(_parsed_columns) > _PARSED_COLUMNS_KEPT:
        del _parsed_columns[next(iter(_parsed_columns))]  # the oldest parsed
    return values


_PARSED_COLUMNS_KEPT = 16
_parsed_columns: dict[tuple[Path, str], tuple[bytes, np.ndarray]] = {}


def forget_parsed_columns() -> None:
    """Drop every column :func:`load_column` keeps (tests)."""
    _parsed_columns.clear()


def _read_column(full: Path, column: str, what: str) -> np.ndarray:
    try:
        header = pd.read_csv(full, nrows=0).columns.tolist()
    except pd.errors.EmptyDataError:
        raise TraceError("empty file", full) from None
    if column not in header:
        raise TraceError(f"{what}: no column {column!r}; columns found: {', '.join(map(str, header))}", full)
    # The C parser reads a clean numeric column directly; anything else (text, blanks) is read again
    # as text below, so that the error quotes the cell as written.
    parsed = pd.read_csv(full, usecols=[column])[column]
    if pd.api.types.is_numeric_dtype(parsed.dtype) and not pd.api.types.is_bool_dtype(parsed.dtype):
        values = parsed.to_numpy(dtype=float)
        if len(values) and not _bad_lengths(values).any():
            return values.astype(np.int64)
    series = pd.read_csv(full, usecols=[column], dtype=str, keep_default_na=False)[column]
    if series.empty:
        raise TraceError(f"{what}: column {column!r} has no values", full)
    values = pd.to_numeric(series, errors="coerce").to_numpy(dtype=float)
    bad = _bad_lengths(values)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise TraceError(
            f"{what}: column {column!r} value {series.iloc[row]!r} is not a non-negative integer",
            full,
            row + 2,
        )
    return values.astype(np.int64)


def _bad_lengths(values: np.ndarray) -> np.ndarray:
    return ~np.isfinite(values) | (values < 0) | (values != np.floor(values))
