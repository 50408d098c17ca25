"""The fit of ``kvsim calibrate --from-runs`` (calibrate/from_runs.py) on hand-made runs: a stub stands
for the replay, so every candidate's errors, every fold's refit and every record can be worked out by
hand (the fit against real replays is in test_serving_calibration.py)."""

from __future__ import annotations

import copy
import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from calibrate import from_runs
from calibrate.from_runs import (
    METRICS,
    START,
    Evaluator,
    RunErrors,
    RunTraits,
    _from_vector,
    best_overhead,
    calibrate_from_runs,
    check_same_runs,
    default_jobs,
    fit,
    fold_groups,
    format_errors,
    log_loss,
    model_family,
    run_traits,
    summarize_errors,
)
from sim.costs.serving import CalibrationError, ServingCalibration

FIGURES = {"ttft_mean": 0.1, "tpot": 0.02, "e2e_mean": 2.0}
"""Every fake run's engine-side figures when replayed with the terms it was 'measured' with."""


@dataclass(frozen=True)
class FakeRun:
    anchor: str
    traits: RunTraits
    planted_s: float
    """The iteration overhead the run was 'measured' with: every simulated figure scales with
    ``(iteration_overhead_s / planted_s) ** sensitivity``."""
    client_s: float = 0.0
    """The client term in its measured TTFT and E2E (client-side runs)."""
    planted_all_reduce_s: float | None = None
    """Where set, the simulated TTFT also scales with ``all_reduce_latency_s / planted_all_reduce_s``."""
    sensitivity: float = 1.0


class FakeReplays:
    """Stands for ``replay_figures``: the run of a 'spec path' (its name) replayed with ``parameters``."""

    def __init__(self, runs: dict[str, FakeRun]):
        self.runs = runs
        self.calls: list[str] = []

    def __call__(self, spec_path: str, parameters: dict[str, float | None]) -> RunErrors:
        self.calls.append(spec_path)
        run = self.runs[spec_path]
        ratio = (parameters["iteration_overhead_s"] / run.planted_s) ** run.sensitivity
        simulated = {metric: value * ratio for metric, value in FIGURES.items()}
        if run.planted_all_reduce_s is not None:
            simulated["ttft_mean"] *= parameters["all_reduce_latency_s"] / run.planted_all_reduce_s
        measured = {
            metric: value + (run.client_s if metric != "tpot" else 0.0) for metric, value in FIGURES.items()
        }
        return RunErrors(spec_path, run.anchor, measured, simulated, run.traits)


def _traits(gpu: str, collectives: str = "none", family: str = "llama-2", tp: int = 1) -> RunTraits:
    return RunTraits(gpu=gpu, model_family=family, tensor_parallel_size=tp, collectives=collectives)


@pytest.fixture
def replays(monkeypatch: pytest.MonkeyPatch):
    def install(runs: dict[str, FakeRun]) -> FakeReplays:
        stub = FakeReplays(runs)
        monkeypatch.setattr(from_runs, "replay_figures", stub)
        return stub

    return install


# Two fake GPUs, X and Y. X's runs were measured with a 0.2 ms iteration overhead (one client-side,
# with a 20 ms client term, over NVLink with a 10 us all-reduce latency; one engine-side), Y's run
# with 0.3 ms over PCIe.
THREE_RUNS = {
    "x-client": FakeRun(
        "client", _traits("X", "nvlink", tp=2), 2e-4, client_s=0.02, planted_all_reduce_s=1e-5
    ),
    "x-engine": FakeRun("engine", _traits("X"), 2e-4),
    "y-engine": FakeRun("engine", _traits("Y", "pcie", tp=2), 3e-4),
}
PATHS = [Path(name) for name in THREE_RUNS]


# --------------------------------------------------------------------------------------------------
# Errors, losses, summaries
# --------------------------------------------------------------------------------------------------


def test_the_client_term_moves_ttft_and_e2e_of_client_side_runs_but_never_tpot() -> None:
    run = RunErrors(
        "r",
        "client",
        {"ttft_mean": 0.2, "tpot": 0.02, "e2e_mean": 2.0},
        {"ttft_mean": 0.1, "tpot": 0.02, "e2e_mean": 1.9},
        _traits("X"),
    )
    # ttft (0.1 + 0.1) / 0.2 - 1 = 0; tpot 0.02 / 0.02 - 1 = 0; e2e (1.9 + 0.1) / 2.0 - 1 = 0
    assert run.with_overhead(0.1) == pytest.approx({"ttft_mean": 0.0, "tpot": 0.0, "e2e_mean": 0.0})


def test_a_figure_not_measured_or_not_simulated_has_no_error() -> None:
    run = RunErrors(
        "r",
        "engine",
        {"ttft_mean": 0.2, "tpot": 0.0, "e2e_mean": 2.0},
        {"ttft_mean": 0.3, "tpot": 0.02, "e2e_mean": math.inf},
        _traits("X"),
    )
    errors = run.with_overhead(0.0)
    assert errors["ttft_mean"] == pytest.approx(0.5)  # 0.3 / 0.2 - 1
    assert math.isnan(errors["tpot"])  # measured 0: nothing to compare with
    assert math.isnan(errors["e2e_mean"])  # a run that never finished in the simulation


def test_log_loss_counts_an_infinite_or_total_shortfall_as_five() -> None:
    # an error of -1 (simulated 0) or below has no logarithm; +inf none either: 5 each
    assert log_loss({"a": -1.0, "b": math.inf, "c": 0.0}) == pytest.approx(10.0 / 3)
    assert log_loss({"a": -1.5}) == 5.0


def test_a_figure_no_run_has_is_summarized_as_nan_without_a_warning() -> None:
    errors = {
        "a": {"ttft_mean": 0.1, "tpot": math.nan, "e2e_mean": -0.3},
        "b": {"ttft_mean": -0.2, "tpot": math.nan, "e2e_mean": 0.1},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no "mean of empty slice")
        summary = summarize_errors(errors)
    assert math.isnan(summary["tpot_mean_abs"]) and math.isnan(summary["tpot_max_abs"])
    assert summary["ttft_mean_mean_abs"] == pytest.approx(0.15)  # (0.1 + 0.2) / 2
    assert summary["e2e_mean_max_abs"] == pytest.approx(0.3)


def test_format_errors_lines_up_runs_and_the_mean() -> None:
    errors = {
        "long-run": {"ttft_mean": 0.1234, "tpot": -0.05, "e2e_mean": 0.0},
        "b": {"ttft_mean": -0.2, "tpot": 0.15, "e2e_mean": 0.1},
    }
    # names padded to the longest (8); figures signed percentages right-aligned in 8; the mean of
    # |error|: TTFT (12.34 + 20) / 2 = 16.17 %, TPOT (5 + 15) / 2 = 10 %, E2E (0 + 10) / 2 = 5 %
    assert format_errors(errors) == [
        "  run           TTFT      TPOT       E2E",
        "  long-run    +12.3%     -5.0%     +0.0%",
        "  b           -20.0%    +15.0%    +10.0%",
        "  mean |error|     16.2%     10.0%      5.0%",
    ]
    # no runs: the name column keeps the width of 'run ' (4)
    assert format_errors({}) == [
        "  run       TTFT      TPOT       E2E",
        "  mean |error|      nan%      nan%      nan%",
    ]


# --------------------------------------------------------------------------------------------------
# Traits and groups
# --------------------------------------------------------------------------------------------------


def test_model_family_of_a_model_file_is_that_of_its_name() -> None:
    assert model_family("configs/models/Llama-2-70B.json") == "llama-2"
    assert model_family("Qwen3-30B-A3B.json") == "qwen3"


def test_model_and_tp_folds_group_by_family_and_tensor_parallel_size() -> None:
    figures = {"ttft_mean": 0.1, "tpot": 0.01, "e2e_mean": 1.0}
    results = [
        RunErrors("a", "engine", figures, figures, _traits("X", family="llama-2", tp=1)),
        RunErrors("b", "engine", figures, figures, _traits("X", family="qwen3", tp=2)),
        RunErrors("c", "engine", figures, figures, _traits("Y", family="llama-2", tp=2)),
    ]
    assert fold_groups(results, [], "model") == {"llama-2": [0, 2], "qwen3": [1]}
    assert fold_groups(results, [], "tp") == {"TP 1": [0], "TP 2": [1, 2]}


def _prepared(
    gpu: object, model: str, tp: int = 1, expert_parallel: bool = False, dp: int = 1
) -> SimpleNamespace:
    engine = SimpleNamespace(
        tensor_parallel_size=tp, enable_expert_parallel=expert_parallel, data_parallel_size=dp
    )
    return SimpleNamespace(config=SimpleNamespace(gpu=gpu, model=model, engine=engine))


def test_run_traits_name_the_gpu_family_tp_and_the_link_of_its_collectives() -> None:
    h100 = run_traits(_prepared("H100-80GB", "Llama-2-70B", tp=4))
    assert h100 == RunTraits(
        gpu="H100-80GB",
        gpu_preset="H100-80GB",
        model_family="llama-2",
        tensor_parallel_size=4,
        collectives="nvlink",
    )
    pcie_gpu = {"base": "H100-80GB", "name": "h100-pcie", "nvlink_gb_per_s": None}
    pcie = run_traits(_prepared(pcie_gpu, "Llama-2-70B", tp=2))
    assert (pcie.gpu, pcie.gpu_preset, pcie.collectives) == ("h100-pcie", "H100-80GB", "pcie")
    # one GPU: no collective at all, whatever the link
    assert run_traits(_prepared("H100-80GB", "Llama-2-7B")).collectives == "none"
    assert run_traits(_prepared(pcie_gpu, "Llama-2-7B")).collectives == "none"
    # expert parallelism across data-parallel ranks: collectives without tensor parallelism
    assert run_traits(_prepared(pcie_gpu, "Qwen3-30B-A3B", expert_parallel=True, dp=2)).collectives == "pcie"
    assert run_traits(_prepared(pcie_gpu, "Qwen3-30B-A3B", expert_parallel=True, dp=1)).collectives == "none"
    assert run_traits(_prepared(pcie_gpu, "Qwen3-30B-A3B", expert_parallel=False, dp=2)).collectives == "none"


# --------------------------------------------------------------------------------------------------
# Candidates: vectors, the client term, the evaluator
# --------------------------------------------------------------------------------------------------


def test_a_vector_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError):
        _from_vector([math.log(1e-4)], ["iteration_overhead_s", "kv_bandwidth_scale"], START)


def test_default_jobs_are_the_usable_cpus_up_to_eight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert default_jobs() == 3  # the affinity, not the machine's 16
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(12)), raising=False)
    assert default_jobs() == 8
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5}, raising=False)
    assert default_jobs() == 1
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS
    assert default_jobs() == 8  # min(16, 8)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert default_jobs() == 4
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown
    assert default_jobs() == 1


def _count_calls(results: list[RunErrors]) -> tuple[list[float], float]:
    seen: list[float] = []

    class Counting(RunErrors):
        def with_overhead(self, overhead_s: float) -> dict[str, float]:
            seen.append(overhead_s)
            return super().with_overhead(overhead_s)

    counted = [Counting(r.name, r.anchor, r.measured, r.simulated, r.traits) for r in results]
    return seen, best_overhead(counted)


def test_the_client_term_is_searched_to_a_tenth_of_a_millisecond_quietly() -> None:
    run = RunErrors(
        "c",
        "client",
        {"ttft_mean": 0.137, "tpot": 0.02, "e2e_mean": 2.037},
        {"ttft_mean": 0.1, "tpot": 0.02, "e2e_mean": 2.0},
        _traits("X"),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only options scipy knows
        seen, found = _count_calls([run])
    assert found == pytest.approx(0.037, abs=1e-4)
    # searched to 0.1 ms, not to scipy's default 0.01 ms: fewer trials than the finer search takes
    # on the same loss (13 and 16 here)
    from scipy.optimize import minimize_scalar

    finer = minimize_scalar(lambda overhead: log_loss(run.with_overhead(overhead)), bounds=(0.0, 0.2))
    assert len(seen) < finer.nfev


def test_an_evaluator_replays_every_run_or_the_ones_named_and_logs_each_candidate(replays) -> None:
    stub = replays(THREE_RUNS)
    messages: list[str] = []
    evaluator = Evaluator(PATHS, log=messages.append)
    parameters = {"iteration_overhead_s": 3e-4, "kv_bandwidth_scale": 1.0, "all_reduce_latency_s": None}
    only_y = evaluator.evaluate(parameters, ["y-engine"], overhead_s=0.0)
    # y-engine replayed at its own 0.3 ms: no error, no loss
    assert [r.name for r in only_y.results] == ["y-engine"] and only_y.loss == pytest.approx(0.0)
    assert only_y.parameters is parameters and only_y.overhead_s == 0.0
    assert messages == [
        "  loss 0.0000  [iteration_overhead_s=0.0003, kv_bandwidth_scale=1, request_overhead_s=0.0000]"
    ]
    x_engine = evaluator.evaluate({**parameters, "iteration_overhead_s": 2e-4}, ["x-engine"], overhead_s=0.0)
    assert x_engine.loss == pytest.approx(0.0)
    assert evaluator.seen == [only_y, x_engine]
    stub.calls.clear()
    every = evaluator.evaluate({**parameters, "all_reduce_latency_s": 1e-5}, overhead_s=0.05)
    assert stub.calls == ["x-client", "x-engine", "y-engine"]
    # x-client at 1.5x: ttft (0.15 + 0.05) / 0.12 - 1 = 2/3, tpot 0.5, e2e (3.0 + 0.05) / 2.02 - 1;
    # x-engine at 1.5x: 0.5 each (log 1.5); y-engine exact
    x_client = (math.log(0.2 / 0.12) + math.log(1.5) + math.log(3.05 / 2.02)) / 3
    assert every.loss == pytest.approx((x_client + math.log(1.5)) / 3)
    assert every.overhead_s == 0.05
    assert messages[-1].endswith(", all_reduce_latency_s=1e-05, request_overhead_s=0.0500]")
    evaluator.close()


def test_an_evaluator_picks_the_client_term_unless_told(replays) -> None:
    replays(THREE_RUNS)
    evaluator = Evaluator(PATHS)
    terms = {"iteration_overhead_s": 2e-4, "all_reduce_latency_s": 1e-5}
    chosen = evaluator.evaluate(terms, ["x-client", "x-engine"])
    # both X runs replayed at their own terms: x-client's 20 ms client term is found, no error left
    assert chosen.overhead_s == pytest.approx(0.02, abs=1e-4)
    assert chosen.loss == pytest.approx(0.0, abs=1e-3)
    fixed = evaluator.evaluate(terms, ["x-client", "x-engine"], overhead_s=0.0)
    # without it: ttft 0.1 / 0.12 - 1, e2e 2.0 / 2.02 - 1
    assert fixed.loss == pytest.approx((math.log(0.12 / 0.1) + math.log(2.02 / 2.0)) / 3 / 2)
    evaluator.close()


def test_an_evaluator_with_one_job_replays_here_and_with_more_in_worker_processes(replays) -> None:
    stub = replays(THREE_RUNS)
    terms = {"iteration_overhead_s": 3e-4, "all_reduce_latency_s": 1e-5}
    for here in (Evaluator(PATHS), Evaluator(PATHS, jobs=0)):
        assert here.jobs == 1
        assert [r.name for r in here.results(terms)] == ["x-client", "x-engine", "y-engine"]
        here.close()
    assert stub.calls == ["x-client", "x-engine", "y-engine"] * 2
    stub.calls.clear()
    pooled = Evaluator(PATHS, jobs=2)
    try:
        results = pooled.results(terms, ["y-engine", "x-engine"])
    finally:
        pooled.close()
    assert stub.calls == []  # the replays ran in the workers (which have the stub too)
    assert [r.name for r in results] == ["y-engine", "x-engine"]
    assert results[1].with_overhead(0.0)["tpot"] == pytest.approx(0.5)  # x-engine at 3/2 of its 0.2 ms


# --------------------------------------------------------------------------------------------------
# The search
# --------------------------------------------------------------------------------------------------


def test_the_search_starts_from_the_start_and_steps_each_term_once(replays) -> None:
    replays(THREE_RUNS)
    evaluator = Evaluator(PATHS)
    names = ["iteration_overhead_s", "kv_bandwidth_scale"]
    fit(evaluator, START, max_evaluations=3, names=names)
    tried = [evaluation.parameters for evaluation in evaluator.seen]
    others = {"decode_attention_per_seq_scale": 0.5, "weight_bandwidth_scale": 1.0}
    others |= {"all_reduce_latency_s": 6e-6, "pcie_all_reduce_scale": 1.5}
    assert tried[0] == pytest.approx({"iteration_overhead_s": 3e-4, "kv_bandwidth_scale": 1.0, **others})
    # a doubling-ish first step (x e^0.7) in the overhead, a gentler x e^0.15 in a bandwidth scale
    assert tried[1] == pytest.approx(
        {"iteration_overhead_s": 3e-4 * 2.0137527, "kv_bandwidth_scale": 1.0, **others}
    )
    assert tried[2] == pytest.approx(
        {"iteration_overhead_s": 3e-4, "kv_bandwidth_scale": 1.1618342, **others}
    )


def test_the_search_replays_only_its_runs_with_the_client_term_it_is_given(replays) -> None:
    stub = replays(THREE_RUNS)
    evaluator = Evaluator(PATHS)
    fit(evaluator, START, ["x-engine"], max_evaluations=4, names=["iteration_overhead_s"], overhead_s=0.05)
    assert stub.calls == ["x-engine"] * 4
    assert [evaluation.overhead_s for evaluation in evaluator.seen] == [0.05] * 4


def test_when_no_candidate_does_better_the_start_stands(replays) -> None:
    flat = {"flat": FakeRun("engine", _traits("X"), 2e-4, sensitivity=0.0)}
    replays(flat)
    evaluator = Evaluator([Path("flat")])
    best = fit(evaluator, START, max_evaluations=3, names=["iteration_overhead_s"])
    assert len(evaluator.seen) == 3 and best is evaluator.seen[0]
    assert best.parameters["iteration_overhead_s"] == pytest.approx(3e-4, rel=1e-12)


def test_the_search_finds_a_planted_term_quietly(replays) -> None:
    replays({"r": FakeRun("engine", _traits("X"), 1.37e-4)})
    evaluator = Evaluator([Path("r")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only options scipy knows
        best = fit(evaluator, START, max_evaluations=200, names=["iteration_overhead_s"])
    # the loss is |log(x / 0.137 ms)|: a loss within fatol = 1e-4 of 0 is x within 0.01 % of it
    assert best.parameters["iteration_overhead_s"] == pytest.approx(1.37e-4, rel=2e-4)
    assert len(evaluator.seen) < 200  # it stopped by itself


# --------------------------------------------------------------------------------------------------
# The whole procedure
# --------------------------------------------------------------------------------------------------


def test_unknown_fold_kinds_are_refused_by_name() -> None:
    with pytest.raises(ValueError) as refused:
        calibrate_from_runs(PATHS, folds=("run", "site", "day"))
    assert str(refused.value) == "unknown fold kind(s) site, day; known: run, gpu, model, tp"


def test_checkpoints_logs_and_evaluations_of_a_fit_with_two_fold_kinds(replays) -> None:
    stub = replays(THREE_RUNS)
    snapshots: list[dict] = []
    messages: list[str] = []
    calibration = calibrate_from_runs(
        PATHS,
        max_evaluations=3,
        folds=("run", "gpu"),
        fold_evaluations=2,
        names=["iteration_overhead_s", "kv_bandwidth_scale"],
        log=messages.append,
        checkpoint=lambda partial: snapshots.append(copy.deepcopy(partial.fit)),
    )
    # evaluations: the full fit's 3; then 2 for each of the 3 runs left out (9); then 2 for each of
    # the 2 GPUs left out (13). Held-out replays are not evaluations.
    assert [snapshot["evaluations"] for snapshot in snapshots] == [3, 9, 13]
    assert "leave_one_out" not in snapshots[0] and "leave_one_gpu_out" not in snapshots[1]
    assert "leave_one_gpu_out" in snapshots[2]
    fit_record = calibration.fit
    assert fit_record["evaluations"] == 13
    assert set(fit_record) == {
        "runs",
        "gpus",
        "loss",
        "evaluations",
        "in_sample",
        "leave_one_out",
        "leave_one_gpu_out",
    }
    assert fit_record["runs"] == ["x-client", "x-engine", "y-engine"]
    assert fit_record["gpus"] == {"x-client": "X", "x-engine": "X", "y-engine": "Y"}
    assert set(fit_record["in_sample"]) == {"runs", "summary"}
    assert calibration.source == "3 measured vLLM runs"
    assert set(fit_record["leave_one_out"]) == {"runs", "summary", "parameters", "borrowed"}  # no groups
    assert set(fit_record["leave_one_gpu_out"]["groups"]) == {"X", "Y"}
    # replays: full fit 3 x 3 runs; each run left out: 2 x 2 others + itself; GPU X left out: 2 x 1
    # + its 2; GPU Y left out: 2 x 2 + its 1
    assert len(stub.calls) == 9 + 3 * 5 + (2 + 2) + (4 + 1)
    assert (
        messages[0] == "fitting iteration_overhead_s, kv_bandwidth_scale (and request_overhead_s) to 3 runs"
    )
    assert sum(message.startswith("  loss ") for message in messages) == 13
    leaving = [message for message in messages if message.startswith("leaving out")]
    assert leaving == [
        "leaving out run x-client (borrowing request_overhead_s, all_reduce_latency_s)",
        "leaving out run x-engine",
        "leaving out run y-engine (borrowing pcie_all_reduce_scale)",
        "leaving out gpu X (borrowing request_overhead_s, all_reduce_latency_s)",
        "leaving out gpu Y (borrowing pcie_all_reduce_scale)",
    ]


def test_folds_run_with_any_positive_budget_and_not_with_none(replays) -> None:
    replays(THREE_RUNS)
    one = calibrate_from_runs(
        PATHS, max_evaluations=2, folds=("gpu",), fold_evaluations=1, names=["iteration_overhead_s"]
    )
    assert one.fit["evaluations"] == 2 + 2 * 1
    assert set(one.fit["leave_one_gpu_out"]["runs"]) == set(THREE_RUNS)
    none = calibrate_from_runs(
        PATHS, max_evaluations=2, folds=("gpu",), fold_evaluations=0, names=["iteration_overhead_s"]
    )
    assert none.fit["evaluations"] == 2 and "leave_one_gpu_out" not in none.fit


def test_jobs_run_the_replays_of_a_fit_in_worker_processes(replays) -> None:
    stub = replays(THREE_RUNS)
    calibration = calibrate_from_runs(
        PATHS, jobs=2, max_evaluations=2, folds=(), names=["iteration_overhead_s"]
    )
    assert stub.calls == []  # none replayed here
    assert (
        set(calibration.fit["in_sample"]["runs"]) == set(THREE_RUNS) and calibration.fit["evaluations"] == 2
    )


def test_the_full_fit_tries_sixty_candidates_unless_told(replays) -> None:
    # six terms from a doubling simplex cannot shrink to xatol = 0.02 in 60 tries: the budget binds
    replays(THREE_RUNS)
    calibration = calibrate_from_runs(PATHS, folds=())
    assert calibration.fit["evaluations"] == 60


def test_a_gpu_left_out_is_replayed_with_the_terms_fitted_to_the_other_and_borrows_the_rest(replays) -> None:
    replays(THREE_RUNS)
    calibration = calibrate_from_runs(
        PATHS, max_evaluations=200, folds=("gpu",), names=["iteration_overhead_s", "all_reduce_latency_s"]
    )
    # in sample: X's two runs outweigh Y's one at 0.2 ms; x-client's TTFT gives the all-reduce
    # latency (10 us) and its E2E the client term (20 ms)
    assert calibration.iteration_overhead_s == pytest.approx(2e-4, rel=1e-2)
    assert calibration.all_reduce_latency_s == pytest.approx(1e-5, rel=2e-2)
    assert calibration.request_overhead_s == pytest.approx(0.02, abs=5e-4)
    record = calibration.fit["leave_one_gpu_out"]
    # X left out: fitted to y-engine alone (0.3 ms); no client-side and no NVLink run to train on,
    # so the client term and the all-reduce latency are the full fit's
    x_terms = record["parameters"]["X"]
    assert x_terms["iteration_overhead_s"] == pytest.approx(3e-4, rel=1e-3)
    assert x_terms["all_reduce_latency_s"] == calibration.all_reduce_latency_s
    assert x_terms["request_overhead_s"] == calibration.request_overhead_s
    # Y left out: fitted to X's runs (0.2 ms, 10 us, 20 ms); no PCIe run: its scale as the start has it
    y_terms = record["parameters"]["Y"]
    assert y_terms["iteration_overhead_s"] == pytest.approx(2e-4, rel=1e-3)
    # (20 ms is 1 % of an E2E: the search leaves it within a couple of ms)
    assert y_terms["request_overhead_s"] == pytest.approx(0.02, abs=3e-3)
    assert y_terms["pcie_all_reduce_scale"] == START.pcie_all_reduce_scale
    assert record["borrowed"] == {
        "X": ["request_overhead_s", "all_reduce_latency_s"],
        "Y": ["pcie_all_reduce_scale"],
    }
    # held out at 3/2 of X's 0.2 ms: x-client ttft (0.15 + 0.02) / 0.12 - 1, tpot 0.5,
    # e2e (3.0 + 0.02) / 2.02 - 1; x-engine 0.5 each; at 2/3 of Y's 0.3 ms: y-engine -1/3 each
    x_client = {"ttft_mean": 0.17 / 0.12 - 1, "tpot": 0.5, "e2e_mean": 3.02 / 2.02 - 1}
    expected = {
        "x-client": x_client,
        "x-engine": {"ttft_mean": 0.5, "tpot": 0.5, "e2e_mean": 0.5},
        "y-engine": {"ttft_mean": -1 / 3, "tpot": -1 / 3, "e2e_mean": -1 / 3},
    }
    assert set(record["runs"]) == set(expected)
    for name, errors in expected.items():
        assert record["runs"][name] == pytest.approx(errors, abs=3e-3), name
    assert record["groups"]["X"]["runs"] == ["x-client", "x-engine"]
    x_summary = record["groups"]["X"]["summary"]
    assert x_summary["ttft_mean_mean_abs"] == pytest.approx((0.17 / 0.12 - 1 + 0.5) / 2, abs=3e-3)
    assert x_summary["e2e_mean_max_abs"] == pytest.approx(0.5, abs=3e-3)
    assert record["groups"]["Y"]["runs"] == ["y-engine"]
    assert record["groups"]["Y"]["summary"] == pytest.approx(
        {f"{metric}_{kind}": 1 / 3 for metric in METRICS for kind in ("mean_abs", "max_abs")}, abs=3e-3
    )
    assert record["summary"]["tpot_mean_abs"] == pytest.approx((0.5 + 0.5 + 1 / 3) / 3, abs=3e-3)


def test_a_run_left_out_gets_the_client_term_of_the_runs_it_was_fitted_to(replays) -> None:
    # two client-side runs at the same 0.2 ms, with client terms of 20 and 60 ms: each fold's
    # training run is client-side, so each fold picks its own client term, not the full fit's
    replays(
        {
            "a": FakeRun("client", _traits("X"), 2e-4, client_s=0.02),
            "b": FakeRun("client", _traits("Y"), 2e-4, client_s=0.06),
        }
    )
    calibration = calibrate_from_runs(
        [Path("a"), Path("b")], max_evaluations=100, folds=("run",), names=["iteration_overhead_s"]
    )
    record = calibration.fit["leave_one_out"]
    assert "borrowed" not in record
    assert record["parameters"]["a"]["request_overhead_s"] == pytest.approx(0.06, abs=2e-3)  # b's
    assert record["parameters"]["b"]["request_overhead_s"] == pytest.approx(0.02, abs=2e-3)  # a's
    # a replayed with b's 60 ms: ttft (0.1 + 0.06) / 0.12 - 1 = 1/3; b with a's 20 ms: 0.12 / 0.16 - 1
    assert record["runs"]["a"]["ttft_mean"] == pytest.approx(1 / 3, abs=0.02)
    assert record["runs"]["b"]["ttft_mean"] == pytest.approx(-0.25, abs=0.02)


# --------------------------------------------------------------------------------------------------
# Folds of an earlier fit
# --------------------------------------------------------------------------------------------------


def test_folds_of_an_earlier_fit_replay_its_terms_with_its_client_term(replays) -> None:
    replays(
        {
            "a": FakeRun("client", _traits("X"), 3e-4, client_s=0.02),
            "b": FakeRun("engine", _traits("Y"), 3e-4),
        }
    )
    paths = [Path("a"), Path("b")]
    earlier = ServingCalibration(
        iteration_overhead_s=3e-4,
        request_overhead_s=0.05,
        fit={"runs": ["b", "a"], "loss": 9.9, "note": "kept"},
    )
    messages: list[str] = []
    added = calibrate_from_runs(paths, folds=(), fitted_before=earlier, log=messages.append)
    assert messages[0] == "replaying the fitted terms on 2 runs (the full fit is not repeated)"
    assert added.parameters() == earlier.parameters() and added.request_overhead_s == 0.05
    record = added.fit
    assert set(record) == {"runs", "gpus", "loss", "evaluations", "in_sample", "note"}
    assert record["note"] == "kept" and record["runs"] == ["a", "b"]
    assert record["evaluations"] == 1  # none recorded before, one replay now
    # a with the earlier 50 ms client term (not the 20 ms it would pick): ttft (0.1 + 0.05) / 0.12 - 1
    # = 0.25, tpot 0, e2e 2.05 / 2.02 - 1; b exact
    a = {"ttft_mean": 0.25, "tpot": 0.0, "e2e_mean": 2.05 / 2.02 - 1}
    runs = record["in_sample"]["runs"]
    assert runs["a"] == pytest.approx(a) and runs["b"] == pytest.approx(
        {"ttft_mean": 0, "tpot": 0, "e2e_mean": 0}
    )
    assert record["in_sample"]["summary"]["ttft_mean_mean_abs"] == pytest.approx(0.125)  # (0.25 + 0) / 2
    assert record["loss"] == pytest.approx((math.log(1.25) + math.log(2.05 / 2.02)) / 3 / 2)
    assert earlier.fit == {"runs": ["b", "a"], "loss": 9.9, "note": "kept"}  # the earlier record untouched
    with pytest.raises(CalibrationError) as refused:
        calibrate_from_runs([Path("a")], folds=(), fitted_before=earlier)
    assert str(refused.value) == (
        "the calibration to add folds to was fitted to other runs than those given; in its fit but not given: b"
    )


def test_check_same_runs_names_what_is_missing_and_what_is_extra() -> None:
    def refusal(fitted_runs: list[str] | None, given: list[str]) -> str:
        fit_record = {} if fitted_runs is None else {"runs": fitted_runs}
        with pytest.raises(CalibrationError) as refused:
            check_same_runs(ServingCalibration(fit=fit_record), [Path(name) for name in given], "F")
        return str(refused.value)

    check_same_runs(ServingCalibration(fit={"runs": ["b", "a"]}), [Path("a"), Path("b")], "F")  # order aside
    stem = "F was fitted to other runs than those given"
    assert (
        refusal(["a", "b"], ["b", "c", "d"]) == f"{stem}; not in its fit: c, d; in its fit but not given: a"
    )
    assert refusal(["a"], ["a", "b"]) == f"{stem}; not in its fit: b"
    assert refusal(["a", "b", "c"], ["b"]) == f"{stem}; in its fit but not given: a, c"
    assert refusal(None, ["a", "b"]) == f"{stem}; not in its fit: a, b (it records no runs)"
    assert refusal([], ["a"]) == f"{stem}; not in its fit: a (it records no runs)"


# --------------------------------------------------------------------------------------------------
# One real replay
# --------------------------------------------------------------------------------------------------


def test_a_replay_reads_its_run_next_to_its_file_and_reports_measured_and_simulated_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from calibrate.from_runs import FITTED, replay_figures
    from sim.costs.serving import NEUTRAL
    from tests.test_replay import _self_measured_run

    folder = tmp_path / "run"
    folder.mkdir()
    bench = _self_measured_run(folder)
    spec = {
        "name": "relative",
        "run": {"path": bench.name},  # relative to the replay file, not to the working directory
        "gpu": "H100-80GB",
        "policy": "paged",
        "engine": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
    }
    (folder / "replay.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(tmp_path)
    result = replay_figures(str(folder / "replay.yaml"), {name: getattr(NEUTRAL, name) for name in FITTED})
    data = json.loads(bench.read_text())
    ttfts = data["ttfts"]
    e2es = [ttft + sum(itl) for ttft, itl in zip(ttfts, data["itls"], strict=True)]
    assert result.name == "relative"
    assert result.anchor == "client"  # vllm bench serve times requests at the client
    # the GPU, its preset, one GPU (no collectives); the family of the model the run names
    assert (result.traits.gpu, result.traits.gpu_preset) == ("H100-80GB", "H100-80GB")
    assert (result.traits.tensor_parallel_size, result.traits.collectives) == (1, "none")
    assert result.traits.model_family == model_family(data["model_id"])
    assert result.measured["ttft_mean"] == pytest.approx(sum(ttfts) / len(ttfts))
    assert result.measured["e2e_mean"] == pytest.approx(sum(e2es) / len(e2es))
