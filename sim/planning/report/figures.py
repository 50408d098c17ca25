"""Figures of sweeps and plans, drawn from tables and ``plan.json`` only (never from engine objects,
nor from the sweeps' and plans' own: the report stands below both).

Each function returns a matplotlib figure (or writes PNGs), so the report embeds them and notebooks
can draw the same ones.
"""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path
from typing import Any

import pandas as pd

from sim.outputs.canvas import subplots

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
    return buffer.getvalue()


FigureJob = tuple[str, dict[str, Any], Any]  # file name, plan.json's document, what else it draws from


def plan_figure_jobs(document: dict[str, Any], root: Path | None) -> list[FigureJob]:
    """The plan report's figures, as jobs for :func:`draw_plan_figure` (each carries what it draws
    from, the points' series read here: a worker elsewhere need not see the plan folder)."""
    jobs: list[FigureJob] = [
        (f"knee_{safe_name(metric)}.png", document, metric) for metric in knee_metrics(document)
    ]
    if root is not None:
        jobs.append(("over_time.png", document, over_time_panels(document, root)))
    jobs += [("memory.png", document, None), ("block_size.png", document, None)]
    return jobs


def draw_plan_figure(job: FigureJob) -> tuple[str, bytes | None]:
    """One report figure as PNG (None: nothing to draw), by its file name."""
    name, document, extra = job
    if name.startswith("knee_"):
        figure = knee_figure(document, extra)
    elif name == "over_time.png":
        figure = over_time_figure_of(extra)
    elif name == "memory.png":
        figure = memory_figure(document)
    else:
        figure = block_size_figure(document)
    return name, None if figure is None else png_bytes(figure)


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


def is_numeric_axis(values: list[Any]) -> bool:
    """Whether an axis's values are drawn along a line (two or more finite numbers)."""
    return len(values) > 1 and all(
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        for value in values
    )


def sweep_axis_figure(table: pd.DataFrame, axis: str, other_axes: list[str]) -> Any:
    metrics = [metric for metric in SWEEP_METRICS if metric in table and table[metric].notna().any()]
    columns = 4
    rows = max(1, -(-len(metrics) // columns))
    figure, axes = subplots(rows, columns, figsize=(4 * columns, 3 * rows), squeeze=False)
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


# --------------------------------------------------------------------------------------------------
# Plan figures, from plan.json's document
# --------------------------------------------------------------------------------------------------

KNEE_METRICS = {
    "ttft_p99_s": "p99 TTFT (s)",
    "ttft_p50_s": "p50 TTFT (s)",
    "tpot_p50_s": "p50 TPOT (s)",
    "tpot_p99_s": "p99 TPOT (s)",
    "e2e_p99_s": "p99 end-to-end (s)",
    "ttft_mean_s": "mean TTFT (s)",
    "tpot_mean_s": "mean TPOT (s)",
    "e2e_mean_s": "mean end-to-end (s)",
    "normalized_latency_mean_s": "mean normalized latency (s/token)",
    "attainment_frac": "goodput SLO attainment (share)",
    "preemptions_per_request": "preemptions per request",
    "rejected_frac": "rejected share",
    "output_tokens_per_s": "output tokens/s",
}

# Knee metrics an early-stopped run bounds from above (the full run's value is lower); it bounds
# the others from below.
BOUNDED_ABOVE_WHEN_STOPPED = frozenset({"attainment_frac"})

MEMORY_PARTS = (
    ("weight_bytes", "weights", "#7f7f7f"),
    ("activation_reserve_bytes", "activation reserve", "#bcbd22"),
    ("used", "KV used", "#1f77b4"),
    ("reserved", "KV reserved", "#aec7e8"),
    ("internal_frag", "KV internal frag.", "#d62728"),
    ("external_frag", "KV external frag.", "#ff9896"),
    ("cached", "KV cached", "#2ca02c"),
    ("free", "KV free", "#dddddd"),
    ("unused_bytes", "not used by the engine (GPU − weights − reserve − KV pool)", "#ffffff"),
)


def _line_label(candidate: dict[str, Any], group_key: str) -> str:
    return candidate["key"].removeprefix(group_key + " / ")


def _group_key(candidate: dict[str, Any]) -> str:
    return str(candidate["group"])


def knee_metrics(document: dict[str, Any]) -> list[str]:
    """The curves a plan report draws: every SLO metric, then throughput."""
    metrics = [slo["metric"] for slo in document["slos"].values() if slo["metric"] in KNEE_METRICS]
    return list(dict.fromkeys([*metrics, "output_tokens_per_s"]))


def knee_figure(document: dict[str, Any], metric: str) -> Any:
    """``metric`` against the request rate per candidate (mean over seeds, min-max bars), one panel
    per model/GPU; the SLO as a dashed line; each candidate's maximum sustainable rate as a star."""
    candidates = [c for c in document["candidates"] if c["probes"]]
    groups = list(dict.fromkeys(_group_key(c) for c in candidates)) or ["(no probes)"]
    figure, axes = subplots(1, len(groups), figsize=(5.5 * len(groups), 3.8), squeeze=False, sharey=True)
    probes = {probe["number"]: probe for probe in document["probes"]}
    limit = next((slo["limit"] for slo in document["slos"].values() if slo["metric"] == metric), None)
    for ax, group in zip(axes[0], groups, strict=True):
        members = [c for c in candidates if _group_key(c) == group]
        for index, candidate in enumerate(members):
            judged = best_evidence([probes[n] for n in candidate["probes"]])
            _knee_line(ax, candidate, judged, metric, group, LINE_STYLES[index % len(LINE_STYLES)])
        if limit is not None:
            ax.axhline(
                limit, color="black", linestyle=":", linewidth=1.2, label=f"SLO {_limit_text(metric, limit)}"
            )
        ax.set_title(group, fontsize=10)
        ax.set_xlabel("request rate (req/s)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axes[0][0].set_ylabel(KNEE_METRICS.get(metric, metric))
    if metric.endswith("_s"):
        axes[0][0].set_yscale("log")
    figure.tight_layout()
    return figure


def best_evidence(probes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One probe per rate, the one a knee curve should show: a confirmation run there if any (ten
    times longer), else the longest judged probe (one run again longer was not judged); a probe
    stopped early (its latencies lower bounds) only where no probe ran to its end."""

    def rank(probe: dict[str, Any]) -> tuple[bool, bool, int]:
        return (not probe.get("stopped_early"), bool(probe.get("confirmation")), probe.get("requests", 0))

    best: dict[float, dict[str, Any]] = {}
    for probe in probes:
        if probe.get("run_again_longer"):
            continue
        held = best.get(probe["rate_per_s"])
        if held is None or rank(probe) > rank(held):
            best[probe["rate_per_s"]] = probe
    return [best[rate] for rate in sorted(best)]


# Candidates often coincide (block 16 and 32 of one policy): a line style and marker each keeps
# every curve visible under the others.
LINE_STYLES = (("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"), ((0, (5, 1)), "v"), ((0, (3, 1, 1, 1)), "P"))


def _limit_text(metric: str, limit: float) -> str:
    if metric.endswith("_frac"):
        return f"{limit:.0%}"
    return f"{limit:g} s" if metric.endswith("_s") else f"{limit:g}"


def _knee_line(
    ax: Any,
    candidate: dict[str, Any],
    probes: list[dict[str, Any]],
    metric: str,
    group: str,
    style: tuple[Any, str] = ("-", "o"),
) -> None:
    rows = sorted(
        (
            (p["rate_per_s"], p["metrics"][metric], bool(p.get("stopped_early")))
            for p in probes
            if p["metrics"].get(metric, {}).get("mean") is not None
        ),
        key=lambda row: row[0],
    )
    if not rows:
        return
    rates = [rate for rate, _, _ in rows]
    means = [m["mean"] for _, m, _ in rows]
    errors = [[m["mean"] - m["min"] for _, m, _ in rows], [m["max"] - m["mean"] for _, m, _ in rows]]
    linestyle, marker = style
    line = ax.errorbar(
        rates,
        means,
        yerr=errors,
        linestyle=linestyle,
        marker=marker,
        markersize=4,
        markerfacecolor="none",
        capsize=2,
        label=_line_label(candidate, group),
    )
    bounds = [(rate, m["mean"]) for rate, m, stopped in rows if stopped]
    if bounds:  # a run stopped once its failure was certain: the value is a bound, the truth beyond it
        caret = 7 if metric in BOUNDED_ABOVE_WHEN_STOPPED else 6  # matplotlib's caret down / up
        rates_bounded, values = zip(*bounds, strict=True)
        ax.plot(
            rates_bounded, values, linestyle="none", marker=caret, markersize=9, color=line[0].get_color()
        )
    knee = candidate.get("max_rate_per_s")
    if knee is not None:
        value = candidate["at_max"].get(metric, {}).get("mean")
        if value is not None:
            ax.plot([knee], [value], marker="*", markersize=12, color=line[0].get_color())


def memory_figure(document: dict[str, Any]) -> Any:
    """GPU memory at each candidate's maximum rate (steady-state time averages), recommended first."""
    rows = [c for c in document["candidates"] if c.get("at_max") and c.get("memory")]
    figure, ax = subplots(figsize=(9, 0.45 * max(len(rows), 1) + 1.4))
    for position, candidate in enumerate(rows):
        left = 0.0
        for key, label, color in MEMORY_PARTS:
            width = memory_part_bytes(candidate, key) / 2**30
            ax.barh(
                position,
                width,
                left=left,
                color=color,
                edgecolor="black",
                linewidth=0.3,
                label=label if position == 0 else None,
            )
            left += width
    labels = [("★ " if c["key"] == document.get("recommendation") else "") + c["key"] for c in rows]
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GPU memory (GiB)")
    if rows:
        figure.legend(fontsize=7, ncol=5, loc="lower center")
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    return figure


def memory_part_bytes(candidate: dict[str, Any], key: str) -> float:
    """Bytes of one part of the GPU memory split at the candidate's maximum rate."""
    memory = candidate["memory"]
    if key == "unused_bytes":
        return max(
            0.0,
            memory["gpu_memory_bytes"]
            - memory["weight_bytes"]
            - memory["activation_reserve_bytes"]
            - memory["kv_pool_bytes"],
        )
    if key.endswith("_bytes"):
        return float(memory[key])
    share = candidate["at_max"].get(f"mean_{key}_frac", {}).get("mean") or 0.0
    return share * memory["kv_pool_bytes"]


def block_size_figure(document: dict[str, Any]) -> Any | None:
    """Maximum sustainable rate and internal fragmentation against block size, per GPU and policy."""
    rows = [
        c
        for c in document["candidates"]
        if c.get("max_rate_per_s") is not None and c.get("uses_blocks", True)
    ]
    if len({c["block_size"] for c in rows}) < 2:
        return None
    figure, (rate_ax, frag_ax) = subplots(1, 2, figsize=(11, 3.8))
    series: dict[str, list[dict[str, Any]]] = {}
    for candidate in rows:
        label = candidate["key"].replace(f" / block {candidate['block_size']}", "")
        series.setdefault(label, []).append(candidate)
    for label, members in series.items():
        members.sort(key=lambda c: c["block_size"])
        sizes = [c["block_size"] for c in members]
        rate_ax.plot(sizes, [c["max_rate_per_s"] for c in members], marker="o", label=label)
        frag = [c["at_max"]["mean_internal_frag_frac"]["mean"] or 0.0 for c in members]
        frag_ax.plot(sizes, [100 * f for f in frag], marker="o", label=label)
    for ax, ylabel in (
        (rate_ax, "max rate under SLO (req/s)"),
        (frag_ax, "internal fragmentation (% of KV pool)"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("block size (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    rate_ax.legend(fontsize=7)
    figure.tight_layout()
    return figure


def best_per_group(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Each group's (GPU's) highest-ranked candidate with a maximum rate, in rank order."""
    ranked = sorted(
        (c for c in document["candidates"] if c.get("max_points")), key=lambda c: c.get("rank") or 10**9
    )
    best: dict[str, dict[str, Any]] = {}
    for candidate in ranked:
        best.setdefault(_group_key(candidate), candidate)
    return list(best.values())


def over_time_figure(document: dict[str, Any], root: Path) -> Any | None:
    """Waiting and running requests (left axis) and KV usage (right axis) over time in the first
    seed's run at each group's best maximum rate, the steady-state window shaded; None without data."""
    return over_time_figure_of(over_time_panels(document, root))


OverTimePanel = tuple[dict[str, Any], pd.DataFrame, dict[str, Any]]  # candidate, its series, steady.json


def over_time_panels(document: dict[str, Any], root: Path) -> list[OverTimePanel]:
    """What :func:`over_time_figure` draws, read from the plan folder ``root``."""
    from sim.outputs.sinks import read_thinned

    panels = []
    for candidate in best_per_group(document):
        folder = root / "points" / candidate["max_points"][0] / str(candidate["policy"])
        table = next(
            (
                folder / f"timeseries.{ext}"
                for ext in ("parquet", "csv")
                if (folder / f"timeseries.{ext}").exists()
            ),
            None,
        )
        steady = folder / "steady.json"
        if table is None or not steady.exists():
            continue
        panels.append((candidate, read_thinned(table, 4000), json.loads(steady.read_text())))
    return panels


def over_time_figure_of(panels: list[OverTimePanel]) -> Any | None:
    if not panels:
        return None
    figure, axes = subplots(1, len(panels), figsize=(5.5 * len(panels), 3.6), squeeze=False)
    for ax, (candidate, series, steady) in zip(axes[0], panels, strict=True):
        times = series["time_s"]
        ax.step(times, series["num_requests_waiting"], where="post", label="waiting", color="#d62728")
        ax.step(times, series["num_requests_running"], where="post", label="running", color="#1f77b4")
        ax.axvspan(
            steady["window_start_s"],
            steady["window_end_s"],
            color="#999999",
            alpha=0.15,
            label="steady window",
        )
        ax.set_xlabel("time (s)")
        ax.set_ylabel("requests")
        kv = ax.twinx()
        kv.step(
            times,
            100 * series["kv_cache_usage_perc"],
            where="post",
            color="#2ca02c",
            linewidth=0.8,
            label="KV usage",
        )
        kv.set_ylabel("KV usage (% of the pool)")
        kv.set_ylim(0, 105)
        ax.set_title(f"{candidate['key']}\nat {candidate['max_rate_per_s']:g} req/s", fontsize=9)
        handles, labels = ax.get_legend_handles_labels()
        kv_handles, kv_labels = kv.get_legend_handles_labels()
        ax.legend(handles + kv_handles, labels + kv_labels, fontsize=7, loc="upper left")
    figure.tight_layout()
    return figure
