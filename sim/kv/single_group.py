"""The one-group case, every model kvsim could express before hybrid layers: each call goes straight
to the group's one policy, so the seam between the engine and KV memory costs one call."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from policies._host_tier import HostPool
from policies.base import (
    ChildSpec,
    PolicyStats,
    PrefixHit,
)
from sim.kv.interface import Breakdown, KVCoordinator, KVGroup
from token_content import TokenContent

__all__ = ["SingleGroupCoordinator"]


class SingleGroupCoordinator(KVCoordinator):
    """Every layer in one group: each call goes straight to its policy."""

    def __init__(self, group: KVGroup):
        self.groups = (group,)
        self.policy = group.policy
        self.pool_slots = group.policy.pool_slots
        self.context_tokens = self.pool_slots

    def lookup(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        return self.policy.lookup(prompt, namespace)

    def match(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        return self.policy.match(prompt, namespace)

    def hold_lookahead(self, slots: int) -> None:
        self.policy.hold_lookahead(slots)
        self.lookahead_slots = slots

    def can_admit(self, prompt: TokenContent, final_len: int) -> bool:
        return self.policy.can_admit(prompt, final_len + self.lookahead_slots)

    def can_admit_quietly(self, prompt: TokenContent, final_len: int) -> bool:
        return self.policy.can_admit_quietly(prompt, final_len + self.lookahead_slots)

    def admit(
        self, seq_id: int, prompt: TokenContent, final_len: int, output_content_id: int, namespace: int = 0
    ) -> int:
        return self.policy.admit(
            seq_id, prompt, final_len + self.lookahead_slots, output_content_id, namespace
        )

    def grow(self, seq_id: int, num_tokens: int) -> None:
        self.policy.grow(seq_id, num_tokens)

    def grow_each(self, seq_ids: list[int], num_tokens: list[int]) -> list[int]:
        return self.policy.grow_each(seq_ids, num_tokens)

    def fits_growth_each(self, seq_ids: list[int], num_tokens: list[int]) -> bool:
        policy = self.policy
        needed = 0
        assert len(seq_ids) == len(num_tokens)
        for seq_id, tokens in zip(seq_ids, num_tokens):  # noqa: B905 (lengths checked above; compiled, strict=True costs a call with keywords)
            needed += policy.slots_needed_to_grow(seq_id, tokens)
        return needed <= policy.available_slots()

    def fork(self, parent_id: int, children: Sequence[ChildSpec]) -> None:
        self.policy.fork(parent_id, children)

    def free(self, seq_id: int, finished: bool = True) -> None:
        self.policy.free(seq_id, finished)

    def growth_room(self, seq_id: int) -> int:
        return self.policy.growth_room(seq_id)

    def available_slots(self) -> int:
        return self.policy.available_slots()

    def available_slots_with_hit_locked(self, prompt: TokenContent) -> int:
        return self.policy.available_slots_with_hit_locked(prompt)

    def seq_len(self, seq_id: int) -> int:
        return self.policy.seq_len(seq_id)

    def prepare_decode_step(self, num_sequences: int) -> None:
        self.policy.prepare_decode_step(num_sequences)

    def defer_prompt_keys(self) -> bool:
        return self.policy.defer_prompt_keys()

    def prompt_scheduled(self, seq_id: int, tokens: int) -> None:
        self.policy.prompt_scheduled(seq_id, tokens)

    def can_defer_unbacked(self) -> bool:
        return self.policy.can_defer_unbacked() and not self.lookahead_slots

    def defer_unbacked(self, pending_tokens: Callable[[], int] | None) -> None:
        self.policy.defer_unbacked(pending_tokens)

    def evict_for_unbacked(self, ahead_tokens: int) -> int:
        return self.policy.evict_for_unbacked(ahead_tokens)

    def breakdown_values(self) -> Breakdown:
        return self.policy.breakdown_values()

    def sharing_slots(self) -> tuple[int, int]:
        return self.policy.sharing_slots()

    def shared_slots(self) -> int:
        return self.policy.shared_slots()

    def may_share(self) -> bool:
        return self.policy.may_share()

    def token_sharing(self) -> tuple[int, int]:
        physical, logical = self.policy.sharing_slots()
        return logical - physical, self.policy.shared_slots()

    def host_breakdown_values(self) -> tuple[int, int]:
        return self.policy.host_breakdown_values()

    @property
    def stats(self) -> PolicyStats:
        return self.policy.stats

    def evictions(self) -> int:
        return self.policy.stats.evictions

    def cow_copies(self) -> int:
        return self.policy.stats.cow_copies

    @property
    def host_tier(self) -> HostPool | None:
        return self.policy.host_tier
