"""The replay comparison (``sim/replay/compare.py``) on a seven-request run worked out by hand: what is
paired, what is left out and why, every statistic, error and throughput figure, and the stages."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.replay.compare import (
    compare,
    compare_scope,
    headline_errors,
    headline_tpot,
    in_system,
    not_compared,
    paired_frame,
    per_request_tpot,
    rejection_examples,
    relative_error,
    statistics,
    throughput,
)
from sim.replay.measured import MeasuredRun, ServerSettings, Stage

NAN = math.nan
# id: arrival, prompt, output, measured TTFT, measured E2E, stage | kvsim's outcome, reason, TTFT, E2E
ROWS = {
    0: (0.0, 100, 11, 0.10, 1.10, 0, "finished", "", 0.11, 1.21),
    1: (1.0, 200, 21, 0.20, 2.20, 0, "finished", "", 0.18, 2.18),
    2: (2.0, 300, 1, 0.30, 0.30, 1, "finished", "", 0.33, 0.33),  # one token: no TPOT
    3: (3.0, 400, 5, NAN, NAN, 1, "rejected", "prompt too long", NAN, NAN),  # lost by the measured run
    4: (4.0, 500, 5, 0.50, 1.50, 1, "unfinished", "", 0.55, NAN),
    5: (5.0, 600, 5, 0.60, 1.60, 1, "rejected", "prompt too long", NAN, NAN),
    6: (6.0, 700, 5, 0.70, 1.70, 1, "failed_oom", "no room", NAN, NAN),
}


def measured_run(tpot_definition="per_request", stages=None) -> MeasuredRun:
    requests = pd.DataFrame(
        [(rid, *row[:6]) for rid, row in ROWS.items()],
        columns=["request_id", "arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "e2e_s", "stage"],
    )
    return MeasuredRun(
        "hand",
        "test",
        Path("hand.csv"),
        requests,
        ServerSettings(),
        "client",
        tpot_definition,
        stages or [Stage(0.0, 6.0)],
    )


def simulated(with_reason=True) -> pd.DataFrame:
    # In another order than the measured table: the pairing goes by request id.
    frame = pd.DataFrame(
        [(rid, row[6], row[7], 0, 0, row[8], row[9]) for rid, row in reversed(ROWS.items())],
        columns=["request_id", "outcome", "reason", "preemptions", "cached_prompt_tokens", "ttft_s", "e2e_s"],
    )
    return frame if with_reason else frame.drop(columns="reason")


def test_the_pairing_goes_by_request_id_and_keeps_finished_requests_latencies_only():
    paired = paired_frame(measured_run(), simulated())
    assert list(paired["request_id"]) == list(range(7))
    assert list(paired["outcome_simulated"]) == [row[6] for row in ROWS.values()]
    # Request 4's TTFT is left out with its E2E: kvsim did not finish it.
    assert paired["ttft_s_simulated"].tolist()[:3] == [0.11, 0.18, 0.33]
    assert paired["ttft_s_simulated"].iloc[3:].isna().all()
    assert paired["tpot_s_measured"].tolist()[:2] == pytest.approx([0.1, 0.1])  # 1.0 / 10, 2.0 / 20
    assert paired["tpot_s_simulated"].tolist()[:2] == pytest.approx([0.11, 0.1])  # 1.1 / 10, 2.0 / 20
    assert paired["tpot_s_measured"].iloc[2:4].isna().all()  # one token; then no measured times
    assert paired["tpot_s_measured"].iloc[4:].tolist() == pytest.approx([0.25] * 3)  # 1.0 / 4
    assert list(paired_frame(measured_run(), simulated(with_reason=False))["reason_simulated"]) == [""] * 7
    assert list(paired.columns) == [
        "request_id",
        "stage",
        "arrival_s",
        "prompt_tokens",
        "output_tokens",
        "outcome_simulated",
        "reason_simulated",
        "preemptions_simulated",
        "cached_prompt_tokens_simulated",
        "ttft_s_measured",
        "e2e_s_measured",
        "ttft_s_simulated",
        "e2e_s_simulated",
        "tpot_s_measured",
        "tpot_s_simulated",
    ]
    assert list(paired["prompt_tokens"]) == [100, 200, 300, 400, 500, 600, 700]


def test_a_measured_request_the_simulation_lacks_is_named():
    with pytest.raises(
        ValueError, match=r"^the simulation has no row for 2 measured request\(s\), e\.g\. 5$"
    ):
        paired_frame(measured_run(), simulated().query("request_id < 5"))


def test_requests_left_out_are_counted_by_the_first_reason_that_holds():
    """Request 3 failed in the measured run (whatever kvsim did with it); 4 was not finished by kvsim,
    5 rejected, 6 failed for memory. The reasons of requests kvsim turned away, distinct, in order."""
    paired = paired_frame(measured_run(), simulated())
    assert not_compared(paired) == {"measured_failed": 1, "rejected": 1, "failed_oom": 1, "unfinished": 1}
    assert not_compared(paired.iloc[:3]) == {}
    assert rejection_examples(paired) == ["prompt too long", "no room"]
    assert rejection_examples(paired, limit=1) == ["prompt too long"]
    assert rejection_examples(paired.iloc[:3]) == []
    assert rejection_examples(paired.drop(columns="reason_simulated")) == []
    # A request kvsim calls finished but gave no latency (no first token) is not compared either.
    odd = paired.iloc[:2].copy()
    odd.loc[1, "ttft_s_simulated"] = NAN
    assert not_compared(odd) == {"unfinished": 1}
    odd.loc[0, "e2e_s_measured"] = NAN  # a first token measured, no end: lost by the measured run
    assert not_compared(odd) == {"measured_failed": 1, "unfinished": 1}
    # At most three distinct reasons by default, in the order they first occur.
    many = paired.iloc[:4].copy()
    many["outcome_simulated"] = "rejected"
    many["reason_simulated"] = ["a", "b", "a", "c"]
    assert rejection_examples(many) == ["a", "b", "c"]
    many.loc[3, "reason_simulated"], many.loc[2, "reason_simulated"] = "d", "c"
    assert rejection_examples(many) == ["a", "b", "c"]


def test_the_whole_runs_statistics_and_errors_by_hand():
    """Both sides finished requests 0, 1, 2. TTFT measured 0.1, 0.2, 0.3 (mean 0.2; p90 of three
    values by linear interpolation: 0.2 + 0.8 x 0.1 = 0.28), simulated 0.11, 0.18, 0.33 (mean 0.62/3):
    +3.33 %. E2E 1.1, 2.2, 0.3 (mean 1.2) against 1.21, 2.18, 0.33 (1.24): +3.33 %. TPOT over the two
    requests with more than one token: 0.1, 0.1 against 0.11, 0.1: +5 %, the publisher's (per-request)
    definition too."""
    run = measured_run()
    scope = compare_scope("whole run", paired_frame(run, simulated()), run.tpot_definition)
    assert (scope.name, scope.requests, scope.compared) == ("whole run", 7, 3)
    ttft = scope.metrics["ttft_s"]
    assert ttft["measured"] == pytest.approx({"mean": 0.2, "p50": 0.2, "p90": 0.28, "p99": 0.298})
    assert ttft["simulated"]["mean"] == pytest.approx(0.62 / 3)
    assert ttft["signed_error"]["mean"] == pytest.approx(0.62 / 3 / 0.2 - 1)
    assert ttft["abs_error"]["p50"] == pytest.approx(abs(0.18 / 0.2 - 1))  # simulated median 0.18
    assert ttft["signed_error"]["p50"] == pytest.approx(-0.1)
    assert scope.metrics["e2e_s"]["signed_error"]["mean"] == pytest.approx(1.24 / 1.2 - 1)
    tpot = scope.metrics["tpot_s"]
    assert tpot["measured"]["headline"] == pytest.approx(0.1)
    assert tpot["simulated"]["headline"] == pytest.approx(0.105)
    assert headline_errors(scope) == pytest.approx(
        {"ttft_mean": 0.62 / 3 / 0.2 - 1, "tpot": 0.05, "e2e_mean": 1.24 / 1.2 - 1}
    )
    assert scope.error("tpot_s", "headline") == pytest.approx(0.05)
    assert scope.as_dict() == {
        "name": "whole run",
        "requests": 7,
        "compared": 3,
        "not_compared": {"measured_failed": 1, "rejected": 1, "failed_oom": 1, "unfinished": 1},
        "metrics": scope.metrics,
        "throughput": scope.throughput,
    }


def test_throughput_runs_from_the_first_arrival_to_the_last_finish_of_each_side():
    """Measured: six requests finished (3 was lost), the last at 6 + 1.7 = 7.7 s, 48 output tokens.
    Simulated: three finished, the last at 1 + 2.18 = 3.18 s, 33 tokens; both from the first arrival
    (0). The error is of the simulated rate against the measured."""
    run = measured_run()
    flows = compare_scope("whole run", paired_frame(run, simulated()), run.tpot_definition).throughput
    assert flows["measured"] == pytest.approx({"requests_per_s": 6 / 7.7, "output_tokens_per_s": 48 / 7.7})
    assert flows["simulated"] == pytest.approx({"requests_per_s": 3 / 3.18, "output_tokens_per_s": 33 / 3.18})
    assert flows["signed_error"]["requests_per_s"] == pytest.approx((3 / 3.18) / (6 / 7.7) - 1)
    late = pd.DataFrame({"arrival_s": [2.0, 3.0], "output_tokens": [4, 6], "e2e_s": [1.0, 0.5]})
    assert throughput(late) == pytest.approx({"requests_per_s": 2 / 1.5, "output_tokens_per_s": 10 / 1.5})
    short = pd.DataFrame({"arrival_s": [1.0], "output_tokens": [4], "e2e_s": [0.5]})
    assert throughput(short) == pytest.approx({"requests_per_s": 2.0, "output_tokens_per_s": 8.0})
    none = pd.DataFrame({"arrival_s": [1.0], "output_tokens": [4], "e2e_s": [NAN]})
    instant = pd.DataFrame({"arrival_s": [1.0], "output_tokens": [4], "e2e_s": [0.0]})
    for frame in (none, instant):
        flows = throughput(frame)
        assert list(flows) == ["requests_per_s", "output_tokens_per_s"]
        assert all(math.isnan(value) for value in flows.values())


def test_the_ratio_of_means_tpot_divides_mean_decode_time_by_mean_decoded_tokens():
    """(mean E2E - mean TTFT) / (mean output - 1) over the compared requests: measured (1.2 - 0.2) /
    (11 - 1) = 0.1, simulated (1.24 - 0.62/3) / 10."""
    run = measured_run("ratio_of_means")
    scope = compare_scope("whole run", paired_frame(run, simulated()), run.tpot_definition)
    tpot = scope.metrics["tpot_s"]
    assert tpot["measured"]["headline"] == pytest.approx(0.1)
    assert tpot["simulated"]["headline"] == pytest.approx((1.24 - 0.62 / 3) / 10)
    frame = pd.DataFrame({"ttft_s": [0.1, 0.3, 0.2], "e2e_s": [1.1, 0.3, 0.5], "output_tokens": [11, 1, 2]})
    # The one-token request drops out; two tokens: one decode step of 0.3 s.
    assert per_request_tpot(frame).tolist() == pytest.approx([0.1, NAN, 0.3], nan_ok=True)
    assert headline_tpot(frame, "per_request") == pytest.approx(0.2)
    assert headline_tpot(frame, "ratio_of_means") == pytest.approx((1.9 / 3 - 0.2) / (14 / 3 - 1))
    # Half a decoded token per request on average still divides; none at all gives NaN, silently.
    assert headline_tpot(frame.iloc[1:], "ratio_of_means") == pytest.approx((0.4 - 0.25) / 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert math.isnan(headline_tpot(frame.iloc[1:2], "ratio_of_means"))


def test_each_load_stage_is_compared_after_the_whole_run():
    """Every scope uses the run's own TPOT definition (here the ratio of means)."""
    run = measured_run("ratio_of_means", stages=[Stage(0.0, 2.0, 1.0), Stage(2.0, 7.0)])
    scopes = compare(run, paired_frame(run, simulated()))
    assert [(s.name, s.requests, s.compared) for s in scopes] == [
        ("whole run", 7, 3),
        ("stage 1 (0-2 s at 1 req/s)", 2, 2),
        ("stage 2 (2-7 s)", 5, 1),
    ]
    assert scopes[1].metrics["ttft_s"]["measured"]["mean"] == pytest.approx(0.15)
    # Whole run: (1.2 - 0.2) / (11 - 1); stage 1, requests 0 and 1: (1.65 - 0.15) / (16 - 1).
    assert scopes[0].metrics["tpot_s"]["measured"]["headline"] == pytest.approx(0.1)
    assert scopes[1].metrics["tpot_s"]["measured"]["headline"] == pytest.approx(0.1)
    assert scopes[1].metrics["tpot_s"]["simulated"]["headline"] == pytest.approx((1.695 - 0.145) / 15)
    # The headline error is of the publisher's TPOT (here not the mean of per-request TPOTs, +5 %).
    assert scopes[0].metrics["tpot_s"]["simulated"]["headline"] == pytest.approx((1.24 - 0.62 / 3) / 10)
    assert headline_errors(scopes[0])["tpot"] == pytest.approx((1.24 - 0.62 / 3) / 10 / 0.1 - 1)
    # Stage 2 compares request 2 alone, whose output is one token: no decode time to divide.
    assert math.isnan(scopes[2].metrics["tpot_s"]["measured"]["headline"])
    assert scopes[2].not_compared == {"measured_failed": 1, "rejected": 1, "failed_oom": 1, "unfinished": 1}
    single = compare(measured_run(), paired_frame(measured_run(), simulated()))
    assert [s.name for s in single] == ["whole run"]


def test_statistics_relative_errors_and_occupancy_at_their_edges():
    assert all(math.isnan(value) for value in statistics(pd.Series([NAN, NAN])).values())
    assert statistics(pd.Series([4.0, NAN, 2.0])) == {"mean": 3.0, "p50": 3.0, "p90": 3.8, "p99": 3.98}
    assert relative_error(1.5, 1.0) == pytest.approx(0.5)
    assert relative_error(0.5, 1.0) == pytest.approx(-0.5)
    for simulated_value, measured_value in ((NAN, 1.0), (1.0, NAN), (math.inf, 1.0), (1.0, 0.0)):
        assert math.isnan(relative_error(simulated_value, measured_value))
    # Requests 0 (0-1 s) and 2 (2-3 s) finished; 1 did not and is not counted. At an end the request
    # has left; at an arrival it is in.
    arrivals, e2e = np.array([0.0, 1.0, 2.0]), np.array([1.0, NAN, 1.0])
    times = np.array([0.0, 0.5, 1.0, 2.5, 3.0])
    assert in_system(arrivals, e2e, times).tolist() == [1, 1, 0, 1, 0]
