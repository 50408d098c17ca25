"""What runs on a worker: one point (one experiment), returned as summaries plus its files.

The worker simulates into a private scratch folder and sends the folder's files back; only the
driver writes results into the sweep folder (one writer, atomic renames), so a remote Dask worker
needs no shared file system for outputs. A local worker's scratch folder is a staging folder inside
the sweep's points folder: a worker killed mid-point leaves it there for the next run to clean (not
in the system temp folder, where nothing would). Its inputs (traces, profiles) must exist at the same paths there.
A failing point is an outcome with its error, never an exception: the other points go on.
"""

from __future__ import annotations

import json
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from sim.config import validate_experiment
from sim.planning.sweeps.early_stop import StopRules, watch_factory
from sim.planning.sweeps.pools import pool_metrics, total_context_tokens, total_pool_tokens
from sim.planning.sweeps.steady import SteadyWindow, steady_metrics, stopped_metrics
from sim.storage.folders import STAGING_MARKER, scratch_folder

if TYPE_CHECKING:
    from sim.runner import VariantResult

STEADY_FILE = "steady.json"


@dataclass(frozen=True)
class PointTask:
    point_id: str
    # The experiment config as the user's keys set it (``model_dump(exclude_unset=True)``): a full dump
    # does not always validate again (e.g. a trace's default ``on_too_long`` then counts as given).
    config: dict[str, Any]
    base_dir: str  # where the config's relative paths are read from
    window: SteadyWindow | None = None  # plan probes also measure the steady state
    stop: StopRules | None = None  # ... and stop once an SLO is certainly broken
    # Where the worker simulates: the sweep's points folder when the worker shares this machine's
    # files (a killed worker's folder is then cleaned by the next run), else its temp folder.
    scratch_dir: str | None = None


@dataclass
class PointOutcome:
    point_id: str
    ok: bool
    summaries: list[dict[str, Any]] = field(default_factory=list)  # one per variant
    error: str = ""
    files: dict[str, bytes] = field(default_factory=dict)  # relative path -> content
    cpu_s: float = 0.0  # CPU time the worker spent on the point (machine load does not inflate it)


def answers(task: PointTask, summaries: list[dict[str, Any]]) -> bool:
    """Whether a stored point's summaries answer ``task``: a run that went to its end does (the same
    config ran), one stopped early only for the same stop rules (other SLOs might not have stopped it)."""
    rules = task.stop.as_dict() if task.stop is not None else None
    stops = [(summary.get("steady") or {}).get("stopped_early") for summary in summaries]
    return all(stop is None or stop.get("rules") == rules for stop in stops)


def run_point(task: PointTask) -> PointOutcome:
    from sim.engine.gc_tuning import fewer_collections

    started = time.process_time()
    try:
        # The whole point, not only its engine run, with few collections: the run's objects are
        # mostly freed by the time the next young collection walks what is left (about 4 ms a point).
        with fewer_collections():
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
    with _scratch(task) as folder:
        results = run_experiment(
            config,
            Path(task.base_dir) / "point.yaml",
            out_dir=folder,
            watch=watch_factory(task.stop),
            # A probe is measured right after it ran; its length is bounded (search.max_requests).
            keep_tables=task.window is not None,
        )
        write_run_files(folder, config.model_dump(mode="json"), results)
        for result in results:
            if task.window is not None:
                # A cluster's series is its total: over every replica's pool.
                pool_tokens = total_pool_tokens(result.summary)
                metrics = probe_metrics(
                    result, pool_tokens, task.window, total_context_tokens(result.summary)
                )
                (folder / result.name / STEADY_FILE).write_text(json.dumps(metrics, indent=2))
        summaries = [read_variant_summary(folder / result.name) for result in results]
        files = {
            str(path.relative_to(folder)): path.read_bytes()
            for path in sorted(folder.rglob("*"))
            if path.is_file() and path.name != STAGING_MARKER
        }
    return PointOutcome(task.point_id, True, summaries, files=files)


@contextmanager
def _scratch(task: PointTask) -> Iterator[Path]:
    if task.scratch_dir is None:
        with tempfile.TemporaryDirectory(prefix="kvsim-point-") as tmp:
            yield Path(tmp)
    else:
        with scratch_folder(Path(task.scratch_dir) / task.point_id) as folder:
            yield folder


def probe_metrics(
    result: VariantResult, pool_tokens: int, window: SteadyWindow, context_tokens: int | None = None
) -> dict[str, Any]:
    """A plan probe's steady-state metrics (of a run stopped early: up to the stop), with its window."""
    requests, timeseries = result.requests, result.timeseries
    if result.stopped_early is None:
        metrics = steady_metrics(requests, timeseries, pool_tokens, window, context_tokens)
    else:
        metrics = stopped_metrics(requests, timeseries, pool_tokens, window, result.stopped_early)
    if result.replica_timeseries is not None and "role" in result.replica_timeseries:
        # A disaggregated deployment: each pool's own evidence (which pool binds).
        replicas = pd.DataFrame(result.replica_summaries)
        start, end = metrics["window_start_s"], metrics["window_end_s"]
        metrics |= pool_metrics(requests, result.replica_timeseries, replicas, start, end)
    return metrics | {"window": window.as_dict()}


def read_variant_summary(variant_dir: Path) -> dict[str, Any]:
    """A variant's summary as written to disk (plus ``steady`` when measured): the same values
    whether the point was just run or resumed from an earlier sweep."""
    summary = json.loads((variant_dir / "summary.json").read_text())
    steady = variant_dir / STEADY_FILE
    if steady.is_file():
        summary["steady"] = json.loads(steady.read_text())
    return summary
