"""SGLang's two token pools for a model with sliding-window (SWA) and full-attention layers.

SGLang (``--disable-radix-cache``, its hybrid SWA memory on, as it is by default for the models it
lists in ``is_hybrid_swa_model``: gpt-oss, Llama 4, MiMo-V2, Step-3.5) keeps two separate pools of
token slots (``SWAKVPool``): one for the full-attention layers, one for the sliding-window layers,
each drawn by its own allocator (``SWATokenToKVPoolAllocator`` over two
``TokenToKVPoolAllocator``\\s, page size 1 by default). Every token a request computes takes a slot
in both (``alloc``); the SWA slots outside the window are freed later (``policies/hybrid/
sglang_sliding_window.py``).

How the pools are sized, as ``ModelRunnerKVCacheMixin`` does it
(``python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py``):

1. ``profile_max_num_token``: ``max_total_num_tokens = rest_memory // cell_size``, where
   ``cell_size = F x n_full + S x n_swa`` bytes (``get_cell_size_per_token``: ``F`` and ``S`` a
   token's K and V in one full / one SWA layer: ``kv_heads x (head_dim + v_head_dim) x dtype``),
   then rounded down to the page size (``init_memory``).
2. ``set_num_tokens_hybrid_swa`` solves ``full x F x n_full + swa x S x n_swa = total_memory`` with
   ``swa = r x full`` (``r = swa_full_tokens_ratio``, 0.8 by default in ``server_args.py``) and
   ``total_memory = max_total_num_tokens x cell_size``:
   ``full = int(total_memory / (F x n_full + r x S x n_swa))``, ``swa = int(full x r)``, each
   rounded down to the page size; ``max_total_num_tokens`` becomes ``full``.
3. The pools: ``SWAKVPool(size=full, size_swa=swa)``; SGLang logs
   ``Use sliding window memory pool. full_layer_tokens=..., swa_layer_tokens=...``.

Read at sgl-project/sglang commit 001ccef0072a4537d4ec6bdd50a73e6feb2c907d
(``model_runner_kv_cache_mixin.py``) and 00381c02b8ad9f78982f46986b63aeab5fc71fe9
(``mem_cache/swa_memory_pool.py``: ``SWAKVPool``, ``SWATokenToKVPoolAllocator``). kvsim's
available KV bytes (:func:`sim.hardware.capacity.size_kv_pool`) stand for SGLang's ``rest_memory``
(which SGLang derives from ``--mem-fraction-static`` instead). Not modelled: the one padding slot
every SGLang pool keeps past its size (slot 0), Llama 4's chunked local attention,
``--max-total-tokens``. A model with Mamba layers gets SGLang's Mamba pool instead
(``sim/hardware/sglang_mamba_capacity.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.hardware.layers import STATE_KINDS, ChunkedLocal, FullAttention, MlpOnly, SlidingWindow
from sim.hardware.models import ModelSpec, resolve_model

__all__ = ["DEFAULT_SWA_FULL_TOKENS_RATIO", "SGLangHybridCapacity", "sglang_hybrid_kv_capacity"]

DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8
"""``ServerArgs.swa_full_tokens_ratio``'s default."""

GIB = 1 << 30


@dataclass(frozen=True)
class SGLangHybridCapacity:
    """The two pools SGLang builds on one GPU (tokens of every full layer, tokens of every SWA layer)."""

    model: str
    available_kv_bytes: int
    swa_full_tokens_ratio: float
    page_size: int
    window: int
    full_layers: int
    swa_layers: int
    layer_bytes: int
    """K and V of one token in one layer, one GPU (the same in full and SWA layers)."""
    max_total_num_tokens: int
    """``profile_max_num_token``'s tokens of every layer, before the split."""
    full_tokens: int
    swa_tokens: int

    @property
    def cell_size(self) -> int:
        """Bytes of one token in every layer (``get_cell_size_per_token``)."""
        return self.layer_bytes * (self.full_layers + self.swa_layers)

    @property
    def groups(self) -> tuple[tuple[str, int], ...]:
        """``(pool, layers)`` of the two pools, full first."""
        return (("full", self.full_layers), ("swa", self.swa_layers))

    @property
    def num_blocks(self) -> int:
        """Pages of both pools together."""
        return (self.full_tokens + self.swa_tokens) // self.page_size

    @property
    def pool_bytes(self) -> int:
        """Bytes both pools' slots take (without SGLang's padding page)."""
        return self.layer_bytes * (self.full_tokens * self.full_layers + self.swa_tokens * self.swa_layers)

    def capacity_lines(self) -> list[str]:
        """SGLang's start-up lines: the split (``set_num_tokens_hybrid_swa``) and ``SWAKVPool``'s
        memory (each pool's buffer holds ``size + page_size`` tokens: slot 0 pads)."""
        page = self.page_size
        buffers = self.layer_bytes * (
            (self.full_tokens + page) * self.full_layers + (self.swa_tokens + page) * self.swa_layers
        )
        return [
            "Use sliding window memory pool. "
            f"full_layer_tokens={self.full_tokens}, swa_layer_tokens={self.swa_tokens}",
            f"SWAKVPool mem usage: {buffers / GIB:.2f} GB, swa size: {self.swa_tokens}, "
            f"full size: {self.full_tokens}",
        ]


def check_swa_full_tokens_ratio(value: object) -> float:
    """The ratio as a float; ``ValueError`` naming the option unless it is a positive finite number."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(
            f"option swa_full_tokens_ratio must be a positive finite number (SWA pool tokens per "
            f"full-attention pool token; SGLang's default {DEFAULT_SWA_FULL_TOKENS_RATIO}), got {value!r}"
        )
    return float(value)


def sglang_attention_layers(spec: ModelSpec) -> tuple[int, int, int]:
    """``(full layers, SWA layers, window)``; ``ValueError`` for a model SGLang's two pools do not fit."""
    kinds = [kind for kind in (spec.layer_kinds or ()) if not isinstance(kind, MlpOnly)]
    if any(isinstance(kind, STATE_KINDS) for kind in kinds):
        raise ValueError(
            f"{spec.name} has Mamba/linear-attention layers: SGLang keeps no SWA pools for it but a Mamba "
            "pool (HybridLinearKVPool, MambaPool), sized by sim.hardware.sglang_mamba_capacity"
        )
    if any(isinstance(kind, ChunkedLocal) for kind in kinds):
        raise ValueError(
            f"{spec.name} has chunked local attention layers: SGLang's attention_chunk_size eviction "
            "(Llama 4) is not modelled by sglang-hybrid; use policy vllm-hybrid"
        )
    windows = {kind.window for kind in kinds if isinstance(kind, SlidingWindow)}
    swa_layers = sum(1 for kind in kinds if isinstance(kind, SlidingWindow))
    full_layers = sum(1 for kind in kinds if isinstance(kind, FullAttention))
    if not swa_layers:
        raise ValueError(
            f"{spec.name} has no sliding-window layers: SGLang keeps one token pool for it (no SWAKVPool); "
            "use policy paged"
        )
    if not full_layers:
        raise ValueError(
            f"{spec.name} has no full-attention layers: SGLang's all-SWA pool is not modelled by sglang-hybrid"
        )
    if len(windows) > 1:
        raise ValueError(
            f"{spec.name} has sliding windows of {sorted(windows)} tokens: SGLang evicts by one "
            "sliding_window_size per model"
        )
    return full_layers, swa_layers, windows.pop()


def sglang_hybrid_kv_capacity(
    model: ModelSpec | str,
    available_kv_bytes: int,
    *,
    swa_full_tokens_ratio: float = DEFAULT_SWA_FULL_TOKENS_RATIO,
    page_size: int = 1,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
) -> SGLangHybridCapacity:
    """SGLang's full and SWA pool sizes from ``available_kv_bytes`` (module docstring: the steps).

    Raises ``ValueError`` for invalid arguments (naming the option), for a model the two pools do
    not fit (Mamba or chunked local layers, no sliding or no full layers, several windows) and, as
    SGLang does ("Not enough memory"), when the full pool gets no token."""
    spec = resolve_model(model)
    ratio = check_swa_full_tokens_ratio(swa_full_tokens_ratio)
    for label, value in (("available_kv_bytes", available_kv_bytes), ("option page_size", page_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{label} must be a positive integer, got {value!r}")
    spec.check_tensor_parallel(tensor_parallel_size)
    full_layers, swa_layers, window = sglang_attention_layers(spec)
    layer_bytes = spec.kv_bytes_per_token_per_layer(kv_cache_dtype, tensor_parallel_size)

    cell_size = layer_bytes * (full_layers + swa_layers)
    max_total_num_tokens = available_kv_bytes // cell_size // page_size * page_size
    # set_num_tokens_hybrid_swa, in the same (float) arithmetic.
    total_memory = max_total_num_tokens * cell_size
    denominator = layer_bytes * full_layers + ratio * layer_bytes * swa_layers
    full_tokens = int(total_memory / denominator)
    swa_tokens = int(full_tokens * ratio)
    full_tokens = full_tokens // page_size * page_size
    swa_tokens = swa_tokens // page_size * page_size
    if full_tokens <= 0 or swa_tokens <= 0:
        # (SGLang itself refuses a full pool of no token: "Not enough memory"; an empty SWA pool runs nothing.)
        raise ValueError(
            f"{spec.name}: {available_kv_bytes:,} bytes of KV cache give SGLang's pools {full_tokens} full and "
            f"{swa_tokens} SWA tokens (cell size {cell_size:,} B, swa_full_tokens_ratio {ratio}): no request "
            "can run. Give the KV cache more memory"
        )
    return SGLangHybridCapacity(
        model=spec.name,
        available_kv_bytes=available_kv_bytes,
        swa_full_tokens_ratio=ratio,
        page_size=page_size,
        window=window,
        full_layers=full_layers,
        swa_layers=swa_layers,
        layer_bytes=layer_bytes,
        max_total_num_tokens=max_total_num_tokens,
        full_tokens=full_tokens,
        swa_tokens=swa_tokens,
    )
