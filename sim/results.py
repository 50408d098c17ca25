"""Writing and reading a run's results folder (the small results API notebooks and reports use).

Layout::

    DIR/config.yaml               the resolved experiment config
    DIR/summary.csv               one row per variant
    DIR/capacity.txt              vLLM-style capacity lines per variant
    DIR/<variant>/summary.json
    DIR/<variant>/timeseries.parquet   (or .csv)
    DIR/<variant>/requests.parquet     (or .csv)
    DIR/<variant>/replicas.csv                  cluster runs: one summary row per replica
    DIR/<variant>/replica_timeseries.parquet    cluster runs: every replica's rows (or .csv)
    DIR/<variant>/transfer_timeseries.parquet   disaggregated runs: handoffs and the KV link over time
    DIR/<variant>/kv_groups.parquet             hybrid allocators: each KV group's breakdown over time
    DIR/figures/*.png             drawn by ``kvsim run`` (sim.figures), not by this module

A cluster variant's summary.json and timeseries are the cluster total (``sim/cluster/results.py``).

The folder is written under a temporary name and renamed at the end (``sim.storage``), so an
interrupted or failed run never leaves something that looks like a result, and it carries kvsim's
marker file, without which kvsim refuses to replace a folder.

Sweeps and plans (``sim/planning/``) are folders of such run folders (``DIR/points/<id>/``) plus a
combined table (``sweep.parquet``) and, for a plan, ``plan.json``: :func:`load_sweep` and
:func:`load_plan` read them back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from sim.outputs.sinks import read_requests, read_thinned
from sim.runner import VariantResult


def write_run_files(
    folder: Path,
    config: dict[str, Any],
    results: list[VariantResult],
) -> None:
    """Everything but the tables a file sink already streamed into ``folder/<variant>/``, and but the
    figures: the results API reads and writes data and never draws (``kvsim run`` draws
    ``figures/`` afterwards with :func:`sim.figures.write_figures`)."""
    (folder / CONFIG_FILE).write_text(config_text(config))
    pd.DataFrame([_flat(result.summary) for result in results]).to_csv(folder / "summary.csv", index=False)
    capacity = [
        f"[{', '.join(names)}]\n" + "\n".join(lines) for names, lines in group_capacity_lines(results)
    ]
    (folder / "capacity.txt").write_text("\n\n".join(capacity) + "\n")
    for result in results:
        variant_dir = folder / result.name
        variant_dir.mkdir(exist_ok=True)
        (variant_dir / "summary.json").write_text(json.dumps(result.summary, indent=2, default=_json_default))
        if result.replica_summaries is not None:
            replicas = pd.DataFrame([_flat(summary) for summary in result.replica_summaries])
            replicas.to_csv(variant_dir / REPLICAS_FILE, index=False)


REPLICAS_FILE = "replicas.csv"  # a cluster variant's per-replica summaries
CONFIG_FILE = "config.yaml"


def config_text(config: dict[str, Any]) -> str:
    """A run folder's config.yaml: the config's keys in the schema's order."""
    # libyaml's emitter where PyYAML has it: 4x faster, which a plan writing hundreds of points feels
    return yaml.dump(config, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)


def group_capacity_lines(results: list[VariantResult]) -> list[tuple[list[str], list[str]]]:
    """``(variant names, capacity lines)`` per distinct pool, in variant order: variants on the same
    pool share one entry instead of repeating identical lines."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for result in results:
        groups.setdefault(tuple(result.capacity_lines), []).append(result.name)
    return [(names, list(lines)) for lines, names in groups.items()]


def _flat(summary: dict[str, Any]) -> dict[str, Any]:
    return {key: (json.dumps(value) if isinstance(value, dict) else value) for key, value in summary.items()}


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


@dataclass
class RunResults:
    """A results folder loaded back: what notebooks and reports read."""

    path: Path
    summary: pd.DataFrame
    variants: list[str]

    def variant_summary(self, variant: str) -> dict[str, Any]:
        return json.loads((self.path / variant / "summary.json").read_text())

    def timeseries(self, variant: str, max_rows: int | None = None) -> pd.DataFrame:
        """The variant's time series; with ``max_rows``, every k-th row, read chunk by chunk."""
        stem = self.path / variant / "timeseries"
        parquet = stem.with_suffix(".parquet")
        return read_thinned(parquet if parquet.exists() else stem.with_suffix(".csv"), max_rows)

    def is_cluster(self, variant: str) -> bool:
        return (self.path / variant / REPLICAS_FILE).is_file()

    def replica_summaries(self, variant: str) -> pd.DataFrame:
        """A cluster variant's per-replica summaries (one row per replica)."""
        return pd.read_csv(self.path / variant / REPLICAS_FILE)

    def replica_timeseries(self, variant: str, max_rows: int | None = None) -> pd.DataFrame:
        """A cluster variant's per-replica series (``replica`` column first)."""
        stem = self.path / variant / "replica_timeseries"
        parquet = stem.with_suffix(".parquet")
        return read_thinned(parquet if parquet.exists() else stem.with_suffix(".csv"), max_rows)

    def is_disaggregated(self, variant: str) -> bool:
        stem = self.path / variant / "transfer_timeseries"
        return stem.with_suffix(".parquet").is_file() or stem.with_suffix(".csv").is_file()

    def transfer_timeseries(self, variant: str) -> pd.DataFrame:
        """A disaggregated variant's handoffs and link over time (``sim/cluster/disaggregated_results.py``)."""
        stem = self.path / variant / "transfer_timeseries"
        parquet = stem.with_suffix(".parquet")
        return read_thinned(parquet if parquet.exists() else stem.with_suffix(".csv"), None)

    def has_kv_groups(self, variant: str) -> bool:
        stem = self.path / variant / "kv_groups"
        return stem.with_suffix(".parquet").is_file() or stem.with_suffix(".csv").is_file()

    def kv_group_timeseries(self, variant: str) -> pd.DataFrame:
        """A hybrid variant's breakdown by KV group over time, in long form (``time_s``, ``kv_group``,
        one column per category in slots; ``sim/outputs/group_series.py``)."""
        stem = self.path / variant / "kv_groups"
        parquet = stem.with_suffix(".parquet")
        return read_thinned(parquet if parquet.exists() else stem.with_suffix(".csv"), None)

    def requests(self, variant: str, columns: list[str] | None = None) -> pd.DataFrame:
        stem = self.path / variant / "requests"
        parquet = stem.with_suffix(".parquet")
        return read_requests(parquet if parquet.exists() else stem.with_suffix(".csv"), columns)


def load_results(path: str | Path) -> RunResults:
    path = Path(path)
    summary_file = path / "summary.csv"
    if not summary_file.is_file():
        raise FileNotFoundError(f"{path}: not a kvsim results folder (no summary.csv)")
    summary = pd.read_csv(summary_file)
    return RunResults(path, summary, [str(name) for name in summary["variant"]])


# --------------------------------------------------------------------------------------------------
# Sweeps and plans (written by ``kvsim sweep`` / ``kvsim plan``, see ``sim/planning/``)
# --------------------------------------------------------------------------------------------------

SWEEP_TABLE = "sweep.parquet"
SWEEP_MANIFEST = "sweep.json"
PLAN_FILE = "plan.json"
PLAN_AXES = ["candidate", "rate_per_s", "seed"]


@dataclass
class SweepResults:
    """A sweep folder loaded back: one table row per point x variant, axis values as columns."""

    path: Path
    table: pd.DataFrame
    axes: list[str]

    @property
    def point_ids(self) -> list[str]:
        return list(dict.fromkeys(str(point) for point in self.table["point_id"]))

    def point(self, point_id: str) -> RunResults:
        """One point's own results folder (summaries, per-request table, time series)."""
        return load_results(self.path / "points" / point_id)


def load_sweep(path: str | Path) -> SweepResults:
    path = Path(path)
    table_file = path / SWEEP_TABLE
    if not table_file.is_file():
        raise FileNotFoundError(f"{path}: not a kvsim sweep or plan folder (no {SWEEP_TABLE})")
    manifest = path / SWEEP_MANIFEST
    axes = json.loads(manifest.read_text())["axes"] if manifest.is_file() else PLAN_AXES
    return SweepResults(path, pd.read_parquet(table_file), list(axes))


@dataclass
class PlanResults:
    """A plan folder loaded back: ``document`` is plan.json; the tables are views of it."""

    path: Path
    document: dict[str, Any]
    sweep: SweepResults

    @property
    def recommendation(self) -> str | None:
        return self.document["recommendation"]

    @property
    def candidates(self) -> pd.DataFrame:
        """One row per candidate, in rank order: max rate, GPUs, binding limit, status, reason..."""
        rows = []
        for candidate in self.document["candidates"]:
            row = {key: value for key, value in candidate.items() if not isinstance(value, dict | list)}
            row["binding_limit"] = (candidate.get("binding") or {}).get("limit")
            row |= {
                f"at_max_{name}": stats["mean"] for name, stats in (candidate.get("at_max") or {}).items()
            }
            rows.append(row)
        return pd.DataFrame(rows)

    @property
    def probes(self) -> pd.DataFrame:
        """One row per probe (candidate x rate): verdict and metrics (mean over seeds, with min/max)."""
        rows = []
        for probe in self.document["probes"]:
            row = {key: probe[key] for key in ("number", "candidate", "rate_per_s", "passed", "error")}
            for name, stats in probe["metrics"].items():
                row |= {name: stats["mean"], f"{name}_min": stats["min"], f"{name}_max": stats["max"]}
            rows.append(row)
        return pd.DataFrame(rows)

    def point(self, point_id: str) -> RunResults:
        return self.sweep.point(point_id)


def load_plan(path: str | Path) -> PlanResults:
    path = Path(path)
    plan_file = path / PLAN_FILE
    if not plan_file.is_file():
        raise FileNotFoundError(f"{path}: not a kvsim plan folder (no {PLAN_FILE})")
    return PlanResults(path, json.loads(plan_file.read_text()), load_sweep(path))
