"""Plans over disaggregated deployments (candidates.disaggregation): candidates, GPUs and prices of
both pools, the pool a failing probe waited for, and bad entries."""

from __future__ import annotations

import pandas as pd
import pytest

from sim.config import ConfigError
from sim.planning.plans.analysis import _sizing, binding_pool
from sim.planning.plans.spec import load_plan_spec
from sim.planning.sweeps.pools import pool_metrics, total_pool_tokens
from tests.planning_helpers import plan_data, write_yaml

POLICIES = [{"name": "prefix", "policy": "prefix"}]


def disaggregated_plan(tmp_path, *entries, **changes):
    data = plan_data(
        gpus=[
            {"gpu": "A100-80GB", "price_per_hour": 2.0},
            {"gpu": "H100-80GB", "name": "h100", "price_per_hour": 3.0},
        ],
        candidates={"policies": POLICIES, "block_sizes": [16], "disaggregation": list(entries)},
        **changes,
    )
    return load_plan_spec(write_yaml(tmp_path / "plan.yaml", data))


def test_each_entry_is_a_candidate_with_both_pools_gpus_and_price(tmp_path):
    """2 prefill replicas at TP 2 on the H100 ($3) + 1 decode replica on the candidate's GPU: 4 + 1 = 5
    GPUs; on the A100 candidate $12 + $2 = $14 an hour, on the H100 candidate $12 + $3."""
    entry = {
        "prefill": {"replicas": 2, "gpu": "h100", "engine": {"tensor_parallel_size": 2}},
        "decode": {"replicas": 1},
    }
    plan = disaggregated_plan(tmp_path, entry)
    colocated = [c for c in plan.candidates if "disaggregated" not in c.key]
    split = [c for c in plan.candidates if "disaggregated" in c.key]
    assert [c.key for c in colocated] == ["A100-80GB / prefix / block 16", "h100 / prefix / block 16"]
    assert [c.key for c in split] == [
        "A100-80GB / prefix / block 16 / disaggregated 2P h100 TP2 + 1D over rdma",
        "h100 / prefix / block 16 / disaggregated 2P TP2 + 1D over rdma",  # (its own GPU: not repeated)
    ]
    assert [c.gpus_per_deployment for c in split] == [5, 5]
    assert [c.deployment_price_per_hour for c in split] == [14.0, 15.0]
    assert colocated[0].gpus_per_deployment == 1 and colocated[0].deployment_price_per_hour == 2.0
    config = plan.probe_config(split[0], 3.0, seed=1)
    pools = config.cluster.disaggregation
    assert pools.prefill.gpu == "H100-80GB" and pools.decode.gpu is None
    assert split[0].router == "prefill least_requests, decode least_requests"


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"prefill": {"replicas": 0}, "decode": {"replicas": 1}}, "candidates.disaggregation.0"),
        (
            {"prefill": {"replicas": 1, "gpu": "b200"}, "decode": {"replicas": 1}},
            "prefill.gpu 'b200' is not one of the plan's gpus",
        ),
        ({"prefill": {"replicas": 1}}, "candidates.disaggregation.0"),
    ],
)
def test_bad_disaggregation_candidates_name_the_entry(tmp_path, entry, expected):
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.").replace("(", r"\(")):
        disaggregated_plan(tmp_path, entry)


def test_a_disaggregated_deployment_is_sized_by_both_pools():
    """Simulated whole (2P + 1D at TP 1: 3 GPUs, $7/h) and sustaining 24 req/s >= the target 16: its
    own 3 GPUs serve the target, headroom 24 / 16 - 1 = +50 %."""
    result = {
        "max_rate_per_s": 24.0,
        "tensor_parallel_size": 1,
        "replicas": 3,
        "router": "prefill least_requests, decode least_requests",
        "price_per_hour": 2.0,
        "gpus_per_deployment": 3,
        "deployment_price_per_hour": 7.0,
        "at_max": {"output_tokens_per_request": {"mean": 100.0}},
    }
    sizing = _sizing(result, target=16)
    assert (sizing["gpus_for_target"], sizing["cost_per_hour_for_target"]) == (3, 7.0)
    assert sizing["headroom_frac"] == pytest.approx(0.5)
    assert sizing["cost_per_million_output_tokens"] == pytest.approx(7.0 / (16 * 100 * 3600) * 1e6)


def test_the_binding_pool_is_the_one_requests_waited_for():
    decode_bound = {"transfer_wait_p99_s": 1.5, "prefill_queue_p99_s": 0.1, "decode_kv_usage_frac": 0.97}
    decode_bound |= {"decode_blocked_by_kv_memory_frac": 0.8}
    prefill_bound = {
        "transfer_wait_p99_s": 0.01,
        "prefill_queue_p99_s": 2.5,
        "prefill_blocked_by_token_budget_frac": 0.6,
    }
    assert binding_pool([decode_bound], ttft_p99_s=2.0)["pool"] == "decode"
    pool = binding_pool([prefill_bound, decode_bound], ttft_p99_s=3.0)
    # The worst seed's waits: queue 2.5 s against 1.5 s of transfer wait.
    assert pool["pool"] == "prefill" and pool["wait_p99_s"] == 2.5
    assert pool["admission_blocked_frac"]["blocked_by_token_budget_frac"] == pytest.approx(0.3)
    # Neither wait is half of p99 TTFT: the iterations are slow, no pool to name.
    assert binding_pool([{"transfer_wait_p99_s": 0.1, "prefill_queue_p99_s": 0.2}], ttft_p99_s=2.0) is None
    assert binding_pool([{"queue_p99_s": 3.0}], ttft_p99_s=2.0) is None  # not disaggregated


def test_pool_metrics_over_a_window_by_hand():
    """Two replicas, one per pool, each row holding until the next. In [0, 10]: the prefill replica is
    held back by KV memory (code 1) from 0 to 4 (40 %); the decode replica's KV usage is 0.5 for 5 s
    and 1.0 for 5 s (mean 0.75)."""
    base = {
        "num_requests_running": 1,
        "num_sequences_running": 1,
        "num_requests_waiting": 0,
        "preemptions": 0,
    }
    rows = []
    for replica, role, times, blockers, used in (
        (0, "prefill", [0, 4, 10], [1, 0, 0], [10, 10, 10]),
        (1, "decode", [0, 5, 10], [0, 0, 0], [50, 100, 100]),
    ):
        for time_s, blocker, tokens in zip(times, blockers, used, strict=True):
            rows.append(
                base
                | {"replica": replica, "role": role, "time_s": float(time_s), "admission_blocker": blocker}
                | {"used_tokens": tokens, "free_tokens": 100 - tokens}
            )
    series = _with_every_series_column(pd.DataFrame(rows))
    replicas = pd.DataFrame({"role": ["prefill", "decode"], "kv_pool_tokens": [100, 100]})
    requests = pd.DataFrame(
        {"arrival_s": [1.0, 2.0, 20.0], "prefill_replica": [0, 0, 0], "queue_s": [0.5, 1.0, 9.0]}
        | {"transfer_wait_s": [0.1, 0.2, 9.0], "transfer_s": [0.01, 0.02, 9.0]}
    )
    metrics = pool_metrics(requests, series, replicas, 0.0, 10.0)
    assert metrics["prefill_blocked_by_kv_memory_frac"] == pytest.approx(0.4)
    assert metrics["decode_kv_usage_frac"] == pytest.approx(0.75)
    assert metrics["prefill_queue_p99_s"] == pytest.approx(0.5 + 0.99 * 0.5)  # two in the window
    assert metrics["transfer_wait_p99_s"] == pytest.approx(0.1 + 0.99 * 0.1)


def _with_every_series_column(frame: pd.DataFrame) -> pd.DataFrame:
    from sim.outputs.metrics import SERIES_COLUMNS

    for name in SERIES_COLUMNS:
        if name not in frame:
            frame[name] = 0
    frame["kv_cache_usage_perc"] = frame["used_tokens"] / 100
    order = ["replica", "role", *SERIES_COLUMNS]
    return frame[order]


def test_total_pool_tokens_counts_both_pools():
    summary = {
        "prefill_replicas": 2,
        "prefill_kv_pool_tokens": 1000,
        "decode_replicas": 3,
        "kv_pool_tokens": 500,
    }
    assert total_pool_tokens(summary) == 3500
    assert total_pool_tokens({"kv_pool_tokens": 500, "replicas": 4}) == 2000
