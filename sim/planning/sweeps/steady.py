"""Steady-state measurement of one run: drop the warm-up and the drain, measure what is left.

A run starts empty (the first requests see an idle GPU) and ends draining (the last ones see a
shrinking batch). Capacity questions are about the regime in between, so a probe is measured on a
**window** of arrival times: requests that arrived after the first ``warmup_frac`` and before the last
``drain_frac`` of the arrivals, and the time series over the same interval. The warm-up also lasts at
least one mean residence time (mean end-to-end latency: by Little's law the system takes about that
long to fill), capped at half the window; when the cap cuts it short (``fill_deficit_s`` > 0) the probe
is too short for its rate. The window is also cut in two halves; a queue that keeps growing shows
up as a late half worse than the whole (see ``sim.planning.plans.search``).

Whether a probe reached a steady state at all is measured here too (:func:`stationarity`), and judged
by the search: its arrivals must span a few times the time they take to fill the KV pool
(``pool_fill_s``: pool tokens / (arrival rate x KV tokens per request)), and from the window's first
segment to its last KV usage, the running batch and the waiting queue must not rise. A KV pool that
fills late (the issue that made this check: a probe of ~60 s whose pool filled after 120-180 s, after
which its queue grew without end) shows as such a rise. The fill time is a lower bound only
(requests leave too, so a pool fills later than this): the rises decide.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from policies.base import MemoryBreakdown
from sim.outputs.metrics import ADMISSION_BLOCKERS, cumulative_area_at, summary_key

LATENCY_METRICS = ("ttft_s", "tpot_s", "e2e_s", "queue_s")  # queue: arrival to admission


@dataclass(frozen=True)
class SteadyWindow:
    warmup_frac: float = 0.2
    drain_frac: float = 0.1
    trend_segments: int = 4  # the window is cut in this many; its first and last are compared
    goodput_ttft_s: float | None = None  # per-request targets of the goodput SLO (None: not measured)
    goodput_tpot_s: float | None = None

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


class _Rows:
    """Some rows of a requests table, read as numpy arrays one column at a time, each once.

    The window's cuts (in the window, finished, in its late half) are boolean masks over the
    columns a measure reads, not copies of the whole table each: a capacity plan measures every
    probe, and the copies took most of that."""

    def __init__(self, read: Callable[[str], np.ndarray], length: int):
        self._read = read
        self._columns: dict[str, np.ndarray] = {}
        self.length = length

    @classmethod
    def of(cls, frame: pd.DataFrame) -> _Rows:
        return cls(lambda name: frame[name].to_numpy(), len(frame))

    def __getitem__(self, name: str) -> np.ndarray:
        column = self._columns.get(name)
        if column is None:
            column = self._columns[name] = self._read(name)
        return column

    def __len__(self) -> int:
        return self.length

    def where(self, mask: np.ndarray) -> _Rows:
        return _Rows(lambda name: self[name][mask], int(mask.sum()))

    def finished(self) -> _Rows:
        return self.where(self["outcome"] == "finished")

    def arrived_within(self, start: float, end: float) -> _Rows:
        arrival = self["arrival_s"]
        return self.where((arrival >= start) & (arrival <= end))

    def values(self, name: str) -> np.ndarray:
        """A float column without its missing values (a latency the request never reached)."""
        column = np.asarray(self[name], dtype=float)
        return column[~np.isnan(column)]


def window_bounds(requests: pd.DataFrame, window: SteadyWindow) -> tuple[float, float]:
    start, end, _ = window_and_fill_deficit(requests, window)
    return start, end


def window_and_fill_deficit(requests: pd.DataFrame, window: SteadyWindow) -> tuple[float, float, float]:
    """The window's start and end, and by how much it opens before the system has filled (0 when the
    warm-up covered the fill; > 0 when the cap at half the window cut it short: the probe is too short
    for its rate, and what it measures is still the ramp-up)."""
    return _window_and_fill_deficit(_Rows.of(requests), window)


def _window_and_fill_deficit(requests: _Rows, window: SteadyWindow) -> tuple[float, float, float]:
    times = np.asarray(requests["arrival_s"], dtype=float)
    if len(times) == 0:
        return 0.0, 0.0, 0.0
    start = float(np.quantile(times, window.warmup_frac))
    end = float(np.quantile(times, 1.0 - window.drain_frac))
    residence = requests.finished().values("e2e_s")
    if not len(residence):
        return start, end, 0.0
    filled = float(times.min() + residence.mean())
    start = min(max(start, filled), start + (end - start) / 2)
    return start, end, max(0.0, filled - start)


def steady_metrics(
    requests: pd.DataFrame,
    timeseries: pd.DataFrame,
    pool_tokens: int,
    window: SteadyWindow,
    context_tokens: int | None = None,
) -> dict[str, Any]:
    """Latencies, rates, memory shares and admission stops over the steady-state window.
    ``pool_tokens``: the pool's slots (the memory shares' unit); ``context_tokens``: the tokens of
    context it holds (``KVCoordinator.context_tokens``, the fill time's; None: ``pool_tokens``)."""
    rows = _Rows.of(requests)
    start, end, fill_deficit = _window_and_fill_deficit(rows, window)
    metrics = _window_metrics(rows, rows, timeseries, pool_tokens, window, start, end)
    head = ("window_start_s", "window_end_s", "window_requests")
    metrics = {key: metrics[key] for key in head} | {"fill_deficit_s": fill_deficit} | metrics
    fill_tokens = pool_tokens if context_tokens is None else context_tokens
    metrics |= stationarity(rows, timeseries, start, end, fill_tokens, window.trend_segments)
    return metrics


def stopped_metrics(
    requests: pd.DataFrame,
    timeseries: pd.DataFrame,
    pool_tokens: int,
    window: SteadyWindow,
    stopped: dict[str, Any],
) -> dict[str, Any]:
    """The metrics of a run stopped early because an SLO was certainly broken
    (``sim.planning.sweeps.early_stop``; ``stopped`` says when and why): over the part of the window
    that ran, from its earliest possible start to the stop, each latency of a request still in
    flight taken as it stood at the stop. Every latency is then a lower bound of the full run's; the
    rest describes the run up to the stop. No fill or trend measures: the verdict needs none."""
    at = float(stopped["at_s"])
    start, end = float(stopped["window_first_s"]), min(float(stopped["window_end_s"]), at)
    rows = _Rows.of(requests)
    metrics = _window_metrics(_censored_at(rows, at), rows, timeseries, pool_tokens, window, start, end)
    return metrics | {"stopped_early": stopped, "latencies_are_lower_bounds": True}


def censored_at(requests: pd.DataFrame, at: float) -> pd.DataFrame:
    """``requests`` with every unfinished one's latencies taken as they stood at ``at``: a first
    token, admission and finish not reached by then count as reached at ``at`` (lower bounds)."""
    columns: dict[str, Any] = _censored_columns(_Rows.of(requests), at)
    columns["outcome"] = pd.array(columns["outcome"], dtype=requests["outcome"].dtype)  # text stays text
    return requests.assign(**columns)


def _censored_at(requests: _Rows, at: float) -> _Rows:
    censored = _censored_columns(requests, at)
    return _Rows(lambda name: censored[name] if name in censored else requests[name], len(requests))


def _censored_columns(requests: _Rows, at: float) -> dict[str, np.ndarray]:
    open_ = requests["outcome"] == "unfinished"

    def reached(name: str) -> np.ndarray:
        column = np.asarray(requests[name], dtype=float)
        return np.where(open_ & np.isnan(column), at, column)

    outcome = np.array(requests["outcome"], dtype=object)
    outcome[open_] = "finished"
    arrival = np.asarray(requests["arrival_s"], dtype=float)
    admitted, first_token = reached("admitted_s"), reached("first_token_s")
    finish = np.where(open_, at, np.asarray(requests["finish_s"], dtype=float))
    overhead, outputs = requests["client_overhead_s"], requests["output_tokens"]
    # The latencies as the requests table derives them (sim.outputs.metrics.requests_frame).
    return {
        "outcome": outcome,
        "admitted_s": admitted,
        "first_token_s": first_token,
        "finish_s": finish,
        "ttft_s": first_token - arrival + overhead,
        "e2e_s": finish - arrival + overhead,
        "tpot_s": (finish - first_token) / np.where(outputs > 1, outputs - 1, np.nan),
        "queue_s": admitted - arrival,
    }


def _window_metrics(
    latencies: _Rows,
    requests: _Rows,
    timeseries: pd.DataFrame,
    pool_tokens: int,
    window: SteadyWindow,
    start: float,
    end: float,
) -> dict[str, Any]:
    """Everything measured over the window [start, end]: latencies from ``latencies`` (the requests
    table, or a stopped run's censored one), rates and counts from ``requests``, means from the
    series."""
    inside = requests.arrived_within(start, end)
    timed = latencies.arrived_within(start, end)
    middle = (start + end) / 2
    metrics: dict[str, Any] = {"window_start_s": start, "window_end_s": end, "window_requests": len(inside)}
    metrics |= _latencies(timed, "", window)
    metrics |= _latencies(timed.where(timed["arrival_s"] >= middle), "late_", window)
    metrics |= _rates(requests, inside, start, end)
    metrics |= _series_means(timeseries, start, end, pool_tokens)
    growth = metrics.pop("waiting_growth", None)
    metrics["queue_growth_frac"] = growth / len(inside) if growth is not None and len(inside) else None
    return metrics


def kv_tokens_per_request(requests: pd.DataFrame) -> float | None:
    """Mean KV tokens a request holds when it finishes: its prompt plus every sample's output."""
    return _kv_tokens_per_request(_Rows.of(requests))


def _kv_tokens_per_request(requests: _Rows) -> float | None:
    if not len(requests):
        return None
    return float((requests["prompt_tokens"] + requests["sample_output_tokens"]).mean())


def stationarity(
    requests: pd.DataFrame | _Rows,
    timeseries: pd.DataFrame,
    start: float,
    end: float,
    pool_tokens: int,
    segments: int,
) -> dict[str, float | None]:
    """How far the probe is from a steady state: its arrival span in units of the time the arrivals
    take to fill the KV pool's ``pool_tokens`` tokens of context (``fill_multiple``; a hybrid pool's
    slots count a token once per layer group, so its caller passes the context it holds), and how
    much KV usage (share of the pool), the
    running batch (relative to it) and the waiting queue (requests, and share of the window's
    arrivals) rose from the window's first segment to its last.

    First against last, not neighbouring segments: a pool that fills slowly (each admitted request
    makes the batch slower, so requests stay longer and hold more) rises a little per segment, less
    than the noise between two neighbours, but plainly across the window."""
    rows = requests if isinstance(requests, _Rows) else _Rows.of(requests)
    times = np.asarray(rows["arrival_s"], dtype=float)
    result: dict[str, float | None] = dict.fromkeys(
        (
            "tokens_per_request",
            "pool_fill_s",
            "arrival_span_s",
            "fill_multiple",
            "kv_usage_rise",
            "running_rise_frac",
            "waiting_rise",
            "waiting_rise_frac",
        )
    )
    if len(times) < 2:
        return result
    span = float(times.max() - times.min())
    tokens = _kv_tokens_per_request(rows)
    result["tokens_per_request"] = tokens
    result["arrival_span_s"] = span
    if tokens and span > 0:
        fill = pool_tokens / (len(times) / span * tokens)
        result["pool_fill_s"] = fill
        result["fill_multiple"] = span / fill
    if end > start and segments >= 2:
        edges = np.linspace(start, end, segments + 1)
        first, last = (float(edges[0]), float(edges[1])), (float(edges[-2]), float(edges[-1]))
        kv = [_mean_of(timeseries, "kv_cache_usage_perc", *part) for part in (first, last)]
        running = [_mean_of(timeseries, "num_requests_running", *part) for part in (first, last)]
        waiting = [_mean_of(timeseries, "num_requests_waiting", *part) for part in (first, last)]
        arrivals = int(((times >= start) & (times <= end)).sum())
        result["kv_usage_rise"] = kv[1] - kv[0]
        # Relative to the batch, with a floor of one request: a batch of 0.4 rising to 1.2 is noise.
        result["running_rise_frac"] = (running[1] - running[0]) / max(running[0], 1.0)
        result["waiting_rise"] = waiting[1] - waiting[0]
        result["waiting_rise_frac"] = (waiting[1] - waiting[0]) / arrivals if arrivals else None
    return result


def _latencies(requests: _Rows, prefix: str, window: SteadyWindow) -> dict[str, float | None]:
    """Percentiles and means of the finished requests' latencies; the mean normalized latency (each
    request's E2E over its output tokens, the vLLM paper's metric); and the goodput SLO's attainment
    over every request (one that did not finish misses its targets)."""
    finished = requests.finished()
    result: dict[str, float | None] = {}
    for column in LATENCY_METRICS:
        name = column.removesuffix("_s")
        values = finished.values(column)
        for q in (50, 99):
            result[f"{prefix}{name}_p{q}_s"] = float(np.percentile(values, q)) if len(values) else None
        result[f"{prefix}{name}_mean_s"] = float(values.mean()) if len(values) else None
    outputs = np.asarray(finished["output_tokens"], dtype=float)
    normalized = np.asarray(finished["e2e_s"], dtype=float)[outputs > 0] / outputs[outputs > 0]
    result[f"{prefix}normalized_latency_mean_s"] = float(normalized.mean()) if len(normalized) else None
    if window.goodput_ttft_s is not None or window.goodput_tpot_s is not None:
        result[f"{prefix}attainment_frac"] = _attainment(
            requests, window.goodput_ttft_s, window.goodput_tpot_s
        )
    return result


def attainment(requests: pd.DataFrame, ttft_s: float | None, tpot_s: float | None) -> float | None:
    """Share of ``requests`` that finished within both per-request targets (DistServe's SLO
    attainment). A single-token output has no TPOT: it meets a TPOT target trivially."""
    return _attainment(_Rows.of(requests), ttft_s, tpot_s)


def _attainment(requests: _Rows, ttft_s: float | None, tpot_s: float | None) -> float | None:
    if not len(requests):
        return None
    met = np.array(requests["outcome"] == "finished", dtype=bool)
    if ttft_s is not None:
        met &= np.asarray(requests["ttft_s"], dtype=float) <= ttft_s
    if tpot_s is not None:
        tpot = np.asarray(requests["tpot_s"], dtype=float)
        met &= np.isnan(tpot) | (tpot <= tpot_s)
    return float(met.mean())


def _rates(requests: _Rows, inside: _Rows, start: float, end: float) -> dict[str, Any]:
    duration = end - start
    count = len(inside)
    finished = requests.finished()
    finish = finished["finish_s"]
    done_inside = finished.where((finish >= start) & (finish <= end))
    window_finished = inside.finished()
    outcome = inside["outcome"]
    return {
        "window_s": duration,
        "arrival_rate_per_s": count / duration if duration > 0 else None,
        "completion_rate_per_s": len(done_inside) / duration if duration > 0 else None,
        # sample_output_tokens: all samples/beams of a request (samples may stop at different lengths)
        "output_tokens_per_s": float(done_inside["sample_output_tokens"].sum()) / duration
        if duration > 0
        else None,
        "output_tokens_per_request": float(window_finished["sample_output_tokens"].mean())
        if len(window_finished)
        else None,
        "preemptions_per_request": float(inside["preemptions"].sum()) / count if count else None,
        "rejected_frac": float((outcome == "rejected").sum()) / count if count else None,
        "failed_oom_frac": float((outcome == "failed_oom").sum()) / count if count else None,
    }


def _series_means(timeseries: pd.DataFrame, start: float, end: float, pool_tokens: int) -> dict[str, Any]:
    """Time-weighted means over [start, end]. Memory shares from the recorder's exact areas (the
    tokens decoded inside event-skipping jumps included); counts and the admission blocker hold
    their value from one row to the next."""
    times = timeseries["time_s"].to_numpy(dtype=float)
    if len(times) < 2 or end <= start:
        return {}
    lo, hi = times[:-1], times[1:]
    weights = np.clip(np.minimum(hi, end) - np.maximum(lo, start), 0.0, None)
    total = weights.sum()
    if total <= 0:
        return {}
    weights = weights / total
    result = _memory_shares(timeseries, max(start, times[0]), min(end, times[-1]), weights, pool_tokens)
    for column, name in (
        ("num_requests_running", "mean_running"),
        ("num_sequences_running", "mean_sequences_running"),
        ("num_requests_waiting", "mean_waiting"),
        ("kv_cache_usage_perc", "mean_kv_cache_usage_frac"),
    ):
        result[name] = float((timeseries[column].to_numpy(dtype=float)[:-1] * weights).sum())
    in_window = (times >= start) & (times <= end)
    running = timeseries["num_requests_running"].to_numpy()[in_window]
    result["peak_running"] = int(running.max()) if len(running) else 0
    preemptions = timeseries["preemptions"].to_numpy()[in_window]
    result["window_preemptions"] = int(preemptions.max() - preemptions.min()) if len(preemptions) else 0
    result["waiting_growth"] = _waiting_growth(timeseries, start, end)
    blocker = timeseries["admission_blocker"].to_numpy()[:-1]
    for code, name in enumerate(ADMISSION_BLOCKERS):
        if code:
            result[f"blocked_by_{name}_frac"] = float(weights[blocker == code].sum())
    return result


def _memory_shares(
    timeseries: pd.DataFrame, start: float, end: float, weights: np.ndarray, pool_tokens: int
) -> dict[str, Any]:
    """Each breakdown category's mean share of the pool over [start, end] (within the series). A
    series without the area columns (written before they existed) falls back on the trapezoid rule
    between rows, which misses the steps of single iterations and of the blocks taken inside jumps."""
    result: dict[str, Any] = {}
    exact = all(f"{category}_token_s" in timeseries for category in MemoryBreakdown.CATEGORIES)
    bounds = np.array([start, end])
    for category in MemoryBreakdown.CATEGORIES:
        value = f"{category}_tokens"
        if exact:
            low, high = cumulative_area_at(timeseries, f"{category}_token_s", value, bounds)
            mean = (high - low) / (end - start)
        else:
            values = timeseries[value].to_numpy(dtype=float)
            mean = ((values[:-1] + values[1:]) / 2 * weights).sum()
        result[summary_key(category)] = float(mean) / pool_tokens
    return result


def _waiting_growth(timeseries: pd.DataFrame, start: float, end: float, part: float = 0.1) -> float:
    """Mean waiting requests over the window's last tenth minus over its first tenth: near zero when
    the engine keeps up (the running batch may fluctuate, the queue does not build), and
    (arrival rate - service rate) x window in overload."""
    span = (end - start) * part
    return _mean_waiting(timeseries, end - span, end) - _mean_waiting(timeseries, start, start + span)


def _mean_waiting(timeseries: pd.DataFrame, start: float, end: float) -> float:
    return _mean_of(timeseries, "num_requests_waiting", start, end)


def _mean_of(timeseries: pd.DataFrame, column: str, start: float, end: float) -> float:
    """Time-weighted mean of a step series (each row's value holds until the next row) over [start, end]."""
    times = timeseries["time_s"].to_numpy(dtype=float)
    weights = np.clip(np.minimum(times[1:], end) - np.maximum(times[:-1], start), 0.0, None)
    total = weights.sum()
    values = timeseries[column].to_numpy(dtype=float)[:-1]
    return float((values * weights).sum() / total) if total > 0 else 0.0
