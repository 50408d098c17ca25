"""Everything about a point that can fail without simulating it, checked before the first point runs.

Schema validation catches unknown keys and bad values; this builds what a run builds before its
first iteration (model and GPU, the KV pool, the policy with its options, the cost model, the
workload) so that a typo in a policy option or a missing trace file stops a sweep up front, with the
point named, instead of failing point after point.
"""

from __future__ import annotations

from pathlib import Path

from policies.base import PolicyError, PoolSpec, make_policy
from sim.config import ConfigError, ExperimentConfig
from sim.costs.core import CostModelError
from sim.hardware.capacity import KVCapacity
from sim.kv.allocators import is_hybrid_allocator
from sim.runner import (
    engine_cost_model,
    policy_name_for,
    resolve_hardware,
    size_pool,
    speculative_knobs,
    unknown_options_error,
)
from workloads import WorkloadError, build_workload


def preflight(config: ExperimentConfig, base_dir: Path, where: str) -> None:
    """Raise :class:`ConfigError` (prefixed with ``where``) if any variant of ``config`` cannot start."""
    try:
        for variant in config.variants:
            prepare_variant(config, variant.name, base_dir)
        build_workload(config.workload, seed=config.seed, base_dir=base_dir)
    except (ConfigError, CostModelError, PolicyError, WorkloadError) as error:
        raise ConfigError(f"{where}: {error}") from None


def prepare_variant(config: ExperimentConfig, variant_name: str, base_dir: Path) -> KVCapacity:
    """Build one variant's hardware, pool, policy and cost model; return its KV capacity.

    Raises :class:`ConfigError` when the model does not fit the GPU (a plan reports that candidate
    as infeasible) or when the policy's options are wrong."""
    variant = next(v for v in config.variants if v.name == variant_name)
    model, gpu = resolve_hardware(config, base_dir)
    engine = config.engine_for(variant)
    capacity = size_pool(model, gpu, engine)
    max_model_len = engine.max_model_len or model.max_position_embeddings
    pool = PoolSpec(capacity.kv_pool_tokens, engine.block_size, max_model_len, capacity.kv_bytes_per_token)
    policy_name = policy_name_for(variant, engine)
    option_error = unknown_options_error(policy_name, variant.options)
    if option_error:
        raise ConfigError(f"variant {variant.name!r}: options: {option_error}")
    if not is_hybrid_allocator(policy_name):  # (a hybrid pool is sized and built by the run itself)
        make_policy(policy_name, pool, **variant.options)
    engine_cost_model(config, model, gpu, engine, base_dir, capacity.kv_pool_tokens)
    speculative_knobs(engine, base_dir, max_model_len=max_model_len)  # (drafts that fit a sequence)
    return capacity
