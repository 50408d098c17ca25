"""Stopping a probe once its failure is certain: the stop instant worked out by hand, the bounds it
rests on, and the verdict of the full run on random cases (sim/planning/sweeps/early_stop.py)."""

from __future__ import annotations

import numpy as np
import pytest

from policies import PoolSpec, make_policy
from sim.engine.core import Engine, EngineKnobs
from sim.planning.plans.search import violations
from sim.planning.plans.spec import SLO_METRICS, SLOs
from sim.planning.sweeps.early_stop import CertainFailureWatch, Ranges, StopRules, certain_count
from sim.planning.sweeps.steady import SteadyWindow, steady_metrics
from tests.engine_helpers import ConstantCost, RoundCostModel, request

WINDOW = SteadyWindow(0.2, 0.1)


def rules(slos: SLOs, window: SteadyWindow = WINDOW, checks: int = 32) -> StopRules:
    limits = slos.limits()
    stop = StopRules.of(limits, {name: SLO_METRICS[name].late_half for name in limits}, window)
    assert stop is not None
    return StopRules(stop.limits, window, checks)


def run(requests, pool, costs, watch=None, **knobs):
    """One engine run (a :class:`CertainFailureWatch` may stop it); the engine and its watch."""
    engine = Engine(
        make_policy(knobs.pop("policy", "paged"), pool, **knobs.pop("options", {})),
        costs,
        EngineKnobs(max_model_len=pool.max_model_len, **knobs),
        iter(requests),
        block_size=pool.block_size,
        on_arrival=watch.arrived if watch else None,
    )
    stop = watch.begin(engine, requests) if watch else None
    engine.run(stop=stop)
    return engine


@pytest.mark.parametrize("percentile", [50.0, 99.0])
def test_certain_count_is_numpys_percentile_threshold_plus_one(percentile):
    """With ``certain_count(n)`` of n values just over a limit, numpy's percentile is over it however
    far under it the others are; the count is at most one more than the fewest that guarantee it (the
    margin for the rounding of numpy's index)."""
    limit = 1.0

    def over(n, k):
        values = np.r_[np.full(n - k, -1e9), np.full(k, limit + 1e-6)]
        return np.percentile(values, percentile) > limit

    for n in range(1, 400):
        fewest = next(k for k in range(n + 1) if over(n, k))
        needed = int(certain_count(n, percentile))
        assert needed > n or fewest <= needed <= fewest + 1, n
        if needed <= n:
            assert over(n, needed)


def test_window_ranges_are_every_start_the_warmup_can_give():
    """Arrivals every 0.5 s, 21 of them: the window ends at the 0.9 quantile (9 s, request 18) and opens
    at the 0.2 quantile (2 s, request 4) or later, up to halfway (5.5 s, request 11); its late half starts
    halfway from there: between 5.5 s (request 11) and 7.25 s (request 15)."""
    arrivals = 0.5 * np.arange(21)
    window, late = Ranges.of(arrivals, 2.0, 9.0)
    assert window.starts.tolist() == list(range(4, 12))
    assert window.end == 19
    assert late.starts.tolist() == list(range(11, 16))
    assert late.end == 19
    assert window.sums(np.ones(21)).tolist() == [float(19 - j) for j in range(4, 12)]


def one_at_a_time():
    """21 requests arriving every 0.5 s on an engine that serves one at a time, 2 s each (prefill
    iteration, then one decode iteration, 1 s apiece): request i runs [2i, 2i + 2), its first token at
    2i + 1, so its TTFT is 1.5 i + 1 s."""
    requests = [request(i, 0.5 * i, 16, 2) for i in range(21)]
    return requests, PoolSpec(16 * 64, 16, 64), ConstantCost(1.0), {"max_num_seqs": 1}


def test_overloaded_probe_stops_when_every_window_has_three_requests_past_the_limit():
    """p99 TTFT <= 5 s on the run above. Every window the run can have ends at request 18; the shortest
    opens at request 11 (8 requests), the longest at request 4 (15). For a p99 of 8 to 15 values to be
    over 5 s, 3 of them must be (numpy's index 0.99 (n - 1) has integer part n - 2, plus one). Requests
    11, 12, 13 never get a first token within 5 s (theirs come at 23, 25, 27 s): request 13 is past 5 s
    after 6.5 + 5 = 11.5 s. The longer windows had their three before (requests 4-6 by 8 s). Checks run
    from 5.5 s every (9 - 2) / 32 = 0.21875 s: the first after 11.5 s is 5.5 + 28 x 0.21875 = 11.625 s."""
    requests, pool, costs, knobs = one_at_a_time()
    full = run(requests, pool, costs, **knobs)
    assert [
        round(r.first_token_s - r.arrival_s, 9) for r in sorted(full.records, key=lambda r: r.request_id)
    ] == [1.5 * i + 1 for i in range(21)]
    watch = CertainFailureWatch(rules(SLOs(ttft_p99_s=5.0)))
    stopped = run(requests, pool, costs, watch, **knobs)
    assert stopped.env.now == 11.625
    outcome = watch.outcome()
    assert outcome is not None
    assert [(b["slo"], b["where"]) for b in outcome["broken"]] == [("ttft_p99_s", "window")]
    assert (outcome["requests_arrived"], outcome["requests_planned"]) == (21, 21)
    assert (outcome["window_first_s"], outcome["window_end_s"]) == (2.0, 9.0)
    # The full run breaks it too: its window opened at 5.5 s (the mean residence of 17 s is capped).
    steady = steady_metrics(full.sink.requests(), full.recorder.frame(), pool.kv_pool_tokens, WINDOW)
    assert steady["window_start_s"] == 5.5
    assert steady["ttft_p99_s"] > 5.0


def test_a_limit_never_certainly_broken_lets_the_run_end_as_it_would_have():
    """p99 TTFT <= 40 s: the last window request (18) has TTFT 28 s, nothing can be certain, and the
    watched run ends when the last request does, with the same records as the unwatched one."""
    requests, pool, costs, knobs = one_at_a_time()
    full = run(requests, pool, costs, **knobs)
    watch = CertainFailureWatch(rules(SLOs(ttft_p99_s=40.0)))
    watched = run(requests, pool, costs, watch, **knobs)
    assert watch.outcome() is None
    assert watched.env.now == full.env.now == 42.0
    assert watched.sink.requests().equals(full.sink.requests())
    assert watched.recorder.frame().equals(full.recorder.frame())


@pytest.mark.parametrize("knobs", [{"on_oom": "fail"}, {"watermark": 0.01}], ids=["on_oom-fail", "watermark"])
def test_runs_where_a_request_could_leave_unfinished_are_not_watched(knobs):
    requests, pool, costs, base = one_at_a_time()
    watch = CertainFailureWatch(rules(SLOs(ttft_p99_s=5.0)))
    engine = run(requests, pool, costs, watch, **(base | knobs))
    assert watch.outcome() is None
    assert engine.env.now == 42.0


def random_case(seed: int):
    """A random single-sequence workload on a random pool and policy, with random SLOs around what it
    achieves: some certainly broken early, some broken only at the end, some met."""
    rng = np.random.default_rng(seed)
    count = int(rng.integers(60, 160))
    arrivals = np.cumsum(rng.exponential(float(rng.choice([0.02, 0.05, 0.1, 0.3])), count))
    requests = [
        request(
            i,
            float(arrival),
            0,
            int(rng.integers(1, 40)),
            prompt=(((1, 32),) if rng.random() < 0.4 else ()) + ((100 + i, int(rng.integers(1, 80))),),
        )
        for i, arrival in enumerate(arrivals)
    ]
    pool = PoolSpec(16 * int(rng.integers(8, 40)), 16, 160)
    policy = str(rng.choice(["paged", "prefix", "contiguous"]))
    options = {"reservation": "pow2", "placement": "buddy"} if policy == "contiguous" else {}
    scale = float(rng.choice([0.05, 0.2, 1.0, 3.0]))
    names = rng.choice(
        [
            "ttft_p99_s",
            "ttft_p50_s",
            "tpot_p50_s",
            "tpot_p99_s",
            "e2e_p99_s",
            "ttft_mean_s",
            "e2e_mean_s",
            "normalized_latency_mean_s",
            "max_preemptions_per_request",
        ],
        size=3,
        replace=False,
    )
    limits = {str(name): scale * (0.05 if "tpot" in name or "normalized" in name else 1.0) for name in names}
    limits = {
        name: (0.5 if name == "max_preemptions_per_request" else limit) for name, limit in limits.items()
    }
    goodput = {"ttft_s": scale, "tpot_s": 0.05 * scale, "min_attainment": 0.9} if rng.random() < 0.5 else None
    slos = SLOs(**limits, goodput=goodput)
    window = SteadyWindow(
        0.2, 0.1, goodput_ttft_s=scale if goodput else None, goodput_tpot_s=0.05 * scale if goodput else None
    )
    knobs = {"policy": policy, "options": options, "max_num_seqs": int(rng.choice([4, 16, 64]))}
    return requests, pool, slos, window, knobs


COSTS = RoundCostModel(intercept_s=0.01, per_seq_s=0.001, per_context_token_s=1e-5, prefill_per_token_s=1e-4)


def test_a_stop_is_the_full_runs_verdict_and_no_stop_changes_nothing():
    """On random cases: a run stopped early named SLOs the full run breaks; a run not stopped is the
    full run, record for record. Some stop, some do not: the test sees both."""
    stopped_cases = ran_through = 0
    for seed in range(40):
        requests, pool, slos, window, knobs = random_case(seed)
        full = run(requests, pool, COSTS, **dict(knobs))
        watch = CertainFailureWatch(rules(slos, window))
        watched = run(requests, pool, COSTS, watch, **dict(knobs))
        steady = steady_metrics(full.sink.requests(), full.recorder.frame(), pool.kv_pool_tokens, window)
        broken = {violation.slo for violation in violations(steady, slos)}
        outcome = watch.outcome()
        if outcome is None:
            ran_through += 1
            assert watched.sink.requests().equals(full.sink.requests()), seed
            continue
        stopped_cases += 1
        assert watched.env.now < full.env.now, seed
        assert {b["slo"] for b in outcome["broken"]} <= broken, seed
    assert stopped_cases >= 5 and ran_through >= 5, (stopped_cases, ran_through)


def test_a_stored_run_stopped_early_answers_only_its_own_stop_rules():
    """A run that went to its end answers any probe of its config; one stopped early only a probe with
    the same stop rules (with another SLO it might have had to run on)."""
    from sim.planning.sweeps.tasks import PointTask, answers

    strict = rules(SLOs(ttft_p99_s=1.0))
    loose = rules(SLOs(ttft_p99_s=2.0))
    task = PointTask("p", {}, ".", WINDOW, strict)
    complete = [{"steady": {"ttft_p99_s": 3.0}}]
    stopped = [{"steady": {"stopped_early": {"at_s": 5.0, "rules": strict.as_dict()}}}]
    assert answers(task, complete)
    assert answers(task, stopped)
    assert not answers(PointTask("p", {}, ".", WINDOW, loose), stopped)
    assert not answers(PointTask("p", {}, ".", WINDOW, None), stopped)


def test_a_window_that_can_still_end_exactly_at_a_limit_is_not_stopped():
    """The SLOs are met *at* their limits (mean TTFT <= 2 s, attainment >= 0.5): a check stops a run
    only when every window is past them. One window, requests 0 and 1: lower bounds on their TTFTs
    1 s and 3 s give a mean of at least 2 s, which can still be exactly 2 s; with a 1 s TTFT goodput
    target request 1 has missed it, request 0 has not: at most 1 of 2 (0.5) can still attain it."""
    watch = CertainFailureWatch(rules(SLOs(ttft_mean_s=2.0), SteadyWindow(0.2, 0.1, goodput_ttft_s=1.0)))
    watch._bounds = {"ttft": np.array([1.0, 3.0, 9.0])}
    watch._admissible = np.ones(3, dtype=bool)
    watch._outputs = np.full(3, 5)
    window = Ranges(np.array([0]), 2)
    assert watch._mean_check(window, "ttft", 2.0)() == ""
    assert watch._mean_check(window, "ttft", 1.99)() == "the mean is at least 2 s"
    assert watch._attainment_check(window, 0.5)() == ""
    assert watch._attainment_check(window, 0.51)() == "at most 50.0% can still meet their targets"
