"""A disaggregated run's own outputs: the transfer series, the TTFT split and the pools' summaries."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from sim.cluster.disaggregated import DisaggregatedCluster

TRANSFER_TIMESERIES = "transfer_timeseries"  # beside timeseries: the link and the handoffs over time
TRANSFER_REQUEST_COLUMNS = [
    "prefill_replica",
    "queue_s",
    "prefill_s",
    "transfer_wait_s",
    "transfer_s",
    "transfer_bytes",
    "first_token_s",
    "transfer_end_s",
]
TRANSFER_SERIES_COLUMNS = [
    "time_s",
    "requests_awaiting_decode",
    "transfers_in_flight",
    "transfer_bytes_in_flight",
]


def transfer_series(rows: list[tuple[float, int, int, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=TRANSFER_SERIES_COLUMNS)


def _mean(values: pd.Series) -> float | None:
    clean = values.dropna()
    return float(clean.mean()) if len(clean) else None


def _p99(values: pd.Series) -> float | None:
    clean = values.dropna()
    return float(np.percentile(clean, 99)) if len(clean) else None


def _pool_usage(replica_summaries: list[dict[str, Any]], role: str) -> float | None:
    """Time-averaged KV usage of a pool's replicas (their pools are the same size: a plain mean)."""
    usage = [
        1.0 - row["mean_free_frac"] - row["mean_cached_frac"]
        for row in replica_summaries
        if row["role"] == role
    ]
    return float(np.mean(usage)) if usage else None


def disaggregation_summary(
    cluster: DisaggregatedCluster,
    requests: pd.DataFrame,
    replica_summaries: list[dict[str, Any]],
    prefill,
    decode,
) -> dict[str, Any]:
    """The summary's disaggregation columns (see ``sim/outputs/columns.py``)."""
    finished = requests[requests["outcome"] == "finished"]
    split = finished[finished["prefill_replica"] >= 0]
    simulated_s = float(cluster.env.now)
    pipes = max(1, len(cluster.link.pipes))
    by_role = {
        role: [row for row in replica_summaries if row["role"] == role] for role in ("prefill", "decode")
    }
    return {
        "prefill_replicas": len(cluster.prefill_replicas),
        "decode_replicas": len(cluster.decode_replicas),
        "prefill_policy": prefill.policy_name,
        "prefill_gpu": prefill.gpu.name if prefill.gpu is not None else None,
        "decode_gpu": decode.gpu.name if decode.gpu is not None else None,
        "prefill_tensor_parallel_size": prefill.capacity.tensor_parallel_size,
        "prefill_kv_pool_tokens": prefill.pool.kv_pool_tokens,
        "link": cluster.link.spec.label,
        "requests_disaggregated": cluster.disaggregated,
        "kv_transfers": cluster.link.transfers,
        "transfer_bytes_total": float(cluster.link.bytes_sent),
        "link_utilization_frac": cluster.link.busy_s() / (pipes * simulated_s) if simulated_s > 0 else 0.0,
        "queue_mean_s": _mean(split["queue_s"]),
        "prefill_mean_s": _mean(split["prefill_s"]),
        "transfer_wait_mean_s": _mean(split["transfer_wait_s"]),
        "transfer_wait_p99_s": _p99(split["transfer_wait_s"]),
        "transfer_mean_s": _mean(split["transfer_s"]),
        "transfer_p99_s": _p99(split["transfer_s"]),
        "decode_first_step_mean_s": _mean(split["first_token_s"] - split["transfer_end_s"]),
        "prefill_kv_usage_mean_frac": _pool_usage(replica_summaries, "prefill"),
        "decode_kv_usage_mean_frac": _pool_usage(replica_summaries, "decode"),
        "prefill_preemptions": sum(row["preemptions"] for row in by_role["prefill"]),
        "decode_preemptions": sum(row["preemptions"] for row in by_role["decode"]),
    }
