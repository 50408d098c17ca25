"""A Mamba or linear-attention group (vLLM's ``MambaManager`` without prefix caching,
``mamba_cache_mode: none``): one block per request holds its state (conv + SSM), whatever its
length, from admission to its end. The state is live memory: its block counts as used."""

from __future__ import annotations

from policies.hybrid.group import NEVER, GroupManager, GroupSequence


class MambaGroup(GroupManager):
    kind = "mamba"

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
