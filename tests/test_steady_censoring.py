"""A run stopped early (``sim/planning/sweeps/early_stop.py``) still measures what its unfinished
requests had waited: ``censored_at`` takes each one's latencies as they stood when the clock stopped
(lower bounds). Worked by hand on four requests."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from sim.planning.sweeps.steady import censored_at

NAN = math.nan


def requests() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "request_id": [0, 1, 2, 3],
            "arrival_s": [0.0, 1.0, 2.0, 3.0],
            "admitted_s": [0.5, 1.5, NAN, NAN],
            "first_token_s": [1.0, 2.0, NAN, NAN],
            "finish_s": [3.0, NAN, NAN, NAN],
            "outcome": ["finished", "unfinished", "unfinished", "rejected"],
            "output_tokens": [5, 5, 1, 5],
            "client_overhead_s": [0.1, 0.1, 0.1, 0.1],
        }
    )


def test_unfinished_requests_count_as_ending_when_the_clock_stopped():
    """Stopped at t=4. Request 0 finished: TTFT 1 + 0.1 client overhead, E2E 3.1, TPOT (3 - 1) / 4,
    queue 0.5. Request 1 had its first token at 2: it counts as finishing at 4 (E2E 3.1, TPOT
    (4 - 2) / 4). Request 2 was never admitted: admitted, first token and end all at 4 (queue 2, TTFT
    and E2E 2.1, no TPOT for one token). Request 3 was rejected: it stays so, without latencies."""
    original = requests()
    frame = censored_at(original, 4.0)
    assert list(frame["outcome"]) == ["finished", "finished", "finished", "rejected"]
    assert list(frame["finish_s"].iloc[:3]) == [3.0, 4.0, 4.0]
    assert frame["ttft_s"].tolist()[:3] == pytest.approx([1.1, 1.1, 2.1])
    assert frame["e2e_s"].tolist()[:3] == pytest.approx([3.1, 3.1, 2.1])
    assert frame["tpot_s"].tolist() == pytest.approx([0.5, 0.5, NAN, NAN], nan_ok=True)
    assert frame["queue_s"].tolist()[:3] == pytest.approx([0.5, 0.5, 2.0])
    assert frame[["ttft_s", "e2e_s", "queue_s"]].iloc[3].isna().all()
    assert frame["admitted_s"].tolist()[:3] == [0.5, 1.5, 4.0]
    assert frame["first_token_s"].tolist()[:3] == [1.0, 2.0, 4.0]
    # The caller's table is left as it was.
    pd.testing.assert_frame_equal(original, requests())


def test_the_windows_rates_count_arrivals_inside_and_completions_inside_by_hand():
    """Window [10, 20] s. Arrivals inside (edges included): requests 1-4, 0.4 per second; request 0
    arrived before but finished inside (12 s), request 2 arrived inside but finished after: the
    completions inside are 0 and 1 (0.2 per second, 150 output tokens: 15 per second). Output per
    request is over those that arrived inside and finished (1 and 2: 60); preemptions, rejections and
    failures per request arrived inside (3 / 4, 1 / 4, 1 / 4)."""
    from sim.planning.sweeps.steady import _rates, _Rows

    requests = pd.DataFrame(
        {
            "arrival_s": [5.0, 10.0, 15.0, 18.0, 20.0, 21.0],
            "outcome": ["finished", "finished", "finished", "rejected", "failed_oom", "finished"],
            "finish_s": [12.0, 15.0, 25.0, NAN, NAN, 22.0],
            "sample_output_tokens": [100, 50, 70, 0, 0, 30],
            "preemptions": [0, 1, 2, 0, 0, 5],
        }
    )
    rows = _Rows.of(requests)
    inside = rows.arrived_within(10.0, 20.0)
    assert _rates(rows, inside, 10.0, 20.0) == pytest.approx(
        {
            "window_s": 10.0,
            "arrival_rate_per_s": 0.4,
            "completion_rate_per_s": 0.2,
            "output_tokens_per_s": 15.0,
            "output_tokens_per_request": 60.0,
            "preemptions_per_request": 0.75,
            "rejected_frac": 0.25,
            "failed_oom_frac": 0.25,
        }
    )
    # A window of no time and no arrivals measures no rate.
    empty = _rates(rows, rows.arrived_within(10.0, 9.0), 10.0, 10.0)
    assert empty["window_s"] == 0.0
    assert all(empty[key] is None for key in empty if key != "window_s")


def test_the_series_means_over_a_window_by_hand():
    """Rows at 0, 10, 20, 30 s, each holding to the next; window [5, 25]: the three segments weigh
    5, 10 and 5 s (0.25, 0.5, 0.25). Running 2, 4, 6 -> 4; sequences 3, 5, 7 -> 5; waiting 0, 2, 4
    -> 2; KV usage 0.1, 0.3, 0.5 -> 0.3. The rows inside (10 and 20 s): peak 6 running, 3 - 1 = 2
    preemptions. The queue grew by 4 from the window's first tenth (0 waiting) to its last (4).
    Blocked by memory half the window, by max_num_seqs a quarter. Memory shares, in a series without
    the area columns, by the trapezoid rule: used 0, 20, 40, 60 of 100 tokens -> segments 10, 30, 50
    -> 0.3, free 0.7."""
    from sim.planning.sweeps.steady import _series_means

    series = pd.DataFrame(
        {
            "time_s": [0.0, 10.0, 20.0, 30.0],
            "num_requests_running": [2, 4, 6, 8],
            "num_sequences_running": [3, 5, 7, 9],
            "num_requests_waiting": [0, 2, 4, 6],
            "kv_cache_usage_perc": [0.1, 0.3, 0.5, 0.7],
            "preemptions": [0, 1, 3, 7],
            "admission_blocker": [0, 1, 2, 0],
        }
    )
    for category in ("reserved", "internal_fragmentation", "external_fragmentation", "cached"):
        series[f"{category}_tokens"] = 0
    series["used_tokens"], series["free_tokens"] = [0, 20, 40, 60], [100, 80, 60, 40]
    assert _series_means(series, 5.0, 25.0, 100) == pytest.approx(
        {
            "mean_used_frac": 0.3,
            "mean_reserved_frac": 0.0,
            "mean_internal_frag_frac": 0.0,
            "mean_external_frag_frac": 0.0,
            "mean_cached_frac": 0.0,
            "mean_free_frac": 0.7,
            "mean_running": 4.0,
            "mean_sequences_running": 5.0,
            "mean_waiting": 2.0,
            "mean_kv_cache_usage_frac": 0.3,
            "peak_running": 6,
            "window_preemptions": 2,
            "waiting_growth": 4.0,
            "blocked_by_kv_memory_frac": 0.5,
            "blocked_by_max_num_seqs_frac": 0.25,
            "blocked_by_token_budget_frac": 0.0,
        }
    )
    assert _series_means(series, 5.0, 5.0, 100) == {}  # a window of no time
    assert _series_means(series.iloc[:1], 0.0, 10.0, 100) == {}  # one row: no segment


def test_a_stopped_runs_metrics_measure_the_window_up_to_the_stop_by_hand():
    """The four requests above, stopped at 4 s with the window from 0.5 s: it ends at the stop, and
    holds requests 1-3 (arrivals in [0.5, 4]). Latencies from the censored table: request 1 (TTFT
    1.1, E2E 3.1, TPOT 0.5, queue 0.5) and request 2 (2.1, 2.1, none, 2.0; request 3 was rejected):
    means 1.6, 2.6, 0.5, 1.25; E2E per output token 3.1 / 5 and 2.1 / 1: 1.36. No request arrived in
    the window's second half and finished. Rates from the table as it stood (request 0 finished at
    3, inside): 3 arrivals and 1 completion in 3.5 s. Series (rows each second, weights 0.5, 1, 1, 1
    over 3.5 s): running 0, 1, 2, 1 -> 4 / 3.5; blocked by memory from 2 to 4 s -> 2 / 3.5; the queue
    grew by 1 (first tenth 0, last 1), a third of the window's 3 arrivals."""
    from policies.base import MemoryBreakdown
    from sim.planning.sweeps.steady import SteadyWindow, stopped_metrics

    table = requests()
    table["prompt_tokens"], table["sample_output_tokens"], table["preemptions"] = (
        100,
        table["output_tokens"],
        0,
    )
    series = pd.DataFrame(
        {
            "time_s": [0.0, 1.0, 2.0, 3.0, 4.0],
            "num_requests_running": [0, 1, 2, 1, 1],
            "num_sequences_running": [0, 1, 2, 1, 1],
            "num_requests_waiting": [0, 0, 1, 1, 0],
            "kv_cache_usage_perc": [0.0, 0.1, 0.2, 0.1, 0.1],
            "preemptions": [0] * 5,
            "admission_blocker": [0, 0, 1, 1, 0],
        }
    )
    for category in MemoryBreakdown.CATEGORIES:
        series[f"{category}_tokens"] = 100 if category == "free" else 0
    stopped = {"at_s": 4.0, "window_first_s": 0.5, "window_end_s": 10.0, "reason": "TTFT SLO broken"}
    metrics = stopped_metrics(table, series, 100, SteadyWindow(), stopped)
    expected = {
        "window_start_s": 0.5,
        "window_end_s": 4.0,
        "window_requests": 3,
        "ttft_mean_s": 1.6,
        "ttft_p50_s": 1.6,
        "ttft_p99_s": 1.1 + 0.99 * 1.0,
        "e2e_mean_s": 2.6,
        "tpot_mean_s": 0.5,
        "queue_mean_s": 1.25,
        "normalized_latency_mean_s": 1.36,
        "late_ttft_mean_s": None,
        "window_s": 3.5,
        "arrival_rate_per_s": 3 / 3.5,
        "completion_rate_per_s": 1 / 3.5,
        "output_tokens_per_request": None,
        "rejected_frac": 1 / 3,
        "mean_running": 4 / 3.5,
        "mean_free_frac": 1.0,
        "peak_running": 2,
        "blocked_by_kv_memory_frac": 2 / 3.5,
        "queue_growth_frac": 1 / 3,
        "latencies_are_lower_bounds": True,
    }
    assert {key: metrics[key] for key in expected} == pytest.approx(expected)
    assert metrics["stopped_early"] == stopped


def test_how_far_a_probe_is_from_a_steady_state_by_hand():
    """Five arrivals 10 s apart (span 40 s), each holding 100 prompt + 100 output tokens: they fill a
    pool of 1,000 tokens in 1,000 / (5 / 40 x 200) = 40 s, once over the span. Window [0, 40] in four
    segments: first [0, 10], last [30, 40]; each series row holds to the next, so KV usage rises
    0.1 -> 0.4, the batch 1 -> 4 (3 times the first segment's), the queue 0 -> 2 (2 of 5 arrivals)."""
    from sim.planning.sweeps.steady import stationarity

    arrivals = pd.DataFrame(
        {"arrival_s": [0.0, 10.0, 20.0, 30.0, 40.0], "prompt_tokens": 100, "sample_output_tokens": 100}
    )
    series = pd.DataFrame(
        {
            "time_s": [0.0, 10.0, 20.0, 30.0, 40.0],
            "kv_cache_usage_perc": [0.1, 0.2, 0.3, 0.4, 0.5],
            "num_requests_running": [1, 2, 3, 4, 5],
            "num_requests_waiting": [0, 0, 1, 2, 3],
        }
    )
    assert stationarity(arrivals, series, 0.0, 40.0, 1000, 4) == pytest.approx(
        {
            "tokens_per_request": 200.0,
            "pool_fill_s": 40.0,
            "arrival_span_s": 40.0,
            "fill_multiple": 1.0,
            "kv_usage_rise": 0.3,
            "running_rise_frac": 3.0,
            "waiting_rise": 2.0,
            "waiting_rise_frac": 0.4,
        }
    )
    # Less than a batch of one in the first segment: the rise is measured against one request.
    low = series.assign(num_requests_running=[0.5, 1, 1, 1.5, 2])
    assert stationarity(arrivals, low, 0.0, 40.0, 1000, 4)["running_rise_frac"] == pytest.approx(1.0)
    # One segment has no first and last to compare; one arrival no span.
    one_segment = stationarity(arrivals, series, 0.0, 40.0, 1000, 1)
    assert one_segment["fill_multiple"] == pytest.approx(1.0) and one_segment["kv_usage_rise"] is None
    assert all(
        value is None for value in stationarity(arrivals.iloc[:1], series, 0.0, 40.0, 1000, 4).values()
    )


def test_censoring_keeps_the_outcome_column_s_type():
    """The censored table's outcome column is the table's own type (text), not Python objects."""
    original = requests()
    original["outcome"] = original["outcome"].astype("string")
    assert censored_at(original, 4.0)["outcome"].dtype == original["outcome"].dtype
