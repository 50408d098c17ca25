"""Full attention: a block for every token, as vLLM's ``FullAttentionManager`` (and kvsim's ``paged``
policy) holds them."""

from __future__ import annotations

from policies.hybrid.group import GroupManager, ceil_div


class FullAttentionGroup(GroupManager):
    kind = "full"

    def held_run(self, num_tokens: int) -> tuple[int, int]:
        return 0, ceil_div(num_tokens, self.block_size)
