"""A host-memory tier for cached KV blocks: an LRU pool of block contents keyed by content chain.

What it follows (vLLM's CPU offloading, ``vllm/v1/kv_offload/lru_manager.py`` ``LRUOffloadingManager``,
and ``kv_connector/v1/offloading/scheduler.py`` ``get_num_new_matched_tokens``):

- An entry is one block's content, keyed by the same exact key the GPU cache uses (parent's content
  chain, what the block holds, namespace). Like vLLM's ``prepare_store``, a key already held is not
  stored twice; when the tier is full the least recently used entry is dropped.
- A lookup counts the leading run of keys the tier holds (``LRUOffloadingManager.lookup``); vLLM's
  connector looks up only past the GPU hit (``num_computed_tokens``), and so does the prefix policy.
- Loading a block back leaves the host copy in place (vLLM frees host blocks only by eviction), and
  a hit is touched (made most recent), as ``touch`` does before vLLM loads.

Unlike vLLM's connector, which stores every computed block as the request runs, blocks reach the
tier when the GPU cache evicts them (write-back on eviction, SGLang HiCache's ``write_back`` policy
and TensorRT-LLM's secondary offload): the host never holds content the GPU cache still has, except
blocks loaded back from it.

The tier holds a content-chain reference for each entry (:class:`policies.prefix.ContentChains`), so a
chain id stays the same while either tier holds its content, and keys of the blocks after it still
match.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

ChainKey = tuple


@dataclass
class HostTierStats:
    """Cumulative host-tier counters (blocks unless named tokens)."""

    host_cache_hits: int = 0  # prompt tokens served from the host tier (loaded back)
    host_loaded_blocks: int = 0  # blocks copied host -> GPU
    host_offloaded_blocks: int = 0  # blocks copied GPU -> host
    host_evictions: int = 0  # host entries dropped to make room (radix: pages)
    host_loaded_tokens: int = 0  # tokens copied host -> GPU: what the engine charges the transfer of
    host_offloaded_tokens: int = 0  # tokens copied GPU -> host


class HostPool:
    """What the engine and the summary read off any host-memory tier: its size in engine blocks and
    its counters. (:class:`HostTier` is the prefix policy's; the radix policy's HiCache pool is
    :class:`policies._radix_tree.HiCachePool`.)"""

    def __init__(self, capacity_blocks: int):
        if isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, int) or capacity_blocks <= 0:
            raise ValueError(f"a host tier needs at least one block, got {capacity_blocks!r}")
        self.capacity_blocks = capacity_blocks
        self.stats = HostTierStats()

    def host_slots(self, block_size: int) -> tuple[int, int]:
        """``(cached, free)`` token slots of the tier: they sum to its size."""
        raise NotImplementedError


class HostTier(HostPool):
    """An LRU pool of ``capacity_blocks`` block contents in host memory.

    ``acquire(key) -> chain id`` and ``release(chain id)`` are the content chains' reference counting:
    the tier holds one reference per entry."""

    def __init__(
        self,
        capacity_blocks: int,
        acquire: Callable[[ChainKey], int],
        release: Callable[[int | None], None],
        block_size: int = 1,
    ):
        super().__init__(capacity_blocks)
        self._block_size = block_size
        self._acquire, self._release = acquire, release
        self._entries: OrderedDict[ChainKey, int] = OrderedDict()  # key -> chain id, oldest first

    @property
    def cached_blocks(self) -> int:
        """Blocks the tier holds now."""
        return len(self._entries)

    def host_slots(self, block_size: int) -> tuple[int, int]:
        cached = len(self._entries)
        return cached * block_size, (self.capacity_blocks - cached) * block_size

    def __contains__(self, key: ChainKey) -> bool:
        return key in self._entries

    def chain_of(self, key: ChainKey) -> int | None:
        """The chain id of ``key`` if the tier holds it (no side effect)."""
        return self._entries.get(key)

    def keys_oldest_first(self) -> list[ChainKey]:
        return list(self._entries)

    def store(self, key: ChainKey) -> bool:
        """Copy an evicted GPU block's content here; returns whether bytes moved (a key already held is
        only touched). Makes room by dropping the least recently used entry."""
        if key in self._entries:
            self._entries.move_to_end(key)
            return False
        if len(self._entries) >= self.capacity_blocks:
            _, chain = self._entries.popitem(last=False)
            self._release(chain)
            self.stats.host_evictions += 1
        self._entries[key] = self._acquire(key)
        self.stats.host_offloaded_blocks += 1
        self.stats.host_offloaded_tokens += self._block_size
        return True

    def load(self, keys: Sequence[ChainKey], block_size: int) -> None:
        """``keys`` (all held) are loaded back to the GPU. Their copies stay and are touched in reverse
        prompt order (vLLM's ``touch``), so the prompt's first block becomes the most recent one and is
        dropped last."""
        for key in reversed(keys):
            self._entries.move_to_end(key)
        self.stats.host_loaded_blocks += len(keys)
        self.stats.host_cache_hits += len(keys) * block_size
        self.stats.host_loaded_tokens += len(keys) * block_size

    def continue_prefix(
        self, parent: int | None, contents: Iterable[tuple], namespace: int
    ) -> list[ChainKey]:
        """The keys of the leading blocks of ``contents`` (what each block holds, in order, after the
        chain ``parent``) that the tier holds: the host part of a prefix hit. No side effect."""
        keys: list[ChainKey] = []
        entries = self._entries
        for content in contents:
            key = (parent, *content, namespace)
            chain = entries.get(key)
            if chain is None:
                break
            keys.append(key)
            parent = chain
        return keys
