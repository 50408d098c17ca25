"""The replay report's figures, drawn from the paired table and the two time series only.

Figures are :class:`matplotlib.figure.Figure` objects saved to PNG: no pyplot, so importing this
module never switches a notebook's backend.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sim.replay.compare import LATENCY_NAMES, in_system
from sim.replay.measured import MeasuredRun

MEASURED = {"color": "#1c1c1c", "label": "measured"}
SIMULATED = {"color": "#1c7ed6", "label": "kvsim"}


def _milliseconds(latency: str) -> bool:
    return latency == "tpot_s"


def _values(frame: pd.DataFrame, column: str, latency: str) -> np.ndarray:
    values = frame[column].dropna().to_numpy(dtype=float)
    return values * 1000 if _milliseconds(latency) else values


def _unit(latency: str) -> str:
    return "ms" if _milliseconds(latency) else "s"


def cdf_figure(paired: pd.DataFrame, path: Path) -> Path:
    """Empirical CDFs of TTFT, TPOT and E2E, measured and simulated on the same axes."""
    figure = Figure(figsize=(13, 3.8), layout="constrained")
    for axis, latency in zip(figure.subplots(1, 3), LATENCY_NAMES, strict=True):
        for style, column in ((MEASURED, f"{latency}_measured"), (SIMULATED, f"{latency}_simulated")):
            values = np.sort(_values(paired, column, latency))
            if len(values):
                axis.step(values, np.arange(1, len(values) + 1) / len(values), where="post", **style)
        axis.set_xlabel(f"{LATENCY_NAMES[latency]} ({_unit(latency)})")
        axis.set_ylabel("fraction of requests")
        axis.grid(alpha=0.3)
        if latency == "ttft_s" and len(paired[f"{latency}_measured"].dropna()):
            axis.set_xscale("log")
        axis.legend(loc="lower right")
    figure.suptitle("Latency distributions: measured vs kvsim")
    figure.savefig(path, dpi=110)
    return path


def scatter_figure(paired: pd.DataFrame, path: Path) -> Path:
    """Each request's simulated latency against its measured one (the diagonal is agreement)."""
    figure = Figure(figsize=(13, 4.2), layout="constrained")
    both = paired.dropna(subset=["ttft_s_measured", "ttft_s_simulated"])
    for axis, latency in zip(figure.subplots(1, 3), LATENCY_NAMES, strict=True):
        scale = 1000 if _milliseconds(latency) else 1
        x = both[f"{latency}_measured"].to_numpy(dtype=float) * scale
        y = both[f"{latency}_simulated"].to_numpy(dtype=float) * scale
        if len(x):
            colours = both["stage"].to_numpy()
            axis.scatter(x, y, s=4, c=colours, cmap="viridis", alpha=0.5, linewidths=0)
            low = max(min(x.min(), y.min()), 1e-6)
            high = max(x.max(), y.max())
            axis.plot([low, high], [low, high], color="#e03131", linewidth=1, label="simulated = measured")
            if latency == "ttft_s":
                axis.set_xscale("log")
                axis.set_yscale("log")
            axis.legend(loc="upper left")
        axis.set_xlabel(f"measured {LATENCY_NAMES[latency]} ({_unit(latency)})")
        axis.set_ylabel(f"kvsim {LATENCY_NAMES[latency]} ({_unit(latency)})")
        axis.grid(alpha=0.3)
    figure.suptitle("Per request: kvsim against measured (colour: load stage)")
    figure.savefig(path, dpi=110)
    return path


def timeline_figure(
    run: MeasuredRun, paired: pd.DataFrame, simulated_series: pd.DataFrame, path: Path
) -> Path:
    """Requests in the system over time, from both per-request tables (the one occupancy every run
    gives), and the server's own running / waiting / KV usage samples where the run recorded them,
    beside the simulation's."""
    recorded = run.timeseries
    panels = ["in_system"] + [
        column
        for column in ("running", "waiting", "kv_usage_frac")
        if recorded is not None and column in recorded
    ]
    figure = Figure(figsize=(13, 2.6 * len(panels)), layout="constrained")
    axes = np.atleast_1d(figure.subplots(len(panels), 1, sharex=True))
    end = float(np.nanmax((paired["arrival_s"] + paired["e2e_s_measured"]).to_numpy()))
    times = np.linspace(0.0, end, 2000)
    sim_series = _simulated_columns(simulated_series)
    for axis, panel in zip(axes, panels, strict=True):
        if panel == "in_system":
            for style, side in ((MEASURED, "measured"), (SIMULATED, "simulated")):
                counts = in_system(
                    paired["arrival_s"].to_numpy(dtype=float),
                    paired[f"e2e_s_{side}"].to_numpy(dtype=float),
                    times,
                )
                axis.plot(times, counts, **style)
            axis.set_ylabel("requests in system")
        else:
            assert recorded is not None
            axis.plot(recorded["time_s"], recorded[panel], drawstyle="steps-post", **MEASURED)
            if panel in sim_series:
                axis.plot(sim_series["time_s"], sim_series[panel], drawstyle="steps-post", **SIMULATED)
            axis.set_ylabel({"running": "running", "waiting": "waiting", "kv_usage_frac": "KV usage"}[panel])
        for stage in run.stages[1:]:
            axis.axvline(stage.start_s, color="#868e96", linestyle=":", linewidth=1)
        axis.grid(alpha=0.3)
        axis.legend(loc="upper left")
    axes[-1].set_xlabel("time since the first request (s)")
    figure.suptitle("Load over time: measured vs kvsim (dotted: load stage changes)")
    figure.savefig(path, dpi=110)
    return path


def _simulated_columns(series: pd.DataFrame) -> pd.DataFrame:
    """The simulation's series under the measured series' names."""
    columns = {"time_s": series["time_s"]}
    if "num_requests_running" in series:
        columns["running"] = series["num_requests_running"]
    if "num_requests_waiting" in series:
        columns["waiting"] = series["num_requests_waiting"]
    if "kv_cache_usage_perc" in series:
        columns["kv_usage_frac"] = series["kv_cache_usage_perc"]
    return pd.DataFrame(columns)


def write_figures(
    run: MeasuredRun, paired: pd.DataFrame, simulated_series: pd.DataFrame, folder: Path
) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [
        cdf_figure(paired, folder / "latency_cdfs.png"),
        scatter_figure(paired, folder / "per_request.png"),
        timeline_figure(run, paired, simulated_series, folder / "load_over_time.png"),
    ]
