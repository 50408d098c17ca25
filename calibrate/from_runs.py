"""``kvsim calibrate --from-runs``: fit the serving terms (``sim/costs/serving.py``) to measured runs.

Each candidate set of terms is judged by replaying every run (``kvsim replay-run``'s pipeline, without
the report) and comparing mean TTFT, the publisher's TPOT and mean E2E. The loss is the mean over
runs and those three figures of ``|log(simulated / measured)|``: symmetric in fast and slow, and
bounded where a run saturates (a queue that explodes costs a few units, not thousands of percent).

``request_overhead_s`` moves every client-side TTFT and E2E by the same amount and nothing else, so
it needs no simulation of its own: replays run with it at 0 and it is chosen, for each candidate,
as the value that minimises the client-side runs' loss (a one-dimensional search).

A fit is judged by its **leave-one-run-out** errors: each run replayed with the terms fitted to the
others, which is what a user with a new run should expect.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from sim.costs.core import CostModelConfig
from sim.costs.serving import ServingCalibration, write_calibration

FITTED = (
    "iteration_overhead_s",
    "decode_attention_per_seq_scale",
    "kv_bandwidth_scale",
    "all_reduce_latency_s",
    "pcie_all_reduce_scale",
    "transferred_bandwidth_scale",
)
"""The terms the simulation depends on, fitted by Nelder-Mead in log space (all are positive)."""

START = ServingCalibration(
    iteration_overhead_s=3e-4,
    decode_attention_per_seq_scale=0.5,
    kv_bandwidth_scale=1.0,
    all_reduce_latency_s=6e-6,
    pcie_all_reduce_scale=1.5,
    transferred_bandwidth_scale=1.0,
)
BOUNDS = {
    "iteration_overhead_s": (1e-6, 5e-3),
    "decode_attention_per_seq_scale": (1e-3, 3.0),
    "kv_bandwidth_scale": (0.5, 1.1),  # (shares are capped at the datasheet: 1.07 x 0.938 already is)
    "all_reduce_latency_s": (1e-7, 3e-5),
    "pcie_all_reduce_scale": (0.2, 20.0),
    "transferred_bandwidth_scale": (0.5, 1.6),
    "request_overhead_s": (0.0, 0.2),
}
METRICS = ("ttft_mean", "tpot", "e2e_mean")


@dataclass(frozen=True)
class RunErrors:
    """One replay's headline figures: measured and simulated (engine-side, without the client term)."""

    name: str
    anchor: str
    measured: dict[str, float]
    simulated: dict[str, float]

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
    figures = {
        label: {
            "ttft_mean": metrics["ttft_s"][label]["mean"],
            "tpot": metrics["tpot_s"][label]["headline"],
            "e2e_mean": metrics["e2e_s"][label]["mean"],
        }
        for label in ("measured", "simulated")
    }
    return RunErrors(spec.name, run.anchor, figures["measured"], figures["simulated"])


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

    def evaluate(self, parameters: dict[str, float | None], paths: Sequence[str] | None = None) -> Evaluation:
        results = self.results(parameters, paths)
        overhead = best_overhead(results)
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
) -> Evaluation:
    """Nelder-Mead over the terms ``names`` (default :data:`FITTED`; log space, clipped to
    :data:`BOUNDS`) from ``start``; the other terms stay as ``start`` has them."""
    from scipy.optimize import minimize

    best: list[Evaluation] = []

    def objective(vector: np.ndarray) -> float:
        evaluation = evaluator.evaluate(_from_vector(vector, names, start), paths)
        if not best or evaluation.loss < best[0].loss:
            best[:] = [evaluation]
        return evaluation.loss

    x0 = _to_vector(start, names)
    # First steps of about a third in each term (the default 5 % of a log is too timid here).
    simplex = np.vstack([x0] + [x0 + np.eye(len(x0))[i] * 0.7 for i in range(len(x0))])
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
    leave_one_out: bool = True,
    leave_one_out_evaluations: int | None = None,
    start: ServingCalibration = START,
    names: Sequence[str] = FITTED,
    log: Callable[[str], None] | None = None,
) -> ServingCalibration:
    """Fit the serving terms to every run of ``spec_paths`` (replay files), then, for each run, refit
    on the others from the same ``start`` (not from the full fit, which has seen the run) and replay
    it with those terms. Both sets of per-run errors go into the calibration's ``fit`` record. Each
    refit may try ``leave_one_out_evaluations`` candidates (None: as many as the full fit; with fewer,
    Nelder-Mead stops short and a fold's error is partly the search's, not the model's)."""
    say = log or (lambda message: None)
    evaluator = Evaluator(spec_paths, jobs, log=say)
    try:
        say(f"fitting {', '.join(names)} (and request_overhead_s) to {len(spec_paths)} runs")
        full = fit(evaluator, start, max_evaluations=max_evaluations, names=names)
        in_sample = _errors_record(full.results, full.overhead_s)
        record: dict[str, Any] = {
            "runs": [str(path) for path in spec_paths],
            "loss": full.loss,
            "evaluations": len(evaluator.seen),
            "in_sample": {"runs": in_sample, "summary": summarize_errors(in_sample)},
        }
        fitted = calibration_of(full, f"{len(spec_paths)} measured vLLM runs", record)
        if leave_one_out and len(spec_paths) > 1:
            held_out: dict[str, dict[str, float]] = {}
            held_parameters: dict[str, dict[str, float | None]] = {}
            refit_evaluations = (
                max_evaluations if leave_one_out_evaluations is None else leave_one_out_evaluations
            )
            for index, path in enumerate(evaluator.spec_paths):
                others = [other for position, other in enumerate(evaluator.spec_paths) if position != index]
                say(f"leaving out {Path(path).stem}")
                trained = fit(
                    evaluator,
                    start,
                    others,
                    max_evaluations=refit_evaluations,
                    names=names,
                )
                result = evaluator.results(trained.parameters, [path])[0]
                held_out[result.name] = result.with_overhead(trained.overhead_s)
                held_parameters[result.name] = {
                    **trained.parameters,
                    "request_overhead_s": trained.overhead_s,
                }
            record["leave_one_out"] = {
                "runs": held_out,
                "summary": summarize_errors(held_out),
                "parameters": held_parameters,
            }
        record["evaluations"] = len(evaluator.seen)
        return fitted
    finally:
        evaluator.close()


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
