"""A KV group's policy that is only a view: one pool of a coordinator that manages its pools together
(SGLang's SWA radix cache, ``sim/kv/sglang_swa_radix.py``, whose tree holds slots in both). What reads
a group's breakdown reads this pool's part here; the sequences are the coordinator's, so every
operation on the view is refused."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NoReturn

from policies.base import KVCachePolicy, PolicyInputError, PoolSpec

__all__ = ["PoolView"]

Breakdown = tuple[int, int, int, int, int, int]


class PoolView(KVCachePolicy):
    def __init__(self, pool: PoolSpec, breakdown: Callable[[], Breakdown]):
        super().__init__(pool)
        self._breakdown = breakdown

    def breakdown_values(self) -> Breakdown:
        return self._breakdown()

    def live_sequences(self) -> Iterable[int]:
        return ()

    def _has_sequence(self, seq_id: int) -> bool:
        return False

    def _operation(self, *_args: object, **_kwargs: object) -> NoReturn:
        raise PolicyInputError("a pool view has no sequences: operate on its KV coordinator")

    can_admit = admit = grow = fork = free = _operation
    slots_needed_to_grow = growth_room = available_slots = seq_len = final_len = _operation
