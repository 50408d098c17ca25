"""The shared block pool of vLLM's hybrid manager with prefix caching on: blocks with identities.

vLLM V1 (``vllm/v1/core/block_pool.py``, ``BlockPool``): every block has a reference count; a full
block of a request's tokens is cached under ``(block hash, KV-cache group id)`` (``cache_full_blocks``,
``BlockHashToBlockMap``), so each group keeps its own cached blocks; a freed block keeps its hash and
waits in the free queue (``FreeKVCacheBlockQueue``: freed blocks to the tail, allocation from the
head, ``get_new_blocks``), still hittable, until an allocation takes it, which evicts it
(``_maybe_evict_cached_block``). A hit on a free cached block takes it out of the queue (``touch``).

Identities here are the content chains of ``policies/prefix.py`` (``ContentChains`` over the keys
``block_contents`` spells out): a block's chain id names its tokens and every token before them, as
vLLM's chained block hash does. One :class:`ContentChains` serves every group of the pool (vLLM
hashes a request's blocks once, ``request.block_hashes``); each group keys its cached blocks by chain
id in a map of its own. Duplicates are kept, as vLLM keeps them: a chain may name several cached
blocks of one group, and a hit takes the earliest cached (``get_one_block``).

Accounting: the groups report what they hold and their cached blocks (reference count 0, identity
kept); the pool reports the blank free blocks and the tail past the last whole block.
"""

from __future__ import annotations

from typing import Final

from mypy_extensions import mypyc_attr

from policies.base import OutOfKVMemory, PolicyStats
from policies.hybrid.block_pool import SharedBlockPool
from policies.paged import FreeBlockQueue
from policies.prefix import ContentChains, block_contents

NO_BLOCK: Final = -1


@mypyc_attr(allow_interpreted_subclasses=True)  # (Jenga's per-type pages: policies/hybrid/jenga_cache.py)
class PrefixCachingBlockPool(SharedBlockPool):
    """A :class:`SharedBlockPool` whose blocks have ids, reference counts and cache identities.
    ``free_blocks`` counts every block an allocation may take: blank ones and evictable cached ones."""

    def __init__(self, num_blocks: int, block_size: int, pool_slots: int | None = None):
        super().__init__(num_blocks, block_size, pool_slots)
        self.caches_prefixes = True
        self.chains = ContentChains()
        self.queue = FreeBlockQueue(range(num_blocks))
        self.ref_count: list[int] = [0] * num_blocks
        self.block_chain: list[int] = [NO_BLOCK] * num_blocks  # its identity, or NO_BLOCK
        self.block_group: list[int] = [NO_BLOCK] * num_blocks  # the group whose cache holds it
        self._caches: list[dict[int, list[int]]] = []  # per group: chain id -> blocks, earliest first
        self._cached: list[int] = []  # per group: its free blocks that keep an identity
        self._stats: list[PolicyStats] = []  # per group: where its evictions are counted
        self.cached_blocks = 0

    # -- groups ----------------------------------------------------------------------------------
    def add_group(self, stats: PolicyStats) -> int:
        """A group drawing on this pool: its index (the group id of vLLM's cache key)."""
        self._caches.append({})
        self._cached.append(0)
        self._stats.append(stats)
        return len(self._caches) - 1

    def cached_in(self, group: int) -> int:
        """Blocks of ``group`` that are free but keep their identity (evictable)."""
        return self._cached[group]

    def cached_block(self, group: int, chain: int) -> int:
        """The block ``group`` would hit for ``chain`` (``get_cached_block``), or ``NO_BLOCK``."""
        blocks = self._caches[group].get(chain)
        return blocks[0] if blocks else NO_BLOCK

    # -- blocks ----------------------------------------------------------------------------------
    def take_blocks(self, count: int, what: str) -> list[int]:
        """``count`` blocks from the head of the free queue, each held once; a cached block taken is
        evicted (its group forgets it). Raises :class:`OutOfKVMemory`, changing nothing, when short."""
        if count > self.free_blocks:
            raise OutOfKVMemory(
                f"{what} needs {count} blocks of the shared pool, {self.free_blocks} free",
                needed_slots=count * self.block_size,
                free_slots=self.free_slots(),
            )
        evicted_from = self.queue.blank
        blocks = self.queue.take(count)
        for index in range(evicted_from, count):
            self._evict(blocks[index])
        for block in blocks:
            self.ref_count[block] = 1
        self.free_blocks -= count
        return blocks

    def _evict(self, block: int) -> None:
        group = self.block_group[block]
        chain = self.block_chain[block]
        holders = self._caches[group][chain]
        holders.remove(block)
        if not holders:
            del self._caches[group][chain]
        self.chains.release(chain)
        self.block_chain[block] = self.block_group[block] = NO_BLOCK
        self._cached[group] -= 1
        self.cached_blocks -= 1
        self._stats[group].evictions += 1

    def touch(self, block: int) -> bool:
        """One more holder of a cached block (a prefix hit); True when others held it already. A free
        one leaves the queue."""
        shared = self.ref_count[block] > 0
        if not shared:
            self.queue.remove_cached(block)
            self._cached[self.block_group[block]] -= 1
            self.cached_blocks -= 1
            self.free_blocks -= 1
        self.ref_count[block] += 1
        return shared

    def release(self, block: int) -> bool:
        """One holder fewer (``free_blocks``: the caller gives blocks back tail first); True when it is
        still held. A block nobody holds goes to the queue: to the tail when it keeps an identity
        (cached), to the head when it holds nothing reusable."""
        count = self.ref_count[block] - 1
        self.ref_count[block] = count
        if count:
            return True
        if self.block_chain[block] == NO_BLOCK:
            self.queue.appendleft(block)
        else:
            self.queue.append(block)
            self._cached[self.block_group[block]] += 1
            self.cached_blocks += 1
        self.free_blocks += 1
        return False

    def cache_block(self, group: int, block: int, chain: int) -> None:
        """A held block of ``group`` became full: it is cached under ``chain`` (``cache_full_blocks``)."""
        self.chains.hold(chain)
        self.block_chain[block] = chain
        self.block_group[block] = group
        self._caches[group].setdefault(chain, []).append(block)

    def has_identity(self, block: int) -> bool:
        return self.block_chain[block] != NO_BLOCK

    # -- what the pool itself reports ---------------------------------------------------------------
    def adjust(self, net_blocks: int) -> None:
        """Nothing: with identities, the groups take and release the blocks themselves."""

    def breakdown_values(self) -> tuple[int, int, int, int, int, int]:
        """The tail and the blank free blocks (the groups report their cached blocks)."""
        tail = self.pool_slots - self.num_blocks * self.block_size
        return 0, 0, 0, tail, 0, (self.free_blocks - self.cached_blocks) * self.block_size


def find_chains(
    chains: ContentChains,
    segments: list[tuple[int, int]],
    ends: list[int],
    last: int,
    block_size: int,
    namespace: int,
) -> list[int]:
    """The chain ids of the first blocks (at most ``last``) of the content laid out as ``segments``,
    up to the first one nothing holds: no block anywhere holds that content after this prefix, nor
    any later one. Changes nothing (a lookup)."""
    found: list[int] = []
    parent: int | None = None
    for content in block_contents(segments, ends, 0, last, block_size):
        chain = chains.find((parent, *content, namespace))
        if chain is None:
            break
        found.append(chain)
        parent = chain
    return found


def acquire_chains(
    chains: ContentChains,
    segments: list[tuple[int, int]],
    ends: list[int],
    first: int,
    last: int,
    block_size: int,
    parent: int | None,
    namespace: int,
) -> list[int]:
    """The chain ids of blocks ``first`` to ``last - 1``, each held once more (interned when new): a
    live sequence holds the chains of its full blocks, so its next block's key always has a parent."""
    ids = []
    for content in block_contents(segments, ends, first, last, block_size):
        parent = chains.acquire((parent, *content, namespace))
        ids.append(parent)
    return ids
