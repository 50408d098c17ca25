"""``kvsim calibrate --from-runs``: fit the serving terms (``sim/costs/serving.py``) to measured runs.

Each candidate set of terms is judged by replaying every run (``kvsim replay-run``'s pipeline, without
the report) and comparing mean TTFT, the publisher's TPOT and mean E2E. The loss is the mean over
runs and those three figures of ``|log(simulated / measured)|``: symmetric in fast and slow, and
bounded where a run saturates (a queue that explodes costs a few units, not thousands of percent).

``request_overhead_s`` moves every client-side TTFT and E2E by the same amount and nothing else, so
it needs no simulation of its own: replays run with it at 0 and it is chosen, for each candidate,
as the value that minimises the client-side runs' loss (a one-dimensional search).

A fit is judged by its held-out errors, in folds (``FOLDS``): **leave one run out** (each run
replayed with the terms fitted to the others: what a user with a new run on a fitted GPU should
expect) and **leave one GPU out** (every run of a GPU replayed with the terms fitted to the other
GPUs' runs: what a GPU no fitted run measured should expect), and on request by model family and by
tensor-parallel size. A fold whose training runs cannot inform a term (no client-side run for the
client term, no NVLink collective for its latency, no PCIe collective for its scale) keeps that term
at the full fit's value and records it as ``borrowed``: such a term is a property of the server or of
a link, not of the GPU the fold leaves out.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from sim.costs.core import CostModelConfig
from sim.costs.serving import CalibrationError, ServingCalibration, write_calibration

FITTED = (
    "iteration_overhead_s",
    "decode_attention_per_seq_scale",
    "kv_bandwidth_scale",
    "weight_bandwidth_scale",
    "all_reduce_latency_s",
    "pcie_all_reduce_scale",
)
"""The terms the simulation depends on, fitted by Nelder-Mead in log space (all are positive)."""

START = ServingCalibration(
    iteration_overhead_s=3e-4,
    decode_attention_per_seq_scale=0.5,
    kv_bandwidth_scale=1.0,
    all_reduce_latency_s=6e-6,
    pcie_all_reduce_scale=1.5,
)
BOUNDS = {
    "iteration_overhead_s": (1e-6, 5e-3),
    "decode_attention_per_seq_scale": (1e-3, 3.0),
    # (shares are capped at each GPU's achievable bandwidth, which bounds these scales further)
    "kv_bandwidth_scale": (0.5, 1.6),
    "weight_bandwidth_scale": (0.5, 1.6),
    "all_reduce_latency_s": (1e-7, 3e-5),
    "pcie_all_reduce_scale": (0.2, 20.0),
    "request_overhead_s": (0.0, 0.2),
}
METRICS = ("ttft_mean", "tpot", "e2e_mean")
INITIAL_STEP = {"kv_bandwidth_scale": 0.15, "weight_bandwidth_scale": 0.15}
"""Nelder-Mead's first step in a term (log units) where the default doubling is too far."""


FOLDS = {
    "run": "leave_one_out",
    "gpu": "leave_one_gpu_out",
    "model": "leave_one_model_out",
    "tp": "leave_one_tp_out",
}
"""Fold kinds and the key of their record in a calibration's ``fit``."""


@dataclass(frozen=True)
class RunTraits:
    """What a run was measured on, for folds and for knowing which terms it informs."""

    gpu: str
    """The GPU's name (what a GPU fold groups by)."""
    model_family: str
    tensor_parallel_size: int
    collectives: str
    """``nvlink``, ``pcie`` (tensor- or expert-parallel collectives over that link) or ``none``."""
    gpu_preset: str | None = None
    """The preset the GPU is or was built from (what makes a preset ``measured``)."""

    def group(self, fold: str, run_name: str) -> str:
        return {
            "run": run_name,
            "gpu": self.gpu,
            "model": self.model_family,
            "tp": f"TP {self.tensor_parallel_size}",
        }[fold]


def model_family(name: str) -> str:
    """A model's family from its name: the part before its size (``Llama-2-70B`` -> ``llama-2``,
    ``Qwen3-30B-A3B`` -> ``qwen3``, ``Mixtral-8x7B`` -> ``mixtral``). A Hugging Face id's organisation
    is no part of it (``meta-llama/Llama-3.1-8B`` is ``llama-3.1``, as the preset ``Llama-3.1-8B``):
    a fold by family must hold both."""
    stem = Path(name).stem if name.endswith(".json") else name.rsplit("/", 1)[-1]
    family = re.split(r"[-_](?:\d+x)?\d+(?:\.\d+)?[bBmM](?![a-zA-Z])", stem, maxsplit=1)[0]
    return (family or stem).lower()


INFORMED_BY = {
    "request_overhead_s": lambda run: run.anchor == "client",
    "all_reduce_latency_s": lambda run: run.traits.collectives == "nvlink",
    "pcie_all_reduce_scale": lambda run: run.traits.collectives == "pcie",
}
"""Terms only some runs inform: a fold without such a run among its training runs borrows the term."""


@dataclass(frozen=True)
class RunErrors:
    """One replay's headline figures: measured and simulated (engine-side, without the client term)."""

    name: str
    anchor: str
    measured: dict[str, float]
    simulated: dict[str, float]
    traits: RunTraits

    def with_overhead(self, overhead_s: float) -> dict[str, float]:
        """Signed errors once the client term is added (client-side runs only)."""
        shift = overhead_s if self.anchor == "client" else 0.0
        errors = {}
        for metric in METRICS:
            simulated = self.simulated[metric] + (shift if metric != "tpot" else 0.0)
            measured = self.measured[metric]
            errors[metric] = (
                simulated / measured - 1 if math.isfinite(simulated) and measured > 0 else math.nan
            )
        return errors


def log_loss(errors: dict[str, float]) -> float:
    """Mean of ``|log(1 + error)|`` over the three figures (a run that finished nothing: 5)."""
    values = [
        abs(math.log1p(error)) if math.isfinite(error) and error > -1 else 5.0 for error in errors.values()
    ]
    return sum(values) / len(values)


# --------------------------------------------------------------------------------------------------
# Replaying one run with one candidate (in worker processes)
# --------------------------------------------------------------------------------------------------

_RUNS: dict[str, Any] = {}  # measured runs read once per worker process


def replay_figures(spec_path: str, parameters: dict[str, float | None]) -> RunErrors:
    """Replay the run of ``spec_path`` with the serving terms ``parameters`` (client term 0)."""
    from sim.replay.compare import compare, paired_frame
    from sim.replay.simulate import prepare_replay, simulate
    from sim.replay.spec import load_replay_spec, read_run

    path = Path(spec_path)
    spec = load_replay_spec(path)
    with tempfile.TemporaryDirectory(prefix="kvsim-fit-") as work:
        folder = Path(work)
        terms: dict[str, Any] = {**parameters, "request_overhead_s": 0.0}
        calibration = ServingCalibration(**terms, source="candidate")
        write_calibration(calibration, folder / "calibration.yaml")
        cost_model = CostModelConfig(kind="derated", calibration=str(folder / "calibration.yaml"))
        spec = spec.model_copy(update={"cost_model": cost_model})
        run = _RUNS.get(spec_path)
        if run is None:
            run = _RUNS[spec_path] = read_run(spec, path.parent)
        prepared = prepare_replay(run, spec, folder / "simulation")
        simulated = simulate(prepared, folder / "simulation" / "results")
        paired = paired_frame(run, simulated.requests)
    metrics = compare(run, paired)[0].metrics
    traits = run_traits(prepared)
    figures = {
        label: {
            "ttft_mean": metrics["ttft_s"][label]["mean"],
            "tpot": metrics["tpot_s"][label]["headline"],
            "e2e_mean": metrics["e2e_s"][label]["mean"],
        }
        for label in ("measured", "simulated")
    }
    return RunErrors(spec.name, run.anchor, figures["measured"], figures["simulated"], traits)


def run_traits(prepared: Any) -> RunTraits:
    """A prepared replay's GPU, model family, TP and collectives."""
    from sim.hardware.gpus import resolve_gpu

    config = prepared.config
    gpu = resolve_gpu(config.gpu)
    engine = config.engine
    tp = engine.tensor_parallel_size
    parallel = tp > 1 or (engine.enable_expert_parallel and engine.data_parallel_size > 1)
    link = "nvlink" if gpu.nvlink_bandwidth_bytes_per_s else "pcie"
    return RunTraits(
        gpu=gpu.name,
        gpu_preset=gpu.preset,
        model_family=model_family(str(config.model)),
        tensor_parallel_size=tp,
        collectives=link if parallel else "none",
    )


def _replay_task(task: tuple[str, dict[str, float | None]]) -> RunErrors:
    return replay_figures(*task)


# --------------------------------------------------------------------------------------------------
# The fit
# --------------------------------------------------------------------------------------------------


def best_overhead(results: Sequence[RunErrors]) -> float:
    """The client term that minimises the client-side runs' loss (0 without such runs)."""
    client = [result for result in results if result.anchor == "client"]
    if not client:
        return 0.0
    from scipy.optimize import minimize_scalar

    low, high = BOUNDS["request_overhead_s"]
    found = minimize_scalar(
        lambda overhead: sum(log_loss(result.with_overhead(overhead)) for result in client),
        bounds=(low, high),
        method="bounded",
        options={"xatol": 1e-4},
    )
    return float(found.x)


@dataclass
class Evaluation:
    parameters: dict[str, float | None]
    overhead_s: float
    results: list[RunErrors]
    loss: float


class Evaluator:
    """Replays every run for a candidate, ``jobs`` runs at a time; remembers what it has seen."""

    def __init__(self, spec_paths: Sequence[Path], jobs: int = 1, log: Callable[[str], None] | None = None):
        self.spec_paths = [str(path) for path in spec_paths]
        self.jobs = max(1, jobs)
        self.log = log or (lambda message: None)
        self._pool = ProcessPoolExecutor(self.jobs) if self.jobs > 1 else None
        self.seen: list[Evaluation] = []

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def results(
        self, parameters: dict[str, float | None], paths: Sequence[str] | None = None
    ) -> list[RunErrors]:
        tasks = [(path, parameters) for path in (paths or self.spec_paths)]
        if self._pool is None:
            return [_replay_task(task) for task in tasks]
        return list(self._pool.map(_replay_task, tasks))

    def evaluate(
        self,
        parameters: dict[str, float | None],
        paths: Sequence[str] | None = None,
        overhead_s: float | None = None,
    ) -> Evaluation:
        """One candidate's loss; the client term is the best one for it unless ``overhead_s`` fixes it."""
        results = self.results(parameters, paths)
        overhead = best_overhead(results) if overhead_s is None else overhead_s
        loss = float(np.mean([log_loss(result.with_overhead(overhead)) for result in results]))
        evaluation = Evaluation(parameters, overhead, results, loss)
        self.seen.append(evaluation)
        shown = ", ".join(f"{key}={value:.3g}" for key, value in parameters.items() if value is not None)
        self.log(f"  loss {loss:.4f}  [{shown}, request_overhead_s={overhead:.4f}]")
        return evaluation


def _to_vector(calibration: ServingCalibration, names: Sequence[str]) -> np.ndarray:
    return np.log([float(getattr(calibration, name)) for name in names])


def _from_vector(
    vector: np.ndarray, names: Sequence[str], start: ServingCalibration
) -> dict[str, float | None]:
    """Every simulation term: those in ``names`` from ``vector`` (clipped to their bounds), the
    others as in ``start``."""
    parameters: dict[str, float | None] = {name: getattr(start, name) for name in FITTED}
    for name, value in zip(names, vector, strict=True):
        low, high = BOUNDS[name]
        parameters[name] = float(min(max(math.exp(value), low), high))
    return parameters


def fit(
    evaluator: Evaluator,
    start: ServingCalibration = START,
    paths: Sequence[str] | None = None,
    max_evaluations: int = 60,
    names: Sequence[str] = FITTED,
    overhead_s: float | None = None,
) -> Evaluation:
    """Nelder-Mead over the terms ``names`` (default :data:`FITTED`; log space, clipped to
    :data:`BOUNDS`) from ``start``; the other terms stay as ``start`` has them, and the client term
    is chosen per candidate unless ``overhead_s`` fixes it."""
    from scipy.optimize import minimize

    best: list[Evaluation] = []

    def objective(vector: np.ndarray) -> float:
        evaluation = evaluator.evaluate(_from_vector(vector, names, start), paths, overhead_s)
        if not best or evaluation.loss < best[0].loss:
            best[:] = [evaluation]
        return evaluation.loss

    x0 = _to_vector(start, names)
    # First steps of a doubling in each term (the default 5 % of a log is too timid here), but of
    # 16 % in the bandwidth scales: a share stops at the GPU's achievable bandwidth, and a first
    # step past it lands on a plateau the search cannot leave.
    steps = [INITIAL_STEP.get(name, 0.7) for name in names]
    simplex = np.vstack([x0] + [x0 + np.eye(len(x0))[i] * steps[i] for i in range(len(x0))])
    minimize(
        objective,
        x0,
        method="Nelder-Mead",
        options={"maxfev": max_evaluations, "initial_simplex": simplex, "xatol": 0.02, "fatol": 1e-4},
    )
    return best[0]


def calibration_of(evaluation: Evaluation, source: str, fit_record: dict[str, Any]) -> ServingCalibration:
    terms: dict[str, Any] = dict(evaluation.parameters)
    return replace(START, **terms, request_overhead_s=evaluation.overhead_s, source=source, fit=fit_record)


def default_jobs() -> int:
    # (sched_getaffinity: the CPUs this process may use, where the platform has it; macOS has not)
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(available, 8))


# --------------------------------------------------------------------------------------------------
# The whole procedure: fit on every run, then leave each run out
# --------------------------------------------------------------------------------------------------


def _errors_record(results: Sequence[RunErrors], overhead_s: float) -> dict[str, dict[str, float]]:
    return {result.name: result.with_overhead(overhead_s) for result in results}


def summarize_errors(errors: dict[str, dict[str, float]]) -> dict[str, float]:
    """Mean absolute error of each figure over runs, and the worst run's figure."""
    summary: dict[str, float] = {}
    for metric in METRICS:
        values = [abs(run[metric]) for run in errors.values() if math.isfinite(run[metric])]
        summary[f"{metric}_mean_abs"] = float(np.mean(values)) if values else math.nan
        summary[f"{metric}_max_abs"] = float(np.max(values)) if values else math.nan
    return summary


def calibrate_from_runs(
    spec_paths: Sequence[Path],
    *,
    jobs: int = 1,
    max_evaluations: int = 60,
    folds: Sequence[str] = ("run", "gpu"),
    fold_evaluations: int | None = None,
    start: ServingCalibration = START,
    names: Sequence[str] = FITTED,
    log: Callable[[str], None] | None = None,
    checkpoint: Callable[[ServingCalibration], None] | None = None,
    fitted_before: ServingCalibration | None = None,
) -> ServingCalibration:
    """Fit the serving terms to every run of ``spec_paths`` (replay files), then, for each fold kind
    of ``folds`` (:data:`FOLDS`) and each group of it, refit on the other groups' runs from the same
    ``start`` (not from the full fit, which has seen them) and replay the group's runs with those
    terms. The per-run errors of each go into the calibration's ``fit`` record. Each refit may try
    ``fold_evaluations`` candidates (None: as many as the full fit; with fewer, Nelder-Mead stops
    short and a fold's error is partly the search's, not the model's). ``checkpoint`` receives the
    calibration after the full fit and after each fold kind (a long fit cut short keeps those).

    ``fitted_before``: a calibration already fitted to these same runs; its terms stand for the
    full fit (replayed once, not searched again) and only the folds run, added to its record (the
    folds of a fit that took hours can follow in another sitting)."""
    unknown = [fold for fold in folds if fold not in FOLDS]
    if unknown:
        raise ValueError(f"unknown fold kind(s) {', '.join(unknown)}; known: {', '.join(FOLDS)}")
    say = log or (lambda message: None)
    evaluator = Evaluator(spec_paths, jobs, log=say)
    try:
        if fitted_before is None:
            say(f"fitting {', '.join(names)} (and request_overhead_s) to {len(spec_paths)} runs")
            full = fit(evaluator, start, max_evaluations=max_evaluations, names=names)
            record = _full_fit_record(full, spec_paths, len(evaluator.seen))
            fitted = calibration_of(full, f"{len(spec_paths)} measured vLLM runs", record)
            earlier_evaluations = 0
        else:
            full, fitted = _replay_fitted(evaluator, fitted_before, spec_paths)
            record = fitted.fit
            earlier_evaluations = record["evaluations"]
        save = checkpoint or (lambda calibration: None)
        save(fitted)
        budget = max_evaluations if fold_evaluations is None else fold_evaluations
        for fold in folds:
            groups = fold_groups(full.results, evaluator.spec_paths, fold)
            if len(groups) > 1 and budget > 0:
                record[FOLDS[fold]] = held_out_record(evaluator, full, groups, fold, start, names, budget)
                record["evaluations"] = earlier_evaluations + len(evaluator.seen)
                save(fitted)
        record["evaluations"] = earlier_evaluations + len(evaluator.seen)
        return fitted
    finally:
        evaluator.close()


def _full_fit_record(full: Evaluation, spec_paths: Sequence[Path], evaluations: int) -> dict[str, Any]:
    in_sample = _errors_record(full.results, full.overhead_s)
    return {
        "runs": [str(path) for path in spec_paths],
        "gpus": {result.name: result.traits.gpu_preset or result.traits.gpu for result in full.results},
        "loss": full.loss,
        "evaluations": evaluations,
        "in_sample": {"runs": in_sample, "summary": summarize_errors(in_sample)},
    }


def _replay_fitted(
    evaluator: Evaluator, fitted: ServingCalibration, spec_paths: Sequence[Path]
) -> tuple[Evaluation, ServingCalibration]:
    """An earlier fit's terms as the full fit: checked to be a fit to the same runs, replayed once
    (the folds need each run's traits and the in-sample errors are refreshed with today's code)."""
    check_same_runs(fitted, spec_paths, "the calibration to add folds to")
    terms = {name: getattr(fitted, name) for name in FITTED}
    evaluator.log(f"replaying the fitted terms on {len(spec_paths)} runs (the full fit is not repeated)")
    full = evaluator.evaluate(terms, overhead_s=fitted.request_overhead_s)
    record = {**fitted.fit, **_full_fit_record(full, spec_paths, len(evaluator.seen))}
    record["evaluations"] = fitted.fit.get("evaluations", 0)
    record["loss"] = full.loss
    return full, replace(fitted, fit=record)


def check_same_runs(fitted: ServingCalibration, spec_paths: Sequence[Path], label: str) -> None:
    """Refuse an earlier fit whose record names other runs than ``spec_paths``."""
    fitted_runs = sorted((fitted.fit or {}).get("runs", []))
    given = sorted(str(path) for path in spec_paths)
    if fitted_runs == given:
        return
    missing = sorted(set(given) - set(fitted_runs))
    extra = sorted(set(fitted_runs) - set(given))
    raise CalibrationError(
        f"{label} was fitted to other runs than those given"
        + (f"; not in its fit: {', '.join(missing)}" if missing else "")
        + (f"; in its fit but not given: {', '.join(extra)}" if extra else "")
        + ("" if fitted_runs else " (it records no runs)")
    )


def fold_groups(results: Sequence[RunErrors], paths: Sequence[str], fold: str) -> dict[str, list[int]]:
    """The groups of a fold kind: group name -> positions of its runs (in the runs' order)."""
    groups: dict[str, list[int]] = {}
    for index, result in enumerate(results):
        groups.setdefault(result.traits.group(fold, result.name), []).append(index)
    return groups


def held_out_record(
    evaluator: Evaluator,
    full: Evaluation,
    groups: dict[str, list[int]],
    fold: str,
    start: ServingCalibration,
    names: Sequence[str],
    budget: int,
) -> dict[str, Any]:
    """Every group of one fold kind replayed with the terms fitted to the other groups' runs."""
    held_out: dict[str, dict[str, float]] = {}
    parameters: dict[str, dict[str, float | None]] = {}
    borrowed: dict[str, list[str]] = {}
    for group, members in groups.items():
        training = [index for index in range(len(full.results)) if index not in members]
        lent = [
            term
            for term, informs in INFORMED_BY.items()
            if any(informs(full.results[index]) for index in members)
            and not any(informs(full.results[index]) for index in training)
        ]
        borrowed_terms: dict[str, Any] = {
            term: full.parameters[term] for term in lent if term in full.parameters
        }
        fold_start = replace(start, **borrowed_terms)
        overhead = full.overhead_s if "request_overhead_s" in lent else None
        evaluator.log(f"leaving out {fold} {group}" + (f" (borrowing {', '.join(lent)})" if lent else ""))
        trained = fit(
            evaluator,
            fold_start,
            [evaluator.spec_paths[index] for index in training],
            max_evaluations=budget,
            names=[name for name in names if name not in lent],
            overhead_s=overhead,
        )
        for result in evaluator.results(trained.parameters, [evaluator.spec_paths[i] for i in members]):
            held_out[result.name] = result.with_overhead(trained.overhead_s)
        parameters[group] = {**trained.parameters, "request_overhead_s": trained.overhead_s}
        if lent:
            borrowed[group] = lent
    record: dict[str, Any] = {
        "runs": held_out,
        "summary": summarize_errors(held_out),
        "parameters": parameters,
    }
    if fold != "run":
        record["groups"] = {
            group: {
                "runs": [full.results[index].name for index in members],
                "summary": summarize_errors(
                    {full.results[i].name: held_out[full.results[i].name] for i in members}
                ),
            }
            for group, members in groups.items()
        }
    if borrowed:
        record["borrowed"] = borrowed
    return record


def format_errors(errors: dict[str, dict[str, float]]) -> list[str]:
    width = max((len(name) for name in errors), default=4)
    lines = [f"  {'run':<{width}}  {'TTFT':>8}  {'TPOT':>8}  {'E2E':>8}"]
    for name, run in errors.items():
        lines.append(f"  {name:<{width}}  " + "  ".join(f"{run[metric]:>+8.1%}" for metric in METRICS))
    summary = summarize_errors(errors)
    lines.append(
        f"  {'mean |error|':<{width}}  "
        + "  ".join(f"{summary[f'{metric}_mean_abs']:>8.1%}" for metric in METRICS)
    )
    return lines
