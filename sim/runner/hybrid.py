"""A hybrid allocator's pool (``vllm-hybrid``, ``sglang-hybrid``, ``jenga``): the layout of its KV
groups from the memory the sizing left for KV, as each server groups the layers, and the settings
such a policy cannot take."""

from __future__ import annotations

import warnings
from collections.abc import Callable

from policies.hybrid.mamba import ALIGN_NEEDS_A_BLOCK
from sim.config import (
    ConfigError,
    ConfigWarning,
    EngineConfig,
    ExperimentConfig,
    VariantConfig,
)
from sim.hardware.capacity import KVCapacity
from sim.hardware.hybrid_capacity import vllm_hybrid_kv_capacity
from sim.hardware.jenga_capacity import jenga_kv_capacity
from sim.hardware.layers import STATE_KINDS, kind_counts
from sim.hardware.models import ModelSpec
from sim.kv.allocators import (
    HybridLayout,
    SGLangHybridLayout,
    SGLangMambaLayout,
    mamba_prefix_policy,
    sglang_hybrid_layout,
    vllm_mamba_cache_mode,
    vllm_mamba_chunk_size,
)
from sim.kv.jenga_layout import JengaLayout


def _warn_of_windows_past_max_model_len(variant: VariantConfig, model: ModelSpec, max_model_len: int) -> None:
    """A window (or chunk) no request reaches frees nothing: those layers hold every token, as full
    attention would. vLLM runs such a server the same way, so it is a warning, not an error."""
    spans = sorted(
        {kind.label for kind, _ in kind_counts(model.layer_kinds or ()) if _reaches(kind, max_model_len)}
    )
    if spans:
        warnings.warn(
            f"variant {variant.name}: {model.name}'s {', '.join(spans)} layers never release a block: "
            f"no request is longer than max_model_len ({max_model_len:,} tokens), so they hold every "
            f"token, as full attention would",
            ConfigWarning,
            stacklevel=2,
        )


def _reaches(kind: object, max_model_len: int) -> bool:
    """Whether a sliding window or a chunk spans every request of up to ``max_model_len`` tokens."""
    span = getattr(kind, "window", None) or getattr(kind, "chunk", None)
    return span is not None and span >= max_model_len


def hybrid_layout(
    config: ExperimentConfig,
    index: int,
    variant: VariantConfig,
    engine_config: EngineConfig,
    model: ModelSpec,
    capacity: KVCapacity,
    max_model_len: int,
    key: Callable[[str], str],
) -> HybridLayout | SGLangHybridLayout | SGLangMambaLayout | JengaLayout:
    """A hybrid allocator's pool from the memory the sizing left for KV, as vLLM groups the layers
    (sglang-hybrid: as SGLang splits it into its two pools; jenga: in large pages of the LCM of the
    layer types' pages; sglang-hybrid on a Mamba model: its full-attention and Mamba pools)."""
    where = f"variants.{index}.policy"
    problems = []
    if config.offload_for(variant) is not None:
        problems.append(f"{where}: {variant.policy} has no host tier (offload:); use policy prefix or radix")
    if variant.pin_shared_prefixes:
        problems.append(
            f"variants.{index}.pin_shared_prefixes: {variant.policy} has no prefix cache to pin into"
        )
    if engine_config.preemption_mode == "swap":
        problems.append(f"{key('preemption_mode')}: {variant.policy} preempts by recompute only")
    if variant.policy == "jenga" and engine_config.num_gpu_blocks_override is not None:
        problems.append(f"{key('num_gpu_blocks_override')}: jenga sizes its large pages from the KV memory")
    if variant.policy == "jenga" and engine_config.scheduler != "vllm":
        # (SGLang's budget is one count of free tokens; Jenga's room is per type, in small pages.)
        problems.append(f"{key('scheduler')}: jenga runs with vLLM's scheduler (Jenga is built on vLLM)")
    jenga_caching = variant.policy == "jenga" and bool(engine_config.enable_prefix_caching)
    if jenga_caching and any(isinstance(kind, STATE_KINDS) for kind, _ in model.layer_kind_counts):
        problems.append(
            f"{key('enable_prefix_caching')}: jenga's prefix caching has no rule for {model.name}'s Mamba / "
            "linear-attention layers (sim/kv/jenga_prefix.py); set it false, or use policy vllm-hybrid"
        )
    if problems:
        raise ConfigError("\n".join(problems))
    _warn_of_windows_past_max_model_len(variant, model, max_model_len)
    prefill_tokens = min(
        engine_config.max_num_batched_tokens if engine_config.enable_chunked_prefill else max_model_len,
        max_model_len,
    )
    batches_in_flight = 2 if engine_config.async_scheduling else 1
    try:
        if variant.policy == "sglang-hybrid":
            return sglang_hybrid_layout(
                model,
                capacity.available_kv_bytes,
                max_model_len=max_model_len,
                prefill_tokens=prefill_tokens,
                kv_cache_dtype=engine_config.kv_cache_dtype,
                tensor_parallel_size=engine_config.tensor_parallel_size,
                overlap=engine_config.async_scheduling,
                # (SGLang's SWA or Mamba radix cache)
                prefix_caching=bool(engine_config.enable_prefix_caching),
                **variant.options,
            )
        if variant.policy == "jenga":
            jenga = jenga_kv_capacity(
                model,
                capacity.available_kv_bytes,
                max_model_len=max_model_len,
                block_size=engine_config.block_size,
                kv_cache_dtype=engine_config.kv_cache_dtype,
                # (With prefix caching a prompt is allocated whole in every type: sim/kv/jenga_prefix.py.)
                max_in_flight_tokens=max_model_len
                if jenga_caching
                else batches_in_flight * engine_config.max_num_batched_tokens,
                tensor_parallel_size=engine_config.tensor_parallel_size,
                **variant.options,
            )
            return JengaLayout(jenga, max_model_len, prefill_tokens, jenga_caching)
    except ValueError as error:
        if str(error).startswith("large_page_bytes"):  # (jenga's option: the key it came from)
            raise ConfigError(f"variants.{index}.options.{error}") from None
        raise ConfigError(f"{where}: {variant.policy}: {error}") from None
    # (vllm-hybrid caches prefixes when enable_prefix_caching is true; unset keeps it off.)
    prefix_caching = bool(engine_config.enable_prefix_caching)
    try:
        mamba_cache_mode = vllm_mamba_cache_mode(
            model,
            variant.options.get("mamba_cache_mode"),
            prefix_caching,
            engine_config.enable_chunked_prefill,
            option_key=f"variants.{index}.options.mamba_cache_mode",
            caching_key=key("enable_prefix_caching"),
            chunked_key=key("enable_chunked_prefill"),
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None
    try:
        hybrid = vllm_hybrid_kv_capacity(
            model,
            capacity.available_kv_bytes,
            max_model_len=max_model_len,
            block_size=engine_config.block_size,
            kv_cache_dtype=engine_config.kv_cache_dtype,
            mamba_cache_mode=mamba_cache_mode,
            mamba_chunk_size=vllm_mamba_chunk_size(model) if mamba_cache_mode == "all" else None,
            max_num_batched_tokens=engine_config.max_num_batched_tokens,
            max_concurrent_batches=batches_in_flight,
            tensor_parallel_size=engine_config.tensor_parallel_size,
            num_gpu_blocks_override=engine_config.num_gpu_blocks_override,
        )
    except ValueError as error:
        raise ConfigError(f"{where}: {variant.policy}: {error}") from None
    if mamba_cache_mode == "align" and prefill_tokens < hybrid.block_size <= max_model_len:
        raise ConfigError(
            f"{key('max_num_batched_tokens')}: {engine_config.max_num_batched_tokens:,} is less than the "
            f"{hybrid.block_size:,}-token block {model.name} takes with Mamba layers: {ALIGN_NEEDS_A_BLOCK}"
        )
    try:
        marconi = mamba_prefix_policy(
            model,
            hybrid,
            variant.options,
            mamba_cache_mode,
            option_prefix=f"variants.{index}.options.",
            caching_key=key("enable_prefix_caching"),
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return HybridLayout(hybrid, max_model_len, prefill_tokens, prefix_caching, marconi, mamba_cache_mode)
