"""What an engine section resolves to: the model and GPU a config names, the policy's name under
``enable_prefix_caching``, speculative decoding's draft, the KV pool and the cost model."""

from __future__ import annotations

from pathlib import Path

from sim.config import (
    ConfigError,
    EngineConfig,
    ExperimentConfig,
    VariantConfig,
)
from sim.costs.core import CostModel
from sim.costs.factory import make_cost_model
from sim.costs.speculative import SpeculativeCostModel, speculative_step
from sim.hardware.capacity import KVCapacity, size_kv_pool
from sim.hardware.draft import Draft, draft_for
from sim.hardware.gpus import GpuSpec, resolve_gpu
from sim.hardware.models import ModelSpec, expert_parallel_size, resolve_model


def resolve_hardware(
    config: ExperimentConfig, base_dir: Path, where: str | Path | None = None
) -> tuple[ModelSpec, GpuSpec]:
    """The model and GPU a config names; errors name the config file (``where``) and the key."""
    where = where if where is not None else base_dir
    model_ref = config.model
    candidate = base_dir / model_ref
    if model_ref.endswith(".json") and candidate.is_file():
        model_ref = str(candidate)
    try:
        model = resolve_model(model_ref)
    except (ValueError, KeyError) as error:
        raise ConfigError(f"{where}: model: {error_text(error)}") from None
    try:
        gpu = resolve_gpu(config.gpu)
    except (ValueError, KeyError) as error:
        raise ConfigError(f"{where}: gpu: {error_text(error)}") from None
    return model, gpu


def error_text(error: BaseException) -> str:
    # KeyError's str() is the repr of its argument: strip the quotes it adds.
    return str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)


def policy_name_for(variant: VariantConfig, engine: EngineConfig) -> str:
    if engine.enable_prefix_caching is None:
        return variant.policy
    if engine.enable_prefix_caching and variant.policy == "paged":
        return "prefix"
    if not engine.enable_prefix_caching and variant.policy in ("prefix", "radix"):
        raise ConfigError(
            f"variant {variant.name!r}: policy {variant.policy!r} contradicts enable_prefix_caching: false"
        )
    if engine.enable_prefix_caching and variant.policy == "contiguous":
        raise ConfigError(f"variant {variant.name!r}: the contiguous policy has no prefix cache")
    return variant.policy


def engine_expert_parallel_size(model: ModelSpec, engine: EngineConfig) -> int:
    """The GPUs the engine section deals the routed experts over (1 without expert parallelism);
    raises ``ValueError`` for data or expert parallelism kvsim does not run."""
    return expert_parallel_size(
        model, engine.data_parallel_size, engine.tensor_parallel_size, engine.enable_expert_parallel
    )


def engine_draft(model: ModelSpec, engine: EngineConfig) -> Draft | None:
    """Speculative decoding's draft for the engine section, None without speculation."""
    speculative = engine.speculative
    if speculative is None:
        return None
    try:
        return draft_for(
            speculative.method,
            model,
            kv_cache_dtype=engine.kv_cache_dtype,
            tensor_parallel_size=engine.tensor_parallel_size,
            draft_model=speculative.draft_model,
            draft_layers=speculative.draft_layers,
            draft_vocab_size=speculative.draft_vocab_size,
        )
    except ValueError as error:
        raise ConfigError(f"engine.speculative.draft_model: {error}") from None


def engine_pool(model: ModelSpec, gpu: GpuSpec, engine: EngineConfig) -> KVCapacity:
    """The KV pool the engine section's sizing keys give (one data-parallel rank's); raises what
    :func:`size_kv_pool` raises (:class:`ModelDoesNotFitError` when the weights leave no room)."""
    draft = engine_draft(model, engine)
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
        expert_parallel_size=engine_expert_parallel_size(model, engine),
        data_parallel_size=engine.data_parallel_size,
        draft_weight_bytes=0 if draft is None else draft.weight_bytes,
        draft_kv_bytes_per_token=0 if draft is None else draft.kv_bytes_per_token,
    )


def size_pool(model: ModelSpec, gpu: GpuSpec, engine: EngineConfig) -> KVCapacity:
    try:
        return engine_pool(model, gpu, engine)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def engine_cost_model(
    config: ExperimentConfig,
    model: ModelSpec,
    gpu: GpuSpec,
    engine: EngineConfig,
    base_dir: Path,
    kv_pool_tokens: int,
) -> CostModel:
    """The experiment's cost model for one instance of the engine section (block size, cache dtype,
    tensor parallelism; with expert parallelism, one data-parallel rank's); with speculative
    decoding its decode step is the speculative step (``sim/costs/speculative.py``), priced per batch
    size up to the largest batch that can run (``max_num_seqs``, and no more sequences than the pool
    of ``kv_pool_tokens`` holds tokens: a file may set ``max_num_seqs`` far past both)."""
    target = make_cost_model(
        config.cost_model,
        model,
        gpu,
        block_size=engine.block_size,
        kv_cache_dtype=engine.kv_cache_dtype,
        base_dir=base_dir,
        tensor_parallel_size=engine.tensor_parallel_size,
        data_parallel_size=engine.data_parallel_size,
        expert_parallel_size=engine_expert_parallel_size(model, engine),
    )
    speculative = engine.speculative
    if speculative is None:
        return target
    draft = engine_draft(model, engine)
    assert draft is not None
    draft_decode = None
    if draft.step_shapes is not None:
        # The draft priced by the same cost model as the target, on the draft's shapes.
        draft_costs = make_cost_model(
            config.cost_model,
            draft.step_shapes,
            gpu,
            block_size=engine.block_size,
            kv_cache_dtype=engine.kv_cache_dtype,
            base_dir=base_dir,
            tensor_parallel_size=engine.tensor_parallel_size,
        )
        draft_decode = draft_costs.decode
    largest_batch = min(engine.max_num_seqs, kv_pool_tokens)
    step = speculative_step(target, speculative.num_speculative_tokens, draft_decode, largest_batch)
    return SpeculativeCostModel(target, step, f"{speculative.method}, k={speculative.num_speculative_tokens}")
