"""``policy: vllm-hybrid`` end to end: a hybrid model's groups behind the coordinator, sized as vLLM
sizes them, replayed beside the single-group policies on one stream; on a model whose layers are
all full attention it must run exactly as ``paged`` (an independent check of the whole path); and
what it cannot do yet is refused before anything runs, naming the key."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from sim.config import ConfigError, ConfigWarning, validate_experiment
from sim.hardware.hybrid_capacity import vllm_hybrid_kv_capacity
from sim.hardware.models import resolve_model
from sim.outputs.metrics import BREAKDOWN_COLUMNS
from sim.runner import prepare_experiment, run_experiment

BREAKDOWN = list(BREAKDOWN_COLUMNS)


def config(model: str, variants: list[dict], **engine) -> dict:
    return {
        "name": "hybrid",
        "seed": 3,
        "model": model,
        "gpu": "H100-80GB",
        "engine": {
            "block_size": 16,
            "max_model_len": 16384,
            "max_num_batched_tokens": 8192,
            "enable_prefix_caching": False,
            "kv_cache_memory_bytes": 1_500_000_000,
            **engine,
        },
        "cost_model": "analytic",
        "workload": {
            "num_requests": 120,
            "arrival": {"kind": "poisson", "rate_per_s": 20},
            "prompt_len": {"kind": "uniform", "low": 1000, "high": 6000},
            "output_len": {"kind": "uniform", "low": 50, "high": 400},
        },
        "variants": variants,
    }


def refused_with(raw: dict, change: dict, message: str, tmp_path) -> None:
    """``raw`` with ``change`` merged in (a section's keys into that section) is refused before
    anything runs, with ``message``."""
    for key, value in change.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) and key in raw else value
    with pytest.raises(ConfigError, match=re.escape(message)):
        prepare_experiment(validate_experiment(raw), tmp_path / "c.yaml")


def run(raw: dict, tmp_path):
    experiment = validate_experiment(raw)
    return {
        result.name: result
        for result in run_experiment(experiment, tmp_path / "c.yaml", out_dir=tmp_path / "out")
    }


PAGED = {"name": "paged", "policy": "paged"}
HYBRID = {"name": "hybrid", "policy": "vllm-hybrid"}


def test_gpt_oss_on_the_hybrid_manager_holds_more_requests_and_its_pool_stays_whole(tmp_path):
    results = run(config("gpt-oss-20b", [PAGED, HYBRID]), tmp_path)
    paged, hybrid = results["paged"].summary, results["hybrid"].summary
    # vLLM's own capacity line for this pool (its arithmetic: tests/test_hybrid_capacity.py).
    # (kv_cache_memory_bytes gives the 1.5e9 bytes; async scheduling, on by default, keeps two
    # batches in flight.)
    expected = vllm_hybrid_kv_capacity(
        resolve_model("gpt-oss-20b"),
        1_500_000_000,
        max_model_len=16384,
        max_num_batched_tokens=8192,
        max_concurrent_batches=2,
    )
    assert results["hybrid"].capacity_lines == expected.capacity_lines()
    assert hybrid["kv_groups"] == 2 and paged["kv_groups"] == 1
    assert hybrid["num_gpu_blocks"] == expected.num_blocks
    # Two groups of 12 layers each: a slot is 12 layers' K and V, half a full-attention token.
    assert hybrid["kv_bytes_per_token"] * 2 == paged["kv_bytes_per_token"]
    assert hybrid["kv_pool_tokens"] == expected.num_blocks * 16
    # The sliding half keeps 128 tokens a request, not thousands: more requests run at once.
    assert hybrid["peak_running"] > paged["peak_running"]
    assert hybrid["preemptions"] <= paged["preemptions"]
    series = pd.read_parquet(tmp_path / "out" / "hybrid" / "timeseries.parquet")
    assert (series[BREAKDOWN].sum(axis=1) == hybrid["kv_pool_tokens"]).all()
    assert (series[BREAKDOWN] >= 0).all().all()


def test_a_mamba_hybrid_keeps_its_states_apart_from_the_tokens(tmp_path):
    """Nemotron-H: 4 attention layers and 24 Mamba2 layers; vLLM raises the block to 1,040 tokens so
    that an attention page holds a state. Decoded tokens fill the attention group's slots, never the
    state blocks: no breakdown category goes negative, and the breakdown sums to the pool."""
    raw = config("Nemotron-H-8B-Base-8K", [HYBRID], max_model_len=8192, kv_cache_memory_bytes=3_000_000_000)
    raw["workload"]["prompt_len"] = {"kind": "uniform", "low": 500, "high": 4000}
    results = run(raw, tmp_path)
    summary = results["hybrid"].summary
    # Groups of 4 layers (the fewest of any kind): one of attention, six of Mamba2 states.
    assert summary["block_size"] == 1040 and summary["kv_groups"] == 7
    series = pd.read_parquet(tmp_path / "out" / "hybrid" / "timeseries.parquet")
    assert (series[BREAKDOWN] >= 0).all().all()
    assert (series[BREAKDOWN].sum(axis=1) == summary["kv_pool_tokens"]).all()
    assert summary["mean_reserved_frac"] >= 0


def test_a_mamba_model_on_a_policy_that_cannot_hold_states_is_refused(tmp_path):
    raw = config("Nemotron-H-8B-Base-8K", [HYBRID, PAGED], max_model_len=8192)
    with pytest.raises(
        ConfigError, match="variants.1.policy: Nemotron-H-8B-Base-8K has Mamba/linear-attention"
    ):
        prepare_experiment(validate_experiment(raw), tmp_path / "c.yaml")


def test_on_a_model_of_full_attention_only_the_hybrid_manager_is_paged_exactly(tmp_path):
    """One group of every layer over a shared pool: the same pool, the same blocks taken and given
    back at the same iterations, so every request's times and every memory sample equal paged's."""
    results = run(config("Llama-3.1-8B", [PAGED, HYBRID], kv_cache_memory_bytes=2_600_000_000), tmp_path)
    assert results["hybrid"].summary["kv_pool_tokens"] == results["paged"].summary["kv_pool_tokens"]
    assert results["paged"].summary["preemptions"] > 0  # (a pool tight enough to matter)
    tables = {
        name: pd.read_parquet(tmp_path / "out" / name / "requests.parquet").drop(columns=[], errors="ignore")
        for name in ("paged", "hybrid")
    }
    pd.testing.assert_frame_equal(tables["paged"], tables["hybrid"])
    series = {
        name: pd.read_parquet(tmp_path / "out" / name / "timeseries.parquet") for name in ("paged", "hybrid")
    }
    pd.testing.assert_frame_equal(
        series["paged"][BREAKDOWN + ["time_s"]], series["hybrid"][BREAKDOWN + ["time_s"]]
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"offload": {"host_memory_gib": 4}}, "variants.1.policy: vllm-hybrid has no host tier"),
        ({"variants": [PAGED, {**HYBRID, "pin_shared_prefixes": True}]}, "variants.1.pin_shared_prefixes"),
        (
            {"engine": {"preemption_mode": "swap"}},
            "engine.preemption_mode: vllm-hybrid preempts by recompute only",
        ),
        ({"variants": [PAGED, {**HYBRID, "options": {"window": 3}}]}, "unknown option(s) 'window'"),
        (
            {"engine": {"kv_cache_memory_bytes": 10_000_000}},
            "vllm-hybrid: gpt-oss-20b: one request of max_model_len",
        ),
    ],
)
def test_what_the_hybrid_manager_cannot_do_is_refused_before_anything_runs(tmp_path, change, message):
    raw = config("gpt-oss-20b", [PAGED, HYBRID])
    for key, value in change.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) and key in raw else value
    with pytest.raises(ConfigError, match=_escaped(message)):
        prepare_experiment(validate_experiment(raw), tmp_path / "c.yaml")
    assert not (tmp_path / "out").exists()


def shared_prompt_config(enable_prefix_caching: bool | None) -> dict:
    """gpt-oss-20b beside the prefix policy, 60 requests of which 9 in 10 start with one of two
    system prompts of 1,000-2,000 tokens (the requests' own tokens follow)."""
    raw = config(
        "gpt-oss-20b",
        [{"name": "paged", "policy": "paged"}, HYBRID],
        enable_prefix_caching=enable_prefix_caching,
    )
    raw["workload"] |= {
        "num_requests": 60,
        "prompt_len": {"kind": "uniform", "low": 100, "high": 1500},
        "shared_prefix": {
            "num_prefixes": 2,
            "prefix_len": {"kind": "uniform", "low": 1000, "high": 2000},
            "fraction": 0.9,
        },
    }
    return raw


def test_prefix_caching_on_the_hybrid_manager_serves_the_shared_system_prompts(tmp_path):
    """With enable_prefix_caching: true, vllm-hybrid hits the system prompts (both groups must hold the
    hit: the sliding group its last window's blocks), and its pool stays whole at every sample, in total
    and per KV group, cached blocks included."""
    results = run(shared_prompt_config(True), tmp_path)
    hybrid = results["hybrid"].summary
    assert results["paged"].summary["policy"] == "prefix"
    assert hybrid["requests_finished"] == 60
    assert hybrid["prefix_cache_hit_rate"] > 0.3
    assert results["paged"].summary["prefix_cache_hit_rate"] >= hybrid["prefix_cache_hit_rate"] * 0.9
    series = pd.read_parquet(tmp_path / "out" / "hybrid" / "timeseries.parquet")
    assert (series[BREAKDOWN].sum(axis=1) == hybrid["kv_pool_tokens"]).all()
    assert (series[BREAKDOWN] >= 0).all().all()
    assert series["cached_tokens"].max() > 0
    groups = pd.read_parquet(tmp_path / "out" / "hybrid" / "kv_groups.parquet")
    entries = groups["kv_group"].nunique()
    assert entries == 3  # the full group, the sliding group, the shared pool's blank blocks
    totals = groups[BREAKDOWN].to_numpy().reshape(-1, entries * len(BREAKDOWN)).sum(axis=1)
    assert (totals == hybrid["kv_pool_tokens"]).all()
    assert (groups[BREAKDOWN] >= 0).all().all()


def test_prefix_caching_off_or_unset_runs_the_hybrid_manager_as_before(tmp_path):
    """false and unset are today's vllm-hybrid (tests/golden pins it on the shipped configs): the same
    requests, the same memory at every sample, no hit."""
    tables = {}
    for setting in (False, None):
        out = tmp_path / str(setting)
        results = run(shared_prompt_config(setting), out)
        assert results["hybrid"].summary["prefix_cache_hits"] == 0
        tables[setting] = (
            pd.read_parquet(out / "out" / "hybrid" / "requests.parquet"),
            pd.read_parquet(out / "out" / "hybrid" / "timeseries.parquet"),
        )
    for before, after in zip(tables[False], tables[None], strict=True):
        pd.testing.assert_frame_equal(before, after)


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


def test_a_window_no_request_reaches_warns_and_runs_as_full_attention(tmp_path):
    """Mistral-7B-v0.1 slides over 4,096 tokens; with max_model_len 2,048 its window frees nothing:
    kvsim warns (vLLM runs such a server) and the run holds what paged holds, slot for slot."""
    raw = config("Mistral-7B-v0.1", [PAGED, HYBRID], max_model_len=2048)
    raw["workload"] |= {"num_requests": 40, "prompt_len": {"kind": "uniform", "low": 500, "high": 1800}}
    with pytest.warns(
        ConfigWarning,
        match=r"variant hybrid: Mistral-7B-v0\.1's sliding\(4096\) layers never release a block: no request is longer than max_model_len \(2,048 tokens\)",
    ):
        results = run(raw, tmp_path)
    paged, hybrid = results["paged"].summary, results["hybrid"].summary
    assert hybrid["mean_used_frac"] * hybrid["kv_pool_tokens"] == pytest.approx(
        paged["mean_used_frac"] * paged["kv_pool_tokens"], rel=1e-9
    )


def test_a_chunk_no_request_crosses_warns_too():
    from sim.config import VariantConfig
    from sim.runner.hybrid import _warn_of_windows_past_max_model_len

    variant = VariantConfig(name="hybrid", policy="vllm-hybrid")
    scout = resolve_model("Llama-4-Scout-17B-16E")
    with pytest.warns(
        ConfigWarning,
        match=r"chunked\(8192\) layers never release a block: no request is longer than max_model_len \(8,192 tokens\)",
    ):
        _warn_of_windows_past_max_model_len(variant, scout, 8192)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_of_windows_past_max_model_len(variant, scout, 8193)  # a request of 8,193 tokens crosses it


@pytest.mark.parametrize("policy", ["vllm-hybrid", "sglang-hybrid", "jenga"])
def test_a_cluster_of_hybrid_replicas_runs_and_sums_to_its_replicas(policy, tmp_path):
    """Two replicas behind a round-robin router. The replicas' summaries used to read each engine's
    single policy, which an engine with several KV groups does not have: the run crashed after the
    simulation (found by ``tools/fuzz_step_modes.py``). Each replica serves half the stream."""
    raw = config("gpt-oss-20b", [{"name": policy, "policy": policy}])
    raw["workload"]["num_requests"] = 40
    raw["cluster"] = {"replicas": 2, "router": "round_robin"}
    result = run(raw, tmp_path)[policy]
    replicas = result.replica_summaries
    assert [row["requests_routed"] for row in replicas] == [20, 20]
    assert sum(row["requests_finished"] for row in replicas) == result.summary["requests_finished"] == 40
