"""Numbers as a planner reads them, always with their unit; what the report calls the metrics and
limits it shows, and which metrics a plan reports at a candidate's maximum rate."""

from __future__ import annotations

from policies.base import MemoryBreakdown
from sim.outputs.metrics import ADMISSION_BLOCKERS, summary_key


def rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g} req/s"


def seconds(value: float | None) -> str:
    """``2.00 s``, ``480 ms``, ``4.8 ms``, ``100 µs``: three significant digits below a second (a
    0.1 ms SLO must not print as 0 ms)."""
    if value is None:
        return "n/a"
    if abs(value) >= 1:
        return f"{value:.2f} s"
    if abs(value) >= 1e-3 or value == 0:
        return f"{float(f'{value * 1e3:.3g}'):g} ms"
    return f"{float(f'{value * 1e6:.3g}'):g} µs"


def bound(value: float, unit: str) -> str:
    """An SLO's bound or a measured value in the SLO's unit."""
    if unit == "s":
        return seconds(value)
    if unit == "s/token":
        return f"{seconds(value)}/token"
    if unit == "share":
        return share(value)
    return f"{value:.3g} {unit}"


def share(value: float | None) -> str:
    """``12.5%``; a share that rounds to zero is ``0.0%`` whichever side it fell on (a queue that
    shrank by 0.004 % did not shrink by "-0.0%")."""
    if value is None:
        return "n/a"
    text = f"{value:.1%}"
    return "0.0%" if text == "-0.0%" else text


def number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}".strip()


def metric_value(name: str, value: float | None) -> str:
    """Format by the metric's name suffix (``_per_s``, ``_s``, ``_frac``)."""
    if name.endswith("_per_s"):
        return number(value, "tokens/s" if "tokens" in name else "req/s")
    if name.endswith("_s"):
        return seconds(value)
    if name == "normalized_latency_mean_s":
        return "n/a" if value is None else f"{seconds(value)}/token"
    if name.endswith("_frac") or name == "kv_usage_rise":
        return share(value)
    if name.endswith("_per_request"):
        return number(value, "tokens/request" if "tokens" in name else "per request")
    return number(value)


# What the report calls the steady-state metrics (the key stays beside it, for plan.json readers).
METRIC_LABELS = {
    "ttft_p50_s": "p50 time to first token",
    "ttft_p99_s": "p99 time to first token",
    "tpot_p50_s": "p50 time per output token",
    "tpot_p99_s": "p99 time per output token",
    "e2e_p99_s": "p99 end-to-end latency",
    "output_tokens_per_s": "output throughput",
    "output_tokens_per_request": "output tokens per request",
    "mean_running": "mean running requests",
    "peak_running": "peak running requests",
    "mean_waiting": "mean waiting requests",
    "queue_growth_frac": "queue growth (share of the window's arrivals)",
    "ttft_mean_s": "mean time to first token",
    "tpot_mean_s": "mean time per output token",
    "e2e_mean_s": "mean end-to-end latency",
    "e2e_p50_s": "p50 end-to-end latency",
    "normalized_latency_mean_s": "mean normalized latency (E2E / output tokens)",
    "attainment_frac": "goodput SLO attainment (share of requests meeting their targets)",
    "fill_deficit_s": "window opened before the system filled by (probe too short if > 0)",
    "fill_multiple": "arrival span in KV-pool fill times",
    "pool_fill_s": "time the arrivals take to fill the KV pool",
    "kv_usage_rise": "KV usage rise over the window's last segment (share of the pool)",
    "running_rise_frac": "running-batch growth over the window's last segment",
    "tokens_per_request": "KV tokens per request (prompt + every sample's output)",
    "preemptions_per_request": "preemptions per request",
    "rejected_frac": "rejected requests",
    "mean_kv_cache_usage_frac": "KV cache usage (vLLM's kv_cache_usage_perc)",
    "mean_used_frac": "KV pool: used",
    "mean_reserved_frac": "KV pool: reserved",
    "mean_internal_frag_frac": "KV pool: internal fragmentation",
    "mean_external_frag_frac": "KV pool: external fragmentation",
    "mean_cached_frac": "KV pool: cached",
    "mean_free_frac": "KV pool: free",
    "blocked_by_kv_memory_frac": "admission held back by KV memory (share of time)",
    "blocked_by_max_num_seqs_frac": "admission held back by max_num_seqs (share of time)",
    "blocked_by_token_budget_frac": "admission held back by the token budget (share of time)",
}


# The steady-state metrics a plan reports at a candidate's maximum rate (mean and spread over seeds).
# Here, with the report's names for them, rather than in the plan's analysis that measures them: the
# report lists them too, and it stands below the plans (it reads plan.json, never the plan's objects).
AT_MAX_METRICS = (
    "ttft_p50_s",
    "ttft_p99_s",
    "ttft_mean_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "tpot_mean_s",
    "e2e_p99_s",
    "e2e_mean_s",
    "normalized_latency_mean_s",
    "attainment_frac",
    "output_tokens_per_s",
    "output_tokens_per_request",
    "queue_growth_frac",
    "mean_running",
    "peak_running",
    "mean_waiting",
    "preemptions_per_request",
    "rejected_frac",
    "mean_kv_cache_usage_frac",
    "fill_multiple",
    "kv_usage_rise",
    "running_rise_frac",
    "tokens_per_request",
    *(summary_key(category) for category in MemoryBreakdown.CATEGORIES),  # mean_used_frac, ...
    *(f"blocked_by_{name}_frac" for name in ADMISSION_BLOCKERS[1:]),
)

# What the report calls each binding limit (the plan's analysis says which one broke the SLOs).
LIMIT_LABELS = {
    "kv_memory": "KV memory",
    "max_num_seqs": "max_num_seqs",
    "token_budget": "token budget (max_num_batched_tokens)",
    "compute": "compute",
    "request_length": "request length (max_model_len)",
    "probe_length": "probe too short (a lower bound)",
}


def metric_label(name: str) -> str:
    return METRIC_LABELS.get(name, name)
