"""Writing and reading a run's results folder (the small results API notebooks and reports use).

Layout::

    DIR/config.yaml               the resolved experiment config
    DIR/summary.csv               one row per variant
    DIR/capacity.txt              vLLM-style capacity lines per variant
    DIR/<variant>/summary.json
    DIR/<variant>/timeseries.parquet   (or .csv)
    DIR/<variant>/requests.parquet     (or .csv)
    DIR/figures/*.png

The folder is written under a temporary name and renamed at the end, so an interrupted or failed run
never leaves something that looks like a result.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from sim.runner import VariantResult


def write_results(
    out_dir: Path,
    config: dict[str, Any],
    results: list[VariantResult],
    *,
    timeseries_format: str = "parquet",
    figures: bool = True,
) -> Path:
    with staged_output_dir(out_dir) as staging:
        (staging / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        pd.DataFrame([_flat(result.summary) for result in results]).to_csv(
            staging / "summary.csv", index=False
        )
        capacity = [f"[{result.name}]\n" + "\n".join(result.capacity_lines) for result in results]
        (staging / "capacity.txt").write_text("\n\n".join(capacity) + "\n")
        for result in results:
            variant_dir = staging / result.name
            variant_dir.mkdir()
            (variant_dir / "summary.json").write_text(
                json.dumps(result.summary, indent=2, default=_json_default)
            )
            _write_frame(result.timeseries, variant_dir / "timeseries", timeseries_format)
            _write_frame(result.requests, variant_dir / "requests", timeseries_format)
        if figures:
            from sim.plots import write_figures

            write_figures(load_results(staging), staging / "figures")
    return Path(out_dir)


@contextmanager
def staged_output_dir(out_dir: str | Path) -> Iterator[Path]:
    """A temporary folder beside ``out_dir`` that replaces it only when the block succeeds, so a
    failed or interrupted run never leaves something that looks like a result."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        yield staging
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _flat(summary: dict[str, Any]) -> dict[str, Any]:
    return {key: (json.dumps(value) if isinstance(value, dict) else value) for key, value in summary.items()}


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def _write_frame(frame: pd.DataFrame, stem: Path, fmt: str) -> None:
    if fmt == "parquet":
        frame.to_parquet(stem.with_suffix(".parquet"), index=False)
    else:
        frame.to_csv(stem.with_suffix(".csv"), index=False)


def _read_frame(stem: Path) -> pd.DataFrame:
    parquet = stem.with_suffix(".parquet")
    return pd.read_parquet(parquet) if parquet.exists() else pd.read_csv(stem.with_suffix(".csv"))


@dataclass
class RunResults:
    """A results folder loaded back: what notebooks and reports read."""

    path: Path
    summary: pd.DataFrame
    variants: list[str]

    def variant_summary(self, variant: str) -> dict[str, Any]:
        return json.loads((self.path / variant / "summary.json").read_text())

    def timeseries(self, variant: str) -> pd.DataFrame:
        return _read_frame(self.path / variant / "timeseries")

    def requests(self, variant: str) -> pd.DataFrame:
        return _read_frame(self.path / variant / "requests")


def load_results(path: str | Path) -> RunResults:
    path = Path(path)
    summary_file = path / "summary.csv"
    if not summary_file.is_file():
        raise FileNotFoundError(f"{path}: not a kvsim results folder (no summary.csv)")
    summary = pd.read_csv(summary_file)
    return RunResults(path, summary, [str(name) for name in summary["variant"]])
