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

Lazy keys (a speed-up with identical results, the ``prefix`` policy's, ``policies/prefix.py``): on
streams with little reuse nearly every block is keyed, cached, then evicted unused, each a chain
interned and forgotten. With ``lazy_keys`` a group's blocks past a sequence's first key nothing holds
(past its prefix hit) form a :class:`LazyRun`, filed under that key: they are only marked cached
(:data:`LAZY`). Any block after that key can be hit only through it, so the first lookup
(:meth:`PrefixCachingBlockPool.find_chains`), fork, or sequence of the same group that reaches it keys
every run filed there (:meth:`PrefixCachingBlockPool.key_runs`): their still-marked blocks are cached
under their chains in the order they were marked, as they would have been. Each group keeps its own
run (the groups' caches are apart); a sequence's groups file theirs under the same key. Only pools
whose groups cache every full block alike use them (not Mamba states, nor Marconi's); Jenga's types,
a pool each over one set of chains, share one registry of runs.

Accounting: the groups report what they hold and their cached blocks (reference count 0, identity
kept); the pool reports the blank free blocks and the tail past the last whole block.
"""

from __future__ import annotations

from typing import Final, cast

from mypy_extensions import mypyc_attr

from policies.base import OutOfKVMemory, PolicyStats
from policies.hybrid.block_pool import SharedBlockPool
from policies.paged import FreeBlockQueue, SequenceState
from policies.prefix import ChainKey, ContentChains, block_contents

NO_BLOCK: Final = -1
LAZY: Final = -2
"""A lazy run's position without a chain yet (in a sequence's chains), or a block marked cached by a
lazy run (as its identity)."""


def as_objects(blocks: list[int]) -> list[object]:
    """The same list, its items read as objects: compiled, a block id read from a ``list[int]`` is
    unboxed, and boxed anew (an allocation past 256) when it is put in another list; read as an
    object, the list's own int object is put there. (A loop over a prompt's or a window's blocks
    did that per block: nearly half the time a ``vllm-hybrid`` replay with caching spent allocating.)"""
    return cast(list[object], blocks)


class LazyRun:
    """One group's full blocks of one sequence from position ``first`` on, cached without keys: the key
    of block ``first`` (``key``) was held by nothing when it filled. ``chains`` is the sequence's own
    list of chains (:data:`LAZY` from ``first`` on) while it lives (``live``)."""

    pool: PrefixCachingBlockPool  # where its blocks are (pools sharing chains share their runs)
    key: ChainKey
    parent: int | None  # the chain before it, held by the run (as its first block's key would hold it)
    first: int
    group: int
    content: SequenceState  # the sequence's tokens: what the keys are made of
    chains: list[int]
    live: bool
    keyed: bool  # keyed since (the sequence's later blocks get their chains at once)
    marked: list[int]  # the blocks it marked, in the order they were cached
    # Where the positions of ``marked`` are not consecutive: flat (index in ``marked``, position)
    # pairs, one per stretch of consecutive positions. (A position stored per mark was a boxed int
    # made per block of every prompt, and freed with the run.)
    stretches: list[int]
    next_position: int  # the position a mark continuing the last stretch has
    identified: int  # blocks marked by this run now (held or cached)

    def __init__(
        self,
        pool: PrefixCachingBlockPool,
        key: ChainKey,
        parent: int | None,
        first: int,
        group: int,
        content: SequenceState,
        chains: list[int],
    ) -> None:
        self.pool = pool
        self.key = key
        self.parent = parent
        self.first = first
        self.group = group
        self.content = content
        self.chains = chains
        self.live = True
        self.keyed = False
        self.marked = []
        self.stretches = []
        self.next_position = -1
        self.identified = 0

    def mark_positions(self) -> list[int]:
        """The position of each block of ``marked``."""
        stretches = self.stretches
        positions: list[int] = []
        for index in range(0, len(stretches), 2):
            end = stretches[index + 2] if index + 2 < len(stretches) else len(self.marked)
            first = stretches[index + 1]
            positions.extend(range(first, first + end - stretches[index]))
        return positions

    def forget_marks(self) -> None:
        self.marked = []
        self.stretches = []
        self.next_position = -1
        self.identified = 0


@mypyc_attr(allow_interpreted_subclasses=True)  # (Jenga's per-type pages: policies/hybrid/jenga_cache.py)
class PrefixCachingBlockPool(SharedBlockPool):
    """A :class:`SharedBlockPool` whose blocks have ids, reference counts and cache identities.
    ``free_blocks`` counts every block an allocation may take: blank ones and evictable cached ones."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        pool_slots: int | None = None,
        lazy_keys: bool = False,
        lazy_runs: dict[ChainKey, list[LazyRun]] | None = None,
    ):
        """``lazy_runs``: the runs of every pool whose blocks share this one's chains (Jenga's types);
        a pool of its own by default."""
        super().__init__(num_blocks, block_size, pool_slots)
        self.caches_prefixes = True
        self.lazy_keys = lazy_keys  # (see the module docstring)
        # First key -> the runs filed under it (a key reached keys them in every pool sharing it).
        self.lazy_runs: dict[ChainKey, list[LazyRun]] = {} if lazy_runs is None else lazy_runs
        self.block_run: list[LazyRun | None] = [None] * num_blocks  # a marked block's run
        self.chains = ContentChains()
        self.queue = FreeBlockQueue(range(num_blocks))
        self.ref_count: list[int] = [0] * num_blocks
        self.block_chain: list[int] = [NO_BLOCK] * num_blocks  # its identity, or NO_BLOCK
        # The group whose cache holds a keyed block, or NO_BLOCK (a lazy mark's is its run's: group_of).
        self.block_group: list[int] = [NO_BLOCK] * num_blocks
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
        ref_count = self.ref_count
        if evicted_from < count:
            for index in range(evicted_from):
                ref_count[blocks[index]] = 1
            self._evict_each(blocks, evicted_from)  # (which holds them once, in the same pass)
        else:
            for block in blocks:
                ref_count[block] = 1
        self.free_blocks -= count
        return blocks

    def _evict_each(self, blocks: list[int], start: int) -> None:
        """:meth:`_evict` of ``blocks[start:]`` in turn, each then held once (:meth:`take_blocks`). A
        lazy run's blocks are evicted here, not one call each: once the cache fills, every block a
        prompt takes is an eviction, and nearly all of them lazy (a sliding window's prompt passes
        through a block per ``block_size`` tokens). They come off the queue a stretch of one run at
        a time (a run's blocks are given back together), and each stretch is counted off its run
        and its group at once."""
        chain_of, run_of, ref_count = self.block_chain, self.block_run, self.ref_count
        lazy = 0
        run: LazyRun | None = None  # the run of the stretch being counted
        stretch = 0
        for index in range(start, len(blocks)):
            block = blocks[index]
            ref_count[block] = 1
            if chain_of[block] != LAZY:
                if run is not None:  # (counted first: a run forgotten releases a chain, as before)
                    self._evict_marks(run, stretch)
                    run, stretch = None, 0
                self._evict(block)
                continue
            lazy += 1
            owner = run_of[block]
            if owner is not run:
                if run is not None:
                    self._evict_marks(run, stretch)
                run, stretch = owner, 0
            stretch += 1
            run_of[block] = None
            chain_of[block] = NO_BLOCK
        if run is not None:
            self._evict_marks(run, stretch)
        self.cached_blocks -= lazy

    def _evict_marks(self, run: LazyRun, blocks: int) -> None:
        """``blocks`` blocks ``run`` marked were evicted (their identities are cleared by the caller):
        counted off the run and its group; a freed run none of whose blocks is marked any more is
        forgotten."""
        group = run.group
        self._cached[group] -= blocks
        self._stats[group].evictions += blocks
        identified = run.identified - blocks
        run.identified = identified
        if not identified and not run.live:
            self.drop_run(run)

    def _evict(self, block: int) -> None:
        chain = self.block_chain[block]
        if chain == LAZY:
            self._evict_lazy(block)
            return
        group = self.block_group[block]
        holders = self._caches[group][chain]
        holders.remove(block)
        if not holders:
            del self._caches[group][chain]
        self.chains.release(chain)
        self.block_chain[block] = self.block_group[block] = NO_BLOCK
        self._cached[group] -= 1
        self.cached_blocks -= 1
        self._stats[group].evictions += 1

    def _evict_lazy(self, block: int) -> None:
        """A block a lazy run marked is evicted: nothing was keyed."""
        run = self.block_run[block]
        assert run is not None
        self.block_run[block] = None
        self.block_chain[block] = NO_BLOCK
        self.cached_blocks -= 1
        self._evict_marks(run, 1)

    def group_of(self, block: int) -> int:
        """The group whose cache holds ``block`` (one with an identity: keyed, or marked by a lazy
        run, whose group it is), else ``NO_BLOCK``. (A mark writes no group per block: a prompt's
        every block is marked.)"""
        chain = self.block_chain[block]
        if chain == LAZY:
            run = self.block_run[block]
            assert run is not None
            return run.group
        return self.block_group[block] if chain != NO_BLOCK else NO_BLOCK

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
            self._cached[self.group_of(block)] += 1
            self.cached_blocks += 1
        self.free_blocks += 1
        return False

    def cache_block(self, group: int, block: int, chain: int) -> None:
        """A held block of ``group`` became full: it is cached under ``chain`` (``cache_full_blocks``)."""
        self.chains.hold(chain)
        self.block_chain[block] = chain
        self.block_group[block] = group
        self._caches[group].setdefault(chain, []).append(block)

    def release_each(self, blocks: list[int]) -> bool:
        """:meth:`release` of each block in turn; True when some stay held (by other sequences). The
        blank ones go to the head in one extension and the cached ones to the tail in another: the
        two ends are apart, so each keeps the order of one-by-one releases. (A sequence gives back
        every block it holds at once, and a sliding window all of a prompt's past blocks.)"""
        ref_count, chain_of, run_of = self.ref_count, self.block_chain, self.block_run
        group_of = self.block_group  # (a keyed block's group; a lazy mark's is its run's)
        blank: list[object] = []
        keyed: list[object] = []
        held = False
        # Each group's count of cached blocks moves once per stretch of its blocks (once per call,
        # in practice: a list element moved per block is a boxed int made per block).
        group, stretch = NO_BLOCK, 0
        for item in as_objects(blocks):
            block = cast(int, item)
            count = ref_count[block] - 1
            ref_count[block] = count
            if count:
                held = True
                continue
            chain = chain_of[block]
            if chain == NO_BLOCK:
                blank.append(item)
                continue
            keyed.append(item)
            if chain == LAZY:
                run = run_of[block]
                assert run is not None
                owner = run.group
            else:
                owner = group_of[block]
            if owner != group:
                self._count_cached(group, stretch)
                group, stretch = owner, 0
            stretch += 1
        self._count_cached(group, stretch)
        if blank:
            self.queue.extendleft(cast(list[int], blank))
        if keyed:
            self.queue.extend(cast(list[int], keyed))
            self.cached_blocks += len(keyed)
        self.free_blocks += len(blank) + len(keyed)
        return held

    def _count_cached(self, group: int, blocks: int) -> None:
        if blocks:
            self._cached[group] += blocks

    def release_one_by_one(self, blocks: list[int]) -> bool:
        """:meth:`release_each` for a pool whose :meth:`release` does more (Jenga's, Marconi's)."""
        held = False
        for block in blocks:
            if self.release(block):
                held = True
        return held

    def has_identity(self, block: int) -> bool:
        return self.block_chain[block] != NO_BLOCK

    # -- lazy runs ----------------------------------------------------------------------------------
    def file_run(self, run: LazyRun) -> LazyRun:
        """A new lazy run of this pool, whose first key nothing holds: filed under it, holding its
        parent."""
        self.chains.hold(run.parent)
        runs = self.lazy_runs.get(run.key)
        if runs is None:
            self.lazy_runs[run.key] = [run]
        else:
            runs.append(run)
        return run

    def reaches_run_of(self, key: ChainKey, group: int) -> bool:
        """A sequence of ``group`` reaches ``key``, which nothing holds: if a run of the same group is
        filed under it (another sequence with the same tokens), every run there is keyed first
        (True); runs of other groups only (the same sequence's) it joins (False)."""
        runs = self.lazy_runs.get(key)
        if runs is None:
            return False
        for run in runs:
            if run.group == group and run.pool is self:
                self.key_runs(key)
                return True
        return False

    def mark_lazy(self, block: int, run: LazyRun, position: int) -> None:
        """A held block at ``position`` of ``run`` is full: cached (in the run's group), keyed if a
        lookup ever reaches it."""
        self.block_chain[block] = LAZY
        self.block_run[block] = run
        if position != run.next_position:
            run.stretches += (len(run.marked), position)
        run.marked.append(block)
        run.next_position = position + 1
        run.identified += 1

    def mark_lazy_each(self, table: list[int], start: int, end: int, run: LazyRun) -> None:
        """:meth:`mark_lazy` of each held block at positions ``start`` to ``end - 1`` of ``table`` that
        has no identity yet, in order (a prompt's blocks past its first key fill together)."""
        chain_of, run_of = self.block_chain, self.block_run
        marked = as_objects(run.marked)
        held = as_objects(table)
        next_position = run.next_position
        marks = 0
        for position in range(start, end):
            item = held[position]
            block = cast(int, item)
            if block != NO_BLOCK and chain_of[block] == NO_BLOCK:
                chain_of[block] = LAZY
                run_of[block] = run
                if position != next_position:
                    run.stretches += (len(marked), position)
                marked.append(item)
                next_position = position + 1
                marks += 1
        run.next_position = next_position
        run.identified += marks

    def key_runs(self, key: ChainKey) -> None:
        """Key every run filed under ``key`` (a lookup, a fork or a sequence of one of their groups
        reached it): its blocks as they would have been keyed, in the order they were cached."""
        for run in self.lazy_runs.pop(key):
            run.pool.key_run(run)

    def key_run(self, run: LazyRun) -> None:
        """The chains of the run's positions up to the last it needs (the live sequence's full blocks,
        or its last still-marked block), each held once by the sequence while it lives, and its
        marked blocks cached under them."""
        run.keyed = True
        marked = run.marked
        positions = run.mark_positions()
        block_run = self.block_run
        live = self._live_marks(run)
        end = run.first
        if run.live:
            end = len(run.chains)
        else:
            for index in range(len(marked)):
                if live[index] and positions[index] >= end:
                    end = positions[index] + 1
        content = run.content
        ids = acquire_chains(
            self.chains, content.segments, content.segment_ends, run.first, end, self.block_size,
            run.parent, content.namespace,
        )  # fmt: skip
        self.chains.release(run.parent)  # (its first key holds it now)
        cache = self._caches[run.group]
        for index in range(len(marked)):
            if live[index]:
                block = marked[index]
                block_run[block] = None
                chain = ids[positions[index] - run.first]
                self.chains.hold(chain)
                self.block_chain[block] = chain
                self.block_group[block] = run.group
                cache.setdefault(chain, []).append(block)
        run.forget_marks()
        if run.live:
            run.chains[run.first :] = ids  # (the sequence's own holds)
        else:
            self.chains.release_each(ids)

    def _live_marks(self, run: LazyRun) -> list[bool]:
        """Which of the run's marks still stand: a block's last mark, if the run still marks it (an
        earlier mark of the same block was evicted, and the block marked again at another position).
        (Found here, where a run is keyed, not kept per block at each mark: a block's position stored
        at every mark cost most of marking.)"""
        marked, block_run = run.marked, self.block_run
        live = [False] * len(marked)
        seen: set[int] = set()
        for index in range(len(marked) - 1, -1, -1):
            block = marked[index]
            if block not in seen:
                seen.add(block)
                live[index] = block_run[block] is run
        return live

    def drop_run(self, run: LazyRun) -> None:
        """A run nothing can reach any more (freed, none of its blocks marked): forgotten."""
        runs = self.lazy_runs[run.key]
        runs.remove(run)
        if not runs:
            del self.lazy_runs[run.key]
        self.chains.release(run.parent)

    def find_chains(
        self, segments: list[tuple[int, int]], ends: list[int], last: int, namespace: int
    ) -> list[int]:
        """The chain ids of the first blocks (at most ``last``) of the content laid out as ``segments``,
        up to the first one nothing holds: no block anywhere holds that content after this prefix,
        nor any later one. The lazy runs filed under a key it reaches are keyed first; nothing else
        changes (a lookup)."""
        found: list[int] = []
        parent: int | None = None
        chains, lazy_runs = self.chains, self.lazy_runs
        for content in block_contents(segments, ends, 0, last, self.block_size):
            key = (parent, *content, namespace)
            chain = chains.find(key)
            if chain is None:
                if key not in lazy_runs:
                    break
                self.key_runs(key)
                chain = chains.find(key)
                assert chain is not None  # (a filed run holds what it needs: a live sequence, or blocks)
            found.append(chain)
            parent = chain
        return found

    # -- what the pool itself reports ---------------------------------------------------------------
    def adjust(self, net_blocks: int) -> None:
        """Nothing: with identities, the groups take and release the blocks themselves."""

    def breakdown_values(self) -> tuple[int, int, int, int, int, int]:
        """The tail and the blank free blocks (the groups report their cached blocks)."""
        tail = self.pool_slots - self.num_blocks * self.block_size
        return 0, 0, 0, tail, 0, (self.free_blocks - self.cached_blocks) * self.block_size


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
