"""Jenga's pool and how to build one replica's coordinator over it: :class:`JengaCoordinator`
(``sim/kv/jenga.py``), or with prefix caching :class:`JengaPrefixCoordinator` (``sim/kv/jenga_prefix.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import PoolSpec
from sim.hardware.jenga_capacity import JengaCapacity
from sim.kv.jenga import JengaCoordinator
from sim.kv.jenga_prefix import JengaPrefixCoordinator

__all__ = ["JengaLayout"]


@dataclass(frozen=True)
class JengaLayout:
    """Jenga's pool (``sim/hardware/jenga_capacity.py``) and how to build one replica's groups over it."""

    capacity: JengaCapacity
    max_model_len: int
    prefill_tokens: int
    prefix_caching: bool = False
    """``engine.enable_prefix_caching``: small pages with identities and Jenga's eviction."""

    @property
    def slot_bytes(self) -> int:
        return self.capacity.slot_bytes

    @property
    def pool(self) -> PoolSpec:
        capacity = self.capacity
        slots = capacity.num_blocks * capacity.large_page_slots
        return PoolSpec(slots, capacity.block_size, self.max_model_len, capacity.slot_bytes)

    def group_names(self) -> list[str]:
        return [group.kind.label for group in self.capacity.groups]

    def make_coordinator(self) -> JengaCoordinator:
        if self.prefix_caching:
            return JengaPrefixCoordinator(self.capacity, self.group_names())
        return JengaCoordinator(self.capacity, self.group_names(), self.prefill_tokens)
