"""vLLM's start-up checks and kvsim's own, each returning its problem as text that names the config key
(the caller gathers every variant's problems before raising): the engine knobs against the model,
data and expert parallelism, a pool too small for one request, a contiguous reservation that could
never be placed, and a policy's options."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

from policies.base import KVCachePolicy, policy_class
from policies.contiguous import ContiguousPolicy
from sim.config import (
    VLLM_BLOCK_SIZES,
    EngineConfig,
    ExperimentConfig,
)
from sim.hardware.capacity import KVCapacity
from sim.hardware.models import ModelSpec, expert_parallel_problems
from sim.kv.allocators import (
    hybrid_allocator_options,
    is_hybrid_allocator,
)


def has_prefix_lookup(policy_name: str) -> bool:
    """Does the policy implement the side-effect-free prefix lookup (a prefix cache)?"""
    if is_hybrid_allocator(policy_name):
        return False
    return policy_class(policy_name).lookup is not KVCachePolicy.lookup


def cluster_key(config: ExperimentConfig, index: int, name: str) -> str:
    return f"variants.{index}.cluster.{name}" if name in config.variants[index].cluster else f"cluster.{name}"


def unknown_options_error(policy_name: str, options: Mapping[str, object]) -> str | None:
    """The options the policy does not take, named with the valid ones; None when there are none.
    (Checked by name up front, not from the constructor's TypeError, whose wording a compiled build
    changes.)"""
    valid = policy_options(policy_name)
    unknown = sorted(set(options) - set(valid))
    if not unknown:
        return None
    return (
        f"unknown option(s) {', '.join(map(repr, unknown))} for policy {policy_name!r} "
        f"(valid: {', '.join(valid) or 'none'})"
    )


def policy_options(name: str) -> list[str]:
    """The options a policy takes (its constructor's keyword arguments after the pool)."""
    if is_hybrid_allocator(name):
        return list(hybrid_allocator_options(name))
    # The class's signature, not its __init__'s: a compiled class's __init__ shows only *args, **kwargs.
    return list(inspect.signature(policy_class(name)).parameters)[1:]


def check_engine(
    engine: EngineConfig, model_name: str, model_max_len: int, key: Callable[[str], str]
) -> tuple[list[str], list[str]]:
    """vLLM's start-up checks of the engine knobs against the model: ``(errors, warnings)``, each
    naming the key (``key(name)`` gives its path in the config)."""
    errors: list[str] = []
    warnings: list[str] = []
    max_model_len = engine.max_model_len or model_max_len
    if engine.max_model_len is not None and engine.max_model_len > model_max_len:
        text = (
            f"{key('max_model_len')}: {engine.max_model_len:,} is beyond {model_name}'s context length "
            f"({model_max_len:,} tokens, max_position_embeddings)"
        )
        if engine.allow_long_max_model_len:
            warnings.append(f"{text}; accepted (allow_long_max_model_len: true)")
        else:
            errors.append(
                f"{text}; vLLM refuses this too. Lower it, or set engine.allow_long_max_model_len: true "
                "(vLLM: VLLM_ALLOW_LONG_MAX_MODEL_LEN=1) if the model really handles longer contexts"
            )
    if engine.block_size > max_model_len:
        errors.append(
            f"{key('block_size')}: {engine.block_size:,} is larger than max_model_len ({max_model_len:,}): "
            "even the longest request would leave most of its only block empty"
        )
    elif engine.block_size not in VLLM_BLOCK_SIZES:
        warnings.append(
            f"{key('block_size')}: {engine.block_size} is not a block size vLLM accepts "
            f"({', '.join(map(str, VLLM_BLOCK_SIZES))}); simulated as given"
        )
    if not engine.enable_chunked_prefill and engine.max_num_batched_tokens < max_model_len:
        errors.append(
            f"{key('max_num_batched_tokens')}: {engine.max_num_batched_tokens:,} is smaller than "
            f"max_model_len ({max_model_len:,}) with enable_chunked_prefill: false, which vLLM refuses "
            "(longer prompts could never be prefilled). Raise max_num_batched_tokens, lower "
            "max_model_len, or enable chunked prefill"
        )
    return errors, warnings


def check_parallelism(
    config: ExperimentConfig, index: int, engine: EngineConfig, model: ModelSpec, key: Callable[[str], str]
) -> tuple[list[str], list[str]]:
    """Data and expert parallelism kvsim runs (:func:`expert_parallel_problems`), and data
    parallelism's own limits: ``(errors, warnings)``, each naming the key."""
    errors = [
        f"{key(knob)}: {text}"
        for knob, text in expert_parallel_problems(
            model, engine.data_parallel_size, engine.tensor_parallel_size, engine.enable_expert_parallel
        )
    ]
    warnings: list[str] = []
    variant = config.variants[index]
    if engine.data_parallel_size > 1 and (config.cluster is not None or variant.cluster):
        where = f"variants.{index}.cluster" if variant.cluster else "cluster"
        errors.append(
            f"{key('data_parallel_size')}: {engine.data_parallel_size} makes the server a group of ranks "
            f"behind vLLM's own balancer; a {where}: section of such servers is not modelled. Use one or "
            "the other"
        )
    if (
        engine.enable_expert_parallel
        and not errors
        and engine.data_parallel_size * engine.tensor_parallel_size == 1
    ):
        warnings.append(
            f"{key('enable_expert_parallel')}: one GPU (data_parallel_size x tensor_parallel_size = 1) "
            "has every expert; nothing is dealt out, as in vLLM"
        )
    return errors, warnings


def check_pool_holds_a_request(
    capacity: KVCapacity, block_size: int, max_model_len: int, key: Callable[[str], str]
) -> str:
    """vLLM refuses to start when one request of ``max_model_len`` tokens cannot fit in the KV cache."""
    pool_tokens = capacity.num_gpu_blocks * block_size
    if max_model_len <= pool_tokens:
        return ""
    return (
        f"max_model_len ({max_model_len:,} tokens) is larger than the KV cache holds "
        f"({capacity.num_gpu_blocks:,} blocks x {block_size} = {pool_tokens:,} tokens), which vLLM refuses "
        f"at start-up. Lower {key('max_model_len')} to at most {pool_tokens:,}, or give the KV cache more "
        "memory (gpu_memory_utilization, kv_cache_memory_bytes, num_gpu_blocks_override, a bigger GPU)"
    )


def check_reservation_fits(policy: KVCachePolicy, max_model_len: int, key: Callable[[str], str]) -> str:
    """A contiguous ``max`` reservation (rounded up by buddy placement) larger than the biggest region an
    empty pool can place would reject every request: refuse it with the numbers."""
    if not isinstance(policy, ContiguousPolicy) or policy.reservation != "max":
        return ""
    region = policy.region_size(policy.reservation_size(1, 1))
    largest = policy.largest_region()
    if region <= largest:
        return ""
    rounding = f" (rounded up to {region:,} by buddy placement)" if region != max_model_len else ""
    biggest = (
        f"its largest buddy chunk is {largest:,} slots"
        if policy.placement == "buddy"
        else f"the KV pool holds {largest:,} slots"
    )
    return (
        f"contiguous reservation 'max' reserves max_model_len = {max_model_len:,} slots per request"
        f"{rounding}, but {biggest}: no request could ever be admitted. Lower {key('max_model_len')} "
        f"to at most {largest:,}, or give the KV cache more memory"
    )
