"""A disaggregated probe's evidence per pool, from which a plan tells which pool's limit broke the
SLOs (``sim.planning.plans.analysis.binding_pool``).

The steady-state metrics of a probe (``steady.py``) are over the cluster total, where the two pools'
admission stops mix. For a disaggregated deployment the answer a buyer needs is *which pool* to grow:
the prefill pool (its queue: prompts wait for a prefill replica) or the decode pool (prompts done wait
for a decode replica to allocate their blocks, holding their prefill blocks meanwhile: back-pressure).
So each pool's series is summed over its replicas and measured over the same window, and the
requests' TTFT split says where the time went.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from sim.cluster.results import total_series
from sim.planning.sweeps.steady import _series_means

ROLES = ("prefill", "decode")
POOL_METRICS = ("blocked_by_kv_memory_frac", "blocked_by_max_num_seqs_frac", "blocked_by_token_budget_frac")


def total_pool_tokens(summary: dict[str, Any]) -> int:
    """Every replica's KV pool together (a disaggregated cluster's pools may differ in size)."""
    if "prefill_replicas" in summary:
        return (
            summary["prefill_kv_pool_tokens"] * summary["prefill_replicas"]
            + summary["kv_pool_tokens"] * summary["decode_replicas"]
        )
    return summary["kv_pool_tokens"] * summary["replicas"]


def total_context_tokens(summary: dict[str, Any]) -> int:
    """Every replica's tokens of context together (``kv_context_tokens``: what arrivals fill); a
    disaggregated cluster's, or a summary from before the key, its pools' slots."""
    if "prefill_replicas" in summary or summary.get("kv_context_tokens") is None:
        return total_pool_tokens(summary)
    return summary["kv_context_tokens"] * summary["replicas"]


def _p99(values: pd.Series) -> float | None:
    clean = values.dropna()
    return float(np.percentile(clean, 99)) if len(clean) else None


def pool_metrics(
    requests: pd.DataFrame, replica_series: pd.DataFrame, replicas: pd.DataFrame, start: float, end: float
) -> dict[str, Any]:
    """Per pool over [start, end]: mean KV usage and the share of time its queues' heads were held back
    by each limit (``prefill_...``, ``decode_...``); and the p99 of the window's disaggregated requests'
    prefill queue and wait for decode blocks."""
    metrics: dict[str, Any] = {}
    for role in ROLES:
        rows = replica_series[replica_series["role"] == role].drop(columns="role")
        pool_tokens = int(replicas.loc[replicas["role"] == role, "kv_pool_tokens"].sum())
        if not len(rows) or not pool_tokens:
            continue
        means = _series_means(total_series(rows, pool_tokens), start, end, pool_tokens)
        metrics[f"{role}_kv_usage_frac"] = means.get("mean_kv_cache_usage_frac")
        for name in POOL_METRICS:
            metrics[f"{role}_{name}"] = means.get(name)
    inside = requests[
        (requests["arrival_s"] >= start) & (requests["arrival_s"] <= end) & (requests["prefill_replica"] >= 0)
    ]
    metrics["prefill_queue_p99_s"] = _p99(inside["queue_s"])
    metrics["transfer_wait_p99_s"] = _p99(inside["transfer_wait_s"])
    metrics["transfer_p99_s"] = _p99(inside["transfer_s"])
    return metrics
