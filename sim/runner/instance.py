"""One engine configuration prepared: the checks, the pool, one policy instance per replica (with
their host tiers or a hybrid layout), the cost model, the pinned prefixes and speculation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from policies.base import KVCachePolicy, OutOfKVMemory, PolicyInputError, PoolSpec, make_policy, policy_class
from sim.cluster.routers import make_router
from sim.config import (
    DATA_PARALLEL_ROUTER,
    ClusterConfig,
    ConfigError,
    EngineConfig,
    ExperimentConfig,
    VariantConfig,
)
from sim.hardware.capacity import KVCapacity, OverrideTooLargeError
from sim.hardware.gpus import GpuSpec
from sim.hardware.models import ModelSpec
from sim.kv.allocators import is_hybrid_allocator
from sim.kv.coordinator import KVCoordinator
from sim.offload import OffloadConfig, host_tier_blocks
from sim.runner.checks import (
    check_engine,
    check_parallelism,
    check_pool_holds_a_request,
    check_reservation_fits,
    cluster_key,
    has_prefix_lookup,
    unknown_options_error,
)
from sim.runner.hybrid import hybrid_layout
from sim.runner.prepared import PreparedVariant
from sim.runner.resolve import engine_cost_model, engine_draft, engine_pool, policy_name_for
from sim.runner.speculative import speculation_problem, speculative_knobs
from token_content import TokenContent


def prepare_instance(
    config: ExperimentConfig,
    index: int,
    variant: VariantConfig,
    engine_config: EngineConfig,
    model: ModelSpec,
    gpu: GpuSpec,
    base_dir: Path,
    prefixes: list[TokenContent] | None,
    key: Callable[[str], str],
    cluster: ClusterConfig | None,
    replicas: int,
    options_key: str | None = None,
    gpu_key: str = "gpu",
) -> tuple[PreparedVariant, list[str]]:
    """``replicas`` instances of one engine configuration (a variant's, or a disaggregated pool's, whose
    own ``options`` and ``gpu`` are named by ``options_key`` and ``gpu_key``)."""
    options_key = options_key or f"variants.{index}.options"
    errors, warnings = check_engine(engine_config, model.name, model.max_position_embeddings, key)
    parallel_errors, parallel_warnings = check_parallelism(config, index, engine_config, model, key)
    errors += parallel_errors
    warnings += parallel_warnings
    if not parallel_errors:
        try:
            capacity = engine_pool(model, gpu, engine_config)
        except OverrideTooLargeError as error:
            errors.insert(0, f"{key('num_gpu_blocks_override')}: {error.detail}")
        except ValueError as error:
            errors.insert(0, f"model, {gpu_key}: {error}")
    if errors:
        raise ConfigError("\n".join(errors))  # one problem per line
    max_model_len = engine_config.max_model_len or model.max_position_embeddings
    policy_name = policy_name_for(variant, engine_config)
    if not is_hybrid_allocator(policy_name) and model.state_bytes_per_request() > 0:
        # vLLM too refuses a Mamba model with the hybrid manager off: a state is not per-token K/V.
        raise ConfigError(
            f"variants.{index}.policy: {model.name} has Mamba/linear-attention layers, a state of "
            f"{model.state_bytes_per_request():,} B per request that policy {policy_name!r} cannot hold "
            "(it keeps per-token K/V only); use policy vllm-hybrid"
        )
    # (A hybrid pool holds less per request than full attention would: vLLM checks it per group.)
    if not is_hybrid_allocator(policy_name):
        pool_error = check_pool_holds_a_request(capacity, engine_config.block_size, max_model_len, key)
        if pool_error:
            raise ConfigError(pool_error)
    option_error = unknown_options_error(policy_name, variant.options)
    if option_error:
        raise ConfigError(f"{options_key}: {option_error}")
    if engine_config.speculative is not None:
        speculation_error = speculation_problem(policy_name, key)
        if speculation_error:
            raise ConfigError(f"variants.{index}.policy: {speculation_error}")
    if engine_config.data_parallel_size > 1:
        # A data-parallel server's ranks are a cluster behind vLLM's own balancer.
        cluster = ClusterConfig.model_validate(
            {"replicas": engine_config.data_parallel_size, "router": DATA_PARALLEL_ROUTER}
        )
        replicas = engine_config.data_parallel_size
    if (
        cluster is not None
        and cluster.disaggregation is None
        and make_router(cluster).needs_prefix_lookup
        and not has_prefix_lookup(policy_name)
    ):
        raise ConfigError(
            f"{cluster_key(config, index, 'router')}: router {cluster.router!r} routes by the prefix each "
            f"replica's cache would serve, but policy {policy_name!r} has no prefix cache (no lookup). "
            "Use policy prefix or radix, or another router"
        )
    hybrid = None
    if is_hybrid_allocator(policy_name):
        hybrid = hybrid_layout(config, index, variant, engine_config, model, capacity, max_model_len, key)
        pool = hybrid.pool
        replica_policies: list[KVCachePolicy | KVCoordinator] = [
            hybrid.make_coordinator() for _ in range(replicas)
        ]
        policy: KVCachePolicy | KVCoordinator = replica_policies[0]
        offload = None
    else:
        pool, policies_made, offload = _single_group_policies(
            config,
            index,
            variant,
            engine_config,
            capacity,
            policy_name,
            max_model_len,
            key,
            replicas,
            options_key,
        )
        replica_policies = list(policies_made)
        policy = policies_made[0]
    costs = engine_cost_model(config, model, gpu, engine_config, base_dir, capacity.kv_pool_tokens)
    pinned_tokens = 0
    if variant.pin_shared_prefixes:
        try:
            # Every replica pins the same prefixes in its own cache: the summary reports one replica's.
            pinned = [
                pin_prefixes(item, prefixes or [])
                for item in replica_policies
                if isinstance(item, KVCachePolicy)
            ]
            pinned_tokens = pinned[0]
        except ConfigError as error:
            raise ConfigError(f"variants.{index}.{error}") from None
    prepared = PreparedVariant(
        variant,
        engine_config,
        policy_name,
        capacity,
        pool,
        max_model_len,
        policy,
        costs,
        pinned_tokens,
        cluster,
        replica_policies,
    )
    prepared.offload = offload
    prepared.lockstep = costs.expert_parallel is not None
    prepared.hybrid = hybrid
    prepared.speculative = speculative_knobs(engine_config, base_dir, key, max_model_len)
    prepared.draft = engine_draft(model, engine_config)
    return prepared, warnings


def _single_group_policies(
    config: ExperimentConfig,
    index: int,
    variant: VariantConfig,
    engine_config: EngineConfig,
    capacity: KVCapacity,
    policy_name: str,
    max_model_len: int,
    key: Callable[[str], str],
    replicas: int,
    options_key: str,
) -> tuple[PoolSpec, list[KVCachePolicy], OffloadConfig | None]:
    """A single-group policy's pool and its instances, one per replica, with their host tiers."""
    try:
        # (The pool's size already reads the options: a radix page_size sets the slots per page.)
        pool = PoolSpec(
            policy_class(policy_name).pool_slots_from_memory(
                capacity.kv_memory_slots, engine_config.block_size, variant.options
            ),
            engine_config.block_size,
            max_model_len,
            capacity.kv_bytes_per_token,
        )
        replica_policies = [make_policy(policy_name, pool, **variant.options) for _ in range(replicas)]
    except (TypeError, PolicyInputError) as error:
        raise ConfigError(f"{options_key}: {error}") from None
    policy = replica_policies[0]
    reservation_error = check_reservation_fits(policy, max_model_len, key)
    if reservation_error:
        raise ConfigError(reservation_error)
    offload = config.offload_for(variant)
    if offload is not None:
        for replica_policy in replica_policies:  # each replica has its own host memory
            attach_host_tier(
                replica_policy,
                offload,
                engine_config.block_size * capacity.kv_bytes_per_token,
                variant,
                index,
            )
    return pool, replica_policies, offload


def attach_host_tier(
    policy: KVCachePolicy, offload: OffloadConfig, block_bytes: int, variant: VariantConfig, index: int
) -> None:
    """Give ``policy`` the host tier ``offload`` asks for, or say why it cannot have one."""
    where = f"variants.{index}.offload" if variant.offload else "offload"
    blocks = host_tier_blocks(offload, block_bytes)
    if blocks < 1:
        raise ConfigError(
            f"{where}.host_memory_gib: {offload.host_memory_gib:g} GiB holds no KV block "
            f"({block_bytes:,} bytes each)"
        )
    try:
        policy.enable_host_tier(blocks, offload.write_policy)
    except PolicyInputError as error:
        raise ConfigError(f"{where}: {error}") from None


def pin_prefixes(policy: KVCachePolicy, prefixes: list[TokenContent]) -> int:
    """Warm-up: pin each shared prefix's full blocks. Returns the slots pinned."""
    try:
        return sum(policy.pin_prefix(prefix) for prefix in prefixes)
    except (PolicyInputError, OutOfKVMemory) as error:
        raise ConfigError(f"pin_shared_prefixes: {error}") from None
