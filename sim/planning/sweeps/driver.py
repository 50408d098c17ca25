"""Running points through an executor into a point store: skip what is done, keep only summaries.

Shared by ``kvsim sweep`` (one batch) and ``kvsim plan`` (one batch per search round).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tqdm.auto import tqdm

from sim.planning.sweeps.executors import Executor
from sim.planning.sweeps.store import FAILED, OK, POINTS, PointStore
from sim.planning.sweeps.tasks import PointOutcome, PointTask, answers, run_point


@dataclass(frozen=True)
class PointRecord:
    """What the driver keeps of a point: its status and variant summaries (never its tables)."""

    point_id: str
    status: str  # ok | failed
    summaries: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


@dataclass
class RunCounts:
    ran: int = 0
    failed: int = 0  # of those that ran
    skipped_done: int = 0
    skipped_failed: int = 0
    cpu_s: float = 0.0  # CPU time of the points that ran

    def add(self, other: RunCounts) -> None:
        self.ran += other.ran
        self.failed += other.failed
        self.skipped_done += other.skipped_done
        self.skipped_failed += other.skipped_failed
        self.cpu_s += other.cpu_s


def progress_enabled(quiet: bool = False) -> bool:
    """A progress bar only for a person watching: not with -q, in CI, or when stderr is not a terminal."""
    if quiet or os.environ.get("CI") or os.environ.get("TQDM_DISABLE") == "1":
        return False
    return sys.stderr.isatty()


def run_points(
    store: PointStore,
    tasks: list[PointTask],
    executor: Executor,
    *,
    retry_failed: bool = False,
    bar: Any = None,
    fn: Callable[[PointTask], PointOutcome] = run_point,
) -> tuple[dict[str, PointRecord], RunCounts]:
    """Run the tasks not finished in ``store`` yet; return every task's record and the counts.

    Each outcome is written to the store as soon as it arrives (a killed run loses only the points
    in flight); its files are dropped right after, so memory holds summaries only."""
    records: dict[str, PointRecord] = {}
    counts = RunCounts()
    todo: list[PointTask] = []
    for task in _unique(tasks):
        status = store.status(task.point_id)
        summaries = store.summaries(task.point_id) if status == OK else []
        if status == OK and answers(task, summaries):
            records[task.point_id] = PointRecord(task.point_id, OK, summaries)
            counts.skipped_done += 1
        elif status == FAILED and not retry_failed:
            records[task.point_id] = PointRecord(task.point_id, FAILED, error=store.error(task.point_id))
            counts.skipped_failed += 1
        else:
            todo.append(task)
    if bar is not None:
        bar.total = (bar.total or 0) + len(todo)
        bar.refresh()
    if executor.shares_files:
        scratch = str(store.root / POINTS)
        todo = [replace(task, scratch_dir=scratch) for task in todo]
    by_id = {task.point_id: task for task in todo}
    for outcome in executor.run(fn, todo):
        store.save(outcome, by_id[outcome.point_id])
        records[outcome.point_id] = PointRecord(
            outcome.point_id, OK if outcome.ok else FAILED, outcome.summaries, outcome.error
        )
        counts.ran += 1
        counts.failed += 0 if outcome.ok else 1
        counts.cpu_s += outcome.cpu_s
        if bar is not None:
            bar.update(1)
    return records, counts


def _unique(tasks: list[PointTask]) -> list[PointTask]:
    seen: dict[str, PointTask] = {}
    for task in tasks:
        seen.setdefault(task.point_id, task)
    return list(seen.values())


def make_bar(description: str, enabled: bool) -> Any:
    return tqdm(total=0, desc=description, unit="point", disable=not enabled, leave=False)


def describe_counts(counts: RunCounts) -> str:
    parts = [f"{counts.ran} simulated" + (f" ({counts.failed} failed)" if counts.failed else "")]
    if counts.ran:
        parts[0] += f" in {counts.cpu_s:.0f} CPU-s"
    if counts.skipped_done:
        parts.append(f"{counts.skipped_done} already done (skipped)")
    if counts.skipped_failed:
        parts.append(f"{counts.skipped_failed} failed earlier (skipped; --retry-failed reruns them)")
    return ", ".join(parts)
