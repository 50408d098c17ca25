"""vLLM's KV pool and start-up lines for a model whose layers are not all full attention.

vLLM V1 (its hybrid KV-cache manager) keeps one block pool for every layer kind. What this module
reproduces, step by step, for a :class:`~sim.hardware.models.ModelSpec` with layer kinds:

1. **Specs.** Each attention layer gets a ``FullAttentionSpec``, ``SlidingWindowSpec`` or
   ``ChunkedLocalAttentionSpec``, each Mamba/linear-attention layer a ``MambaSpec``; MLP-only blocks
   get none. A page is ``block_size`` tokens of one layer: ``block_size x 2 x kv_heads x head_dim x
   dtype`` for attention, the whole state for Mamba.
2. **Mamba hybrids raise the block size** (``Platform._align_hybrid_block_size``; older vLLM:
   ``HybridAttentionMambaModelConfig.verify_and_update_config``) so an attention page holds at least
   one Mamba state: with ``align = max(kernel_block_size, block_size)``, the block becomes
   ``align x cdiv(state page, align x attention bytes per token)`` ("all" mamba_cache_mode: the
   least multiple of ``lcm(mamba_chunk_size, align)`` that holds the state), and the Mamba page is
   padded up to the attention page.
3. **Hybrid manager off** (``--disable-hybrid-kv-cache-manager``; vLLM also turns it off on
   non-GPU platforms, with a KV connector that does not support it, and for chunked local
   attention when ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE`` is 0, the default before
   2026): when full attention sits beside sliding or chunked layers, those become full attention
   (``unify_hybrid_kv_cache_specs``); a Mamba model cannot start that way.
4. **Groups** (``get_kv_cache_groups``): one group of every layer when all specs are equal; else
   the layers of each spec, split into groups of ``group_size`` layers (the fewest layers of any
   spec, or the most when that is under 1.5 times the fewest), the last group of a spec padded.
   gpt-oss-20b: 12 sliding + 12 full, group size 12, two groups. Gemma 3: 52 sliding + 10 full,
   group size 10, six sliding groups (8 padding layers) and one full.
5. **Blocks**: ``num_blocks = available // page // group_size`` (every group's i-th layer shares
   one tensor of ``num_blocks`` pages), or ``num_gpu_blocks_override``.
6. **A request's worst case**, in blocks, per group (``max_memory_usage_bytes / page``): full
   ``cdiv(L, block)``; sliding ``cdiv(min(W - 1 + F, L), block) + 1``; chunked
   ``cdiv(min(C + F, L), block)``; Mamba 1 ("none"), 2 ("align") or ``cdiv(L, block)`` ("all"),
   with ``L`` = ``max_model_len`` and ``F`` = ``max_in_flight_tokens`` = ``max_concurrent_batches x
   max_num_batched_tokens`` (2 batches with async scheduling at pipeline size 1; older vLLM used
   ``max_num_batched_tokens`` itself, ``max_concurrent_batches=1``).
7. **The lines**: ``Maximum concurrency = num_blocks / sum of the groups' blocks per request``
   and ``GPU KV cache size = int(concurrency x L)`` tokens (``tokens_line="concurrency"``, vLLM
   main in 2026); older vLLM printed ``num_blocks // groups x the smallest group block size``
   (``tokens_line="blocks"``; 0.10.2 in the public Qwen3-Next log the tests check).

Read at vLLM commit 001cabc1be16a59a70d720ed61a13b678c060a18 (``vllm/v1/core/kv_cache_utils.py``,
``vllm/v1/kv_cache_interface.py``: specs, grouping, ``get_num_blocks``, the concurrency),
02d710837549a368073552333f66d714477415d2 (``mamba_utils.py``: state shapes and dtypes) and
1936cf3841edb9781b06c50fc4daf4bac9d3b23e (``models/config.py``: the block-size raise); the 2026
changes (``max_in_flight_tokens``, the block-size raise moved to ``vllm/platforms/interface.py``
with the backend's kernel block size, the tokens line from the concurrency, ``mamba_cache_mode``
"all"/"align" by default with prefix caching) from copies of vLLM main in the public code index
whose commit is not recorded there. A model's available bytes are an input here:
:func:`sim.hardware.capacity.size_kv_pool` estimates them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from sim.hardware.layers import (
    STATE_KINDS,
    ChunkedLocal,
    FullAttention,
    LayerKind,
    MlpOnly,
    SlidingWindow,
    StateKind,
)
from sim.hardware.models import ModelSpec, resolve_model

__all__ = ["HybridKVCapacity", "KVCacheGroup", "MambaCacheMode", "TokensLine", "vllm_hybrid_kv_capacity"]

MambaCacheMode = Literal["none", "align", "all"]
TokensLine = Literal["concurrency", "blocks"]


@dataclass(frozen=True)
class KVCacheGroup:
    """One of vLLM's KV-cache groups: ``layers`` layers of one kind (``group_size - layers`` of the
    group's slots are padding), each request holding at most ``blocks_per_request`` of its blocks."""

    kind: LayerKind
    layers: int
    blocks_per_request: int


@dataclass(frozen=True)
class HybridKVCapacity:
    """The pool vLLM builds on one GPU and what it says about it at start-up."""

    model: str
    max_model_len: int
    block_size: int
    """Tokens per block of every group (raised for a Mamba hybrid)."""
    page_bytes: int
    """Bytes of one block of one layer, the same in every group (Mamba pages padded up to it)."""
    mamba_state_bytes: int
    """Bytes of one layer's Mamba state before padding (0 without state layers)."""
    group_size: int
    groups: tuple[KVCacheGroup, ...]
    num_blocks: int
    available_kv_bytes: int
    hybrid_manager: bool
    mamba_block_size: int = 0
    """Tokens per Mamba block: ``max_model_len`` in "none" mode, the block size otherwise (0 without
    state layers)."""
    tokens_line: TokensLine = "concurrency"

    @property
    def blocks_per_request(self) -> int:
        """Blocks one request of ``max_model_len`` tokens takes at worst, all groups together."""
        return sum(group.blocks_per_request for group in self.groups)

    @property
    def max_concurrency(self) -> float:
        """vLLM's "Maximum concurrency": ``num_blocks / blocks_per_request``."""
        return self.num_blocks / self.blocks_per_request

    @property
    def kv_cache_tokens(self) -> int:
        """vLLM's "GPU KV cache size": ``int(max_concurrency x max_model_len)``, or with
        ``tokens_line="blocks"`` ``num_blocks // groups x`` the smallest block size of any group."""
        if self.tokens_line == "blocks":
            smallest = min(self.block_size, self.mamba_block_size or self.block_size)
            return self.num_blocks // len(self.groups) * smallest
        return int(self.max_concurrency * self.max_model_len)

    @property
    def pool_bytes(self) -> int:
        """Bytes the pool takes: ``num_blocks`` pages in each of ``group_size`` shared tensors."""
        return self.num_blocks * self.page_bytes * self.group_size

    def capacity_lines(self) -> list[str]:
        """vLLM's two start-up lines, character for character."""
        return [
            f"GPU KV cache size: {self.kv_cache_tokens:,} tokens",
            f"Maximum concurrency for {self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x",
        ]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_positive(label: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{label} must be a positive integer, got {value!r}")


def _cache_kinds(spec: ModelSpec, hybrid_manager: bool) -> list[LayerKind]:
    """One kind per layer with a cache, after vLLM's unification when the hybrid manager is off."""
    kinds: list[LayerKind] = [kind for kind in (spec.layer_kinds or ()) if not isinstance(kind, MlpOnly)]
    if not kinds:
        kinds = [FullAttention()] * spec.num_layers
    distinct = set(kinds)
    if hybrid_manager or len(distinct) == 1:
        return kinds
    if any(not isinstance(kind, (FullAttention, SlidingWindow, ChunkedLocal)) for kind in distinct):
        raise ValueError(
            f"{spec.name} has Mamba/linear-attention layers and vLLM refuses to start it with the hybrid "
            'KV cache manager disabled ("Hybrid KV cache manager is disabled but failed to convert the KV '
            'cache specs to one unified type.")'
        )
    if not any(isinstance(kind, FullAttention) for kind in distinct):
        raise ValueError(
            f"{spec.name} mixes {', '.join(sorted(kind.label for kind in distinct))} without full-attention "
            "layers, which vLLM cannot unify with the hybrid KV cache manager disabled"
        )
    # unify_hybrid_kv_cache_specs: sliding and chunked layers allocate as full attention.
    return [FullAttention()] * len(kinds)


def _state_kind(spec: ModelSpec, kinds: list[LayerKind]) -> StateKind | None:
    states: set[StateKind] = {kind for kind in kinds if isinstance(kind, STATE_KINDS)}
    if len(states) > 1:
        raise ValueError(
            f"{spec.name} has {len(states)} different state shapes; vLLM sizes every Mamba layer of a "
            "model from one shape (get_mamba_state_shape_from_config)"
        )
    return next(iter(states), None)


def _hybrid_block_size(
    attention_bytes_per_token: int,
    state_bytes: int,
    block_size: int,
    kernel_block_size: int,
    mamba_cache_mode: MambaCacheMode,
    mamba_chunk_size: int | None,
) -> int:
    """The attention block size vLLM settles on so that one attention page holds one Mamba state."""
    alignment = max(kernel_block_size, block_size)
    if mamba_cache_mode == "all":
        if mamba_chunk_size is None:
            raise ValueError("mamba_cache_mode 'all' needs mamba_chunk_size (the model's Mamba chunk size)")
        _check_positive("mamba_chunk_size", mamba_chunk_size)
        chunk = math.lcm(mamba_chunk_size, alignment)
        needed = chunk * _cdiv(_cdiv(state_bytes, attention_bytes_per_token), chunk)
    else:
        needed = alignment * _cdiv(state_bytes, alignment * attention_bytes_per_token)
    return max(block_size, needed)


def _blocks_per_request(
    kind: LayerKind,
    block_size: int,
    max_model_len: int,
    max_in_flight_tokens: int,
    mamba_cache_mode: MambaCacheMode,
) -> int:
    """``max_memory_usage_bytes / page_size_bytes`` of the kind's spec."""
    if isinstance(kind, FullAttention):
        return _cdiv(max_model_len, block_size)
    if isinstance(kind, SlidingWindow):
        # +1: the window need not start at a block boundary.
        return _cdiv(min(kind.window - 1 + max_in_flight_tokens, max_model_len), block_size) + 1
    if isinstance(kind, ChunkedLocal):
        return _cdiv(min(kind.chunk + max_in_flight_tokens, max_model_len), block_size)
    if mamba_cache_mode == "all":
        return _cdiv(max_model_len, block_size)
    return 2 if mamba_cache_mode == "align" else 1


def _group_layers(kinds: list[LayerKind]) -> tuple[int, list[tuple[LayerKind, int]]]:
    """``(group_size, [(kind, real layers), ...])`` as ``get_kv_cache_groups`` splits the layers."""
    counts: dict[LayerKind, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    if len(counts) == 1:
        kind, count = next(iter(counts.items()))
        return count, [(kind, count)]
    fewest, most = min(counts.values()), max(counts.values())
    group_size = most if most < fewest * 1.5 else fewest
    groups: list[tuple[LayerKind, int]] = []
    for kind, count in counts.items():
        number = _cdiv(count, group_size)
        # layers[i::number] go to group i: the first (count % number) groups get one layer more.
        groups += [(kind, len(range(i, count, number))) for i in range(number)]
    return group_size, groups


def vllm_hybrid_kv_capacity(
    model: ModelSpec | str,
    available_kv_bytes: int,
    *,
    max_model_len: int | None = None,
    block_size: int = 16,
    kernel_block_size: int = 16,
    kv_cache_dtype: str = "auto",
    mamba_cache_dtype: str = "auto",
    mamba_ssm_cache_dtype: str = "auto",
    mamba_cache_mode: MambaCacheMode = "none",
    mamba_chunk_size: int | None = None,
    max_num_batched_tokens: int = 8192,
    max_concurrent_batches: int = 2,
    hybrid_kv_cache_manager: bool = True,
    tensor_parallel_size: int = 1,
    num_gpu_blocks_override: int | None = None,
    tokens_line: TokensLine = "concurrency",
) -> HybridKVCapacity:
    """The KV pool vLLM builds on one GPU from ``available_kv_bytes`` (vLLM's "Available KV cache
    memory") for ``model``, with its two start-up lines (module docstring: the steps).

    ``max_model_len`` defaults to the model's ``max_position_embeddings``. ``block_size`` is the
    block size before the Mamba raise (16 unless ``--block-size`` or the attention backend's
    preferred size says otherwise); ``kernel_block_size`` the backend's smallest kernel block
    (16 for FlashAttention and FlashInfer). ``mamba_cache_mode``: vLLM uses "none" without prefix
    caching and, with it (its default), "all" for models that support Mamba prefix caching, else
    "align"; "all" needs ``mamba_chunk_size``. ``max_concurrent_batches`` is 2 with async
    scheduling (pipeline size 1), else 1 (vLLM before ``max_in_flight_tokens``: 1).
    ``tokens_line`` picks how the "GPU KV cache size" line is computed (step 7). Speculative
    decoding's extra state blocks are not modelled. A model without layer kinds works too (one
    full-attention group).

    Raises ``ValueError`` for invalid arguments, for a configuration vLLM refuses (a Mamba model with
    the hybrid manager off, ``max_model_len`` past the model's context) and, as vLLM does, when not
    even one request of ``max_model_len`` tokens fits.
    """
    spec = resolve_model(model)
    max_model_len = spec.max_position_embeddings if max_model_len is None else max_model_len
    for label, value in (
        ("available_kv_bytes", available_kv_bytes),
        ("max_model_len", max_model_len),
        ("block_size", block_size),
        ("kernel_block_size", kernel_block_size),
        ("max_num_batched_tokens", max_num_batched_tokens),
        ("max_concurrent_batches", max_concurrent_batches),
    ):
        _check_positive(label, value)
    if max_model_len > spec.max_position_embeddings:
        raise ValueError(
            f"max_model_len ({max_model_len:,}) exceeds {spec.name}'s max_position_embeddings "
            f"({spec.max_position_embeddings:,}); vLLM refuses it"
        )
    if mamba_cache_mode not in ("none", "align", "all"):
        raise ValueError(f"mamba_cache_mode must be 'none', 'align' or 'all', got {mamba_cache_mode!r}")
    if tokens_line not in ("concurrency", "blocks"):
        raise ValueError(f"tokens_line must be 'concurrency' or 'blocks', got {tokens_line!r}")
    if num_gpu_blocks_override is not None:
        _check_positive("num_gpu_blocks_override", num_gpu_blocks_override)
    spec.check_tensor_parallel(tensor_parallel_size)

    kinds = _cache_kinds(spec, hybrid_kv_cache_manager)
    attention_bytes_per_token = spec.kv_bytes_per_token_per_layer(kv_cache_dtype, tensor_parallel_size)
    state = _state_kind(spec, kinds)
    state_bytes = 0
    mamba_block_size = 0
    if state is not None:
        state_bytes = spec.state_bytes_per_layer(
            state, tensor_parallel_size, mamba_cache_dtype, mamba_ssm_cache_dtype
        )
        block_size = _hybrid_block_size(
            attention_bytes_per_token,
            state_bytes,
            block_size,
            kernel_block_size,
            mamba_cache_mode,
            mamba_chunk_size,
        )
        mamba_block_size = max_model_len if mamba_cache_mode == "none" else block_size
    page_bytes = block_size * attention_bytes_per_token

    group_size, layer_groups = _group_layers(kinds)
    num_blocks = available_kv_bytes // page_bytes // group_size
    if num_gpu_blocks_override is not None:
        num_blocks = num_gpu_blocks_override
    in_flight = max_concurrent_batches * max_num_batched_tokens
    groups = tuple(
        KVCacheGroup(
            kind, layers, _blocks_per_request(kind, block_size, max_model_len, in_flight, mamba_cache_mode)
        )
        for kind, layers in layer_groups
    )
    capacity = HybridKVCapacity(
        model=spec.name,
        max_model_len=max_model_len,
        block_size=block_size,
        page_bytes=page_bytes,
        mamba_state_bytes=state_bytes,
        group_size=group_size,
        groups=groups,
        num_blocks=num_blocks,
        available_kv_bytes=available_kv_bytes,
        hybrid_manager=hybrid_kv_cache_manager,
        mamba_block_size=mamba_block_size,
        tokens_line=tokens_line,
    )
    needed = capacity.blocks_per_request * page_bytes * group_size
    if num_gpu_blocks_override is None and needed > available_kv_bytes:
        raise ValueError(
            f"{spec.name}: one request of max_model_len {max_model_len:,} tokens needs {needed:,} bytes of KV "
            f"cache ({capacity.blocks_per_request} blocks of {page_bytes * group_size:,} bytes), more than the "
            f"{available_kv_bytes:,} available; vLLM refuses to start. Lower max_model_len or give the KV "
            "cache more memory"
        )
    return capacity
