"""Hybrid allocators: KV memory for a model whose layers are not all full attention, built as KV
groups behind one coordinator. A variant names one as its ``policy`` beside the single-group
policies (``policies/``), so the same stream can be replayed on both, side by side.

``vllm-hybrid``: vLLM V1's hybrid KV-cache manager without prefix caching: the model's layers
  grouped as vLLM groups them (``sim/hardware/hybrid_capacity.py``: one group per ``group_size``
  layers of one kind), every group drawing blocks of one page size from one pool of
  ``num_gpu_blocks`` blocks, each group released by its kind's rule (``policies/hybrid/``).

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
from policies.hybrid.sliding_window import SlidingWindowGroup
from sim.hardware.hybrid_capacity import HybridKVCapacity
from sim.hardware.layers import ChunkedLocal, FullAttention, LayerKind, SlidingWindow
from sim.kv.coordinator import KVCoordinator, KVGroup, make_coordinator

__all__ = ["HYBRID_ALLOCATORS", "HybridLayout", "is_hybrid_allocator"]

HYBRID_ALLOCATORS = ("vllm-hybrid",)


def is_hybrid_allocator(name: str) -> bool:
    return name in HYBRID_ALLOCATORS


@dataclass(frozen=True)
class HybridLayout:
    """A hybrid pool as vLLM sizes it, and how to build one replica's groups over it."""

    capacity: HybridKVCapacity
    max_model_len: int
    prefill_tokens: int
    """The most prompt tokens one iteration computes for one request (a sliding or chunked group
    holds what chunked prefill keeps at once: ``policies/hybrid/``)."""

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
        shared = SharedBlockPool(self.capacity.num_blocks, spec.block_size, spec.kv_pool_tokens)
        groups = [
            KVGroup(name, _manager(group.kind, spec, shared, self.prefill_tokens), self.slot_bytes)
            for name, group in zip(self.group_names(), self.capacity.groups, strict=True)
        ]
        return make_coordinator(groups)


def _manager(kind: LayerKind, spec: PoolSpec, shared: SharedBlockPool, prefill_tokens: int) -> GroupManager:
    if isinstance(kind, FullAttention):
        return FullAttentionGroup(spec, shared, prefill_tokens)
    if isinstance(kind, SlidingWindow):
        return SlidingWindowGroup(spec, shared, prefill_tokens, kind.window)
    if isinstance(kind, ChunkedLocal):
        return ChunkedLocalGroup(spec, shared, prefill_tokens, kind.chunk)
    return MambaGroup(spec, shared, prefill_tokens)
