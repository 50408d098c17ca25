"""A sliding window of ``window`` tokens (vLLM's ``SlidingWindowManager``): at a step that starts with
``n`` tokens computed, the blocks wholly before token ``n - window + 1`` leave the window and are
released (``remove_skipped_blocks``) before the step's new blocks are taken. A sequence of ``n``
tokens, its last one just decoded, so holds blocks ``(n - window) // block_size`` onwards.

During a prompt, vLLM's chunked prefill holds at most the window before a chunk plus the chunk:
``cdiv(window - 1 + chunk, block_size) + 1`` blocks (vLLM's ``SlidingWindowSpec.max_memory_usage_bytes``),
which is what a prompt holds here from admission to its first decoded token.
"""

from __future__ import annotations

from policies.base import PolicyInputError, PoolSpec
from policies.hybrid.block_pool import SharedBlockPool
from policies.hybrid.group import GroupManager, GroupSequence, ceil_div


class SlidingWindowGroup(GroupManager):
    kind = "sliding_window"

    def __init__(self, pool: PoolSpec, shared_pool: SharedBlockPool, prefill_tokens: int, window: int):
        if window <= 0:
            raise PolicyInputError(f"a sliding window must be positive, got {window}")
        super().__init__(pool, shared_pool, prefill_tokens)
        self.window = window

    def held_run(self, num_tokens: int) -> tuple[int, int]:
        return max(0, (num_tokens - self.window) // self.block_size), ceil_div(num_tokens, self.block_size)

    def releases_while_decoding(self) -> bool:
        return True

    def next_release(self, seq: GroupSequence) -> int:
        return (seq.first_block + 1) * self.block_size + self.window

    def prefill_run(self, prompt_len: int) -> tuple[int, int]:
        return self.prompt_tail_run(prompt_len, self.window)

    # -- prefix caching ---------------------------------------------------------------------------
    def skipped_blocks(self, num_tokens: int) -> int:
        # vLLM SlidingWindowManager.get_num_skipped_tokens: the tokens before the next one's window.
        return max(0, num_tokens - self.window + 1) // self.block_size

    def longest_cache_hit(self, chains: list[int], max_blocks: int) -> int:
        """vLLM ``SlidingWindowManager.find_longest_cache_hit`` (``single_type_kv_cache_manager.py``):
        scanning from the right, the first ``ceil((window - 1) / block_size)`` cached blocks in a row
        end the hit (the blocks before them are out of the window: null blocks); failing that, the
        leading run of cached blocks, however short."""
        tables = self.tables
        assert tables is not None
        needed = ceil_div(self.window - 1, self.block_size)
        in_a_row = 0
        # Blocks past the known chains are cached nowhere: the scan starts at the last known one.
        for position in range(min(max_blocks, len(chains)) - 1, -1, -1):
            if not tables.is_cached(chains[position]):
                in_a_row = 0
                continue
            in_a_row += 1
            if in_a_row >= needed:
                return position + in_a_row
        return in_a_row
