"""The blocks several KV groups draw from: vLLM's ``BlockPool`` under a hybrid model's groups.

vLLM gives every KV-cache group the same page size in bytes and lets all groups take blocks from one
pool of ``num_gpu_blocks`` (``kv_cache_utils.py``: one KV-cache tensor per layer slot, each group
owning one layer of every slot), so a block id is memory for ``block_size`` tokens in one group. The
groups hold blocks; the pool holds what no group holds. Without a prefix cache, free blocks are
interchangeable, so the pool keeps their count.
"""

from __future__ import annotations

from collections.abc import Callable

from mypy_extensions import mypyc_attr

from policies.base import OutOfKVMemory, PolicyInputError


@mypyc_attr(allow_interpreted_subclasses=True)
class SharedBlockPool:
    def __init__(self, num_blocks: int, block_size: int, pool_slots: int | None = None):
        """``num_blocks`` blocks of ``block_size`` slots; ``pool_slots`` (default: the blocks' slots)
        is the KV memory they were cut from, in slots: what is left past the last whole block is
        external fragmentation, as in every block policy."""
        if num_blocks <= 0 or block_size <= 0:
            raise PolicyInputError(
                f"a shared block pool needs blocks, got {num_blocks} of {block_size} slots"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.pool_slots = num_blocks * block_size if pool_slots is None else pool_slots
        if self.pool_slots < num_blocks * block_size:
            raise PolicyInputError(f"pool_slots={pool_slots} cannot hold {num_blocks} blocks of {block_size}")
        self.free_blocks = num_blocks
        self.caches_prefixes = False  # (blocks with identities: ``prefix_pool.PrefixCachingBlockPool``)
        # Unbacked decode growth (``KVCachePolicy.defer_unbacked``; blocks of one token): decoded
        # tokens no group holds yet, each taking a free block of this pool.
        self.unbacked: Callable[[], int] | None = None

    def spare_blocks(self) -> int:
        """Free blocks an allocation may take: the free ones less those pending tokens fill."""
        unbacked = self.unbacked
        return self.free_blocks if unbacked is None else self.free_blocks - unbacked()

    def free_slots(self) -> int:
        return self.spare_blocks() * self.block_size

    def take(self, blocks: int, what: str) -> None:
        """Hand ``blocks`` to a group; raises :class:`OutOfKVMemory`, changing nothing, when short."""
        if blocks > self.spare_blocks():
            raise OutOfKVMemory(
                f"{what} needs {blocks} blocks of the shared pool, {self.spare_blocks()} free",
                needed_slots=blocks * self.block_size,
                free_slots=self.free_slots(),
            )
        self.free_blocks -= blocks

    def adjust(self, net_blocks: int) -> None:
        """Groups took ``net_blocks`` blocks (negative: gave them back) in one growth whose net the
        caller checked against the free blocks."""
        self.free_blocks -= net_blocks
        assert 0 <= self.free_blocks <= self.num_blocks, "a growth the pool could not hold"

    def give_back(self, blocks: int) -> None:
        self.free_blocks += blocks
        assert self.free_blocks <= self.num_blocks, "a group gave back blocks it never took"

    def breakdown_values(self) -> tuple[int, int, int, int, int, int]:
        """The pool's own part of the breakdown: free blocks and the split-off tail (the groups report
        what they hold)."""
        return 0, 0, 0, self.pool_slots - self.num_blocks * self.block_size, 0, self.free_slots()
