"""Jenga's KV pool for a model whose layers are not all full attention: large pages of the LCM of
the layer types' page sizes, each carved into small pages of one type (``policy: jenga``).

Jenga (Zhang et al., "Jenga: Effective Memory Management for Serving LLM with Heterogeneity", SOSP
2025, arXiv 2503.18292) groups the layers by type (its ``app_property``: full attention, a sliding
window, an attention chunk, a Mamba state) and gives each group a *small page*: ``block_size`` tokens
of every layer of the group (a Mamba group: one request's state in every layer of the group). The
memory is cut into *large pages* of ``lcm`` of the small pages, so every type's small page divides a
large page and no type is padded up to another's page (vLLM pads: one page size for every group,
``sim/hardware/hybrid_capacity.py``). Read in heheda12345/Jenga-SOSP25-AE (the paper's artifact,
vLLM with Jenga), ``vllm/core/block_v3/custom_block_manager.py``, ``_compile_two_level``: a group's
page is the per-layer page times its layers, ``level0_page_size = math.lcm(*group_page_size.values())``,
``num_pages = cdiv(available, level0) - 1`` ("to avoid overflow due to start_bias"),
``large_small_ratio = level0 // group page``.

Kinds and bytes are kvsim's (``sim/hardware/layers.py``): every attention layer of a model has the
same K/V bytes per token, so the attention groups differ in their layer counts (Gemma 3: 52 sliding
and 10 full layers: small pages of 52 and 10 layer-blocks, a large page of 260); a Mamba group's
page is its layers' states, unrelated to the attention page, so the LCM can be large.

A *slot* of this pool is ``slot_bytes``: one token of one attention layer when every Mamba page is a
multiple of it (else the greatest common divisor), so that each group's pages are whole slots and
the breakdown is exact (``sim/kv/jenga.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.hardware.hybrid_capacity import _blocks_per_request, _cache_kinds, _state_kind
from sim.hardware.layers import STATE_KINDS, LayerKind
from sim.hardware.models import ModelSpec, resolve_model

__all__ = ["JengaCapacity", "JengaGroupSpec", "jenga_kv_capacity"]


@dataclass(frozen=True)
class JengaGroupSpec:
    """The layers of one type: ``layers`` of them, a small page of ``page_bytes`` (``ratio`` to a large
    page), a request holding at most ``blocks_per_request`` small pages."""

    kind: LayerKind
    layers: int
    page_bytes: int
    ratio: int
    blocks_per_request: int

    @property
    def holds_tokens(self) -> bool:
        return not isinstance(self.kind, STATE_KINDS)


@dataclass(frozen=True)
class JengaCapacity:
    """Jenga's pool on one GPU and what kvsim prints for it at start-up."""

    model: str
    max_model_len: int
    block_size: int
    large_page_bytes: int
    groups: tuple[JengaGroupSpec, ...]
    num_blocks: int
    """Large pages (the summary's ``num_gpu_blocks``)."""
    slot_bytes: int
    available_kv_bytes: int
    lcm_bytes: int
    """The LCM of the small pages (the large page unless option ``large_page_bytes`` replaced it)."""

    @property
    def large_page_slots(self) -> int:
        return self.large_page_bytes // self.slot_bytes

    def small_page_slots(self, group: JengaGroupSpec) -> int:
        return group.page_bytes // self.slot_bytes

    @property
    def large_pages_per_request(self) -> float:
        """Large pages one request of ``max_model_len`` tokens fills at worst, its small pages packed."""
        return sum(group.blocks_per_request / group.ratio for group in self.groups)

    @property
    def max_concurrency(self) -> float:
        return self.num_blocks / self.large_pages_per_request

    def capacity_lines(self) -> list[str]:
        pages = ", ".join(
            f"{group.kind.label}: {group.layers} layers, {group.page_bytes:,} B x {group.ratio}"
            for group in self.groups
        )
        what = "the LCM of the small pages" if self.large_page_bytes == self.lcm_bytes else "large_page_bytes"
        return [
            f"Jenga: {self.num_blocks:,} large pages of {self.large_page_bytes:,} B ({what}; {pages})",
            f"Maximum concurrency for {self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x",
        ]


def jenga_kv_capacity(
    model: ModelSpec | str,
    available_kv_bytes: int,
    *,
    max_model_len: int,
    block_size: int = 16,
    kv_cache_dtype: str = "auto",
    max_in_flight_tokens: int = 8192,
    tensor_parallel_size: int = 1,
    large_page_bytes: int | None = None,
) -> JengaCapacity:
    """Jenga's pool from ``available_kv_bytes`` (module docstring). ``large_page_bytes`` replaces the
    LCM (a multiple of every small page). ``ValueError`` names what cannot run: a large page that a
    small page does not divide, or a pool that cannot hold one request of ``max_model_len`` tokens."""
    spec = resolve_model(model)
    kinds = _cache_kinds(spec, hybrid_manager=True)
    attention_bytes = spec.kv_bytes_per_token_per_layer(kv_cache_dtype, tensor_parallel_size)
    state = _state_kind(spec, kinds)
    state_bytes = spec.state_bytes_per_layer(state, tensor_parallel_size) if state is not None else 0
    counts: dict[LayerKind, int] = {}
    for kind in kinds:  # (types in the order their first layer comes)
        counts[kind] = counts.get(kind, 0) + 1
    pages = {
        kind: layers * (state_bytes if isinstance(kind, STATE_KINDS) else block_size * attention_bytes)
        for kind, layers in counts.items()
    }
    lcm = math.lcm(*pages.values())
    if large_page_bytes is not None and (
        isinstance(large_page_bytes, bool) or not isinstance(large_page_bytes, int) or large_page_bytes <= 0
    ):
        raise ValueError(f"large_page_bytes: must be a positive integer, got {large_page_bytes!r}")
    large = lcm if large_page_bytes is None else large_page_bytes
    for kind, page in pages.items():
        if large % page:
            raise ValueError(
                f"large_page_bytes: {large:,} is not a multiple of the {kind.label} small page ({counts[kind]} "
                f"layers x {page // counts[kind]:,} B = {page:,} B, block_size {block_size}); the LCM of the "
                f"small pages is {lcm:,} B"
            )
    num_large = max(0, -(-available_kv_bytes // large) - 1)
    slot_bytes = math.gcd(
        attention_bytes, *(page for kind, page in pages.items() if isinstance(kind, STATE_KINDS))
    )
    groups = tuple(
        JengaGroupSpec(
            kind,
            counts[kind],
            page,
            large // page,
            _blocks_per_request(kind, block_size, max_model_len, max_in_flight_tokens, "none"),
        )
        for kind, page in pages.items()
    )
    capacity = JengaCapacity(
        spec.name, max_model_len, block_size, large, groups, num_large, slot_bytes, available_kv_bytes, lcm
    )
    # Each request takes large pages of its own per type (request-aware allocation): at worst a whole
    # large page per type for what it leaves unfilled.
    needed = sum(-(-group.blocks_per_request // group.ratio) for group in groups)
    if num_large < needed:
        raise ValueError(
            f"{spec.name}: one request of max_model_len {max_model_len:,} tokens needs {needed} large pages of "
            f"{large:,} B, the {available_kv_bytes:,} B of KV memory hold {num_large}. Lower max_model_len or "
            "block_size, or give the KV cache more memory"
        )
    return capacity
