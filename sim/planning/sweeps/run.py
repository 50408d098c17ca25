"""``kvsim sweep`` from Python: run every point of a sweep and write the combined table and figures."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sim.planning.sweeps.driver import PointRecord, RunCounts, make_bar, run_points
from sim.planning.sweeps.executors import Executor, InlineExecutor
from sim.planning.sweeps.spec import Point, Sweep, shown
from sim.planning.sweeps.store import PointStore, replace_dir_atomic
from sim.planning.sweeps.tasks import PointOutcome, PointTask, run_point

SWEEP_KIND = "sweep"


@dataclass
class SweepRun:
    out_dir: Path
    table: pd.DataFrame
    counts: RunCounts


def point_task(point: Point) -> PointTask:
    return PointTask(
        point.point_id, point.config.model_dump(mode="json", exclude_unset=True), str(point.base_dir)
    )


def run_sweep(
    sweep: Sweep,
    out_dir: str | Path,
    executor: Executor | None = None,
    *,
    retry_failed: bool = False,
    progress: bool = False,
    figures: bool = True,
    log: Callable[[str], None] = lambda message: None,
    fn: Callable[[PointTask], PointOutcome] = run_point,
) -> SweepRun:
    """Run (or resume) ``sweep`` into ``out_dir``; return the combined table (one row per point x
    variant). ``fn`` runs one point (tests pass a counting wrapper)."""
    store = PointStore.open(out_dir, SWEEP_KIND, sweep.digest(), log)
    store.clean_stale()
    executor = executor or InlineExecutor()
    bar = make_bar(sweep.name, progress)
    try:
        records, counts = run_points(
            store,
            [point_task(point) for point in sweep.points],
            executor,
            retry_failed=retry_failed,
            bar=bar,
            fn=fn,
        )
    finally:
        bar.close()
    table = sweep_table(sweep, records)
    store.write_table(table)
    _write_manifest(store.root, sweep, counts)
    if figures:
        from sim.planning.report.figures import sweep_figures

        replace_dir_atomic(
            store.root / "figures", lambda folder: sweep_figures(table, sweep.axis_keys, folder)
        )
    return SweepRun(store.root, table, counts)


def sweep_table(sweep: Sweep, records: dict[str, PointRecord]) -> pd.DataFrame:
    rows = []
    for point in sweep.points:
        record = records[point.point_id]
        head = {"point_index": point.index, "point_id": point.point_id}
        head |= {key: point.values[key] for key in sweep.axis_keys}
        head |= {"status": record.status, "error": record.error}
        rows += [head | flatten_summary(summary) for summary in record.summaries] or [head]
    table = pd.DataFrame(rows)
    for key in sweep.axis_keys:
        table[key] = _uniform_column(table[key])
    return table


def flatten_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """One table row: ``steady`` metrics as ``steady_<name>`` columns, other mappings as JSON text."""
    row: dict[str, Any] = {}
    for key, value in summary.items():
        if key == "steady" and isinstance(value, dict):
            row |= {f"steady_{name}": item for name, item in value.items() if not isinstance(item, dict)}
        elif isinstance(value, dict | list):
            row[key] = json.dumps(value, sort_keys=True)
        else:
            row[key] = value
    return row


def _uniform_column(column: pd.Series) -> pd.Series:
    """Parquet needs one type per column: numbers stay numbers, anything mixed becomes text."""
    values = list(column)
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    text = all(isinstance(v, str) for v in values)
    if numeric or text or all(isinstance(v, bool) for v in values):
        return column
    return pd.Series([shown(v) for v in values], index=column.index, dtype=object)


def _write_manifest(root: Path, sweep: Sweep, counts: RunCounts) -> None:
    from sim.planning.sweeps.store import write_atomic
    from sim.storage.folders import kvsim_version

    manifest = {
        "kind": SWEEP_KIND,
        "name": sweep.name,
        "sweep_file": str(sweep.path),
        "kvsim_version": kvsim_version(),
        "axes": sweep.axis_keys,
        "points": [{"index": p.index, "point_id": p.point_id, "values": p.values} for p in sweep.points],
        "last_run": {
            "simulated": counts.ran,
            "failed": counts.failed,
            "skipped_done": counts.skipped_done,
            "skipped_failed": counts.skipped_failed,
            "cpu_s": counts.cpu_s,
        },
    }
    write_atomic(
        root / "sweep.json", lambda path: path.write_text(json.dumps(manifest, indent=2, default=str))
    )
