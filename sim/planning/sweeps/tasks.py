"""What runs on a worker: one point (one experiment), returned as summaries plus its files.

The worker simulates into a private temporary folder and sends the folder's files back; only the
driver writes into the sweep folder (one writer, atomic renames), so a remote Dask worker needs no
shared file system for outputs. Its inputs (traces, profiles) must exist at the same paths there.
A failing point is an outcome with its error, never an exception: the other points go on.
"""

from __future__ import annotations

import json
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sim.config import validate_experiment
from sim.outputs.sinks import read_requests, read_thinned
from sim.planning.plans.pools import pool_metrics, total_pool_tokens
from sim.planning.plans.steady import SteadyWindow, steady_metrics

STEADY_FILE = "steady.json"


@dataclass(frozen=True)
class PointTask:
    point_id: str
    # The experiment config as the user's keys set it (``model_dump(exclude_unset=True)``): a full dump
    # does not always validate again (e.g. a trace's default ``on_too_long`` then counts as given).
    config: dict[str, Any]
    base_dir: str  # where the config's relative paths are read from
    window: SteadyWindow | None = None  # plan probes also measure the steady state


@dataclass
class PointOutcome:
    point_id: str
    ok: bool
    summaries: list[dict[str, Any]] = field(default_factory=list)  # one per variant
    error: str = ""
    files: dict[str, bytes] = field(default_factory=dict)  # relative path -> content
    cpu_s: float = 0.0  # CPU time the worker spent on the point (machine load does not inflate it)


def run_point(task: PointTask) -> PointOutcome:
    started = time.process_time()
    try:
        outcome = _simulate(task)
    except Exception as error:  # recorded in the point's folder; --retry-failed runs it again
        detail = traceback.format_exc()
        outcome = PointOutcome(
            task.point_id,
            False,
            error=f"{type(error).__name__}: {error}",
            files={"error.txt": detail.encode()},
        )
    outcome.cpu_s = time.process_time() - started
    return outcome


def _simulate(task: PointTask) -> PointOutcome:
    from sim.results import write_run_files
    from sim.runner import run_experiment

    config = validate_experiment(task.config, f"point {task.point_id}")
    with tempfile.TemporaryDirectory(prefix="kvsim-point-") as tmp:
        folder = Path(tmp)
        results = run_experiment(config, Path(task.base_dir) / "point.yaml", out_dir=folder)
        write_run_files(folder, config.model_dump(mode="json"), results)
        for result in results:
            if task.window is not None:
                _write_steady(
                    # A cluster's series is its total: over every replica's pool.
                    folder / result.name,
                    total_pool_tokens(result.summary),
                    task.window,
                )
        summaries = [read_variant_summary(folder / result.name) for result in results]
        files = {
            str(path.relative_to(folder)): path.read_bytes()
            for path in sorted(folder.rglob("*"))
            if path.is_file()
        }
    return PointOutcome(task.point_id, True, summaries, files=files)


def _write_steady(variant_dir: Path, pool_tokens: int, window: SteadyWindow) -> None:
    requests = read_requests(_table(variant_dir, "requests"))
    timeseries = read_thinned(_table(variant_dir, "timeseries"), None)
    metrics = steady_metrics(requests, timeseries, pool_tokens, window) | {"window": window.as_dict()}
    if (variant_dir / "transfer_timeseries.parquet").exists() or (
        variant_dir / "transfer_timeseries.csv"
    ).exists():
        replica_series = read_thinned(_table(variant_dir, "replica_timeseries"), None)
        replicas = pd.read_csv(variant_dir / "replicas.csv")
        start, end = metrics["window_start_s"], metrics["window_end_s"]
        metrics |= pool_metrics(requests, replica_series, replicas, start, end)
    (variant_dir / STEADY_FILE).write_text(json.dumps(metrics, indent=2))


def _table(variant_dir: Path, stem: str) -> Path:
    parquet = variant_dir / f"{stem}.parquet"
    return parquet if parquet.exists() else variant_dir / f"{stem}.csv"


def read_variant_summary(variant_dir: Path) -> dict[str, Any]:
    """A variant's summary as written to disk (plus ``steady`` when measured): the same values
    whether the point was just run or resumed from an earlier sweep."""
    summary = json.loads((variant_dir / "summary.json").read_text())
    steady = variant_dir / STEADY_FILE
    if steady.is_file():
        summary["steady"] = json.loads(steady.read_text())
    return summary
