"""The sweep folder: one atomically written folder per point, resumable, never touching foreign files.

Layout (``kind`` is "sweep" or "plan")::

    DIR/.kvsim-results                 kvsim's marker (kind, config hash): DIR may be resumed
    DIR/points/<point id>/             one per point, staged in a hidden sibling and renamed
        .kvsim-results                 marker of kind "point"
        status.json                    {"status": "ok" | "failed", "error": ...}
        config.yaml                    the resolved config, its relative paths read from here
        summary.csv, capacity.txt, <variant>/summary.json, tables, [steady.json]
        error.txt                      (failed points) the traceback
    DIR/sweep.parquet, sweep.csv       one row per point x variant (written at the end)

A point folder exists only once complete, so a killed sweep loses only the points in flight; a
re-run skips the finished ones (and the failed ones, unless asked to retry them).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from sim.config import validate_experiment
from sim.planning.sweeps.config_paths import relocated
from sim.planning.sweeps.tasks import PointOutcome, PointTask, read_variant_summary
from sim.results import CONFIG_FILE, SWEEP_TABLE, config_text
from sim.storage.folders import (
    check_output_target,
    clean_stale_staging,
    read_marker,
    staged_output_dir,
    write_marker,
)

POINTS = "points"
STATUS_FILE = "status.json"
POINT_KIND = "point"
OK, FAILED = "ok", "failed"


class PointStore:
    def __init__(self, root: Path):
        self.root = root

    @classmethod
    def open(cls, out_dir: str | Path, kind: str, digest: str, log: Callable[[str], None]) -> PointStore:
        """Create ``out_dir`` or resume it (only if it is kvsim's folder of the same kind)."""
        root = check_output_target(out_dir, kind)
        previous = read_marker(root)
        if previous and previous.get("config_hash") != digest:
            log(
                f"kvsim: {out_dir} holds an earlier {kind} with another config; its points are kept and "
                "reused where identical, the tables list this one's"
            )
        (root / POINTS).mkdir(parents=True, exist_ok=True)
        write_marker(root, kind, digest)
        return cls(root)

    def point_dir(self, point_id: str) -> Path:
        return self.root / POINTS / point_id

    def status(self, point_id: str) -> str | None:
        """ "ok", "failed" or None (not run, or not a complete kvsim point folder)."""
        folder = self.point_dir(point_id)
        marker = read_marker(folder)
        if marker is None or marker.get("kind") != POINT_KIND:
            return None
        try:
            return str(json.loads((folder / STATUS_FILE).read_text())["status"])
        except (OSError, ValueError, KeyError):
            return None

    def error(self, point_id: str) -> str:
        try:
            return str(json.loads((self.point_dir(point_id) / STATUS_FILE).read_text()).get("error", ""))
        except (OSError, ValueError):
            return ""

    def summaries(self, point_id: str) -> list[dict[str, Any]]:
        """The point's variant summaries, in the order of its summary.csv."""
        folder = self.point_dir(point_id)
        names = pd.read_csv(folder / "summary.csv")["variant"].astype(str)
        return [read_variant_summary(folder / name) for name in names]

    def save(self, outcome: PointOutcome, task: PointTask) -> None:
        """Write a point folder atomically (replacing an earlier failed attempt, which is ours). Its
        config.yaml reads the task's files from where the folder is, so ``kvsim run`` reruns it."""
        target = self.point_dir(outcome.point_id)
        if CONFIG_FILE in outcome.files:
            outcome.files[CONFIG_FILE] = _config_for(task, target).encode()
        status = {
            "status": OK if outcome.ok else FAILED,
            "point_id": outcome.point_id,
            "error": outcome.error,
            "cpu_s": outcome.cpu_s,
        }
        # Stale staging folders were cleaned when the store opened (clean_stale): the driver is the
        # points folder's only writer since.
        with staged_output_dir(target, POINT_KIND, outcome.point_id, clean_stale=False) as staging:
            for relative, content in outcome.files.items():
                path = staging / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
            (staging / STATUS_FILE).write_text(json.dumps(status, indent=2) + "\n")

    def clean_stale(self) -> None:
        """Staging folders of points whose writer was killed (only kvsim's own, by their marker)."""
        points = self.root / POINTS
        names = {path.name.split(".partial-")[0].lstrip(".") for path in points.glob(".*.partial-*")}
        for name in names:
            clean_stale_staging(points / name)

    def write_table(self, table: pd.DataFrame) -> None:
        """``DIR/sweep.parquet`` and ``.csv``, each written to a hidden file and renamed."""
        parquet = self.root / SWEEP_TABLE
        write_atomic(parquet, lambda path: table.to_parquet(path, index=False))
        write_atomic(parquet.with_suffix(".csv"), lambda path: table.to_csv(path, index=False))


def _config_for(task: PointTask, folder: Path) -> str:
    """The resolved config the worker ran (as it writes it), its relative file paths, which the task
    reads from its ``base_dir``, rewritten to be read from ``folder``."""
    config = validate_experiment(task.config, f"point {task.point_id}")
    data = relocated(config.model_dump(mode="json"), config, Path(task.base_dir), folder)
    return config_text(data)


def _sibling(path: Path, kind: str) -> Path:
    """A hidden sibling name no other writer (another process, an earlier crash, the user) holds:
    kvsim only ever removes a sibling it created itself in this call."""
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")


def write_atomic(path: Path, write: Callable[[Path], Any]) -> None:
    staging = _sibling(path, "partial")
    try:
        write(staging)
        os.replace(staging, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            staging.unlink()  # what ``write`` left of its own file when it failed


def replace_dir_atomic(path: Path, fill: Callable[[Path], Any]) -> None:
    """Fill a hidden sibling and swap it in for ``path`` (a folder kvsim writes, e.g. figures/)."""
    staging = _sibling(path, "partial")
    made = False
    try:
        staging.mkdir()  # a fresh name: it fails rather than adopt a folder that is not this call's
        made = True
        fill(staging)
        if path.exists():
            retired = _sibling(path, "retired")
            path.rename(retired)
            try:
                staging.rename(path)
            except BaseException:
                retired.rename(path)  # stopped between the renames: the old folder comes back
                raise
            shutil.rmtree(retired, ignore_errors=True)
        else:
            staging.rename(path)
    finally:
        if made:
            shutil.rmtree(staging, ignore_errors=True)  # still there only if this call did not finish
        else:
            with contextlib.suppress(OSError):
                staging.rmdir()  # stopped between mkdir and ``made``: only an empty folder is removed
