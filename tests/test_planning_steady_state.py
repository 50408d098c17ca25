"""A plan's answer must hold: probes run until they reach a steady state, and each candidate's
maximum rate is confirmed by a run ten times longer. The search logic is checked against a made-up
server whose verdict depends on rate and probe length (worked by hand), then end to end."""

from __future__ import annotations

import json
import re

import pytest

from sim.planning.plans.run import run_plan
from sim.planning.plans.search import violations
from sim.planning.plans.spec import load_plan_spec
from sim.planning.sweeps.tasks import PointOutcome, PointTask, run_point
from tests.planning_helpers import plan_data, write_yaml

STEADY = {"kv_usage_rise": 0.0, "running_rise_frac": 0.0, "waiting_rise": 0.0, "waiting_rise_frac": 0.0}
FILLING = STEADY | {"kv_usage_rise": 0.2}  # the KV pool still filling across the window


def made_up_outcome(task: PointTask, steady: dict) -> PointOutcome:
    """A point's outcome as a worker returns it: one variant's summary and steady-state metrics."""
    summary = {"variant": "paged", "cost_model": "made up"}
    files = {
        "summary.csv": b"variant\npaged\n",
        "paged/summary.json": json.dumps(summary).encode(),
        "paged/steady.json": json.dumps(steady).encode(),
    }
    return PointOutcome(task.point_id, True, [summary | {"steady": steady}], files=files)


def made_up_server(task: PointTask) -> PointOutcome:
    """Up to 4 req/s it keeps up at any length. Above 6 req/s it breaks the TTFT SLO at once. In
    between, a short probe (500 requests) meets the SLO with its pool still filling, a medium one
    (1,000) meets it steady, and only a long one (10,000) shows the overload: the issue's late fill."""
    workload = task.config["workload"]
    rate, requests = workload["arrival"]["rate_per_s"], workload["num_requests"]
    ttft, shape = 0.5, STEADY
    if rate > 6:
        ttft = 3.0
    elif rate > 4:
        ttft, shape = (
            (0.5, FILLING) if requests < 1000 else (0.5, STEADY) if requests < 10000 else (5.0, STEADY)
        )
    steady = shape | {"ttft_p99_s": ttft, "late_ttft_p99_s": ttft, "queue_growth_frac": 0.0}
    return made_up_outcome(task, steady)


def made_up_plan(tmp_path, **search):
    data = plan_data(candidates={"policies": [{"name": "paged", "policy": "paged"}], "block_sizes": [16]})
    data["search"] = {
        "start_rate_per_s": 2,
        "seeds": [1],
        "min_requests": 500,
        "rel_tolerance": 0.2,
        "min_fill_multiple": 0,
        "cost_band": "none",
    } | search
    return load_plan_spec(write_yaml(tmp_path / "plan.yaml", data))


def test_short_probes_run_longer_and_a_confirmation_refutes_a_lucky_rate(tmp_path):
    """By hand: 2 and 4 pass; 8 fails; 6 is filling at 500 requests, runs again at 1,000 and passes;
    7 fails (its first probe as long as 6 needed, 1,000; 7/6 - 1 <= 20 %: converged). The confirmation at 6 (10 x 1,000 requests) breaks, so 6
    fails after all, and the search goes on with probes of 10,000 requests: 5 fails, 4.5 fails
    (4.5/4 - 1 <= 20 %); 4 is confirmed by a run as long (10 x its 500 would be shorter)."""
    plan = made_up_plan(tmp_path)
    document = run_plan(plan, tmp_path / "out", fn=made_up_server).document
    probes = [(p["rate_per_s"], p["requests"], p["confirmation"], p["passed"]) for p in document["probes"]]
    assert probes == [
        (2.0, 500, False, True),
        (4.0, 500, False, True),
        (8.0, 500, False, False),
        (6.0, 500, False, False),  # filling: run again longer, not judged
        (6.0, 1000, False, True),
        (7.0, 1000, False, False),
        (6.0, 10000, True, False),
        (5.0, 10000, False, False),
        (4.5, 10000, False, False),
        (4.0, 10000, True, True),
    ]
    assert [p["run_again_longer"] for p in document["probes"]].count(True) == 1
    (result,) = document["candidates"]
    assert result["max_rate_per_s"] == 4.0 and result["fail_rate_per_s"] == 4.5
    assert result["confirmed"]["held"] is True and result["confirmed"]["requests"] == 10000
    assert result["max_probe"] == 9  # the confirmation run is the evidence at the max rate
    confirmation = document["probes"][9]
    assert [seed["seed"] for seed in confirmation["seeds"]] == [2]  # fresh: the search's seed is 1
    assert result["gpus_for_target"] == 5  # 20 req/s over 4 per GPU


def test_a_probe_that_never_settles_fails_at_max_requests(tmp_path):
    """With max_requests 500 the filling probes above 4 req/s cannot run longer: they fail as not
    steady, so the search converges on 4 (confirmed), and the first failure says why."""
    plan = made_up_plan(tmp_path, max_requests=500)
    document = run_plan(plan, tmp_path / "out", fn=made_up_server).document
    (result,) = document["candidates"]
    assert result["max_rate_per_s"] == 4.0 and result["confirmed"]["held"] is True
    assert result["fail_rate_per_s"] == 4.5
    assert any("no steady state after 500 requests" in reason for reason in result["fail_reasons"])
    assert result["binding"]["limit"] == "probe_length"


def test_without_confirmation_the_lucky_rate_stands_and_says_so(tmp_path):
    plan = made_up_plan(tmp_path, confirm_factor=0)
    document = run_plan(plan, tmp_path / "out", fn=made_up_server).document
    (result,) = document["candidates"]
    assert result["max_rate_per_s"] == 6.0 and result["confirmed"]["held"] is None
    assert not any(p["confirmation"] for p in document["probes"])


def test_every_max_rate_of_a_real_plan_holds_ten_times_longer(tmp_path):
    """End to end on a small simulated plan: each candidate's maximum rate, run again ten times longer
    than its passing probe with a seed the plan never used (7), meets every SLO."""
    data = plan_data(
        search={"start_rate_per_s": 2, "seeds": [1, 2], "min_requests": 150, "rel_tolerance": 0.15},
    )
    plan = load_plan_spec(write_yaml(tmp_path / "plan.yaml", data))
    document = run_plan(plan, tmp_path / "out").document
    probes = {p["number"]: p for p in document["probes"]}
    checked = 0
    for result in document["candidates"]:
        candidate = next(c for c in plan.candidates if c.key == result["key"])
        assert result["confirmed"]["held"] is True, result["key"]
        passing_search_probe = min(
            (p for p in probes.values() if p["rate_per_s"] == result["max_rate_per_s"] and p["passed"]),
            key=lambda p: p["requests"],
        )
        requests = 10 * passing_search_probe["requests"]
        outcome = run_point(plan.probe_task(candidate, result["max_rate_per_s"], 7, requests))
        assert outcome.ok, outcome.error
        steady = outcome.summaries[0]["steady"]
        assert violations(steady, plan.spec.slos) == [], (result["key"], steady["ttft_p99_s"])
        checked += 1
    assert checked == 2  # max_num_seqs 2 and 64


def server_slowed_by_the_cost_model(task: PointTask) -> PointOutcome:
    """Keeps up to 4 req/s at nominal GPU times, 4 / s when they are scaled by s; beyond, it breaks
    the TTFT SLO at any length."""
    cost_model = task.config.get("cost_model")
    time_scale = cost_model.get("time_scale", 1.0) if isinstance(cost_model, dict) else 1.0
    rate = task.config["workload"]["arrival"]["rate_per_s"]
    ttft = 0.5 if rate <= 4.0 / time_scale + 1e-9 else 3.0
    steady = STEADY | {"ttft_p99_s": ttft, "late_ttft_p99_s": ttft, "queue_growth_frac": 0.0}
    return made_up_outcome(task, steady)


def test_the_cost_band_is_searched_at_its_edges(tmp_path):
    """Band [0.8, 1.6]: nominal 4 req/s (5 GPUs for 20 req/s). At x0.8 the search starts at 4 / 0.8 =
    5 (passes), grows by 1.4 to 7 (fails), bisects to 6 (fails; 6/5 - 1 <= 20 %): 5 req/s, 4 GPUs. At
    x1.6 it starts at 2.5 (passes), 3.5 fails, 3 fails: 2.5 req/s, 8 GPUs. The edges are short
    probes only: no confirmation runs."""
    plan = made_up_plan(tmp_path, cost_band=[0.8, 1.6])
    document = run_plan(plan, tmp_path / "out", fn=server_slowed_by_the_cost_model).document
    (result,) = document["candidates"]
    assert result["max_rate_per_s"] == 4.0 and result["gpus_for_target"] == 5
    edges = {edge["side"]: edge for edge in result["band"]["edges"]}
    assert edges["fast"]["time_scale"] == 0.8 and edges["slow"]["time_scale"] == 1.6
    assert edges["fast"]["max_rate_per_s"] == 5.0 and edges["fast"]["gpus_for_target"] == 4
    assert edges["slow"]["max_rate_per_s"] == 2.5 and edges["slow"]["gpus_for_target"] == 8
    assert result["band"]["overtaken_by"] == []
    band_probes = [p for p in document["probes"] if p["time_scale"] != 1.0]
    assert [(p["time_scale"], p["rate_per_s"]) for p in band_probes] == [  # both edges in each round
        (0.8, 5.0),
        (1.6, 2.5),
        (0.8, 7.0),
        (1.6, 3.5),
        (0.8, 6.0),
        (1.6, 3.0),
    ]
    assert band_probes[0]["candidate"] == f"{result['key']} @ GPU times x0.8"
    assert not any(p["confirmation"] for p in band_probes)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "4–8 GPUs over its cost band (GPU times ×0.8 to ×1.6; short probes" in report
    assert "it ranks first across the bands" in report


def test_a_max_rate_study_needs_no_target(tmp_path):
    """Without target_rate_per_s: the maximum rate per GPU and per output token, ranked by rate per GPU
    (no price) and no GPU counts; a cluster check without a target is refused."""
    from sim.config import ConfigError

    data = plan_data(candidates={"policies": [{"name": "paged", "policy": "paged"}], "block_sizes": [16]})
    del data["target_rate_per_s"]
    data["gpus"] = ["A100-80GB"]
    data["search"] = {"start_rate_per_s": 2, "seeds": [1], "min_requests": 500, "rel_tolerance": 0.2}
    data["search"] |= {"min_fill_multiple": 0, "cost_band": "none"}
    plan = load_plan_spec(write_yaml(tmp_path / "plan.yaml", data))
    run = run_plan(plan, tmp_path / "out", fn=made_up_server)
    (result,) = run.document["candidates"]
    assert result["max_rate_per_s"] == 4.0 and result["rate_per_gpu_per_s"] == 4.0
    assert result["rank"] == 1 and "gpus_for_target" not in result
    assert run.document["recommendation"] == result["key"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Recommended (a max-rate study, no target rate)" in report and "| rate per GPU |" in report
    data["search"] |= {"cluster_check": {"router": "round_robin"}}
    with pytest.raises(ConfigError, match="cluster_check simulates the cluster at target_rate_per_s"):
        load_plan_spec(write_yaml(tmp_path / "checked.yaml", data))


def test_knee_curves_show_the_best_evidence_at_each_rate():
    """At a rate with a short probe, a longer one and a confirmation run, the curve shows the
    confirmation; a probe run again longer is never shown."""
    from sim.planning.report.figures import best_evidence

    probes = [
        {"number": 0, "rate_per_s": 6.0, "requests": 500, "run_again_longer": True},
        {"number": 1, "rate_per_s": 6.0, "requests": 1000},
        {"number": 2, "rate_per_s": 7.0, "requests": 500},
        {"number": 3, "rate_per_s": 6.0, "requests": 10000, "confirmation": True},
        {"number": 4, "rate_per_s": 5.0, "requests": 10000},
    ]
    assert [p["number"] for p in best_evidence(probes)] == [4, 3, 2]


def test_a_probe_stopped_early_is_shown_only_where_nothing_ran_to_its_end():
    from sim.planning.report.figures import best_evidence

    probes = [
        {"number": 0, "rate_per_s": 7.0, "requests": 500},
        {"number": 1, "rate_per_s": 7.0, "requests": 10000, "confirmation": True, "stopped_early": True},
        {"number": 2, "rate_per_s": 8.0, "requests": 10000, "stopped_early": True},
    ]
    assert [p["number"] for p in best_evidence(probes)] == [0, 2]


def test_a_block_size_sibling_starts_from_its_neighbours_answer(tmp_path):
    """Block sizes 16 and 32 of one policy, on the made-up server (blind to block size). Block 32 (the
    larger: fewer blocks to simulate) searches as in the test above: 4 req/s, confirmed by 10,000
    requests, 4.5 failing at 10,000. Block 16 then starts from that: 4 and 4.5 in one round, at 10,000
    requests each (the length that decided 4.5, and the long-probe length for 4, which 4 inherits: the
    short probes near this knee proved lucky). 4 passes at that length (no other confirmation needed)
    and 4.5 fails: 4.5/4 - 1 <= 20 %, done in one round."""
    data = plan_data(candidates={"policies": [{"name": "paged", "policy": "paged"}], "block_sizes": [16, 32]})
    data["search"] = {
        "start_rate_per_s": 2,
        "seeds": [1],
        "min_requests": 500,
        "rel_tolerance": 0.2,
        "min_fill_multiple": 0,
        "cost_band": "none",
    }
    plan = load_plan_spec(write_yaml(tmp_path / "plan.yaml", data))
    document = run_plan(plan, tmp_path / "out", fn=made_up_server).document
    leader, follower = "A100-80GB / paged / block 32", "A100-80GB / paged / block 16"
    mine = [
        (p["rate_per_s"], p["requests"], p["passed"])
        for p in document["probes"]
        if p["candidate"] == follower
    ]
    assert mine == [(4.0, 10000, True), (4.5, 10000, False)]
    first = min(p["number"] for p in document["probes"] if p["candidate"] == follower)
    assert first > max(p["number"] for p in document["probes"] if p["candidate"] == leader)
    results = {r["key"]: r for r in document["candidates"]}
    assert len([p for p in document["probes"] if p["candidate"] == leader]) == 10
    for key in (leader, follower):
        assert results[key]["max_rate_per_s"] == 4.0 and results[key]["fail_rate_per_s"] == 4.5
        assert results[key]["confirmed"]["held"] is True and results[key]["confirmed"]["requests"] == 10000


def test_a_sibling_whose_answer_differs_searches_on_from_its_neighbours(tmp_path):
    """A server where block 16 keeps up only to 3 req/s: starting from block 32's 4 (fails) and 4.5
    (fails), it steps down by 1 + 2 x 20 % = 1.4: 4 / 1.4 = 2.9 passes; the midpoints 3.5 and 3.2
    fail (3.2/2.9 - 1 <= 20 %). Every probe is as long as block 32's confirmation (10,000 requests,
    the long-probe length it inherits), so 2.9 needs no other confirmation."""

    def block_aware(task: PointTask) -> PointOutcome:
        if (
            task.config["engine"].get("block_size") == 16
            and task.config["workload"]["arrival"]["rate_per_s"] > 3
        ):
            steady = STEADY | {"ttft_p99_s": 3.0, "late_ttft_p99_s": 3.0, "queue_growth_frac": 0.0}
            return made_up_outcome(task, steady)
        return made_up_server(task)

    data = plan_data(candidates={"policies": [{"name": "paged", "policy": "paged"}], "block_sizes": [16, 32]})
    data["search"] = {"start_rate_per_s": 2, "seeds": [1], "min_requests": 500, "rel_tolerance": 0.2}
    data["search"] |= {"min_fill_multiple": 0, "cost_band": "none"}
    plan = load_plan_spec(write_yaml(tmp_path / "plan.yaml", data))
    document = run_plan(plan, tmp_path / "out", fn=block_aware).document
    mine = [
        (p["rate_per_s"], p["requests"], p["confirmation"], p["passed"])
        for p in document["probes"]
        if p["candidate"] == "A100-80GB / paged / block 16"
    ]
    assert mine == [
        (4.0, 10000, False, False),
        (4.5, 10000, False, False),
        (2.9, 10000, False, True),
        (3.5, 10000, False, False),
        (3.2, 10000, False, False),
    ]
    result = next(r for r in document["candidates"] if r["key"] == "A100-80GB / paged / block 16")
    assert result["max_rate_per_s"] == 2.9 and result["fail_rate_per_s"] == 3.2
    assert result["confirmed"]["held"] is True


def test_a_siblings_band_edges_start_from_its_neighbours(tmp_path):
    """The band test above with block sizes 16 and 32: block 32's edges search as there (x0.8: 5
    passes, 7 and 6 fail; x1.6: 2.5 passes, 3.5 and 3 fail); block 16's then probe those brackets
    alone, both ends in one round: 5 and 6 at x0.8, 2.5 and 3 at x1.6: the same rates and GPUs."""
    data = plan_data(candidates={"policies": [{"name": "paged", "policy": "paged"}], "block_sizes": [16, 32]})
    data["search"] = {"start_rate_per_s": 2, "seeds": [1], "min_requests": 500, "rel_tolerance": 0.2}
    data["search"] |= {"min_fill_multiple": 0, "cost_band": [0.8, 1.6]}
    plan = load_plan_spec(write_yaml(tmp_path / "plan.yaml", data))
    document = run_plan(plan, tmp_path / "out", fn=server_slowed_by_the_cost_model).document
    follower = "A100-80GB / paged / block 16"
    edges = [
        (p["time_scale"], p["rate_per_s"], p["passed"])
        for p in document["probes"]
        if p["candidate"].startswith(follower + " @")
    ]
    assert edges == [(0.8, 5.0, True), (0.8, 6.0, False), (1.6, 2.5, True), (1.6, 3.0, False)]
    for result in document["candidates"]:
        by_side = {edge["side"]: edge for edge in result["band"]["edges"]}
        assert (by_side["fast"]["max_rate_per_s"], by_side["fast"]["gpus_for_target"]) == (5.0, 4)
        assert (by_side["slow"]["max_rate_per_s"], by_side["slow"]["gpus_for_target"]) == (2.5, 8)
    # one GPU, one error: the siblings are compared at the same edge, where neither overtakes the best
    best = document["recommendation"]
    assert next(r for r in document["candidates"] if r["key"] == best)["band"]["overtaken_by"] == []


def test_worker_processes_draw_the_same_report(tmp_path):
    """The report's figures are drawn by the plan's executor: two local processes give the same report
    and the same images as drawing them one by one here."""
    from sim.planning.sweeps.executors import LocalExecutor

    plan = made_up_plan(tmp_path, cost_band=[0.8, 1.6])
    here = run_plan(plan, tmp_path / "here", fn=server_slowed_by_the_cost_model)
    executor = LocalExecutor(2)
    try:
        there = run_plan(plan, tmp_path / "there", executor, fn=server_slowed_by_the_cost_model)
    finally:
        executor.close()
    for name in ("report.md", "report.html"):
        assert (here.out_dir / name).read_text() == (there.out_dir / name).read_text()
    figures = sorted(path.name for path in (here.out_dir / "figures").iterdir())
    assert figures and figures == sorted(path.name for path in (there.out_dir / "figures").iterdir())
    for name in figures:
        assert (here.out_dir / "figures" / name).read_bytes() == (
            there.out_dir / "figures" / name
        ).read_bytes()


def test_round_lines_give_the_rounds_left_and_the_time(tmp_path):
    """The same search as above, its progress lines worked out by hand from
    :meth:`RateSearch.rounds_left` (rel_tolerance 0.2: a bracket of width 1 needs 3 halvings, of
    1/3 one, of 1/2 two, of 1/4 one; a confirmation adds one while one is due)."""
    plan = made_up_plan(tmp_path)
    lines: list[str] = []
    run_plan(plan, tmp_path / "out", fn=made_up_server, log=lines.append)
    rounds = [line for line in lines if line.startswith("kvsim plan: round")]
    totals = [re.match(r"kvsim plan: round (\d+)( of about (\d+)|)", line).groups() for line in rounds]
    assert [(int(n), int(m) if m else None) for n, _, m in totals] == [
        (1, 1 + 1 + 3 + 1),  # 2 passed: one more growth step, 3 halvings, the confirmation
        (2, 2 + 5),  # 4 passed
        (3, 3 + 3 + 1),  # 8 failed: [4, 8]
        (4, 4 + 3 + 1),  # 6 runs again longer: still [4, 8]
        (5, 5 + 1 + 1),  # 6 passed: [6, 8]
        (6, 6 + 0 + 1),  # 7 failed: [6, 7] is within 20 %: only the confirmation
        (7, 7 + 2 + 1),  # the confirmation at 6 broke: [4, 6] again, and a new confirmation
        (8, 8 + 1 + 1),  # 5 failed: [4, 5]
        (9, 9 + 0 + 1),  # 4.5 failed
        (10, None),  # 4 confirmed: the last
    ]
    assert "(the last, unless a search must run again)" in rounds[-1]
    assert all(re.search(r"; \d+ s so far", line) for line in rounds)
    assert all("left" in line for line in rounds[:-1]) and "left" not in rounds[-1]
