"""Figures of sweeps and plans, drawn from tables and ``plan.json`` only (never from engine objects).

Each function returns a matplotlib figure (or writes PNGs), so the report embeds them and notebooks
can draw the same ones.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from sim.planning.spec import is_numeric_axis  # noqa: E402

# Sweep metrics worth a line per policy: summary key -> axis label (with unit).
SWEEP_METRICS = {
    "output_tokens_per_s": "output tokens/s",
    "ttft_p99_s": "p99 TTFT (s)",
    "tpot_p50_s": "p50 TPOT (s)",
    "e2e_p99_s": "p99 end-to-end (s)",
    "preemptions": "preemptions",
    "peak_running": "peak running requests",
    "mean_used_frac": "mean used KV share",
    "mean_internal_frag_frac": "mean internal fragmentation share",
}


def png_bytes(figure: Any) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "figure"


def sweep_figures(table: pd.DataFrame, axis_keys: list[str], folder: Path) -> list[Path]:
    """One PNG per numeric axis: each key metric against it, one line per variant (averaged over the
    other axes when they vary too; the title says so)."""
    ok = table[table["status"] == "ok"] if "status" in table else table
    written = []
    for axis in axis_keys:
        if axis not in ok or not is_numeric_axis(sorted(set(ok[axis].dropna()))):
            continue
        figure = sweep_axis_figure(ok, axis, [key for key in axis_keys if key != axis])
        path = folder / f"{safe_name(axis)}.png"
        path.write_bytes(png_bytes(figure))
        written.append(path)
    return written


def sweep_axis_figure(table: pd.DataFrame, axis: str, other_axes: list[str]) -> Any:
    metrics = [metric for metric in SWEEP_METRICS if metric in table and table[metric].notna().any()]
    columns = 4
    rows = max(1, -(-len(metrics) // columns))
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3 * rows), squeeze=False)
    varying = [key for key in other_axes if key in table and table[key].nunique() > 1]
    for ax, metric in zip(axes.flat, metrics, strict=False):
        means = table.groupby(["variant", axis])[metric].mean().reset_index()
        for variant, group in means.groupby("variant"):
            ax.plot(group[axis], group[metric], marker="o", label=str(variant))
        ax.set_xlabel(axis)
        ax.set_ylabel(SWEEP_METRICS[metric])
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    if metrics:
        axes.flat[0].legend(fontsize=8)
    note = f" (mean over {', '.join(varying)})" if varying else ""
    figure.suptitle(f"against {axis}{note}")
    figure.tight_layout()
    return figure
