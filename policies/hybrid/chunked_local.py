"""Chunked local attention over aligned chunks of ``chunk`` tokens (Llama 4; vLLM's
``ChunkedLocalAttentionManager``): a token attends to the tokens of its own chunk, so at a step that
starts with ``n`` tokens computed, the blocks wholly before ``(n // chunk) x chunk`` are released.
A sequence of ``n`` tokens, its last one just decoded, holds blocks from
``((n - 1) // chunk x chunk) // block_size`` onwards.

During a prompt, chunked prefill holds at most the part of the current attention chunk before a
prefill chunk plus the prefill chunk: ``cdiv(chunk - 1 + prefill chunk, block_size) + 1`` blocks.
"""

from __future__ import annotations

from policies.base import PolicyInputError, PoolSpec
from policies.hybrid.block_pool import SharedBlockPool
from policies.hybrid.group import GroupManager, GroupSequence, ceil_div


class ChunkedLocalGroup(GroupManager):
    kind = "chunked_local"

    def __init__(self, pool: PoolSpec, shared_pool: SharedBlockPool, prefill_tokens: int, chunk: int):
        if chunk <= 0:
            raise PolicyInputError(f"an attention chunk must be positive, got {chunk}")
        super().__init__(pool, shared_pool, prefill_tokens)
        self.chunk = chunk

    def held_run(self, num_tokens: int) -> tuple[int, int]:
        chunk_start = max(0, num_tokens - 1) // self.chunk * self.chunk
        return chunk_start // self.block_size, ceil_div(num_tokens, self.block_size)

    def releases_while_decoding(self) -> bool:
        return True

    def next_release(self, seq: GroupSequence) -> int:
        # The first token count whose chunk starts in a later block than the one held first.
        chunk = self.chunk
        next_start = ((seq.first_block + 1) * self.block_size + chunk - 1) // chunk * chunk
        return next_start + 1

    def prefill_run(self, prompt_len: int) -> tuple[int, int]:
        return self.prompt_tail_run(prompt_len, self.chunk)

    # -- prefix caching ---------------------------------------------------------------------------
    def skipped_blocks(self, num_tokens: int) -> int:
        # vLLM ChunkedLocalAttentionManager.get_num_skipped_tokens: the tokens before the current chunk.
        return num_tokens // self.chunk * self.chunk // self.block_size

    def longest_cache_hit(self, chains: list[int], max_blocks: int) -> int:
        """vLLM ``ChunkedLocalAttentionManager.find_longest_cache_hit``
        (``single_type_kv_cache_manager.py``): the blocks before the chunk the hit would end in count
        as computed (null blocks); from that chunk's first block, the run of cached blocks."""
        tables = self.tables
        assert tables is not None
        hit = self.skipped_blocks(max_blocks * self.block_size) if max_blocks else 0
        while hit < max_blocks and hit < len(chains) and tables.is_cached(chains[hit]):
            hit += 1
        return hit
