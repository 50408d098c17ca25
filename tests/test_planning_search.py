"""The rate search, SLO verdicts, binding limits, sizing and the steady-state window, by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from sim.outputs.metrics import KV_MEMORY, MAX_NUM_SEQS, TOKEN_BUDGET
from sim.planning.plans.analysis import _sizing, binding_limit, rank
from sim.planning.plans.run import Probe, SeedRun
from sim.planning.plans.search import (
    STEADY_STATE,
    RateSearch,
    Violation,
    describe,
    nice_rate,
    unsteady_reasons,
    violations,
)
from sim.planning.plans.spec import SearchSpec, SLOs
from sim.planning.sweeps.steady import (
    SteadyWindow,
    attainment,
    stationarity,
    steady_metrics,
    window_and_fill_deficit,
    window_bounds,
)


def search_against(capacity: float, **spec) -> RateSearch:
    """Run a search where a rate passes exactly when it is at most ``capacity``."""
    search = RateSearch(SearchSpec.model_validate(spec))
    while (rate := search.next_rate()) is not None:
        search.record(rate, rate <= capacity)
    return search


def test_bracket_then_bisect_straddles_the_capacity():
    search = search_against(7.3, start_rate_per_s=2, rel_tolerance=0.05)
    assert search.passed[:3] == [2.0, 4.0] + [search.passed[2]] and search.failed[0] == 8.0
    assert search.lo <= 7.3 < search.hi
    assert search.hi / search.lo - 1 <= 0.05
    assert search.status() == "feasible"
    rates = search.passed + search.failed
    assert len(rates) == len(set(rates))  # never probes a rate twice


def test_bracketing_downwards_and_infeasible():
    down = search_against(0.7, start_rate_per_s=4)
    assert down.failed[:3] == [4.0, 2.0, 1.0] and down.lo <= 0.7 < down.hi
    none = search_against(0.01, start_rate_per_s=1, min_rate_per_s=0.2)
    assert none.status() == "infeasible" and none.lo is None
    assert min(none.failed) == 0.2  # the floor itself was tried before giving up


def test_no_failure_up_to_the_ceiling():
    search = search_against(1e9, start_rate_per_s=10, max_rate_per_s=50)
    assert search.passed == [10.0, 20.0, 40.0, 50.0] and search.status() == "at_max_rate"


def test_max_probes_stops_the_search():
    search = search_against(7.3, start_rate_per_s=1, rel_tolerance=0.001, max_probes=5)
    assert len(search.passed + search.failed) == 5 and "max_probes=5" in search.stopped


def test_rounds_left_counts_bracketing_halvings_and_confirmation():
    """By hand, growth 2 and rel_tolerance 0.05: a bracket of relative width 1 needs
    ceil(log2(1 / 0.05)) = 5 halvings; an unbracketed search one more growth step first (two before
    its first verdict); a confirmation adds one."""
    search = RateSearch(SearchSpec.model_validate({"start_rate_per_s": 2}))
    assert search.rounds_left() == 2 + 5 + 1
    search.record(2.0, True)
    assert search.rounds_left() == 1 + 5 + 1
    search.record(4.0, False)  # bracket [2, 4]: width 1
    assert search.rounds_left() == 5 + 1
    search.record(3.0, True)  # [3, 4]: width 1/3, ceil(log2(6.67)) = 3 halvings
    assert search.rounds_left() == 3 + 1
    search.record(3.9, True)  # [3.9, 4]: width 0.026 <= 0.05, only the confirmation is left
    assert search.rounds_left() == 1
    search.record_confirmation(3.9, True, 10_000)
    assert search.rounds_left() == 0
    no_confirmation = RateSearch(SearchSpec.model_validate({"confirm_factor": 0, "max_probes": 3}))
    no_confirmation.record(1.0, True)
    no_confirmation.record(2.0, True)
    assert no_confirmation.rounds_left() == 1  # max_probes caps the 1 + 5 probes at the one left
    at_ceiling = search_against(1e9, start_rate_per_s=10, max_rate_per_s=50, confirm_factor=0)
    assert at_ceiling.rounds_left() == 0


def test_nice_rates_stay_strictly_inside_the_bracket():
    assert nice_rate(5.123456, 4.0, 6.0) == 5.1
    assert nice_rate(4.0001, 4.0, 4.001) == 4.0001


def test_violations_check_the_late_half_and_describe_ranges():
    slos = SLOs.model_validate({"ttft_p99_s": 2.0, "tpot_p50_s": 0.05})
    fine = {"ttft_p99_s": 1.0, "late_ttft_p99_s": 1.5, "tpot_p50_s": 0.04, "late_tpot_p50_s": 0.04}
    assert violations(fine | {"queue_growth_frac": 0.0}, slos) == []
    late = violations(fine | {"late_ttft_p99_s": 2.5, "queue_growth_frac": 0.0}, slos)
    assert [(v.slo, v.where, v.value) for v in late] == [("ttft_p99_s", "late half", 2.5)]
    growing = violations(fine | {"queue_growth_frac": 0.2}, slos)
    assert [v.slo for v in growing] == ["max_queue_growth_frac"]
    missing = violations({"queue_growth_frac": 0.0}, slos)  # nothing finished: every latency SLO fails
    assert [v.slo for v in missing] == ["ttft_p99_s", "tpot_p50_s"]
    seeds = violations(fine | {"ttft_p99_s": 2.74, "queue_growth_frac": 0}, slos) + violations(
        fine | {"ttft_p99_s": 3.2, "queue_growth_frac": 0.12}, slos
    )
    assert describe(seeds) == ["p99 TTFT 2.74 s–3.20 s > 2.00 s", "queue growth 12.0% > 5.0%"]
    assert describe(missing) == ["p99 TTFT none finished > 2.00 s", "p50 TPOT none finished > 50 ms"]
    # A window that opened 3 s before the system filled is not an SLO broken: the search runs it longer.
    assert violations(fine | {"queue_growth_frac": 0.0, "fill_deficit_s": 3.0}, slos) == []


def failing_probe(broken: dict, blocked: dict, queue_p99: float = 0.9, ttft_p99: float = 1.0) -> Probe:
    steady = {f"blocked_by_{name}_frac": share for name, share in blocked.items()}
    steady |= {"queue_p99_s": queue_p99, "ttft_p99_s": ttft_p99}
    slos = SLOs.model_validate({"ttft_p99_s": 2.0, "tpot_p50_s": 0.05})
    found = violations(broken | {"queue_growth_frac": 0.0}, slos)
    if broken.get("not_steady"):  # at search.max_requests and still not steady (the search adds it)
        found.append(Violation(STEADY_STATE, "no steady state after 20,000 requests", None, 20000, "window"))
    run = SeedRun(1, "abc", {}, steady, found)
    return Probe(7, "c", 3.0, 1000, [run])


OK_LATENCIES = {"ttft_p99_s": 1.0, "late_ttft_p99_s": 1.0, "tpot_p50_s": 0.01, "late_tpot_p50_s": 0.01}


@pytest.mark.parametrize(
    ("broken", "blocked", "queue", "expected"),
    [
        ({"tpot_p50_s": 0.08}, {"kv_memory": 0.5}, 0.9, "compute"),
        ({"ttft_p99_s": 3.0}, {"kv_memory": 0.4, "max_num_seqs": 0.1}, 2.8, "kv_memory"),
        ({"ttft_p99_s": 3.0}, {"kv_memory": 0.01, "max_num_seqs": 0.3}, 2.8, "max_num_seqs"),
        ({"ttft_p99_s": 3.0}, {"token_budget": 0.02}, 2.8, "token_budget"),
        ({"ttft_p99_s": 3.0}, {"kv_memory": 0.3}, 0.2, "compute"),  # slow prefills, not waits
        ({"ttft_p99_s": 3.0}, {}, 2.8, "compute"),  # waited, but nothing held admissions back
        ({"not_steady": True}, {"kv_memory": 0.3}, 0.2, "probe_length"),  # SLOs met, never steady
    ],
)
def test_binding_limit(broken, blocked, queue, expected):
    probe = failing_probe(OK_LATENCIES | broken, blocked, queue_p99=queue, ttft_p99=3.0)
    limit = binding_limit(probe)
    assert limit["limit"] == expected
    assert limit["evidence"]["points"] == ["abc"] and limit["evidence"]["probe"] == 7
    assert binding_limit(None)["limit"] is None


def test_sizing_divides_the_target_evenly():
    result = {
        "max_rate_per_s": 7.5,
        "tensor_parallel_size": 2,
        "price_per_hour": 3.0,
        "at_max": {"output_tokens_per_request": {"mean": 400.0}},
    }
    sizing = _sizing(result, target=50)
    assert sizing["replicas_for_target"] == 7 and sizing["gpus_for_target"] == 14
    assert sizing["headroom_frac"] == pytest.approx(7 * 7.5 / 50 - 1)
    assert sizing["cost_per_million_output_tokens"] == pytest.approx(14 * 3.0 / (50 * 400 * 3600) * 1e6)
    assert sizing["cost_per_hour_for_target"] == pytest.approx(14 * 3.0)
    exact = _sizing(result | {"max_rate_per_s": 10.0}, target=50)
    assert exact["replicas_for_target"] == 5 and exact["headroom_frac"] == pytest.approx(0.0)


def test_sizing_a_simulated_cluster_does_not_divide_the_rate():
    """A cluster of 2 replicas x TP 2 simulated whole: it sustains 60 req/s >= the target 50, so it
    needs its own 2 x 2 = 4 GPUs (headroom 60 / 50 - 1 = +20 %); at 40 req/s it is below the target
    and gets no GPU count (dividing would have said 2 clusters)."""
    result = {
        "max_rate_per_s": 60.0,
        "tensor_parallel_size": 2,
        "replicas": 2,
        "router": "prefix_aware",
        "price_per_hour": 3.0,
        "at_max": {"output_tokens_per_request": {"mean": 400.0}},
    }
    sizing = _sizing(result, target=50)
    assert (sizing["replicas_for_target"], sizing["gpus_for_target"]) == (2, 4)
    assert sizing["headroom_frac"] == pytest.approx(0.2)
    assert sizing["cost_per_hour_for_target"] == pytest.approx(4 * 3.0)
    assert sizing["sizing_method"] == "simulated cluster"
    short = _sizing(result | {"max_rate_per_s": 40.0}, target=50)
    assert "gpus_for_target" not in short and short["status"] == "below_target"
    assert "2 replica(s) behind prefix_aware sustain 40 req/s < the target 50 req/s" in short["reason"]
    # Ranking per GPU counts every replica's GPUs: 60 req/s over 4 GPUs loses to 40 req/s over 2.
    cluster = result | sizing | {"key": "cluster"}
    single = {
        "key": "single",
        "max_rate_per_s": 40.0,
        "tensor_parallel_size": 1,
        "replicas": 1,
        "router": None,
    }
    single |= {"gpus_for_target": 4, "price_per_hour": 3.0, "cost_per_hour_for_target": 12.0}
    assert [r["key"] for r in rank([cluster, single], target=50)] == ["single", "cluster"]


def ten_requests() -> pd.DataFrame:
    """Ten requests arriving at t = 0..9 s, each 2 s in the system (test_steady_window_by_hand)."""
    return pd.DataFrame(
        {
            "arrival_s": [float(t) for t in range(10)],
            "finish_s": [t + 2.0 for t in range(10)],
            "ttft_s": [0.1 * (t + 1) for t in range(10)],
            "tpot_s": [0.01] * 10,
            "e2e_s": [2.0] * 10,
            "queue_s": [0.0] * 10,
            "preemptions": [0, 0, 1, 0, 0, 0, 2, 0, 0, 0],
            "outcome": ["finished"] * 9 + ["rejected"],
            "prompt_tokens": [20] * 10,
            "output_tokens": [10] * 10,
            "sample_output_tokens": [10] * 10,
            "n": [1] * 10,
            "beam_width": [1] * 10,
        }
    )


def test_steady_window_by_hand():
    """Ten requests arriving at t = 0..9 s, each 2 s in the system. The window keeps arrivals between
    the 20 % and 90 % quantiles (1.8 s and 8.1 s), but not before the system has filled: one mean
    residence time (2 s) after the first arrival. So [2.0, 8.1]: requests 2..8."""
    requests = ten_requests()
    # The series: 100 slots, a constant split; blocked by KV memory on [2, 5), max_num_seqs on [5, 6).
    times = [0.0, 2.0, 5.0, 6.0, 12.0]
    series = pd.DataFrame(
        {
            "time_s": times,
            "used_tokens": [40.0] * 5,
            "reserved_tokens": [10.0] * 5,
            "internal_fragmentation_tokens": [5.0] * 5,
            "external_fragmentation_tokens": [0.0] * 5,
            "cached_tokens": [0.0] * 5,
            "free_tokens": [45.0] * 5,
            "num_requests_running": [2, 3, 3, 2, 0],
            "num_sequences_running": [2, 3, 3, 2, 0],
            "num_requests_waiting": [0, 1, 1, 0, 0],
            "kv_cache_usage_perc": [0.55] * 5,
            "preemptions": [0, 1, 2, 3, 3],
            "admission_blocker": [0, KV_MEMORY, MAX_NUM_SEQS, 0, TOKEN_BUDGET],
        }
    )
    got = steady_metrics(requests, series, 100, SteadyWindow(0.2, 0.1))
    assert (got["window_start_s"], got["window_end_s"]) == pytest.approx((2.0, 8.1))
    assert got["window_requests"] == 7  # arrivals 2..8
    assert got["fill_deficit_s"] == 0.0  # the warm-up (2 s) covered the fill
    assert got["ttft_p50_s"] == pytest.approx(0.6)  # median of 0.3..0.9
    # The late half holds arrivals after 5.05 s (6..8: TTFT 0.7..0.9); numpy's p99 interpolates.
    assert got["late_ttft_p99_s"] == pytest.approx(0.898)
    assert got["preemptions_per_request"] == pytest.approx(3 / 7)
    assert got["rejected_frac"] == 0.0
    duration = 8.1 - 2.0
    assert got["arrival_rate_per_s"] == pytest.approx(7 / duration)
    assert got["completion_rate_per_s"] == pytest.approx(7 / duration)  # finished at 2..8 s: requests 0..6
    assert got["output_tokens_per_s"] == pytest.approx(70 / duration)
    assert got["mean_used_frac"] == pytest.approx(0.40) and got["mean_free_frac"] == pytest.approx(0.45)
    assert got["blocked_by_kv_memory_frac"] == pytest.approx(3.0 / duration)
    assert got["blocked_by_max_num_seqs_frac"] == pytest.approx(1.0 / duration)
    assert got["blocked_by_token_budget_frac"] == 0.0
    assert got["mean_waiting"] == pytest.approx(4.0 / duration)
    assert got["peak_running"] == 3 and got["window_preemptions"] == 2  # counter 1 at the start, 3 at the end
    # Waiting over the last tenth of the window (7.49-8.1 s: 0) minus over the first (2.0-2.61 s: 1).
    assert got["queue_growth_frac"] == pytest.approx((0.0 - 1.0) / 7)
    # Means and the normalized latency over requests 2..8: TTFT 0.3..0.9, E2E 2 s over 10 output tokens.
    assert got["ttft_mean_s"] == pytest.approx(0.6) and got["e2e_mean_s"] == pytest.approx(2.0)
    assert got["normalized_latency_mean_s"] == pytest.approx(0.2)
    assert "attainment_frac" not in got  # no goodput SLO: not measured
    # Stationarity: 30 KV tokens per request (20 + 10) at 10 arrivals over 9 s fill 100 slots in
    # 100 / (10 / 9 x 30) = 3 s; the arrivals span 9 s = 3 fills. The window's quarters are 1.525 s:
    # over the first ([2.0, 3.525]) 3 running and 1 waiting, over the last ([6.575, 8.1]) 2 and 0.
    assert got["tokens_per_request"] == 30.0 and got["pool_fill_s"] == pytest.approx(3.0)
    assert got["fill_multiple"] == pytest.approx(3.0)
    assert got["kv_usage_rise"] == pytest.approx(0.0)
    assert got["running_rise_frac"] == pytest.approx((2 - 3) / 3)
    assert got["waiting_rise"] == pytest.approx(-1.0) and got["waiting_rise_frac"] == pytest.approx(-1 / 7)
    # DistServe's attainment with a 0.55 s TTFT target: requests 2, 3 and 4 (TTFT 0.3-0.5 s) of 7;
    # with a TPOT target of 5 ms as well, none (every TPOT is 10 ms).
    goodput = SteadyWindow(0.2, 0.1, goodput_ttft_s=0.55)
    assert steady_metrics(requests, series, 100, goodput)["attainment_frac"] == pytest.approx(3 / 7)
    both = SteadyWindow(0.2, 0.1, goodput_ttft_s=0.55, goodput_tpot_s=0.005)
    assert steady_metrics(requests, series, 100, both)["attainment_frac"] == 0.0


def test_attainment_at_the_edges_by_hand():
    """DistServe's SLO attainment over six requests, targets TTFT 0.5 s and TPOT 20 ms:
    0 finished exactly at both targets (met: the targets are inclusive); 1 a single-token output (no
    TPOT: met by it); 2 unfinished after its first token at 0.1 s (missed, however fast); 3 finished
    fast but at 30 ms per token (misses TPOT only); 4 finished well inside both; 5 rejected."""
    nan = float("nan")
    requests = pd.DataFrame(
        {
            "outcome": ["finished", "finished", "unfinished", "finished", "finished", "rejected"],
            "ttft_s": [0.5, 0.4, 0.1, 0.2, 0.3, nan],
            "tpot_s": [0.02, nan, nan, 0.03, 0.01, nan],
        }
    )
    assert attainment(requests, 0.5, 0.02) == pytest.approx(3 / 6)  # 0, 1, 4
    assert attainment(requests, 0.5, None) == pytest.approx(4 / 6)  # 0, 1, 3, 4
    assert attainment(requests, None, 0.02) == pytest.approx(3 / 6)  # 0, 1, 4
    assert attainment(requests, None, None) == pytest.approx(4 / 6)  # the finished ones
    assert attainment(requests.iloc[:0], 0.5, 0.02) is None


def test_a_batch_under_one_request_rises_relative_to_one_request():
    """The running batch's rise is relative to the first segment's batch with a floor of one request:
    half a request on average over the first quarter of [0, 8] s and one over the last is a rise of
    0.5 requests, 50 % of one request (not 100 % of half a one: a batch that small is noise)."""
    requests = pd.DataFrame(
        {"arrival_s": [0.0, 8.0], "prompt_tokens": [10, 10], "sample_output_tokens": [10, 10]}
    )
    series = pd.DataFrame(
        {
            "time_s": [float(t) for t in range(9)],
            "num_requests_running": [0, 1, 1, 1, 1, 1, 1, 1, 1],
            "num_requests_waiting": [0] * 9,
            "kv_cache_usage_perc": [0.1] * 9,
        }
    )
    got = stationarity(requests, series, 0.0, 8.0, 100, 4)
    assert got["running_rise_frac"] == pytest.approx(0.5)
    assert got["waiting_rise"] == 0.0 and got["kv_usage_rise"] == pytest.approx(0.0)


def exact_area_series() -> pd.DataFrame:
    """test_steady_memory_shares_come_from_the_exact_areas's series: 100 slots, used tokens rising inside a jump."""
    times = [0.0, 2.0, 5.0, 6.0, 12.0]
    used = [40.0, 60.0, 90.0, 40.0, 0.0]
    used_area = [0.0, 80.0, 290.0, 380.0, 620.0]
    constant = {"reserved": 10.0, "internal_fragmentation": 5.0, "external_fragmentation": 0.0, "cached": 0.0}
    return pd.DataFrame(
        {
            "time_s": times,
            "used_tokens": used,
            "used_token_s": used_area,
            **{f"{name}_tokens": [value] * 5 for name, value in constant.items()},
            **{f"{name}_token_s": [value * t for t in times] for name, value in constant.items()},
            "free_tokens": [100.0 - 15.0 - u for u in used],
            "free_token_s": [85.0 * t - a for t, a in zip(times, used_area, strict=True)],
            "num_requests_running": [2] * 5,
            "num_sequences_running": [2] * 5,
            "num_requests_waiting": [0] * 5,
            "kv_cache_usage_perc": [0.5] * 5,
            "preemptions": [0] * 5,
            "admission_blocker": [0] * 5,
        }
    )


def test_steady_memory_shares_come_from_the_exact_areas():
    """The window of test_steady_window_by_hand, [2.0, 8.1], over a series whose used tokens grow
    inside a jump: 60 at t=2, then 70 and 80 at the next iterations (3 and 4 s, no rows), 90 at the
    jump's end (5 s), 40 from 6 s. Used area from 0: 80 at 2 s, 80 + 60 + 70 + 80 = 290 at 5 s, 380
    at 6 s, 620 at 12 s, and at 8.1 s 380 + 40 x 2.1 = 464: mean (464 - 80) / 6.1 slots. The
    trapezoid rule between rows would count (60 + 90) / 2 x 3 = 225 for [2, 5) instead of 210."""
    series = exact_area_series()
    got = steady_metrics(ten_requests(), series, 100, SteadyWindow(0.2, 0.1))
    assert (got["window_start_s"], got["window_end_s"]) == pytest.approx((2.0, 8.1))
    assert got["mean_used_frac"] == pytest.approx((464 - 80) / 6.1 / 100, rel=1e-12)
    assert got["mean_reserved_frac"] == pytest.approx(0.10, rel=1e-12)
    assert got["mean_free_frac"] == pytest.approx(0.85 - (464 - 80) / 6.1 / 100, rel=1e-12)
    # Without the area columns (a series written before them) the trapezoid rule is the fallback.
    legacy = series.drop(columns=[c for c in series.columns if c.endswith("_token_s")])
    trapezoid = steady_metrics(ten_requests(), legacy, 100, SteadyWindow(0.2, 0.1))["mean_used_frac"]
    # [2, 5): (60 + 90) / 2 x 3; [5, 6): (90 + 40) / 2; [6, 8.1]: (40 + 0) / 2 x 2.1.
    assert trapezoid == pytest.approx((225 + 65 + 20 * 2.1) / 6.1 / 100, rel=1e-12)


def test_short_probe_keeps_half_its_window():
    """Residence longer than the run: the warm-up stops halfway through the nominal window."""
    requests = pd.DataFrame(
        {
            "arrival_s": [float(t) for t in range(11)],
            "e2e_s": [100.0] * 11,
            "outcome": ["finished"] * 11,
        }
    )
    assert window_bounds(requests, SteadyWindow(0.2, 0.2)) == pytest.approx((2.0 + 3.0, 8.0))
    # The system fills at 0 + 100 s; the window opened at 5 s: 95 s too early, so the probe cannot pass.
    assert window_and_fill_deficit(requests, SteadyWindow(0.2, 0.2))[2] == pytest.approx(95.0)


def test_ranking_by_hourly_cost_then_gpus_then_rate():
    def usable(key, rate, gpus, per_hour=None, tokens_cost=None):
        result = {"key": key, "max_rate_per_s": rate, "tensor_parallel_size": 1, "gpus_for_target": gpus}
        if per_hour is not None:
            result |= {"cost_per_hour_for_target": per_hour, "cost_per_million_output_tokens": tokens_cost}
        return result

    infeasible = {"key": "x", "status": "infeasible"}
    priced = [
        usable("a100", 3.5, 15, 27.0, 0.34),
        usable("h100 paged", 9.0, 6, 18.0, 0.21),  # cheaper per token only by sampling noise
        usable("h100 prefix", 9.5, 6, 18.0, 0.22),
        infeasible,
    ]
    assert [r["key"] for r in rank(priced, 50)] == ["h100 prefix", "h100 paged", "a100", "x"]
    assert [r["rank"] for r in priced] == [3, 2, 1, None]
    unpriced = [usable("slow", 2.0, 25), usable("fast", 5.0, 10), usable("fast too", 5.5, 10)]
    assert [r["key"] for r in rank(unpriced, 50)] == ["fast too", "fast", "slow"]


def test_convergence_is_relative_below_one_request_per_second():
    """At 0.37 req/s a 5 % tolerance is a gap of ~0.0185 req/s; an absolute `hi - lo <= 0.05` rule
    would stop at a 10-15 % gap."""
    search = search_against(0.37, start_rate_per_s=0.1, min_rate_per_s=0.01, rel_tolerance=0.05)
    assert search.lo <= 0.37 < search.hi
    assert search.hi / search.lo - 1 <= 0.05
    assert search.hi - search.lo < 0.0185 + 1e-9


def test_output_tokens_per_request_count_every_sample():
    """n = 2 samples of 10 and 6 tokens: the request yields 16 output tokens (sample_output_tokens),
    not the longest sample's 10 (output_tokens); $/M tokens stand on it."""
    requests = ten_requests()
    requests["n"] = 2
    requests["sample_output_tokens"] = 16
    series = pd.DataFrame(
        {
            "time_s": [0.0, 12.0],
            **{f"{c}_tokens": [0.0, 0.0] for c in ("used", "reserved", "cached", "free")},
            "internal_fragmentation_tokens": [0.0, 0.0],
            "external_fragmentation_tokens": [0.0, 0.0],
            "num_requests_running": [1, 0],
            "num_sequences_running": [2, 0],
            "num_requests_waiting": [0, 0],
            "kv_cache_usage_perc": [0.1, 0.0],
            "preemptions": [0, 0],
            "admission_blocker": [0, 0],
        }
    )
    got = steady_metrics(requests, series, 100, SteadyWindow(0.2, 0.1))
    assert got["output_tokens_per_request"] == 16.0
    assert got["output_tokens_per_s"] == pytest.approx(7 * 16 / (8.1 - 2.0))
    assert got["tokens_per_request"] == 20 + 16  # KV held at the end: the prompt and both samples


def test_seeds_as_replicates():
    """Seed 1 passes 2 and 4, fails 6: 4. Seed 2 fails 4: 2. Seed 3 passes up to 6, fails 8: 6.
    Mean 4, sample sd 2: 95 % interval 4 -/+ t(0.975, 2) x 2 / sqrt(3) = 4 -/+ 4.303 x 1.1547."""
    from sim.planning.plans.analysis import seed_spread

    def probe(rate, verdicts):
        runs = [
            SeedRun(
                seed,
                f"p{rate}-{seed}",
                {},
                {},
                [] if ok else [Violation("ttft_p99_s", "x", 3.0, 2.0, "window")],
            )
            for seed, ok in verdicts.items()
        ]
        return Probe(0, "c", rate, 100, runs)

    probes = [
        probe(2.0, {1: True, 2: True, 3: True}),
        probe(4.0, {1: True, 2: False, 3: True}),
        probe(6.0, {1: False, 3: True}),
        probe(8.0, {3: False}),
    ]
    got = seed_spread(probes)
    assert got["max_rate_per_seed"] == {"1": 4.0, "2": 2.0, "3": 6.0}
    assert (got["min"], got["max"]) == (2.0, 6.0)
    half = 4.302652729911275 * 2 / 3**0.5
    assert got["mean_ci95"] == pytest.approx([4 - half, 4 + half], rel=1e-9)
    # A probe short of a steady state does not count as passed for its seed.
    short = probe(2.0, {1: True, 2: True})
    short.runs[1].unsteady = ["the running batch grew 15% across the window"]
    assert seed_spread([short])["max_rate_per_seed"] == {"1": 2.0, "2": None}
    two = seed_spread([probe(2.0, {1: True, 2: True}), probe(4.0, {1: False, 2: True})])
    assert two == {"max_rate_per_seed": {"1": 2.0, "2": 4.0}, "min": 2.0, "max": 4.0}  # no interval of 2


def test_a_rate_starts_as_long_as_another_needed_to_pass_short_of_the_long_probes():
    """6 passed only at 1,000 requests: the next rate's first probe runs 1,000, not the plan's 500. A
    pass at the long-probe length (after a refuted confirmation) is no such floor: long_probe is."""
    search = RateSearch(SearchSpec(start_rate_per_s=2, min_requests=500, rel_tolerance=0.2))
    search.record(2.0, True, 500)
    search.record(6.0, True, 1000)
    search.record(8.0, False, 500)
    assert search.next_rates() == [(7.0, 1000)]
    search.long_probe_requests = 10000
    search.record(6.5, True, 10000)
    assert search.steady_requests == 1000 and search.next_rates() == [(7.2, 10000)]


def test_after_a_refuted_confirmation_probes_run_as_long_as_the_longest_that_passed():
    """Confirmation at 1 req/s broke at 5,780 requests; 0.5 then needed 11,560 to settle and passed:
    the next rate starts at 11,560, and a pass there needs no other confirmation."""
    search = RateSearch(SearchSpec(start_rate_per_s=1, min_requests=500, rel_tolerance=0.1))
    search.record(1.0, True, 578)
    search.record(2.0, False, 578)
    search.record(1.1, False, 578)
    search.record_confirmation(1.0, False, 5780)
    search.record(0.5, True, 11560)
    assert search.long_probe_requests == 11560
    ((rate, requests),) = search.next_rates()
    assert (rate, requests) == (0.75, 11560)
    search.record(0.75, True, 11560)
    assert search.confirmed == 0.75 and search.confirmation() is None


def test_a_sibling_probes_a_refuted_rate_as_long_as_the_confirmation_that_refuted_it():
    """7 passed short, its 12,000-request confirmation broke; 6.5 then passed at 20,000: a sibling
    starts from 6.5 at 20,000 and 7 at 12,000 (the evidence that failed it), in one round."""
    spec = SearchSpec(start_rate_per_s=2, min_requests=600, rel_tolerance=0.1)
    search = RateSearch(spec)
    search.record(6.0, True, 1200)
    search.record(7.0, True, 1200)
    search.record(7.5, False, 2400)
    search.record_confirmation(7.0, False, 12000)
    search.record(6.5, True, 20000)
    assert search.following(spec).next_rates() == [(6.5, 20000), (7.0, 12000)]


@pytest.mark.parametrize(
    ("metrics", "broken"),
    [
        ({"ttft_p99_s": 2.0, "late_ttft_p99_s": 2.0}, []),  # exactly at an upper bound: met
        ({"ttft_p99_s": 2.0000001, "late_ttft_p99_s": 2.0}, ["ttft_p99_s"]),
        ({"ttft_p99_s": 2.0, "late_ttft_p99_s": 2.0000001}, ["ttft_p99_s"]),
        ({"attainment_frac": 0.9, "late_attainment_frac": 0.9}, []),  # exactly at a lower bound: met
        ({"attainment_frac": 0.8999999, "late_attainment_frac": 0.9}, ["goodput"]),
        ({"queue_growth_frac": 0.05}, []),  # the always-checked queue growth, exactly at its 5 %
        ({"queue_growth_frac": 0.0500001}, ["max_queue_growth_frac"]),
    ],
)
def test_slo_thresholds_hit_exactly_are_met(metrics, broken):
    slos = SLOs.model_validate({"ttft_p99_s": 2.0, "goodput": {"ttft_s": 1.0, "min_attainment": 0.9}})
    steady = {
        "ttft_p99_s": 1.0,
        "late_ttft_p99_s": 1.0,
        "attainment_frac": 1.0,
        "late_attainment_frac": 1.0,
        "queue_growth_frac": 0.0,
    } | metrics
    assert [violation.slo for violation in violations(steady, slos)] == broken


@pytest.mark.parametrize(
    ("steady", "reasons"),
    [
        ({"fill_multiple": 2.0, "pool_fill_s": 10.0}, 0),  # exactly min_fill_multiple: filled enough
        ({"fill_multiple": 1.9999, "pool_fill_s": 10.0}, 1),
        ({"kv_usage_rise": 0.05}, 0),
        ({"kv_usage_rise": 0.0500001}, 1),
        ({"waiting_rise": 2.0, "waiting_rise_frac": 0.9}, 0),  # a rise of 2 requests is noise
        ({"waiting_rise": 2.01, "waiting_rise_frac": 0.9}, 1),
        ({"waiting_rise": 50.0, "waiting_rise_frac": 0.02}, 0),  # exactly max_waiting_rise_frac
        ({"waiting_rise": 50.0, "waiting_rise_frac": 0.0200001}, 1),
    ],
)
def test_steady_state_thresholds_hit_exactly_are_steady(steady, reasons):
    spec = SearchSpec.model_validate(
        {"min_fill_multiple": 2.0, "max_kv_usage_rise": 0.05, "max_waiting_rise_frac": 0.02}
    )
    assert len(unsteady_reasons(steady, spec)) == reasons
