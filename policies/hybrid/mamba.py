"""A Mamba or linear-attention group (vLLM's ``MambaManager`` without prefix caching,
``mamba_cache_mode: none``): one block per request holds its state (conv + SSM), whatever its
length, from admission to its end. The state is live memory: its block counts as used."""

from __future__ import annotations

from policies.base import PolicyInputError, PoolSpec
from policies.hybrid.block_pool import SharedBlockPool
from policies.hybrid.group import NEVER, GroupManager, GroupSequence

MAMBA_PREFIX_CACHING = (
    "vLLM caches Mamba states for prefix caching only in mamba_cache_mode 'align', at the block "
    "boundaries its prefill chunks are aligned to end on (MambaManager), a state per aligned chunk; "
    "kvsim computes a prompt at admission and keeps one state block per request, so which states "
    "would be cached is not modelled"
)


class MambaGroup(GroupManager):
    kind = "mamba"

    def __init__(self, pool: PoolSpec, shared_pool: SharedBlockPool, prefill_tokens: int):
        if shared_pool.caches_prefixes:
            raise PolicyInputError(f"a Mamba group cannot cache prefixes: {MAMBA_PREFIX_CACHING}")
        super().__init__(pool, shared_pool, prefill_tokens)

    def held_run(self, num_tokens: int) -> tuple[int, int]:
        return 0, 1

    def next_release(self, seq: GroupSequence) -> int:
        return NEVER

    def _room(self, seq: GroupSequence) -> int:
        return seq.final_len - seq.num_tokens

    def _account(self, seq: GroupSequence, sign: int) -> None:
        self._used += sign * self.block_size
        self._held_blocks += sign

    def _account_growth(self, seq: GroupSequence, tokens: int, first: int, end: int) -> None:
        """A growth leaves the state as it is: one block, used."""
