"""A disaggregated variant prepared: its prefill and decode pools, each an instance of its own (its
GPU, engine overrides, policy), the link between them, and what such a cluster cannot run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from policies.base import policy_class
from sim.cluster.link import resolve_link
from sim.cluster.routers import ROUTER_CLASSES
from sim.config import (
    ClusterConfig,
    ConfigError,
    DisaggregationConfig,
    EngineConfig,
    ExperimentConfig,
    PoolConfig,
    VariantConfig,
)
from sim.hardware.gpus import GpuSpec, resolve_gpu
from sim.hardware.models import ModelSpec
from sim.kv.allocators import is_hybrid_allocator
from sim.runner.checks import cluster_key, has_prefix_lookup
from sim.runner.instance import prepare_instance
from sim.runner.prepared import PreparedVariant
from sim.runner.resolve import error_text
from token_content import TokenContent


def prepare_disaggregated(
    config: ExperimentConfig,
    index: int,
    cluster: ClusterConfig,
    model: ModelSpec,
    gpu: GpuSpec,
    base_dir: Path,
    prefixes: list[TokenContent] | None,
) -> tuple[PreparedVariant, list[str]]:
    """Both pools of a disaggregated variant, each prepared as an instance of its own (its GPU, engine
    overrides, policy); the variant is its decode pool, with the prefill pool beside it."""
    variant = config.variants[index]
    spec = cluster.disaggregation
    assert spec is not None
    where = cluster_key(config, index, "disaggregation")
    problems: list[str] = []
    pools: dict[str, PreparedVariant] = {}
    warnings: list[str] = []
    for role, pool in (("prefill", spec.prefill), ("decode", spec.decode)):
        prefix = f"{where}.{role}"
        try:
            pools[role], notes = _prepare_pool(
                config, index, variant, role, pool, prefix, model, gpu, base_dir, prefixes, cluster
            )
            warnings += notes
        except ConfigError as error:
            problems += str(error).split("\n")
    if not problems:
        problems += _disaggregation_problems(pools["prefill"], pools["decode"], spec, where)
        if any(pool.engine.speculative is not None for pool in pools.values()):
            problems.append(f"{where}: speculative decoding with disaggregated pools is not modelled yet")
    if problems:
        raise ConfigError("\n".join(problems))
    prepared = pools["decode"]
    prepared.prefill_pool = pools["prefill"]
    prepared.cluster = cluster
    try:
        prepared.link = resolve_link(spec.link, pools["prefill"].gpu or gpu, f"{where}.link")
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return prepared, warnings


def _prepare_pool(
    config: ExperimentConfig,
    index: int,
    variant: VariantConfig,
    role: str,
    pool: PoolConfig,
    prefix: str,
    model: ModelSpec,
    gpu: GpuSpec,
    base_dir: Path,
    prefixes: list[TokenContent] | None,
    cluster: ClusterConfig,
) -> tuple[PreparedVariant, list[str]]:
    """One pool: the variant with the pool's policy and options, the engine section with the variant's
    then the pool's overrides, on the pool's GPU."""
    try:
        pool_gpu = resolve_gpu(pool.gpu) if pool.gpu is not None else gpu
    except (ValueError, KeyError) as error:
        raise ConfigError(f"{prefix}.gpu: {error_text(error)}") from None
    engine_config = config.engine_for(variant)
    try:
        engine_config = EngineConfig.model_validate(engine_config.model_dump() | pool.engine)
    except ValidationError as error:
        raise ConfigError(f"{prefix}.engine: {error.errors()[0]['msg']}") from None
    update: dict[str, Any] = {"name": f"{variant.name}-{role}"} if role == "prefill" else {}
    if pool.policy is not None:
        update["policy"] = pool.policy
    if pool.options is not None:
        update["options"] = pool.options
    pool_variant = variant.model_copy(update=update)

    def key(name: str) -> str:
        if name in pool.engine:
            return f"{prefix}.engine.{name}"
        return f"variants.{index}.engine.{name}" if name in variant.engine else f"engine.{name}"

    prepared, warnings = prepare_instance(
        config,
        index,
        pool_variant,
        engine_config,
        model,
        pool_gpu,
        base_dir,
        prefixes,
        key,
        None,
        pool.replicas,
        f"{prefix}.options" if pool.options is not None else None,
        f"{prefix}.gpu" if pool.gpu is not None else "gpu",
    )
    prepared.gpu = pool_gpu
    prepared.replica_count = pool.replicas
    return prepared, [f"{prefix}: {note}" for note in warnings]


def _disaggregation_problems(
    prefill: PreparedVariant, decode: PreparedVariant, spec: DisaggregationConfig, where: str
) -> list[str]:
    """What a disaggregated cluster cannot do, each naming its key."""
    problems = []
    for role, pool in (("prefill", prefill), ("decode", decode)):
        if is_hybrid_allocator(pool.policy_name):
            problems.append(
                f"{where}.{role}.policy: {pool.policy_name} does not run in a disaggregated cluster yet"
            )
        elif not policy_class(pool.policy_name).uses_blocks:
            problems.append(
                f"{where}.{role}.policy: {pool.policy_name} has no blocks: KV is sent and received block by "
                "block (vLLM's NIXL connector, Mooncake); use paged, prefix or radix"
            )
        if pool.engine.data_parallel_size > 1 or pool.engine.enable_expert_parallel:
            problems.append(
                f"{where}.{role}.engine: data or expert parallelism inside a disaggregated pool is not modelled "
                "(give the pool more replicas instead)"
            )
        if pool.engine.scheduler != "vllm":
            problems.append(
                f"{where}.{role}.engine.scheduler: {pool.engine.scheduler} is not modelled in disaggregated "
                "pools (only vllm's scheduler)"
            )
    if prefill.engine.block_size != decode.engine.block_size:
        problems.append(
            f"{where}: the pools' block sizes differ ({prefill.engine.block_size} and "
            f"{decode.engine.block_size}): blocks are sent as they are; give both the same engine.block_size"
        )
    if spec.decider.mode == "prefix_threshold" and not has_prefix_lookup(decode.policy_name):
        problems.append(
            f"{where}.decider.mode: prefix_threshold reads the decode replica's prefix cache, but policy "
            f"{decode.policy_name!r} has none; use prefix or radix in the decode pool, or mode: always"
        )
    for role, pool_config in (("prefill", spec.prefill), ("decode", spec.decode)):
        pool = prefill if role == "prefill" else decode
        if ROUTER_CLASSES[pool_config.router].needs_prefix_lookup and not has_prefix_lookup(pool.policy_name):
            problems.append(
                f"{where}.{role}.router: {pool_config.router} routes by prefix, but policy {pool.policy_name!r} "
                "has no prefix cache"
            )
    return problems
