"""A cluster run's outputs: per-replica rows, the cluster total, and load-imbalance metrics.

- Requests: one table for the cluster; each row names its ``replica``.
- Time series: each replica's rows (``replica`` column) and the cluster total, the sum of the
  replicas' step functions, a row wherever a replica has one. In the total, ``admission_blocker``
  is the blocker most replicas with a waiting queue have at that instant (ties: the lower code), and
  ``kv_cache_usage_perc`` is over the replicas' pools together. Cluster runs keep their time series in
  memory until the end (the total needs every replica's rows); requests still stream to the sink.
- Summary: the cluster total (counters summed, time averages over the pools together, percentiles
  over every request; the pool columns stay per replica) plus :func:`balance_metrics`, and one row
  per replica (``replicas.csv``).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np
import pandas as pd

from policies.base import PolicyStats
from sim.outputs.metrics import (
    ADMISSION_BLOCKERS,
    AREA_COLUMNS,
    BREAKDOWN_COLUMNS,
    SERIES_COLUMNS,
    Counters,
    RequestRecord,
    averages_from_areas,
    cumulative_area_at,
)
from sim.outputs.sinks import OutputSink, thin


class ReplicaSink:
    """One replica's outputs: its requests, stamped with the replica, go on to the variant's sink (one
    table for the cluster); its time-series rows are kept for the per-replica and total series."""

    def __init__(self, variant_sink: OutputSink, replica: int):
        self.variant_sink = variant_sink
        self.replica = replica
        self._frames: list[pd.DataFrame] = []

    def write_requests(self, records: list[RequestRecord]) -> None:
        for record in records:
            record.replica = self.replica
        self.variant_sink.write_requests(records)

    def write_timeseries(self, frame: pd.DataFrame) -> None:
        self._frames.append(frame)

    def requests(self, columns: list[str] | None = None) -> pd.DataFrame:
        return self.variant_sink.requests(columns)

    def timeseries(self, max_rows: int | None = None) -> pd.DataFrame:
        frame = pd.concat(self._frames, ignore_index=True) if self._frames else pd.DataFrame()
        return thin(frame, max_rows)

    def close(self) -> None:
        """Nothing to close: the cluster writes the series once every replica has finished."""


def replica_series(sinks: list[ReplicaSink]) -> pd.DataFrame:
    """Every replica's rows, a ``replica`` column first, replica after replica."""
    frames = [sink.timeseries().assign(replica=sink.replica) for sink in sinks]
    frame = pd.concat(frames, ignore_index=True)
    return frame[["replica", *[name for name in frame.columns if name != "replica"]]]


SUMMED = [name for name in SERIES_COLUMNS if name not in ("time_s", "admission_blocker", *AREA_COLUMNS)]


def total_series(per_replica: pd.DataFrame, pool_tokens: int) -> pd.DataFrame:
    """The cluster's series: one row per replica row, in time order, holding the sum of every
    replica's state at that point (each replica's row changes only its own share: the rows' deltas
    are merged in time order and summed up). ``pool_tokens``: the replicas' pools together. A
    cluster of one gives its replica's series unchanged."""
    codes = range(1, len(ADMISSION_BLOCKERS))
    times, deltas = [], []
    replicas = [frame for _, frame in per_replica.groupby("replica", sort=True)]
    for frame in replicas:
        blockers = frame["admission_blocker"].to_numpy()
        # Per blocker code, whether this replica is held back by it: summed, how many replicas are.
        held = np.stack([blockers == code for code in codes], axis=1).astype(np.int64)
        first = np.zeros((len(frame), 1), dtype=np.int64)
        first[0] = 1  # counts the replicas that have a row yet
        values = np.concatenate(
            [frame[SUMMED].to_numpy(dtype=np.int64), held, np.cumsum(first, axis=0)], axis=1
        )
        times.append(frame["time_s"].to_numpy(dtype=float))
        deltas.append(np.diff(values, axis=0, prepend=np.zeros((1, values.shape[1]), dtype=np.int64)))
    all_times = np.concatenate(times)
    order = np.argsort(all_times, kind="stable")
    sums = np.cumsum(np.concatenate(deltas)[order], axis=0)
    # Rows before every replica has its first one (all at time 0) would leave replicas out.
    complete = sums[:, -1] == len(times)
    sums = sums[complete]
    total = pd.DataFrame(sums[:, : len(SUMMED)], columns=SUMMED)
    total.insert(0, "time_s", all_times[order][complete])
    total["admission_blocker"] = _most_common_blocker(sums[:, len(SUMMED) : -1])
    at = total["time_s"].to_numpy()
    for area, value in zip(AREA_COLUMNS, BREAKDOWN_COLUMNS, strict=True):
        total[area] = sum(cumulative_area_at(frame, area, value, at) for frame in replicas)
    total = total[list(SERIES_COLUMNS)]
    total["kv_cache_usage_perc"] = 1.0 - (total["free_tokens"] + total["cached_tokens"]) / pool_tokens
    return total


def _most_common_blocker(held: np.ndarray) -> np.ndarray:
    """Per row of replica counts held back by each blocker code (1, 2, 3): the code most replicas are
    held back by (ties: the lower code), 0 when none is."""
    return np.where(held.max(axis=1) > 0, held.argmax(axis=1) + 1, 0).astype(np.int64)


def summed_dataclass(items: list[Any], cls: type) -> Any:
    """Field-by-field sum of counter dataclasses (PolicyStats, Counters)."""
    return cls(**{field.name: sum(getattr(item, field.name) for item in items) for field in fields(cls)})


class _Now:
    def __init__(self, now: float):
        self.now = now


class _Stats:
    def __init__(self, stats: PolicyStats, context_tokens: int = 0):
        self.stats = stats
        self.context_tokens = context_tokens


class _TotalRecorder:
    def __init__(self, peak_running: int, areas: list[float] | None, pool_tokens: int):
        self.peak_running = peak_running
        self._areas = areas
        self._pool_tokens = pool_tokens

    def time_averages(self, end_s: float) -> dict[str, float]:
        return averages_from_areas(self._areas, end_s, self._pool_tokens)


class ClusterTotals:
    """The cluster seen as one engine by ``sim.runner.summarize``: counters and statistics summed over
    the replicas, time averages over their pools together, the peak of the total running requests."""

    def __init__(self, replicas: list, total: pd.DataFrame):
        now = replicas[0].env.now
        self.env = _Now(now)
        # (Per replica, as the summary's pool: 0, unknown, where replicas' pools differ.)
        contexts = {replica.kv.context_tokens for replica in replicas}
        self.kv = _Stats(
            summed_dataclass([replica.kv.stats for replica in replicas], PolicyStats),
            contexts.pop() if len(contexts) == 1 else 0,
        )
        self.counters = summed_dataclass([replica.counters for replica in replicas], Counters)
        self.wakeups = sum(replica.wakeups for replica in replicas)
        areas = [replica.recorder.areas(now) for replica in replicas]
        known = [area for area in areas if area is not None]
        summed = [sum(values) for values in zip(*known, strict=True)] if known else None
        pool_tokens = sum(replica.kv.pool_slots for replica in replicas)
        peak = int(total["num_requests_running"].max()) if len(total) else 0
        self.recorder = _TotalRecorder(peak, summed, pool_tokens)


def balance_metrics(
    router: str, routed: list[int], replica_summaries: list[dict[str, Any]]
) -> dict[str, Any]:
    """Load imbalance across replicas: requests routed and time-averaged KV usage (max / mean and the
    coefficient of variation, population standard deviation / mean), and the spread of the replicas'
    prefix-cache hit rates. A single engine is a cluster of one (max / mean 1, CV 0)."""
    usage = [1.0 - summary["mean_free_frac"] - summary["mean_cached_frac"] for summary in replica_summaries]
    rates = [
        summary["prefix_cache_hit_rate"]
        for summary in replica_summaries
        if summary["prefix_cache_hit_rate"] is not None
    ]
    return {
        "replicas": len(routed),
        "router": router,
        "requests_max_over_mean": _max_over_mean(routed),
        "requests_cv": _cv(routed),
        "kv_usage_max_over_mean": _max_over_mean(usage),
        "kv_usage_cv": _cv(usage),
        "prefix_cache_hit_rate_min": min(rates) if rates else None,
        "prefix_cache_hit_rate_max": max(rates) if rates else None,
    }


def _max_over_mean(values: list[float] | list[int]) -> float | None:
    mean = float(np.mean(values))
    return float(max(values)) / mean if mean > 0 else None


def _cv(values: list[float] | list[int]) -> float | None:
    mean = float(np.mean(values))
    return float(np.std(values)) / mean if mean > 0 else None
