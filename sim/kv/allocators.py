"""Hybrid allocators: KV memory for a model whose layers are not all full attention, built as KV
groups behind one coordinator. A variant names one as its ``policy`` beside the single-group
policies (``policies/``), so the same stream can be replayed on both, side by side.

``vllm-hybrid``: vLLM V1's hybrid KV-cache manager: the model's layers grouped as vLLM groups them
  (``sim/hardware/hybrid_capacity.py``: one group per ``group_size`` layers of one kind), every group
  drawing blocks of one page size from one pool of ``num_gpu_blocks`` blocks, each group released by
  its kind's rule (``policies/hybrid/``). With ``engine.enable_prefix_caching: true`` the pool's
  blocks keep their identities (``policies/hybrid/prefix_pool.py``) and a prompt's hit is the
  longest prefix every group serves (``sim/kv/coordinator.py``); a Mamba group then runs vLLM's
  ``mamba_cache_mode: all`` or ``align`` (``policies/hybrid/mamba.py``). Option ``mamba_cache_mode``
  (vLLM's ``--mamba-cache-mode``; unset: vLLM's default for the model, :func:`vllm_mamba_cache_mode`),
  what vLLM would not run refused. Option ``mamba_prefix_policy``
  (``vllm``, the default, or ``marconi``: Marconi's admission and eviction of the align mode's
  states, ``policies/hybrid/marconi.py``, :func:`mamba_prefix_policy`) with ``marconi_alpha``.

``sglang-hybrid``: SGLang's hybrid SWA memory without its radix cache (``--disable-radix-cache``):
  two token pools of their own (``SWAKVPool``), sized as SGLang sizes them
  (``sim/hardware/sglang_hybrid_capacity.py``, option ``swa_full_tokens_ratio``, default 0.8, and
  ``page_size``, default 1): the full-attention pool holds every token, the SWA pool what
  ``policies/hybrid/sglang_sliding_window.py`` says. An admission or a step needs room in both.
  A slot there is one token of one pool's layers (the summary counts both pools' slots). With
  ``engine.enable_prefix_caching: true``, SGLang's ``SWARadixCache`` over the two pools
  (``sim/kv/sglang_swa_radix.py``). A model with Mamba / linear-attention layers (Qwen3-Next,
  Nemotron-H) gets SGLang's full-attention token pool and Mamba state pool instead
  (``sim/hardware/sglang_mamba_capacity.py``, options ``mamba_full_memory_ratio``, default 0.9,
  ``max_mamba_cache_size`` and ``mamba_ssm_dtype``): every running request holds one Mamba slot; with
  prefix caching, SGLang's ``MambaRadixCache`` (``sim/kv/sglang_mamba_radix.py``).

``jenga``: Jenga's two-level allocator (``sim/kv/jenga.py``): large pages of the LCM of the layer
  types' small pages (``sim/hardware/jenga_capacity.py``), carved per type (option
  ``large_page_bytes``: another multiple of every small page); with prefix caching, its cached small
  pages and eviction (``sim/kv/jenga_prefix.py``).

A *slot* of a hybrid pool is one token in one group: ``group_size`` layers' K and V (a Mamba group's
block holds one request's state instead). The pool's slots are ``num_gpu_blocks x block_size``; the
breakdown sums to them, each group's part and the free blocks apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import PoolSpec
from policies.hybrid.block_pool import SharedBlockPool
from policies.hybrid.chunked_local import ChunkedLocalGroup
from policies.hybrid.full import FullAttentionGroup
from policies.hybrid.group import GroupManager
from policies.hybrid.mamba import MambaGroup
from policies.hybrid.marconi import (
    DEFAULT_ALPHA,
    MarconiBlockPool,
    MarconiCosts,
    MarconiEvictor,
    MarconiMambaGroup,
)
from policies.hybrid.prefix_pool import PrefixCachingBlockPool
from policies.hybrid.sglang_sliding_window import SGLangSlidingWindowGroup
from policies.hybrid.sliding_window import SlidingWindowGroup
from sim.hardware.hybrid_capacity import HybridKVCapacity, MambaCacheMode
from sim.hardware.layers import (
    STATE_KINDS,
    ChunkedLocal,
    FullAttention,
    GatedDeltaNetState,
    LayerKind,
    Mamba2State,
    SlidingWindow,
)
from sim.hardware.models import ModelSpec, resolve_model
from sim.hardware.sglang_hybrid_capacity import (
    DEFAULT_SWA_FULL_TOKENS_RATIO,
    SGLangHybridCapacity,
    sglang_hybrid_kv_capacity,
)
from sim.hardware.sglang_mamba_capacity import SGLangMambaCapacity, has_state_layers, sglang_mamba_kv_capacity
from sim.kv.coordinator import KVCoordinator, KVGroup, make_coordinator
from sim.kv.sglang_mamba_radix import MambaRadixCoordinator, MambaTracking
from sim.kv.sglang_swa_radix import SWARadixCoordinator

__all__ = [
    "HYBRID_ALLOCATORS",
    "HybridLayout",
    "SGLangHybridLayout",
    "SGLangMambaLayout",
    "MarconiSettings",
    "hybrid_allocator_options",
    "is_hybrid_allocator",
    "mamba_prefix_policy",
    "sglang_hybrid_layout",
    "vllm_mamba_cache_mode",
    "vllm_mamba_chunk_size",
]

HYBRID_ALLOCATORS = ("vllm-hybrid", "sglang-hybrid", "jenga")
DEFAULT_MAMBA_CHUNK_SIZE = 2048
"""vLLM's Mamba chunk size for a model whose config has none (``get_mamba_chunk_size``)."""

_OPTIONS: dict[str, tuple[str, ...]] = {
    "vllm-hybrid": ("mamba_cache_mode", "mamba_prefix_policy", "marconi_alpha"),
    "sglang-hybrid": (
        "swa_full_tokens_ratio",
        "page_size",
        "mamba_full_memory_ratio",
        "max_mamba_cache_size",
        "mamba_ssm_dtype",
        "mamba_scheduler_strategy",
        "mamba_radix_cache_strategy",  # (SGLang's later name for the same flag)
        "mamba_track_interval",
    ),
    "jenga": ("large_page_bytes",),
}


def is_hybrid_allocator(name: str) -> bool:
    return name in HYBRID_ALLOCATORS


def hybrid_allocator_options(name: str) -> tuple[str, ...]:
    """The ``options`` a hybrid allocator takes."""
    return _OPTIONS.get(name, ())


@dataclass(frozen=True)
class MarconiSettings:
    """Marconi's eviction for a layout's Mamba groups: its costs (from the model) and alpha."""

    costs: MarconiCosts
    alpha: float = DEFAULT_ALPHA


@dataclass(frozen=True)
class HybridLayout:
    """A hybrid pool as vLLM sizes it, and how to build one replica's groups over it."""

    capacity: HybridKVCapacity
    max_model_len: int
    prefill_tokens: int
    """The most prompt tokens one iteration computes for one request (a sliding or chunked group
    holds what chunked prefill keeps at once: ``policies/hybrid/``)."""
    prefix_caching: bool = False
    """vLLM's prefix caching (``engine.enable_prefix_caching: true``): cached blocks kept by identity
    (a Mamba group's states as ``mamba_cache_mode`` says)."""
    marconi: MarconiSettings | None = None
    """Marconi's admission and eviction of the Mamba groups' states (``mamba_prefix_policy: marconi``)."""
    mamba_cache_mode: MambaCacheMode | None = None
    """The Mamba groups' ``mamba_cache_mode`` (:func:`vllm_mamba_cache_mode`; None: "align" with prefix
    caching, "none" without)."""

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot: a page of one layer, in each of the group's ``group_size`` layers, per token."""
        return self.capacity.page_bytes * self.capacity.group_size // self.capacity.block_size

    @property
    def pool(self) -> PoolSpec:
        """The shared pool as a policy's pool spec."""
        capacity = self.capacity
        # Whole blocks only, as the single-group block policies count their pool.
        return PoolSpec(
            capacity.num_blocks * capacity.block_size,
            capacity.block_size,
            self.max_model_len,
            self.slot_bytes,
        )

    def group_names(self) -> list[str]:
        """One name per group, by kind (numbered when a kind has several groups: Gemma 3's six)."""
        labels = [group.kind.label for group in self.capacity.groups]
        names = []
        for index, label in enumerate(labels):
            names.append(
                label if labels.count(label) == 1 else f"{label} #{labels[: index + 1].count(label)}"
            )
        return names

    def make_coordinator(self) -> KVCoordinator:
        """One replica's groups over a pool of its own."""
        spec = self.pool
        marconi = self.marconi
        blocks, tokens = self.capacity.num_blocks, spec.kv_pool_tokens
        shared: SharedBlockPool
        if marconi is not None:
            shared = MarconiBlockPool(blocks, spec.block_size, tokens)
        elif self.prefix_caching:
            # Lazy keys unless a Mamba group caches states, not every full block (policies/hybrid/mamba.py).
            states = any(isinstance(group.kind, STATE_KINDS) for group in self.capacity.groups)
            shared = PrefixCachingBlockPool(blocks, spec.block_size, tokens, lazy_keys=not states)
        else:
            shared = SharedBlockPool(blocks, spec.block_size, tokens)
        mode = self.mamba_cache_mode
        groups = []
        for name, group in zip(self.group_names(), self.capacity.groups, strict=True):
            if marconi is not None and isinstance(group.kind, STATE_KINDS):
                evictor = MarconiEvictor(marconi.costs, marconi.alpha)
                manager: GroupManager = MarconiMambaGroup(spec, shared, self.prefill_tokens, evictor)
            else:
                manager = group_manager(group.kind, spec, shared, self.prefill_tokens, mode)
            groups.append(KVGroup(name, manager, self.slot_bytes))
        return make_coordinator(groups)


def vllm_mamba_cache_mode(
    model: ModelSpec,
    option: object,
    prefix_caching: bool,
    chunked_prefill: bool,
    *,
    option_key: str = "mamba_cache_mode",
    caching_key: str = "enable_prefix_caching",
    chunked_key: str = "enable_chunked_prefill",
) -> MambaCacheMode:
    """The ``mamba_cache_mode`` vLLM runs ``model`` with (``option``: the variant's option, None when
    unset), as vLLM's ``MambaModelConfig.verify_and_update_config`` (``vllm/model_executor/models/
    config.py``, vLLM main in the public code index) settles it: "none" without prefix caching; with
    it, an unset (or "none") mode becomes "all" for a model whose Mamba layers support it
    (``SupportsMambaPrefixCaching``: vLLM's Mamba and Mamba2 models, Nemotron-H among them), else
    "align" (Qwen3-Next's gated delta net), and "all" asked of a model without that support falls
    back to "align"; "align" needs chunked prefill ("all" does not). ``ValueError``, naming the key and
    its value, for what vLLM would not run (and for "none" with prefix caching, which vLLM replaces
    by its default: set nothing to run it)."""
    if option is not None and option not in ("none", "align", "all"):
        raise ValueError(f"{option_key}: {option!r} is not one of vLLM's modes 'none', 'align', 'all'")
    states = {type(kind) for kind in model.layer_kinds or () if isinstance(kind, STATE_KINDS)}
    if not states:
        if option is not None:
            raise ValueError(
                f"{option_key}: {option!r}: {model.name} has no Mamba/linear-attention layers (vLLM reads "
                "mamba_cache_mode for models with them only)"
            )
        return "none"
    if not prefix_caching:
        if option in (None, "none"):
            return "none"
        raise ValueError(
            f"{option_key}: {option!r} needs {caching_key}: true (vLLM sets mamba_cache_mode 'none' "
            "without prefix caching)"
        )
    supports_all = not states <= {GatedDeltaNetState}
    if option == "none":
        raise ValueError(
            f"{option_key}: 'none' with {caching_key}: true: vLLM replaces it by its default for "
            f"{model.name}, {'all' if supports_all else 'align'!r}; leave the option unset or set "
            f"{'all' if supports_all else 'align'!r}"
        )
    if option != "align" and supports_all:
        return "all"
    if not chunked_prefill:
        raise ValueError(
            f"{chunked_key}: false: vLLM's mamba_cache_mode 'align' (prefix caching on {model.name}"
            f"{'' if option == 'align' else ', whose Mamba layers do not support all'}) requires chunked "
            "prefill"
        )
    return "align"


def vllm_mamba_chunk_size(model: ModelSpec) -> int:
    """The Mamba chunk size vLLM aligns the block size to in ``mamba_cache_mode: all``
    (``ModelConfig.get_mamba_chunk_size``, vLLM main in the public code index): the config's
    ``mamba_chunk_size`` or ``chunk_size`` (a Mamba2 kind's ``chunk_size``), else 2048 (vLLM's default
    for a model without one, Mamba1's)."""
    for kind in model.layer_kinds or ():
        if isinstance(kind, Mamba2State) and kind.chunk_size is not None:
            return kind.chunk_size
    return DEFAULT_MAMBA_CHUNK_SIZE


def mamba_prefix_policy(
    model: ModelSpec,
    capacity: HybridKVCapacity,
    options: dict,
    mamba_cache_mode: MambaCacheMode,
    *,
    option_prefix: str = "",
    caching_key: str = "enable_prefix_caching",
) -> MarconiSettings | None:
    """Marconi's settings when the options ask for ``mamba_prefix_policy: marconi`` (None for vLLM's
    own, ``vllm``, the default): its FLOPs from ``model`` (:func:`marconi_costs`), ``marconi_alpha``
    (default 0: LRU among the states). ``ValueError`` naming the key and value: an unknown policy, Marconi on a model
    without Mamba/linear-attention layers, without prefix caching or in ``all`` (the mode is not ``align``), an
    alpha that is not a number >= 0 or one set without Marconi."""
    policy_key, alpha_key = f"{option_prefix}mamba_prefix_policy", f"{option_prefix}marconi_alpha"
    policy = options.get("mamba_prefix_policy", "vllm")
    if policy not in ("vllm", "marconi"):
        raise ValueError(f"{policy_key}: {policy!r} is not one of 'vllm', 'marconi'")
    alpha = options.get("marconi_alpha")
    if policy == "vllm":
        if alpha is not None:
            raise ValueError(f"{alpha_key}: {alpha!r} is Marconi's weight: set {policy_key}: marconi")
        return None
    if mamba_cache_mode != "align":
        if not any(isinstance(kind, STATE_KINDS) for kind in model.layer_kinds or ()):
            raise ValueError(
                f"{policy_key}: 'marconi': {model.name} has no Mamba/linear-attention layers (Marconi "
                "caches their states)"
            )
        if mamba_cache_mode == "all":
            raise ValueError(
                f"{policy_key}: 'marconi' chooses among the states mamba_cache_mode 'align' writes, and "
                f"{model.name} runs 'all' (vLLM's default for its Mamba layers): set "
                f"{option_prefix}mamba_cache_mode: align"
            )
        raise ValueError(
            f"{policy_key}: 'marconi' needs {caching_key}: true (Marconi chooses which Mamba states "
            "vLLM's prefix caching, mamba_cache_mode 'align', keeps)"
        )
    if alpha is None:
        alpha = DEFAULT_ALPHA
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha >= 0:
        raise ValueError(f"{alpha_key}: {alpha!r} must be a number >= 0")
    return MarconiSettings(marconi_costs(model, capacity), float(alpha))


def marconi_costs(model: ModelSpec, capacity: HybridKVCapacity) -> MarconiCosts:
    """What a hit on a prefix saves and holds for ``model`` (``policies/hybrid/marconi.py``): kvsim's
    roofline prefill FLOPs (``sim/costs/core.py``: ``2 x active parameters`` and the state layers'
    scan per token, attention's QK^T and PV over the causal prefix; sliding windows counted as full
    attention) and the layout's groups (a state per Mamba group, a block per attention group)."""
    from sim.costs.core import SCAN_FLOPS_PER_STATE_ELEMENT, attention_layer_count, attention_width

    elements = sum(
        count * kind.ssm_state_elements(1)
        for kind, count in model.layer_kind_counts
        if isinstance(kind, STATE_KINDS)
    )
    state_groups = sum(1 for group in capacity.groups if isinstance(group.kind, STATE_KINDS))
    return MarconiCosts(
        2.0 * model.active_params + SCAN_FLOPS_PER_STATE_ELEMENT * elements,
        4.0 * attention_layer_count(model) * attention_width(model),
        state_groups,
        len(capacity.groups) - state_groups,
        capacity.block_size,
    )


def group_manager(
    kind: LayerKind,
    spec: PoolSpec,
    shared: SharedBlockPool,
    prefill_tokens: int,
    mamba_cache_mode: MambaCacheMode | None = None,
) -> GroupManager:
    """The manager of one KV group of ``kind`` over ``shared``: which blocks a sequence of that layer
    kind holds (``policies/hybrid/``; a Mamba group's by ``mamba_cache_mode``, None: "align" over a
    prefix-caching pool). vllm-hybrid's groups and jenga's types are built with it."""
    if isinstance(kind, FullAttention):
        return FullAttentionGroup(spec, shared, prefill_tokens)
    if isinstance(kind, SlidingWindow):
        return SlidingWindowGroup(spec, shared, prefill_tokens, kind.window)
    if isinstance(kind, ChunkedLocal):
        return ChunkedLocalGroup(spec, shared, prefill_tokens, kind.chunk)
    return MambaGroup(spec, shared, prefill_tokens, mamba_cache_mode)


@dataclass(frozen=True)
class SGLangHybridLayout:
    """SGLang's two pools (``sim/hardware/sglang_hybrid_capacity.py``) and how to build one replica's
    groups over them: the full-attention group over the full pool, the sliding-window group over the
    SWA pool, pages of ``page_size`` tokens in both."""

    capacity: SGLangHybridCapacity
    max_model_len: int
    prefill_tokens: int
    """The most prompt tokens one iteration computes for one request (SGLang's chunked prefill size)."""
    overlap: bool = False
    """SGLang's overlap scheduler (kvsim's async scheduling): one more prefill chunk in the SWA pool."""
    prefix_caching: bool = False
    """SGLang's SWA radix cache (``engine.enable_prefix_caching: true``); off, ``--disable-radix-cache``."""

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot: one token of one pool's layers (both pools have as many layers)."""
        return self.capacity.layer_bytes * self.capacity.full_layers

    @property
    def pool(self) -> PoolSpec:
        """Both pools as one policy's pool spec: their slots together."""
        capacity = self.capacity
        return PoolSpec(
            capacity.full_tokens + capacity.swa_tokens,
            capacity.page_size,
            self.max_model_len,
            self.slot_bytes,
        )

    def make_coordinator(self) -> KVCoordinator:
        """One replica's two groups, each over a pool of its own (with prefix caching, both behind
        SGLang's SWA radix cache)."""
        capacity, spec = self.capacity, self.pool
        page = capacity.page_size
        if self.prefix_caching:
            names = (FullAttention().label, SlidingWindow(capacity.window).label)
            return SWARadixCoordinator(
                capacity.full_tokens, capacity.swa_tokens, page, capacity.window, self.max_model_len,
                self.slot_bytes, names,
            )  # fmt: skip
        full_pool = SharedBlockPool(capacity.full_tokens // page, page)
        swa_pool = SharedBlockPool(capacity.swa_tokens // page, page)
        full = FullAttentionGroup(spec, full_pool, self.prefill_tokens)
        swa = SGLangSlidingWindowGroup(spec, swa_pool, self.prefill_tokens, capacity.window, self.overlap)
        return make_coordinator(
            [
                KVGroup(FullAttention().label, full, self.slot_bytes),
                KVGroup(SlidingWindow(capacity.window).label, swa, self.slot_bytes),
            ]
        )


@dataclass(frozen=True)
class SGLangMambaLayout:
    """SGLang's full-attention token pool and Mamba state pool
    (``sim/hardware/sglang_mamba_capacity.py``) and how to build one replica's coordinator over them
    (``sim/kv/sglang_mamba_radix.py``: the radix cache with prefix caching, else ``ChunkCache``). The
    summary's pool counts both pools' slots at a full-pool token's bytes (a Mamba slot is
    ``capacity.mamba_cache_per_req`` bytes: the capacity lines and the breakdown in bytes say so)."""

    capacity: SGLangMambaCapacity
    max_model_len: int
    prefill_tokens: int
    """A prefill chunk (SGLang's chunked prefill size): where the radix cache caches a state."""
    prefix_caching: bool = False

    @property
    def max_running_requests(self) -> int:
        """SGLang's cap on running requests, from its Mamba pool (the runner caps ``max_num_seqs``)."""
        return self.capacity.max_running_requests

    @property
    def pool(self) -> PoolSpec:
        capacity = self.capacity
        return PoolSpec(
            capacity.full_tokens + capacity.mamba_slots,
            capacity.page_size,
            self.max_model_len,
            capacity.cell_size,
        )

    def make_coordinator(self) -> KVCoordinator:
        capacity = self.capacity
        return MambaRadixCoordinator(
            capacity.full_tokens, capacity.mamba_slots, capacity.page_size, self.max_model_len,
            self.prefill_tokens, (capacity.cell_size, capacity.mamba_cache_per_req),
            (FullAttention().label, capacity.state_label), radix=self.prefix_caching,
            tracking=MambaTracking.of(capacity),
        )  # fmt: skip


def sglang_hybrid_layout(
    model: ModelSpec | str,
    available_kv_bytes: int,
    *,
    max_model_len: int,
    prefill_tokens: int,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    overlap: bool = False,
    swa_full_tokens_ratio: float | None = None,
    page_size: int = 1,
    prefix_caching: bool = False,
    mamba_full_memory_ratio: float | None = None,
    max_mamba_cache_size: int | None = None,
    mamba_ssm_dtype: str | None = None,
    mamba_scheduler_strategy: str | None = None,
    mamba_radix_cache_strategy: str | None = None,
    mamba_track_interval: int | None = None,
) -> SGLangHybridLayout | SGLangMambaLayout:
    """``sglang-hybrid``'s layout from the bytes left for KV: SGLang's SWA pools, or for a model with
    Mamba / linear-attention layers its full-attention and Mamba pools; ``ValueError`` (naming the
    option) for what it cannot run, and for an option of the other kind of pools."""
    spec = resolve_model(model)
    if mamba_scheduler_strategy is not None and mamba_radix_cache_strategy is not None:
        raise ValueError(
            "options mamba_scheduler_strategy and mamba_radix_cache_strategy are one setting (SGLang "
            "renamed --mamba-scheduler-strategy to --mamba-radix-cache-strategy); give one of them"
        )
    strategy_option = "mamba_scheduler_strategy"
    if mamba_radix_cache_strategy is not None:
        mamba_scheduler_strategy, strategy_option = mamba_radix_cache_strategy, "mamba_radix_cache_strategy"
    mamba_options: dict[str, object] = {
        "mamba_full_memory_ratio": mamba_full_memory_ratio,
        "max_mamba_cache_size": max_mamba_cache_size,
        "mamba_ssm_dtype": mamba_ssm_dtype,
        strategy_option: mamba_scheduler_strategy,
        "mamba_track_interval": mamba_track_interval,
    }
    if has_state_layers(spec):
        if swa_full_tokens_ratio is not None:
            raise ValueError(
                f"option swa_full_tokens_ratio sizes SGLang's sliding-window pool; {spec.name} has Mamba/"
                "linear-attention layers (its Mamba pool: options mamba_full_memory_ratio, max_mamba_cache_size)"
            )
        mamba = sglang_mamba_kv_capacity(
            spec,
            available_kv_bytes,
            max_model_len=max_model_len,
            radix_cache=prefix_caching,
            page_size=page_size,
            kv_cache_dtype=kv_cache_dtype,
            tensor_parallel_size=tensor_parallel_size,
            mamba_full_memory_ratio=mamba_full_memory_ratio,
            max_mamba_cache_size=max_mamba_cache_size,
            mamba_ssm_dtype=mamba_ssm_dtype,
            mamba_scheduler_strategy=mamba_scheduler_strategy,
            mamba_track_interval=mamba_track_interval,
            overlap=overlap,
            strategy_option=strategy_option,
        )
        if mamba.page_size > 1 and prefill_tokens < max_model_len and prefill_tokens % mamba.page_size:
            raise ValueError(
                f"option page_size {mamba.page_size}: a prefill chunk of {prefill_tokens} tokens "
                "(engine.max_num_batched_tokens) must be whole pages (SGLang: chunked_prefill_size % page_size == 0)"
            )
        return SGLangMambaLayout(mamba, max_model_len, prefill_tokens, prefix_caching)
    given = [name for name, value in mamba_options.items() if value is not None]
    if given:
        raise ValueError(
            f"option {given[0]} sizes SGLang's Mamba pool; {spec.name} has no Mamba/linear-attention layers"
        )
    capacity = sglang_hybrid_kv_capacity(
        spec,
        available_kv_bytes,
        swa_full_tokens_ratio=DEFAULT_SWA_FULL_TOKENS_RATIO
        if swa_full_tokens_ratio is None
        else swa_full_tokens_ratio,
        page_size=page_size,
        kv_cache_dtype=kv_cache_dtype,
        tensor_parallel_size=tensor_parallel_size,
    )
    if capacity.full_layers != capacity.swa_layers:
        # (A slot of either pool must be the same bytes: the summary counts one size of slot.)
        raise ValueError(
            f"{capacity.model} has {capacity.full_layers} full-attention and {capacity.swa_layers} sliding-window "
            "layers: sglang-hybrid runs models with as many of each (gpt-oss; SGLang's hybrid SWA models). "
            "Size the pools with sim.hardware.sglang_hybrid_capacity, or use policy vllm-hybrid"
        )
    return SGLangHybridLayout(capacity, max_model_len, prefill_tokens, overlap, prefix_caching)
