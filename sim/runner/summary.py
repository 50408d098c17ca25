"""A run's summary row: counts, latency percentiles, the pool's figures and time averages, with what
speculation, KV groups and a host tier add."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from policies.base import KVCachePolicy, PoolSpec
from sim.cluster.results import ClusterTotals
from sim.config import VariantConfig
from sim.engine.core import Engine
from sim.hardware.capacity import KVCapacity
from sim.kv.coordinator import KVCoordinator
from sim.native import engine_build
from sim.offload import host_tier_summary
from sim.runner.prepared import PreparedVariant
from sim.runner.speculative import speculative_summary

# The per-request columns a summary needs (read back alone from a streamed file).
SUMMARY_REQUEST_COLUMNS = [
    "outcome",
    "sample_output_tokens",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "decode_steps",
    "decode_step_tokens",
]


def variant_summary(
    engine,
    requests_table: pd.DataFrame,
    prepared: PreparedVariant,
    wall_s: float,
    policies: list[KVCachePolicy | KVCoordinator],
) -> dict[str, Any]:
    """The summary row of ``engine`` (one engine, a replica, or a cluster's totals) whose host tiers,
    if any, are those of ``policies``."""
    summary = summarize(
        engine,
        requests_table,
        prepared.variant,
        prepared.policy_name,
        prepared.pool,
        prepared.capacity,
        prepared.costs.label,
        wall_s,
        prepared.max_model_len,
        cost_error_band=prepared.costs.error_band,
        kv_groups=len(prepared.hybrid.capacity.groups) if prepared.hybrid is not None else 1,
    )
    summary["pinned_tokens"] = prepared.pinned_tokens
    summary.update(speculative_summary(prepared))
    group_series = getattr(engine, "group_series", None)  # one engine with several KV groups
    summary["kv_group_means"] = (
        group_series.time_averages(float(engine.env.now), prepared.pool.kv_pool_tokens)
        if group_series is not None
        else None
    )
    if prepared.hybrid is not None:
        summary["num_gpu_blocks"] = prepared.hybrid.capacity.num_blocks
    block_bytes = prepared.engine.block_size * prepared.capacity.kv_bytes_per_token
    summary.update(host_tier_summary(policies, block_bytes, engine.counters.host_load_s))
    return summary


def summarize(
    engine: Engine | ClusterTotals,
    requests: pd.DataFrame,
    variant: VariantConfig,
    policy_name: str,
    pool: PoolSpec,
    capacity: KVCapacity,
    cost_label: str,
    wall_s: float,
    max_model_len: int,
    cost_error_band: str = "not validated",
    kv_groups: int = 1,
) -> dict[str, Any]:
    simulated_s = float(engine.env.now)
    finished = requests[requests["outcome"] == "finished"]
    stats = engine.kv.stats
    output_tokens = float(finished["sample_output_tokens"].sum()) if len(finished) else 0.0
    summary: dict[str, Any] = {
        "variant": variant.name,
        "policy": policy_name,
        "policy_options": dict(variant.options),
        "block_size": pool.block_size,
        "tensor_parallel_size": capacity.tensor_parallel_size,
        "data_parallel_size": capacity.data_parallel_size,
        "expert_parallel_size": capacity.expert_parallel_size,
        "max_model_len": max_model_len,
        "kv_pool_tokens": pool.kv_pool_tokens,
        "kv_context_tokens": _kv_context_tokens(engine, pool),
        "kv_pool_bytes": _kv_pool_bytes(engine, pool),
        "kv_bytes_per_token": pool.kv_bytes_per_token,
        "kv_groups": kv_groups,
        "num_gpu_blocks": capacity.num_gpu_blocks,
        "cost_model": cost_label,
        "cost_model_error_band": cost_error_band,
        "requests_total": len(requests),
        "requests_finished": len(finished),
        "requests_rejected": int((requests["outcome"] == "rejected").sum()),
        "requests_failed_oom": int((requests["outcome"] == "failed_oom").sum()),
        "requests_unfinished": int((requests["outcome"] == "unfinished").sum()),
        "admission_waits": engine.counters.admission_waits,
        "preemptions": engine.counters.preemptions,
        "oom_failures": engine.counters.oom_failures,
        "swapped_out_blocks": engine.counters.swapped_out_blocks,
        "peak_running": engine.recorder.peak_running,
        "cow_copies": stats.cow_copies,
        "fork_copied_tokens": stats.fork_copied_tokens,
        "evictions": stats.evictions,
        "prefix_cache_queries": stats.prefix_cache_queries,
        "prefix_cache_hits": stats.prefix_cache_hits,
        "prefix_cache_hit_rate": (
            stats.prefix_cache_hits / stats.prefix_cache_queries if stats.prefix_cache_queries else None
        ),
        "output_tokens_per_s": output_tokens / simulated_s if simulated_s > 0 else 0.0,
        "ttft_p50_s": _percentile(finished["ttft_s"], 50),
        "ttft_p99_s": _percentile(finished["ttft_s"], 99),
        "tpot_p50_s": _percentile(finished["tpot_s"], 50),
        "tokens_per_decode_step": _tokens_per_decode_step(finished),
        "e2e_p50_s": _percentile(finished["e2e_s"], 50),
        "e2e_p99_s": _percentile(finished["e2e_s"], 99),
        "iterations": engine.counters.iterations,
        "engine_wakeups": engine.wakeups,
        "simulated_s": simulated_s,
        "wall_s": wall_s,
        "engine_build": engine_build(),
    }
    summary.update(engine.recorder.time_averages(simulated_s))
    return summary


def _tokens_per_decode_step(finished: pd.DataFrame) -> float | None:
    """Tokens a decode step gave the finished requests, on average over their steps (None without
    steps, or for a table without the step columns: one read back from an older run)."""
    if "decode_steps" not in finished or "decode_step_tokens" not in finished:
        return None
    steps = float(finished["decode_steps"].sum())
    return float(finished["decode_step_tokens"].sum()) / steps if steps else None


def _kv_pool_bytes(engine: Engine | ClusterTotals, pool: PoolSpec) -> int:
    """The pool's bytes per GPU: its slots at one token's bytes, or, where KV groups or pools hold
    slots of different sizes (a Mamba state beside per-token K/V), the sum of their breakdown in
    bytes, which the accounting identity keeps equal to the pool at every instant."""
    kv = getattr(engine, "kv", None)
    breakdown_bytes = getattr(kv, "breakdown_bytes", None)
    if breakdown_bytes is None:
        return pool.kv_pool_tokens * pool.kv_bytes_per_token
    return sum(breakdown_bytes().values())


def _kv_context_tokens(engine: Engine | ClusterTotals, pool: PoolSpec) -> int:
    """Tokens of context one replica's pool holds (``KVCoordinator.context_tokens``: a hybrid pool's
    slots count a token once per layer group); the pool's slots where a cluster's replicas differ."""
    return getattr(getattr(engine, "kv", None), "context_tokens", 0) or pool.kv_pool_tokens


def _percentile(values: pd.Series, q: float) -> float | None:
    clean = values.dropna()
    return float(np.percentile(clean, q)) if len(clean) else None
