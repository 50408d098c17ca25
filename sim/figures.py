"""Figures a person reads without code. Plotting reads results frames, never engine objects.

Conventions every figure follows: the KV pool size is in the title (per variant when variants differ,
and the reason when they differ only because a contiguous pool keeps the slots that do not fill a
whole block); legends sit outside the data; curves of several variants that coincide (all at zero,
typically) stay visible, drawn with different dashes and widths and marked "(0 throughout)", or
"(≈0 throughout, at most ...)" when a curve is too close to zero to tell apart at the figure's
scale; an empty panel says why instead of showing blank axes.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import pandas as pd
from matplotlib.patches import Rectangle

from sim.cluster.results import total_series
from sim.outputs.canvas import subplots
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
# A curve whose largest value is below this share of the largest on its axes is drawn on the zero
# line, to the eye: its label says so, and how far from zero it really gets.
NEAR_ZERO_SHARE = 0.01
Key = TypeVar("Key", bound=Hashable)  # what names a curve: a variant, or (counter, variant)


def write_figures(results: RunResults, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    series = {variant: results.timeseries(variant, max_rows=MAX_POINTS) for variant in results.variants}
    latency_columns = ["outcome", "ttft_s", "e2e_s"]
    requests = {variant: results.requests(variant, columns=latency_columns) for variant in results.variants}
    pools = describe_pools(results.summary)
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
            _percent,
        ),
        _curves(
            series,
            pools,
            empty,
            out_dir / "fragmentation.png",
            "Internal + external fragmentation",
            _frag_frac,
            "fraction of KV pool",
            _percent,
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
            _percent,
        ),
        _oom_preemptions(series, pools, empty, out_dir / "oom_preemptions.png"),
        _latency_cdfs(requests, pools, empty, out_dir / "latency_cdf.png"),
    ]
    clusters = [variant for variant in results.variants if results.is_cluster(variant)]
    if clusters:
        paths.append(_replicas(results, clusters, out_dir / "replicas.png"))
    split = [variant for variant in results.variants if results.is_disaggregated(variant)]
    if split:
        paths.append(_disaggregation(results, split, out_dir / "disaggregation.png"))
    hybrid = [variant for variant in results.variants if results.has_kv_groups(variant)]
    if hybrid:
        paths.append(_kv_groups(results, hybrid, pools, out_dir / "kv_groups.png"))
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


@dataclass(frozen=True)
class Pools:
    """How the figures name the variants' KV pools: one ``title`` when they are the same memory, else
    each variant's own pool in its legend label."""

    per_variant: dict[str, str]  # variant -> "458,096 tokens, 55.9 GiB" (pool_labels)
    title: str | None  # the title's pool line(s), when one describes every variant

    def legend_label(self, variant: str) -> str:
        return variant if self.title is not None else f"{variant} (pool {self.per_variant[variant]})"


def describe_pools(summary: pd.DataFrame) -> Pools:
    """The pools of a run's variants, for figure titles and legends.

    Block-based policies hold whole blocks of the KV memory, as vLLM sizes ``num_gpu_blocks``; the
    contiguous policy has no blocks and keeps every slot, so on the same memory its pool can be up
    to ``block_size - 1`` tokens larger (458,097 against 458,096 tokens for Llama-3.1-8B on an
    A100-80GB). Such pools are one memory: the title names the block-based pool and says why the
    other is larger."""
    labels = pool_labels(summary)
    if len(set(labels.values())) == 1:
        return Pools(labels, f"KV pool {next(iter(labels.values()))}")
    rows = list(summary.itertuples())
    shared = {
        (int(row.block_size), int(getattr(row, "replicas", 1)), int(row.kv_bytes_per_token)) for row in rows
    }
    if len(shared) == 1:
        ((block, replicas, _),) = shared
        whole = {int(row.kv_pool_tokens) // block * block for row in rows}
        blocked = [row for row in rows if int(row.kv_pool_tokens) % block == 0]
        slotted = {
            str(row.variant): int(row.kv_pool_tokens) for row in rows if int(row.kv_pool_tokens) % block
        }
        if len(whole) == 1 and blocked and len(set(slotted.values())) == 1:
            times = f"{replicas} x " if replicas > 1 else ""
            return Pools(
                labels,
                f"KV pool {times}{int(blocked[0].kv_pool_tokens):,} tokens in whole {block}-token blocks, "
                f"{blocked[0].kv_pool_bytes / GiB:.1f} GiB\n"
                f"({', '.join(slotted)}: {next(iter(slotted.values())):,}, every slot: a contiguous pool has "
                "no blocks)",
            )
    return Pools(labels, None)


def _title(title: str, pools: Pools) -> str:
    return f"{title}\n{pools.title}" if pools.title is not None else title


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.2g} %"


def _count(value: float) -> str:
    return f"{value:,.0f}"


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
    series: dict[str, pd.DataFrame], pools: Pools, empty: dict[str, str], path: Path
) -> Path:
    figure, axes = subplots(len(series), 1, figsize=(10, 2.6 * len(series) + 0.8), sharex=True, squeeze=False)
    for axis, (variant, frame) in zip(axes[:, 0], series.items(), strict=True):
        axis.set_title(f"{variant}: where the KV pool ({pools.per_variant[variant]}) goes", fontsize=10)
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
    axis,
    curves: Mapping[Key, tuple[np.ndarray, np.ndarray]],
    labels: Mapping[Key, str],
    value_text: Callable[[float], str] = _count,
    scale: float | None = None,
    **style,
) -> None:
    """Step curves, one per entry of ``curves`` (labelled ``labels[name]``); identical curves stay
    visible (dashes, decreasing widths), and one that is 0, or looks it at the axes' ``scale`` (by
    default the largest value of ``curves``), says so (its largest value written by ``value_text``)."""
    count = len(curves)
    peaks = {
        name: float(np.nanmax(np.abs(values))) if len(values) else 0.0 for name, (_, values) in curves.items()
    }
    if scale is None:
        scale = max(peaks.values(), default=0.0)
    for index, (name, (times, values)) in enumerate(curves.items()):
        label = labels[name]
        if len(values) and peaks[name] == 0:
            label += " (0 throughout)"
        elif len(values) and peaks[name] < NEAR_ZERO_SHARE * scale:
            label += f" (≈0 throughout, at most {value_text(peaks[name])})"
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
    pools: Pools,
    empty: dict[str, str],
    path: Path,
    title: str,
    metric,
    ylabel: str,
    value_text: Callable[[float], str] = _count,
) -> Path:
    figure, axis = subplots(figsize=(10, 4.4))
    curves = {
        variant: (frame["time_s"].to_numpy(), metric(frame).to_numpy())
        for variant, frame in series.items()
        if not frame.empty
    }
    _draw_variants(axis, curves, {variant: pools.legend_label(variant) for variant in curves}, value_text)
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
    series: dict[str, pd.DataFrame], pools: Pools, empty: dict[str, str], path: Path
) -> Path:
    # Three counters per variant: too many entries for a legend beside the axes (it would squeeze
    # them), so it goes below, one column per counter.
    figure, axis = subplots(figsize=(10, 6.0))
    counters = {
        "admission_waits": "waited for KV memory",
        "preemptions": "preemptions",
        "oom_failures": "OOM failures",
    }
    curves = {
        (column, variant): (frame["time_s"].to_numpy(), frame[column].to_numpy())
        for column in counters
        for variant, frame in series.items()
        if not frame.empty
    }
    scale = max((float(np.abs(values).max()) for _, values in curves.values() if len(values)), default=0.0)
    for column, what in counters.items():
        # Drawn per counter (each cycles the dashes anew) against the scale of all nine.
        group = {key: value for key, value in curves.items() if key[0] == column}
        labels = {key: f"{pools.legend_label(key[1])}: {what}" for key in group}
        _draw_variants(axis, group, labels, _count, scale=scale)
    axis.set_title(
        _title(
            "Cumulative counts: requests that waited for KV memory,\npreemptions, OOM failures (on_oom: fail)",
            pools,
        ),
        fontsize=11,
    )
    axis.set_xlabel("simulated time (s)")
    axis.set_ylabel("count")
    if all(empty.values()) or not axis.get_lines():
        _finish_axis(axis, empty)
    else:
        axis.legend(
            loc="upper center",
            bbox_to_anchor=(0.5, -0.14),
            ncol=len(counters),
            fontsize=8,
            frameon=False,
        )
    return _save(figure, path)


def _latency_cdfs(requests: dict[str, pd.DataFrame], pools: Pools, empty: dict[str, str], path: Path) -> Path:
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
        _draw_variants(axis, curves, {variant: pools.legend_label(variant) for variant in curves}, _percent)
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


GROUP_COLOURS = ["#2b8a3e", "#1c7ed6", "#f08c00", "#ae3ec9", "#e03131", "#0c8599", "#5c940d", "#d6336c"]


def _kv_groups(results: RunResults, variants: list[str], pools: Pools, path: Path) -> Path:
    """Hybrid allocators, one panel each: the pool's slots each KV group holds over time (its live
    tokens, the slots reserved for them, fragmentation and cached blocks together), stacked, and the
    free slots of each pool the groups share on top: the split by layer kind that the pool-wide
    breakdown sums over. A group keeps its colour in every panel."""
    figure, axes = subplots(len(variants), 1, figsize=(10, 2.8 * len(variants) + 0.6), squeeze=False)
    held = [f"{name}_tokens" for name in CATEGORY_COLOURS if name != "free"]
    frames = {variant: results.kv_group_timeseries(variant) for variant in variants}
    groups = list(dict.fromkeys(name for frame in frames.values() for name in frame["kv_group"]))
    colours = {
        name: GROUP_COLOURS[index % len(GROUP_COLOURS)]
        for index, name in enumerate(name for name in groups if not name.startswith("shared pool"))
    }
    for axis, (variant, frame) in zip(axes[:, 0], frames.items(), strict=True):
        axis.set_title(f"{variant}: KV pool ({pools.per_variant[variant]}) by KV group", fontsize=10)
        axis.set_ylim(0, 1)
        axis.set_ylabel("fraction of pool")
        axis.set_xlabel("simulated time (s)")
        wide = frame.assign(held=frame[held].sum(axis=1)).pivot_table(
            index="time_s", columns="kv_group", values=["held", "free_tokens"], aggfunc="last", sort=False
        )
        pool = wide["held"].sum(axis=1) + wide["free_tokens"].sum(axis=1)
        names = list(dict.fromkeys(frame["kv_group"]))
        stacks, labels, fills = [], [], []
        for name in names:
            if name in colours:
                stacks.append(wide["held"][name] / pool)
                labels.append(f"{name}: held")
                fills.append(colours[name])
        free_shades = ["#dee2e6", "#ced4da", "#adb5bd", "#e9ecef"]
        for index, name in enumerate(name for name in names if wide["free_tokens"][name].any()):
            stacks.append(wide["free_tokens"][name] / pool)
            labels.append(f"free ({name})" if name not in colours else f"{name}: free")
            fills.append(free_shades[index % len(free_shades)])
        axis.stackplot(wide.index, stacks, labels=labels, colors=fills, step="post")
        axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    return _save(figure, path)


TTFT_PARTS = (  # (label, start column, end column) of a disaggregated request's time to first token
    ("prefill queue", "arrival_s", "admitted_s"),
    ("prefill", "admitted_s", "prefill_done_s"),
    ("wait for decode blocks", "prefill_done_s", "transfer_start_s"),
    ("transfer", "transfer_start_s", "transfer_end_s"),
    ("decode's first step", "transfer_end_s", "first_token_s"),
)


def _disaggregation(results: RunResults, variants: list[str], path: Path) -> Path:
    """Disaggregated variants, one row each: each pool's KV usage over time (its replicas together),
    the handoffs and the link over time, and the mean TTFT split of the finished requests."""
    figure, axes = subplots(len(variants), 3, figsize=(15, 3.2 * len(variants) + 0.8), squeeze=False)
    for (usage_axis, link_axis, split_axis), variant in zip(axes, variants, strict=True):
        frame = results.replica_timeseries(variant, max_rows=MAX_POINTS)
        replicas = results.replica_summaries(variant)
        for role, rows in frame.groupby("role", sort=False):
            pool_tokens = int(replicas.loc[replicas["role"] == role, "kv_pool_tokens"].sum())
            total = total_series(rows.drop(columns="role"), pool_tokens)
            usage_axis.step(total["time_s"], total["kv_cache_usage_perc"], where="post", label=f"{role} pool")
        usage_axis.set_title(f"{variant}: KV usage per pool (1 - (free + cached) / pools)", fontsize=10)
        usage_axis.set_xlabel("simulated time (s)")
        usage_axis.set_ylabel("fraction of the pool's KV")
        usage_axis.legend(fontsize=8, frameon=False)
        transfers = results.transfer_timeseries(variant)
        link_axis.step(
            transfers["time_s"], transfers["transfers_in_flight"], where="post", label="transfers in flight"
        )
        link_axis.step(
            transfers["time_s"],
            transfers["requests_awaiting_decode"],
            where="post",
            label="prompts waiting for decode blocks",
        )
        link_axis.set_title(f"{variant}: handoffs and the KV link", fontsize=10)
        link_axis.set_xlabel("simulated time (s)")
        link_axis.set_ylabel("requests")
        link_axis.legend(fontsize=8, frameon=False)
        requests = results.requests(variant)
        done = requests[(requests["outcome"] == "finished") & (requests["prefill_replica"] >= 0)]
        left = 0.0
        for label, start, end in TTFT_PARTS:
            mean_s = float((done[end] - done[start]).mean()) if len(done) else 0.0
            split_axis.barh([0], [mean_s], left=left, label=f"{label} ({mean_s * 1e3:,.1f} ms)")
            left += mean_s
        split_axis.set_yticks([])
        split_axis.set_xlabel("mean seconds from arrival")
        split_axis.set_title(f"{variant}: mean TTFT split ({len(done):,} requests)", fontsize=10)
        split_axis.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(0, -0.25), ncol=2)
    return _save(figure, path)


def _save(figure, path: Path, top: float | None = None) -> Path:
    figure.tight_layout()
    if top is not None:
        figure.subplots_adjust(top=top)
    figure.savefig(path, dpi=110)
    return path
