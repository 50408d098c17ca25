"""Figures a person reads without code. Plotting reads results frames, never engine objects.

Conventions every figure follows: the KV pool size is in the title (per variant when variants differ);
legends sit outside the data; curves of several variants that coincide (all at zero, typically) stay
visible, drawn with different dashes and widths and marked "(0 throughout)"; an empty panel says why
instead of showing blank axes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from matplotlib.patches import Rectangle

from sim.outputs.canvas import subplots

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
LINE_STYLES = ["-", "--", ":", "-."]
GiB = 2**30


def write_figures(results: RunResults, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    series = {variant: results.timeseries(variant, max_rows=MAX_POINTS) for variant in results.variants}
    latency_columns = ["outcome", "ttft_s", "e2e_s"]
    requests = {variant: results.requests(variant, columns=latency_columns) for variant in results.variants}
    pools = pool_labels(results.summary)
    empty = {variant: _nothing_ran_text(results.summary, variant) for variant in results.variants}
    paths = [
        _breakdown_stacks(series, pools, empty, out_dir / "memory_breakdown.png"),
        _curves(
            series,
            pools,
            empty,
            out_dir / "utilization.png",
            "KV pool holding token states",
            _used_frac,
            "fraction of KV pool",
        ),
        _curves(
            series,
            pools,
            empty,
            out_dir / "fragmentation.png",
            "Internal + external fragmentation",
            _frag_frac,
            "fraction of KV pool",
        ),
        _curves(series, pools, empty, out_dir / "running.png", "Requests running", _running, "requests"),
        _curves(
            series,
            pools,
            empty,
            out_dir / "queue.png",
            "Requests waiting (queue length)",
            _waiting,
            "requests",
        ),
        _curves(
            series,
            pools,
            empty,
            out_dir / "sharing.png",
            "Memory saved by sharing (1 - physical / logical blocks of live sequences)",
            _saved_by_sharing,
            "fraction",
        ),
        _oom_preemptions(series, pools, empty, out_dir / "oom_preemptions.png"),
        _latency_cdfs(requests, pools, empty, out_dir / "latency_cdf.png"),
    ]
    clusters = [variant for variant in results.variants if results.is_cluster(variant)]
    if clusters:
        paths.append(_replicas(results, clusters, out_dir / "replicas.png"))
    return paths


def pool_labels(summary: pd.DataFrame) -> dict[str, str]:
    """``variant -> "458,096 tokens, 55.9 GiB"``: the KV pool each variant ran with."""
    labels = {}
    for row in summary.itertuples():
        # A cluster's pool columns are per replica.
        replicas = f"{int(row.replicas)} x " if int(getattr(row, "replicas", 1)) > 1 else ""
        labels[str(row.variant)] = (
            f"{replicas}{int(row.kv_pool_tokens):,} tokens, {row.kv_pool_bytes / GiB:.1f} GiB"
        )
    return labels


def _title(title: str, pools: dict[str, str]) -> str:
    distinct = set(pools.values())
    return f"{title}\nKV pool {distinct.pop()}" if len(distinct) == 1 else title


def _legend_label(variant: str, pools: dict[str, str]) -> str:
    # Pools that differ between variants go into the legend instead of the title.
    return variant if len(set(pools.values())) <= 1 else f"{variant} (pool {pools[variant]})"


def _nothing_ran_text(summary: pd.DataFrame, variant: str) -> str:
    """Why a variant has nothing to show ("" when it served requests)."""
    row = summary[summary["variant"] == variant].iloc[0]
    if int(row["requests_finished"]) > 0:
        return ""
    total, rejected = int(row["requests_total"]), int(row["requests_rejected"])
    if total == 0:
        return "nothing ran: the workload produced no requests"
    return f"nothing ran: no request finished ({rejected:,} of {total:,} rejected)"


def _say(axis, text: str, *, blank: bool = False) -> None:
    """Write ``text`` across the panel; ``blank``: the panel has no data, so no meaningless ticks."""
    axis.text(
        0.5, 0.5, text, ha="center", va="center", transform=axis.transAxes, fontsize=10, color="#868e96"
    )
    if blank:
        axis.set_xticks([])
        axis.set_yticks([])


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


def _waiting(frame: pd.DataFrame) -> pd.Series:
    return frame["num_requests_waiting"]


def _breakdown_stacks(
    series: dict[str, pd.DataFrame], pools: dict[str, str], empty: dict[str, str], path: Path
) -> Path:
    figure, axes = subplots(len(series), 1, figsize=(10, 2.6 * len(series) + 0.8), sharex=True, squeeze=False)
    for axis, (variant, frame) in zip(axes[:, 0], series.items(), strict=True):
        axis.set_title(f"{variant}: where the KV pool ({pools[variant]}) goes", fontsize=10)
        axis.set_ylim(0, 1)
        axis.set_ylabel("fraction of pool")
        if frame.empty:
            _say(axis, empty[variant] or "no samples", blank=True)
            continue
        pool = _pool(frame)
        axis.stackplot(
            frame["time_s"],
            [frame[f"{name}_tokens"] / pool for name in CATEGORY_COLOURS],
            labels=[name.replace("_", " ") for name in CATEGORY_COLOURS],
            colors=list(CATEGORY_COLOURS.values()),
            step="post",
        )
        if empty[variant]:
            _say(axis, empty[variant])
    axes[-1, 0].set_xlabel("simulated time (s)")
    handles = [Rectangle((0, 0), 1, 1, color=colour) for colour in CATEGORY_COLOURS.values()]
    # One legend for all panels, above them: it never covers the data.
    figure.legend(
        handles,
        [name.replace("_", " ") for name in CATEGORY_COLOURS],
        loc="upper center",
        ncol=len(CATEGORY_COLOURS),
        fontsize=8,
        frameon=False,
    )
    return _save(figure, path, top=1 - 0.45 / figure.get_figheight())


def _draw_variants(
    axis, curves: dict[str, tuple[np.ndarray, np.ndarray]], pools: dict[str, str], **style
) -> None:
    """Step curves, one per variant; identical curves stay visible (dashes, decreasing widths)."""
    count = len(curves)
    for index, (variant, (times, values)) in enumerate(curves.items()):
        label = _legend_label(variant, pools)
        if len(values) and not np.any(values):
            label += " (0 throughout)"
        axis.step(
            times,
            values,
            where="post",
            label=label,
            linestyle=LINE_STYLES[index % len(LINE_STYLES)],
            linewidth=1.0 + 1.5 * (count - 1 - index) / max(1, count - 1),
            **style,
        )


def _curves(
    series: dict[str, pd.DataFrame],
    pools: dict[str, str],
    empty: dict[str, str],
    path: Path,
    title: str,
    metric,
    ylabel: str,
) -> Path:
    figure, axis = subplots(figsize=(10, 4.4))
    curves = {
        variant: (frame["time_s"].to_numpy(), metric(frame).to_numpy())
        for variant, frame in series.items()
        if not frame.empty
    }
    _draw_variants(axis, curves, pools)
    axis.set_title(_title(title, pools), fontsize=11)
    axis.set_xlabel("simulated time (s)")
    axis.set_ylabel(ylabel)
    _finish_axis(axis, empty)
    return _save(figure, path)


def _finish_axis(axis, empty: dict[str, str]) -> None:
    """Legend outside the data (to the right), or a note when no variant has anything to show."""
    if all(empty.values()) or not axis.get_lines():
        _say(axis, next((text for text in empty.values() if text), "no samples"), blank=True)
        return
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _oom_preemptions(
    series: dict[str, pd.DataFrame], pools: dict[str, str], empty: dict[str, str], path: Path
) -> Path:
    figure, axis = subplots(figsize=(10, 4.4))
    counters = {
        "admission_waits": "waited for KV memory",
        "preemptions": "preemptions",
        "oom_failures": "OOM failures",
    }
    for column, what in counters.items():
        curves = {
            f"{variant}: {what}": (frame["time_s"].to_numpy(), frame[column].to_numpy())
            for variant, frame in series.items()
            if not frame.empty
        }
        labelled = {name: pools[name.split(": ")[0]] for name in curves}
        _draw_variants(axis, curves, labelled)
    axis.set_title(
        _title(
            "Cumulative requests that waited for KV memory, preemptions, OOM failures (on_oom: fail)",
            pools,
        ),
        fontsize=11,
    )
    axis.set_xlabel("simulated time (s)")
    axis.set_ylabel("count")
    _finish_axis(axis, empty)
    return _save(figure, path)


def _latency_cdfs(
    requests: dict[str, pd.DataFrame], pools: dict[str, str], empty: dict[str, str], path: Path
) -> Path:
    # One x scale for both panels: TTFT is part of end-to-end latency, so they compare directly.
    figure, axes = subplots(1, 2, figsize=(11, 4.4), sharex=True, sharey=True)
    for axis, column, title in zip(
        axes, ("ttft_s", "e2e_s"), ("Time to first token", "End-to-end latency"), strict=True
    ):
        curves = {}
        for variant, frame in requests.items():
            values = np.sort(frame.loc[frame["outcome"] == "finished", column].dropna().to_numpy())
            if len(values):
                curves[variant] = (values, np.arange(1, len(values) + 1) / len(values))
        _draw_variants(axis, curves, pools)
        axis.set_title(f"{title} (finished requests)", fontsize=10)
        axis.set_xlabel("seconds")
        axis.set_xscale("symlog", linthresh=0.1)
        if not curves:
            _say(axis, next((text for text in empty.values() if text), "no finished requests"), blank=True)
    axes[0].set_ylabel("fraction of requests")
    if any(axis.get_lines() for axis in axes):
        axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    figure.suptitle(_title("Latency CDFs", pools), fontsize=11)
    return _save(figure, path)


def _replicas(results: RunResults, variants: list[str], path: Path) -> Path:
    """Cluster variants, one row each: every replica's KV usage over time (left); requests routed
    and prefix-cache hit rate per replica (right), the load imbalance the summary condenses."""
    figure, axes = subplots(
        len(variants), 2, figsize=(12, 3.0 * len(variants) + 0.8), squeeze=False, width_ratios=[2, 1]
    )
    for (usage_axis, bar_axis), variant in zip(axes, variants, strict=True):
        frame = results.replica_timeseries(variant, max_rows=MAX_POINTS)
        for replica, rows in frame.groupby("replica"):
            usage_axis.step(
                rows["time_s"], rows["kv_cache_usage_perc"], where="post", label=f"replica {replica}"
            )
        usage_axis.set_title(
            f"{variant}: KV cache usage per replica (1 - (free + cached) / pool)", fontsize=10
        )
        usage_axis.set_xlabel("simulated time (s)")
        usage_axis.set_ylabel("fraction of pool")
        usage_axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
        summaries = results.replica_summaries(variant)
        positions = summaries["replica"].to_numpy()
        bar_axis.bar(positions, summaries["requests_routed"], color="#adb5bd", label="requests routed")
        bar_axis.set_xlabel("replica")
        bar_axis.set_ylabel("requests routed")
        bar_axis.set_xticks(positions)
        hit_axis = bar_axis.twinx()
        hit_axis.plot(positions, summaries["prefix_cache_hit_rate"], "o", color="#1c7ed6")
        hit_axis.set_ylim(0, 1)
        hit_axis.set_ylabel("prefix-cache hit rate (dots)", color="#1c7ed6")
        bar_axis.set_title(f"{variant}: requests (bars) and hit rate (dots)", fontsize=10)
    return _save(figure, path)


def _save(figure, path: Path, top: float | None = None) -> Path:
    figure.tight_layout()
    if top is not None:
        figure.subplots_adjust(top=top)
    figure.savefig(path, dpi=110)
    return path
