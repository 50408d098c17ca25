"""Figures a person reads without code. Plotting reads results frames, never engine objects."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

if TYPE_CHECKING:
    from sim.results import RunResults

CATEGORY_COLOURS = {
    "used": "#2b8a3e",
    "reserved": "#74b816",
    "internal_fragmentation": "#f08c00",
    "external_fragmentation": "#e03131",
    "cached": "#1c7ed6",
    "free": "#dee2e6",
}
MAX_POINTS = 4000


def write_figures(results: RunResults, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    series = {variant: results.timeseries(variant, max_rows=MAX_POINTS) for variant in results.variants}
    latency_columns = ["outcome", "ttft_s", "e2e_s"]
    requests = {variant: results.requests(variant, columns=latency_columns) for variant in results.variants}
    paths = [
        _breakdown_stacks(series, out_dir / "memory_breakdown.png"),
        _curves(
            series,
            out_dir / "utilization.png",
            "KV pool holding token states",
            _used_frac,
            "fraction of KV pool",
        ),
        _curves(
            series,
            out_dir / "fragmentation.png",
            "Internal + external fragmentation",
            _frag_frac,
            "fraction of KV pool",
        ),
        _curves(series, out_dir / "running.png", "Requests running", _running, "requests"),
        _curves(
            series,
            out_dir / "sharing.png",
            "Memory saved by sharing (1 - physical / logical blocks of live sequences)",
            _saved_by_sharing,
            "fraction",
        ),
        _oom_preemptions(series, out_dir / "oom_preemptions.png"),
        _latency_cdfs(requests, out_dir / "latency_cdf.png"),
    ]
    return paths


def _pool(frame: pd.DataFrame) -> pd.Series:
    columns = [f"{name}_tokens" for name in CATEGORY_COLOURS]  # the six categories: they sum to the pool
    return frame[columns].sum(axis=1)


def _used_frac(frame: pd.DataFrame) -> pd.Series:
    return frame["used_tokens"] / _pool(frame)


def _frag_frac(frame: pd.DataFrame) -> pd.Series:
    return (frame["internal_fragmentation_tokens"] + frame["external_fragmentation_tokens"]) / _pool(frame)


def _saved_by_sharing(frame: pd.DataFrame) -> pd.Series:
    logical = frame["logical_tokens"].where(frame["logical_tokens"] > 0)
    return (1 - frame["physical_tokens"] / logical).fillna(0.0)


def _running(frame: pd.DataFrame) -> pd.Series:
    return frame["num_requests_running"]


def _breakdown_stacks(series: dict[str, pd.DataFrame], path: Path) -> Path:
    figure, axes = plt.subplots(len(series), 1, figsize=(10, 2.6 * len(series)), sharex=True, squeeze=False)
    for axis, (variant, frame) in zip(axes[:, 0], series.items(), strict=True):
        pool = _pool(frame)
        layers = [frame[f"{name}_tokens"] / pool for name in CATEGORY_COLOURS]
        axis.stackplot(
            frame["time_s"],
            layers,
            labels=[name.replace("_", " ") for name in CATEGORY_COLOURS],
            colors=list(CATEGORY_COLOURS.values()),
            step="post",
        )
        axis.set_ylim(0, 1)
        axis.set_ylabel("fraction of pool")
        axis.set_title(f"{variant}: where the KV pool goes")
    axes[0, 0].legend(loc="upper right", fontsize=7, ncol=3)
    axes[-1, 0].set_xlabel("simulated time (s)")
    return _save(figure, path)


def _curves(series: dict[str, pd.DataFrame], path: Path, title: str, metric, ylabel: str) -> Path:
    figure, axis = plt.subplots(figsize=(10, 4))
    for variant, frame in series.items():
        axis.step(frame["time_s"], metric(frame), where="post", label=variant)
    axis.set_title(title)
    axis.set_xlabel("simulated time (s)")
    axis.set_ylabel(ylabel)
    axis.legend()
    return _save(figure, path)


def _oom_preemptions(series: dict[str, pd.DataFrame], path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(10, 4))
    for variant, frame in series.items():
        (line,) = axis.step(
            frame["time_s"],
            frame["admission_waits"],
            where="post",
            label=f"{variant}: requests that waited for KV memory",
        )
        for column, style, label in (
            ("preemptions", "--", "preemptions"),
            ("oom_failures", ":", "OOM failures"),
        ):
            axis.step(
                frame["time_s"],
                frame[column],
                where="post",
                linestyle=style,
                color=line.get_color(),
                label=f"{variant}: {label}",
            )
    axis.set_title("Cumulative requests that waited for KV memory, preemptions, OOM failures (on_oom: fail)")
    axis.set_xlabel("simulated time (s)")
    axis.set_ylabel("count")
    axis.legend(fontsize=8)
    return _save(figure, path)


def _latency_cdfs(requests: dict[str, pd.DataFrame], path: Path) -> Path:
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for variant, frame in requests.items():
        done = frame[frame["outcome"] == "finished"]
        for axis, column in zip(axes, ("ttft_s", "e2e_s"), strict=True):
            values = np.sort(done[column].dropna().to_numpy())
            if len(values):
                axis.step(values, np.arange(1, len(values) + 1) / len(values), where="post", label=variant)
    for axis, title in zip(axes, ("Time to first token", "End-to-end latency"), strict=True):
        axis.set_title(f"{title} (finished requests)")
        axis.set_xlabel("seconds")
        axis.set_ylabel("fraction of requests")
        axis.set_xscale("symlog", linthresh=0.1)
        axis.legend(fontsize=8)
    return _save(figure, path)


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
