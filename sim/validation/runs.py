"""Helpers shared by the checks: running an experiment's variants, reducing their time series and
request tables and byte units.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from policies.base import MemoryBreakdown, PoolSpec, make_policy
from policies.contiguous import ContiguousPolicy
from sim.config import ConfigError, ExperimentConfig
from sim.runner import VariantResult, run_variant

GiB = 2**30
GB = 10**9


# --------------------------------------------------------------------------------------------------
# Simulation helpers shared by the checks
# --------------------------------------------------------------------------------------------------


def run_config(
    config: ExperimentConfig, base_dir: Path, variants: Iterable[str] | None = None
) -> dict[str, VariantResult]:
    """Run the named variants (default: all) of ``config`` on its request stream."""
    wanted = None if variants is None else list(variants)
    chosen = [v for v in config.variants if wanted is None or v.name in wanted]
    if wanted is not None and len(chosen) != len(wanted):
        known = ", ".join(v.name for v in config.variants)
        raise ConfigError(f"{config.name}: variants {wanted} not all among {known}")
    return {variant.name: run_variant(config, variant, base_dir) for variant in chosen}


def interval_frame(timeseries: pd.DataFrame) -> pd.DataFrame:
    """The time series as intervals between consecutive samples.

    Token counts are each interval's exact mean, from the recorder's cumulative areas (tokens grow
    inside an event-skipping jump, by the batch every iteration, and no row shows it); a series
    without them falls back on the trapezoid rule. Counts of requests change only at events, so
    they hold their value over the interval."""
    times = timeseries["time_s"].to_numpy(dtype=float)
    dt = np.diff(times)
    frame = pd.DataFrame({"dt": dt})
    for column in timeseries.columns:
        values = timeseries[column].to_numpy(dtype=float)
        area = column.removesuffix("s") + "_s"  # used_tokens -> used_token_s
        if column.endswith("_tokens") and area in timeseries:
            with np.errstate(divide="ignore", invalid="ignore"):
                frame[column] = np.diff(timeseries[area].to_numpy(dtype=float)) / dt
        elif column.endswith("_tokens"):
            frame[column] = (values[:-1] + values[1:]) / 2
        else:
            frame[column] = values[:-1]
    return frame[frame["dt"] > 0].reset_index(drop=True)


def saturated_means(timeseries: pd.DataFrame, pool_tokens: int) -> dict[str, float]:
    """Time averages over the intervals during which a request was waiting (the engine saturated).

    Returns ``saturated_s`` (their total length), ``running``, and the six breakdown categories as
    fractions of the pool (``used``, ``reserved``...)."""
    frame = interval_frame(timeseries)
    frame = frame[frame["num_requests_waiting"] > 0]
    total = float(frame["dt"].sum())
    result = {"saturated_s": total}
    if total <= 0:
        return result | {"running": float("nan")} | {c: float("nan") for c in MemoryBreakdown.CATEGORIES}
    weights = frame["dt"] / total
    result["running"] = float((frame["num_requests_running"] * weights).sum())
    for category in MemoryBreakdown.CATEGORIES:
        result[category] = float((frame[f"{category}_tokens"] * weights).sum()) / pool_tokens
    return result


def steady_window(requests: pd.DataFrame, warmup_fraction: float) -> tuple[float, float]:
    """The steady-state window of an open-loop run: from the arrival of the request at
    ``warmup_fraction`` of the stream (warm-up dropped) to the last arrival (the drain after it
    dropped)."""
    arrivals = np.sort(requests["arrival_s"].to_numpy(dtype=float))
    start = float(arrivals[min(int(warmup_fraction * len(arrivals)), len(arrivals) - 1)])
    return start, float(arrivals[-1])


def window_means(
    timeseries: pd.DataFrame, pool_tokens: int, start_s: float, end_s: float
) -> dict[str, float]:
    """Time averages over ``[start_s, end_s]``: the six breakdown categories as fractions of the
    pool, ``running``, and ``waiting_share`` (the share of the window with a request waiting: 1 when
    the engine stayed saturated)."""
    frame = interval_frame(timeseries)
    times = timeseries["time_s"].to_numpy(dtype=float)
    positive = np.diff(times) > 0  # the intervals interval_frame keeps, in order
    starts, ends = times[:-1][positive], times[1:][positive]
    overlap = np.clip(np.minimum(ends, end_s) - np.maximum(starts, start_s), 0.0, None)
    total = float(overlap.sum())
    if total <= 0:
        raise ValueError(f"no recorded time in the window [{start_s:g}, {end_s:g}] s")
    weights = overlap / total
    result = {
        "window_s": total,
        "running": float((frame["num_requests_running"] * weights).sum()),
        "waiting_share": float(((frame["num_requests_waiting"] > 0) * weights).sum()),
    }
    for category in MemoryBreakdown.CATEGORIES:
        result[category] = float((frame[f"{category}_tokens"] * weights).sum()) / pool_tokens
    return result


def request_means(requests: pd.DataFrame) -> dict[str, float]:
    total = requests["prompt_tokens"] + requests["output_tokens"]
    return {
        "requests": float(len(requests)),
        "mean_prompt": float(requests["prompt_tokens"].mean()),
        "mean_output": float(requests["output_tokens"].mean()),
        "max_total": float(total.max()),
    }


def describe_lengths(requests: pd.DataFrame) -> str:
    means = request_means(requests)
    return (
        f"{int(means['requests'])} requests; realised mean prompt {means['mean_prompt']:.1f}, "
        f"mean output {means['mean_output']:.1f} tokens; longest prompt + output "
        f"{int(means['max_total'])} tokens"
    )


def contiguous_internal_split(
    result: VariantResult, reservation: str, placement: str, window: tuple[float, float] | None = None
) -> tuple[float, float]:
    """Time-averaged slots (as fractions of the pool) of a contiguous policy's internal fragmentation,
    split into the reservation rule's overshoot (``reservation_size - final_len``) and the
    placement's rounding (buddy: ``region - reservation_size``).

    Exact from the requests table: a contiguous region lives from admission to finish with a fixed
    size (growth never fails, so the policy never preempts). The averaging window is ``window``
    (start, end in s), by default the whole run, as the summary's ``mean_*_frac``."""
    summary = result.summary
    requests = result.requests
    if int(summary["preemptions"]) or (requests[["n", "beam_width"]].max(axis=1) > 1).any():
        raise ValueError("the split needs a run without preemptions or forks")
    pool = PoolSpec(int(summary["kv_pool_tokens"]), int(summary["block_size"]), int(summary["max_model_len"]))
    policy = make_policy("contiguous", pool, reservation=reservation, placement=placement)
    assert isinstance(policy, ContiguousPolicy)
    run_end_s = float(summary["simulated_s"])
    start_s, end_s = window if window is not None else (0.0, run_end_s)
    live = requests[requests["admitted_s"].notna()]
    finish = np.minimum(live["finish_s"].fillna(run_end_s).to_numpy(dtype=float), end_s)
    lifetime = np.clip(finish - np.maximum(live["admitted_s"].to_numpy(dtype=float), start_s), 0.0, None)
    rule = np.empty(len(live))
    rounding = np.empty(len(live))
    prompts = live["prompt_tokens"].to_numpy(dtype=int)
    outputs = live["output_tokens"].to_numpy(dtype=int)
    for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        final = int(prompt + output)
        size = policy.reservation_size(int(prompt), final)
        rule[i] = size - final
        rounding[i] = policy.region_size(size) - size
    scale = (end_s - start_s) * pool.kv_pool_tokens
    return float((rule * lifetime).sum() / scale), float((rounding * lifetime).sum() / scale)


def block_waste(means: dict[str, float]) -> float:
    """Share of allocated slots holding no token state (tail blocks: reserved + internal)."""
    allocated = means["used"] + means["reserved"] + means["internal_fragmentation"]
    return (means["reserved"] + means["internal_fragmentation"]) / allocated if allocated else float("nan")
