"""Run an experiment: every variant replays the identical request stream; results go to one folder."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from policies.base import (
    KVCachePolicy,
    OutOfKVMemory,
    PolicyInputError,
    PoolSpec,
    TokenContent,
    make_policy,
)
from sim.capacity import KVCapacity, size_kv_pool
from sim.config import ConfigError, EngineConfig, ExperimentConfig, VariantConfig
from sim.costs import make_cost_model
from sim.engine import Engine, EngineKnobs
from sim.gpus import GpuSpec, resolve_gpu
from sim.models import ModelSpec, resolve_model
from sim.outputs import FileSink, MemorySink, OutputSink
from workloads import build_workload

GIB = 1024**3


@dataclass
class VariantResult:
    """A finished variant: its summary, and its tables wherever the sink put them."""

    name: str
    summary: dict[str, Any]
    capacity_lines: list[str]
    sink: OutputSink

    @property
    def timeseries(self) -> pd.DataFrame:
        return self.sink.timeseries()

    @property
    def requests(self) -> pd.DataFrame:
        return self.sink.requests()


def resolve_hardware(config: ExperimentConfig, base_dir: Path) -> tuple[ModelSpec, GpuSpec]:
    model_ref = config.model
    candidate = base_dir / model_ref
    if model_ref.endswith(".json") and candidate.is_file():
        model_ref = str(candidate)
    try:
        return resolve_model(model_ref), resolve_gpu(config.gpu)
    except (ValueError, KeyError) as error:
        raise ConfigError(f"{base_dir}: {error}") from None


def policy_name_for(variant: VariantConfig, engine: EngineConfig) -> str:
    if engine.enable_prefix_caching is None:
        return variant.policy
    if engine.enable_prefix_caching and variant.policy == "paged":
        return "prefix"
    if not engine.enable_prefix_caching and variant.policy == "prefix":
        raise ConfigError(
            f"variant {variant.name!r}: policy 'prefix' contradicts enable_prefix_caching: false"
        )
    if engine.enable_prefix_caching and variant.policy == "contiguous":
        raise ConfigError(f"variant {variant.name!r}: the contiguous policy has no prefix cache")
    return variant.policy


def size_pool(model: ModelSpec, gpu: GpuSpec, engine: EngineConfig) -> KVCapacity:
    try:
        return size_kv_pool(
            model,
            gpu,
            block_size=engine.block_size,
            kv_cache_dtype=engine.kv_cache_dtype,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            activation_reserve_bytes=engine.activation_reserve_bytes,
            kv_cache_memory_bytes=engine.kv_cache_memory_bytes,
            num_gpu_blocks_override=engine.num_gpu_blocks_override,
            tensor_parallel_size=engine.tensor_parallel_size,
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None


def run_variant(
    config: ExperimentConfig,
    variant: VariantConfig,
    base_dir: Path,
    *,
    progress: bool = False,
    out_dir: Path | None = None,
) -> VariantResult:
    """Run one variant. With ``out_dir`` its tables stream to ``out_dir/<variant>/`` as it runs (memory
    stays bounded by the running requests); without, they are kept in memory."""
    model, gpu = resolve_hardware(config, base_dir)
    engine_config = config.engine_for(variant)
    capacity = size_pool(model, gpu, engine_config)
    max_model_len = engine_config.max_model_len or model.max_position_embeddings
    pool = PoolSpec(
        capacity.kv_pool_tokens, engine_config.block_size, max_model_len, capacity.kv_bytes_per_token
    )
    policy_name = policy_name_for(variant, engine_config)
    try:
        policy = make_policy(policy_name, pool, **variant.options)
    except TypeError as error:
        raise ConfigError(
            f"variant {variant.name!r}: bad policy options {variant.options}: {error}"
        ) from None
    costs = make_cost_model(
        config.cost_model,
        model,
        gpu,
        block_size=engine_config.block_size,
        kv_cache_dtype=engine_config.kv_cache_dtype,
        base_dir=base_dir,
    )
    workload = build_workload(config.workload, seed=config.seed, base_dir=base_dir)
    pinned_tokens = pin_prefixes(policy, workload.shared_prefixes()) if variant.pin_shared_prefixes else 0
    block_bytes = engine_config.block_size * capacity.kv_bytes_per_token
    knobs = EngineKnobs(
        max_model_len=max_model_len,
        max_num_seqs=engine_config.max_num_seqs,
        max_num_batched_tokens=engine_config.max_num_batched_tokens,
        enable_chunked_prefill=engine_config.enable_chunked_prefill,
        preemption_mode=engine_config.preemption_mode,
        swap_space_blocks=int(engine_config.swap_space * GIB // block_bytes),
        watermark=engine_config.watermark,
        on_oom=engine_config.on_oom,
        beam_divergence_prob=engine_config.beam_divergence_prob,
        step_mode=engine_config.step_mode,
    )
    requests = workload.requests()
    total = workload.describe().get("num_requests")
    bar = tqdm(total=total, desc=variant.name, unit="req", disable=not progress, leave=False)
    sink: OutputSink = (
        FileSink(out_dir / variant.name, config.output.timeseries_format)
        if out_dir is not None
        else MemorySink()
    )
    engine = Engine(
        policy,
        costs,
        knobs,
        _counted(requests, bar),
        seed=config.seed,
        follow_up=workload.follow_up,
        block_size=engine_config.block_size,
        sink=sink,
    )
    started = time.perf_counter()
    engine.run(until_s=config.until_s)
    wall_s = time.perf_counter() - started
    bar.close()
    sink.close()
    requests_table = sink.requests(columns=SUMMARY_REQUEST_COLUMNS)
    summary = summarize(
        engine, requests_table, variant, policy_name, pool, capacity, costs.label, wall_s, max_model_len
    )
    summary["pinned_tokens"] = pinned_tokens
    return VariantResult(variant.name, summary, capacity.capacity_lines(max_model_len), sink)


# The per-request columns a summary needs (read back alone from a streamed file).
SUMMARY_REQUEST_COLUMNS = ["outcome", "n", "beam_width", "output_tokens", "ttft_s", "tpot_s", "e2e_s"]


def pin_prefixes(policy: KVCachePolicy, prefixes: list[TokenContent]) -> int:
    """Warm-up: pin each shared prefix's full blocks. Returns the slots pinned."""
    try:
        return sum(policy.pin_prefix(prefix) for prefix in prefixes)
    except (PolicyInputError, OutOfKVMemory) as error:
        raise ConfigError(f"pin_shared_prefixes: {error}") from None


def _counted(requests, bar):
    for request in requests:
        bar.update(1)
        yield request


def summarize(
    engine: Engine,
    requests: pd.DataFrame,
    variant: VariantConfig,
    policy_name: str,
    pool: PoolSpec,
    capacity: KVCapacity,
    cost_label: str,
    wall_s: float,
    max_model_len: int,
) -> dict[str, Any]:
    simulated_s = float(engine.env.now)
    finished = requests[requests["outcome"] == "finished"]
    stats = engine.policy.stats
    widths = finished[["n", "beam_width"]].max(axis=1) if len(finished) else pd.Series(dtype=float)
    output_tokens = float((finished["output_tokens"] * widths).sum()) if len(finished) else 0.0
    summary: dict[str, Any] = {
        "variant": variant.name,
        "policy": policy_name,
        "policy_options": dict(variant.options),
        "block_size": pool.block_size,
        "max_model_len": max_model_len,
        "kv_pool_tokens": pool.kv_pool_tokens,
        "kv_pool_bytes": pool.kv_pool_tokens * pool.kv_bytes_per_token,
        "kv_bytes_per_token": pool.kv_bytes_per_token,
        "num_gpu_blocks": capacity.num_gpu_blocks,
        "cost_model": cost_label,
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
        "e2e_p50_s": _percentile(finished["e2e_s"], 50),
        "e2e_p99_s": _percentile(finished["e2e_s"], 99),
        "iterations": engine.counters.iterations,
        "simulated_s": simulated_s,
        "wall_s": wall_s,
    }
    summary.update(engine.recorder.time_averages(simulated_s))
    return summary


def _percentile(values: pd.Series, q: float) -> float | None:
    clean = values.dropna()
    return float(np.percentile(clean, q)) if len(clean) else None


def run_experiment(
    config: ExperimentConfig, config_path: Path, *, progress: bool = False, out_dir: Path | None = None
) -> list[VariantResult]:
    base_dir = config_path.parent
    variants = tqdm(config.variants, desc=config.name, unit="variant", disable=not progress)
    return [
        run_variant(config, variant, base_dir, progress=progress, out_dir=out_dir) for variant in variants
    ]
