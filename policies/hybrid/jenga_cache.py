"""Jenga's prefix caching: one layer type's small pages with identities, and its eviction, which
frees whole large pages first.

Followed from the paper's artifact, heheda12345/Jenga-SOSP25-AE, branch ``vllm-v0-jenga`` (commit
bb5cee614b054e54cd2a4791cb214051cde46fda): ``vllm/core/evictor_v2.py`` (``Level1LRUEvictor``,
``Level0LRUEvictor``), ``vllm/core/block/prefix_caching_block.py`` (``_allocate_block_id``,
``remove_blocks_from_evictor``, ``LastAccessBlocksTracker``) and
``vllm/core/block_v3/custom_block.py`` (``SlidingWindowManager.free_skipped_blocks``); the paper (Zhang et al., SOSP 2025, arXiv 2503.18292) describes it as
request-aware and layer-aware eviction, balancing the hit of every layer type.

* **Cached small pages** (per type): a small page nobody holds any more that keeps its content's
  identity (a full block's content chain, ``policies/hybrid/prefix_pool.py``) is *cached*: still
  hittable, evictable. Its large page stays carved by the type until every small page of it is
  evicted or blank, so a large page is given back to the shared pool only when all its small pages
  are free (blank), as without caching.
* **Stamps** (``LastAccessBlocksTracker``): every page a request gives back at once gets the same
  time, in every type (so one request's pages of every type leave together, *aligned*), with the
  request as tie-break (the artifact adds ``seq_id / 100``, "so that the eviction will be
  centralized to one request"); within that, the page given back first, which is the deepest (a
  free gives its pages back tail first: the artifact's ``-num_hashed_tokens``). The pages a sliding
  window or an attention chunk releases while its request runs are stamped :data:`SKIPPED_AGE`
  older (the artifact's ``-200``): only the last window is needed for a hit, so they go first.
* **Eviction** (``_allocate_block_id``): a small page of a type comes from the request's own free
  pages, a new large page within its quota, free pages whose request is gone; then, while the quota
  asks for a new large page and none is free, the *large page* all of whose small pages are cached
  and whose latest stamp is the oldest, of any type, is evicted whole and given back
  (``Level0LRUEvictor.evict_level0``); then another request's free pages; last, the type's oldest
  cached small page (``evict_level1``). Room counts a large page of cached pages as a free large
  page, and the other cached pages of a type as its free small pages (``set_large_block_quota``).
  A large page with blank small pages beside cached ones is not evicted whole (its pages are not
  all in the evictor, ``Level1LRUEvictor.free_block_counter``): its blank pages serve its type.

Kvsim's differences: the clock is the engine's scheduler step (its iteration: every operation of
one step shares it, as the artifact stamps with the step's time), so ``SKIPPED_AGE`` is 200 steps
(driven without an engine, the clock counts the coordinator's operations); a page stamp's parts are
compared in order (time, request, order given back), where the artifact adds the request to the
time as ``seq_id / 100``; the type's oldest cached page is taken from the large pages not wholly
cached (the artifact may take one from a wholly cached large page that it also counts as a free
large page).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Final

from policies.hybrid.jenga_pages import SmallPageAllocator
from policies.hybrid.prefix_pool import NO_BLOCK, LazyRun, PrefixCachingBlockPool
from policies.prefix import ChainKey, ContentChains

SKIPPED_AGE = 200
"""How much older (in scheduler steps) a page a window or a chunk released while its request runs is
stamped."""

Stamp = int
"""(time, request, order given back), compared in that order, as one int (``EvictionClock.stamp``):
the smallest is evicted first. (One int, not a tuple: the eviction heaps compare stamps at every
page taken, and a tuple's comparison is a generic call per element.)"""

_PART_BITS: Final = 40  # request ids and orders below 2**40 keep the parts' order
_INDEX_BITS: Final = 40  # a page or large page below 2**40: an eviction heap's entry is one int
_INDEX_MASK: Final = (1 << _INDEX_BITS) - 1


def _queued(stamp: Stamp, index: int) -> int:
    """An eviction heap's entry: ``stamp``, then the page (or large page) ``index``, as one int (the
    heaps pop one at every page taken: ints compare without a tuple's generic call per element)."""
    return (stamp << _INDEX_BITS) + index


def stamp_parts(stamp: Stamp) -> tuple[int, int, int]:
    """A stamp's (time, request, order given back)."""
    mask = (1 << _PART_BITS) - 1
    return stamp >> 2 * _PART_BITS, (stamp >> _PART_BITS) & mask, stamp & mask


class EvictionClock:
    """The time, the request and the age that the pages given back now are stamped with (every type
    shares one: a request's pages of every type get one stamp)."""

    def __init__(self) -> None:
        self.time = 0
        self.request = 0
        self.age = 0
        self._order = 0
        self._base = 0  # the stamp's (time, request) part, as tick() and serve() leave them
        # The engine's scheduler step of the operation in progress (KVCoordinator.follow_steps); None:
        # the clock counts the coordinator's operations instead (a pool driven without an engine).
        self.steps: Callable[[], int] | None = None

    def tick(self) -> None:
        """A new operation of the KV coordinator: stamped with its scheduler step, as the artifact
        stamps with the step's time, so that how the engine groups its operations (one step at a
        time, or the flushes of a jump) changes no stamp's order."""
        steps = self.steps
        self.time = self.time + 1 if steps is None else steps()
        self._rebase()

    def serve(self, request: int, age: int = 0) -> None:
        """The pages given back next are ``request``'s, stamped ``age`` older than now."""
        self.request = request
        self.age = age
        self._rebase()

    def _rebase(self) -> None:
        # (Once per operation or request, not per page: a stamp's parts are multi-digit ints.)
        assert 0 <= self.request < 1 << _PART_BITS
        self._base = (((self.time - self.age) << _PART_BITS) + self.request) << _PART_BITS

    def stamp(self) -> Stamp:
        self._order += 1
        assert self._order < 1 << _PART_BITS
        return self._base + self._order


class WholeQueue:
    """A type's wholly cached large pages, oldest latest stamp first: a heap of entries (``_queued``),
    a stale one (the large page no longer wholly cached, or cached again since) skipped when it comes
    up."""

    def __init__(self) -> None:
        self.heap: list[int] = []

    def push(self, latest: Stamp, large: int) -> None:
        heapq.heappush(self.heap, _queued(latest, large))

    def oldest(self, whole: list[Stamp | None]) -> Stamp | None:
        """The oldest entry's stamp (``whole``: each large page's latest stamp while wholly cached),
        None without one."""
        heap = self.heap
        while heap and whole[heap[0] & _INDEX_MASK] != heap[0] >> _INDEX_BITS:
            heapq.heappop(heap)
        return heap[0] >> _INDEX_BITS if heap else None

    def pop_oldest(self, whole: list[Stamp | None]) -> int:
        """The large page :meth:`oldest` named, taken out."""
        entry = heapq.heappop(self.heap)
        large = entry & _INDEX_MASK
        assert whole[large] == entry >> _INDEX_BITS, "oldest() first"
        return large

    def pop_oldest_before(self, whole: list[Stamp | None], most: int, before: Stamp | None) -> list[int]:
        """The oldest entries' large pages, taken out in order while their latest stamp is below
        ``before`` (None: whatever it is), ``most`` at most; each is wholly cached no more (``whole``
        None), so that a second entry of the same page and stamp is stale. (A large page made whole
        twice keeps its latest stamp when the page cached again is stamped older: a window's.)"""
        taken: list[int] = []
        while len(taken) < most:
            stamp = self.oldest(whole)
            if stamp is None or (before is not None and stamp >= before):
                break
            large = self.pop_oldest(whole)
            whole[large] = None
            taken.append(large)
        return taken


class WholeRuns(WholeQueue):
    """:class:`WholeQueue` for pages that are each a whole large page (``ratio`` 1, every type of
    gpt-oss, Gemma 3 or Llama 4): a page's latest stamp is the one it was just given, so the pages a
    request gives back at once arrive with consecutive stamps, and are kept as one run, the heap
    holding one key per run (its first stamp), not one entry per page.

    Why a run's key may stay its first stamp while its head moves on: stamps are never given twice,
    so a stamp between a run's first and its head was that run's own, and is gone or stale; no other
    run's valid page lies there."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: dict[Stamp, StampRun] = {}  # first stamp -> run
        self.top: StampRun | None = None  # the run whose first stamp is the heap's least
        self.tail: StampRun | None = None  # the run the next consecutive stamp extends

    def push(self, latest: Stamp, large: int) -> None:
        tail = self.tail
        if tail is not None and tail.next_stamp == latest:
            tail.pages.append(large)
            tail.next_stamp = latest + 1
            return
        tail = self.tail = StampRun(latest, large)
        self.runs[latest] = tail
        heapq.heappush(self.heap, latest)
        if self.top is None or latest < self.top.first:
            self.top = tail

    def oldest(self, whole: list[Stamp | None]) -> Stamp | None:
        run = self.top
        while run is not None:
            pages, index, stamp = run.pages, run.head, run.head_stamp
            while index < len(pages):
                if whole[pages[index]] == stamp:
                    run.head, run.head_stamp = index, stamp
                    return stamp
                index += 1  # (stale)
                stamp += 1
            heap = self.heap
            heapq.heappop(heap)
            del self.runs[run.first]
            if run is self.tail:
                self.tail = None
            run = self.top = self.runs[heap[0]] if heap else None
        return None

    def pop_oldest(self, whole: list[Stamp | None]) -> int:
        run = self.top
        assert run is not None, "oldest() first"
        large = run.pages[run.head]
        assert whole[large] == run.head_stamp, "oldest() first"
        run.head += 1
        run.head_stamp += 1
        return large

    def pop_oldest_before(self, whole: list[Stamp | None], most: int, before: Stamp | None) -> list[int]:
        # A run's pages are taken in one pass while they stay below ``before`` (a prompt evicts a run
        # at a time: one call of oldest() and pop_oldest() per page was most of its cost).
        taken: list[int] = []
        while len(taken) < most:
            stamp = self.oldest(whole)
            if stamp is None or (before is not None and stamp >= before):
                break
            run = self.top
            assert run is not None
            pages, index = run.pages, run.head
            while index < len(pages) and len(taken) < most and (before is None or stamp < before):
                large = pages[index]
                if whole[large] == stamp:  # (else stale: a hit took it out since)
                    whole[large] = None
                    taken.append(large)
                index += 1
                stamp += 1
            run.head, run.head_stamp = index, stamp
        return taken


class StampRun:
    """Large pages given consecutive stamps from ``first`` on, in that order; those before ``head``
    are gone. (``head_stamp`` and ``next_stamp`` are kept, not summed at each use: a stamp is a
    multi-digit int, and a sum a new object.)"""

    def __init__(self, first: Stamp, large: int) -> None:
        self.first = first
        self.pages = [large]
        self.head = 0
        self.head_stamp = first  # the stamp of pages[head]
        self.next_stamp = first + 1  # the stamp the next page joining the run has


class LargePageEvictor:
    """Every type's wholly cached large pages (``Level0LRUEvictor``): evicts the one whose latest
    stamp is the oldest, whatever its type."""

    def __init__(self) -> None:
        self.caches: list[JengaPageCache] = []

    def whole_large_pages(self) -> int:
        return sum(cache.whole_count for cache in self.caches)

    def evict_oldest(self, count: int = 1) -> None:
        """The ``count`` oldest, one after another: from the type whose oldest is the oldest, as many
        as are older than every other type's oldest, then again. (Each type's oldest is read once,
        then again only for the type evicted from: an eviction moves no other type's order.)"""
        caches = self.caches
        oldest = [cache.oldest_whole() for cache in caches]
        while count > 0:
            chosen = -1
            chosen_stamp: Stamp | None = None
            runner_up: Stamp | None = None  # the oldest of the other types
            for index, stamp in enumerate(oldest):
                if stamp is None:
                    continue
                if chosen_stamp is None or stamp < chosen_stamp:
                    runner_up = chosen_stamp
                    chosen, chosen_stamp = index, stamp
                elif runner_up is None or stamp < runner_up:
                    runner_up = stamp
            assert chosen >= 0, "a quota the evictor's wholly cached large pages were counted for"
            count -= caches[chosen].evict_oldest_wholes(count, runner_up)
            oldest[chosen] = caches[chosen].oldest_whole()


class JengaPageCache(PrefixCachingBlockPool):
    """One layer type's small pages as the block pool of its group's manager (block ids are small-page
    ids; ``policies/hybrid/block_tables.py`` keeps each sequence's), with identities, reference counts
    and Jenga's eviction over the type's :class:`SmallPageAllocator`.

    The KV coordinator checks room by Jenga's quota rule (:meth:`free_pages`, :meth:`after_touch`,
    :meth:`after_release`) and names the request and its quota (:meth:`serve`) before its manager
    takes pages, so ``free_blocks`` is the most this type could ever hold (the managers' own checks
    never bind)."""

    def __init__(
        self,
        allocator: SmallPageAllocator,
        block_size: int,
        chains: ContentChains,
        clock: EvictionClock,
        evictor: LargePageEvictor,
        lazy_runs: dict[ChainKey, list[LazyRun]] | None = None,
    ):
        """``lazy_runs``: every type's lazy runs (``policies/hybrid/prefix_pool.py``), with lazy keys;
        None: every full page keyed at once."""
        super().__init__(
            allocator.large_pages.num_pages * allocator.ratio,
            block_size,
            lazy_keys=lazy_runs is not None,
            lazy_runs=lazy_runs,
        )
        assert self.num_blocks <= _INDEX_MASK, "page ids past an eviction heap entry's bits"
        self.chains = chains  # (one for every type: a prompt's blocks have one chain in each)
        self.allocator = allocator
        self.ratio = allocator.ratio
        self.clock = clock
        self.evictor = evictor
        evictor.caches.append(self)
        # By page and by large page (ids are dense: lists, not dicts, as every page taken may evict
        # one, and every page given back is stamped): a cached page's stamp, else None; a large
        # page's cached pages; the latest stamp of a large page all of whose pages are cached, else
        # None.
        num_large = allocator.large_pages.num_pages
        self.stamps: list[Stamp | None] = [None] * self.num_blocks
        self.cached_per_large: list[int] = [0] * num_large
        self.whole: list[Stamp | None] = [None] * num_large
        self.stamped_count = 0  # cached pages
        self.whole_count = 0  # wholly cached large pages
        self._page_queue: list[int] = []  # cached pages (_queued; stale entries skipped)
        self._whole_queue = WholeRuns() if self.ratio == 1 else WholeQueue()
        self.request = 0
        self.quota = 0

    # -- room -------------------------------------------------------------------------------------
    @property
    def evictable(self) -> int:
        """Cached pages outside wholly cached large pages (those count as free large pages)."""
        return self.stamped_count - self.ratio * self.whole_count

    def free_pages(self) -> int:
        """What Jenga's quota rule counts as this type's free small pages: blank and evictable ones."""
        return self.allocator.free_small + self.evictable

    def after_touch(self, pages: list[int]) -> tuple[int, int]:
        """What holding the distinct cached ``pages`` (a prefix hit) would do, changing nothing:
        ``(wholly cached large pages lost, free pages after)``."""
        touched: dict[int, int] = {}
        for page in pages:
            touched[page // self.ratio] = touched.get(page // self.ratio, 0) + 1
        lost, evictable = 0, self.evictable
        for large, count in touched.items():
            if self.whole[large] is not None:
                lost += 1
                evictable += self.ratio - count
            else:
                evictable -= count
        return lost, self.allocator.free_small + evictable

    def after_release(self, pages: list[int], keyed: int = 0) -> tuple[int, int, int]:
        """What giving back the distinct ``pages`` (each held once) would do, changing nothing:
        ``(large pages freed, wholly cached large pages gained, free pages after)``. The first
        ``keyed`` of them gain an identity before they go back (a growth fills them: they go back
        cached, not blank)."""
        if self.ratio == 1:  # (each page its own large page: freed when blank, else wholly cached)
            chain = self.block_chain
            freed = sum(1 for index, page in enumerate(pages) if index >= keyed and chain[page] == NO_BLOCK)
            return freed, len(pages) - freed, self.allocator.free_small + self.evictable
        blank: dict[int, int] = {}
        cached: dict[int, int] = {}
        for index, page in enumerate(pages):
            into = blank if index >= keyed and self.block_chain[page] == NO_BLOCK else cached
            into[page // self.ratio] = into.get(page // self.ratio, 0) + 1
        freed = gained = 0
        free_small, evictable = self.allocator.free_small, self.evictable
        for large in blank.keys() | cached.keys():
            was_blank = self.allocator.free_count[large]
            was_cached = self.cached_per_large[large]
            if was_blank + blank.get(large, 0) == self.ratio:
                freed += 1
                free_small -= was_blank
            elif was_cached + cached.get(large, 0) == self.ratio:
                gained += 1
                evictable -= was_cached
            else:
                free_small += blank.get(large, 0)
                evictable += cached.get(large, 0)
        return freed, gained, free_small + evictable

    def serve(self, request: int, quota: int) -> None:
        """The request the next pages are taken for, and its quota of new large pages."""
        self.request = request
        self.quota = quota

    # -- pages ------------------------------------------------------------------------------------
    def take_blocks(self, count: int, what: str) -> list[int]:
        """``count`` small pages for the request being served, each held once, in the artifact's
        order (module docstring); the caller checked that they fit."""
        pages: list[int] = []
        while len(pages) < count:
            pages += self._take(count - len(pages), what)
        for page in pages:
            self.ref_count[page] = 1
        return pages

    def _take(self, count: int, what: str) -> list[int]:
        allocator, request = self.allocator, self.request
        own = allocator.preferred[request]
        if own:
            return allocator.take_own(own, count)
        # Whole large pages (a prompt's, mostly) are carved, and evicted for, a run at a time: the
        # same pages in the same order as one at a time (a carved page changes no cache's order).
        whole = min(self.quota, count // self.ratio)
        free_large = allocator.large_pages.free
        if self.quota > 0 and free_large:
            if whole:
                whole = min(whole, free_large)
                self.quota -= whole
                return allocator.carve_whole(request, whole)
            self.quota -= 1
            return allocator.carve(request, count)
        if allocator.unowned:
            return allocator.adopt_unowned(request)
        evictable_large = self.evictor.whole_large_pages()
        if self.quota > 0 and evictable_large:
            # (Free large pages now: the next round carves them.)
            self.evictor.evict_oldest(max(1, min(whole, evictable_large)))
            return []
        if allocator.others_free() is not None:
            return allocator.take_others(count)
        assert self.evictable, f"{what}: pages the KV coordinator checked were free or evictable"
        return [self._evict_oldest_page()]

    def touch(self, block: int) -> bool:
        shared = self.ref_count[block] > 0
        if not shared:  # a cached page is hit: it leaves the cache
            self._forget_stamp(block)
            self._cached[self.block_group[block]] -= 1
            self.cached_blocks -= 1
        self.ref_count[block] += 1
        return shared

    def release_each(self, blocks: list[int]) -> bool:
        return self.release_one_by_one(blocks)  # (each release does more here)

    def release(self, block: int) -> bool:
        count = self.ref_count[block] - 1
        self.ref_count[block] = count
        if count:
            return True
        if self.block_chain[block] == NO_BLOCK:  # nothing reusable: blank again
            self.allocator.release([block])
        else:
            self._stamp(block)
            self._cached[self.group_of(block)] += 1
            self.cached_blocks += 1
        return False

    def cached_stamps(self) -> dict[int, Stamp]:
        """Every cached page -> its stamp, in page order."""
        return {page: stamp for page, stamp in enumerate(self.stamps) if stamp is not None}

    def whole_stamps(self) -> dict[int, Stamp]:
        """Every wholly cached large page -> its latest stamp, in page order."""
        return {large: stamp for large, stamp in enumerate(self.whole) if stamp is not None}

    # -- the cached pages' order ------------------------------------------------------------------
    def _stamp(self, page: int) -> None:
        stamp = self.clock.stamp()
        stamps = self.stamps
        stamps[page] = stamp
        self.stamped_count += 1
        ratio = self.ratio
        large = page // ratio
        cached = self.cached_per_large[large] + 1
        self.cached_per_large[large] = cached
        if cached == ratio:  # wholly cached: its latest stamp (``Level1LRUEvictor.add``)
            latest = stamp
            for sibling in range(large * ratio, large * ratio + ratio):
                sibling_stamp = stamps[sibling]
                assert sibling_stamp is not None
                if sibling_stamp > latest:
                    latest = sibling_stamp
            self.whole[large] = latest
            self.whole_count += 1
            self._whole_queue.push(latest, large)
        else:
            heapq.heappush(self._page_queue, _queued(stamp, page))

    def _forget_stamp(self, page: int) -> None:
        """``page`` is cached no more: its large page, if it was wholly cached, is not now, and its
        other cached pages are evictable one by one again."""
        stamps = self.stamps
        stamps[page] = None
        self.stamped_count -= 1
        large = page // self.ratio
        self.cached_per_large[large] -= 1
        if self.whole[large] is not None:
            self.whole[large] = None
            self.whole_count -= 1
            for sibling in range(large * self.ratio, large * self.ratio + self.ratio):
                sibling_stamp = stamps[sibling]
                if sibling_stamp is not None:
                    heapq.heappush(self._page_queue, _queued(sibling_stamp, sibling))

    def _evict_oldest_page(self) -> int:
        """The type's oldest cached page outside a wholly cached large page, evicted (``evict_level1``):
        it is the caller's now."""
        while True:
            entry = heapq.heappop(self._page_queue)
            page = entry & _INDEX_MASK
            if self.stamps[page] == entry >> _INDEX_BITS and self.whole[page // self.ratio] is None:
                break
        self._forget_stamp(page)
        self._evict(page)
        return page

    def oldest_whole(self) -> Stamp | None:
        """The latest stamp of this type's wholly cached large page evicted first, None without one."""
        return self._whole_queue.oldest(self.whole)

    def evict_oldest_wholes(self, most: int, before: Stamp | None) -> int:
        """This type's oldest wholly cached large pages whose latest stamp is below ``before`` (None:
        any), ``most`` at most (one at least: the caller's oldest), each evicted page by page and given
        back to the shared pool (``evict_level0``, ``remove_blocks_from_evictor``); how many."""
        larges = self._whole_queue.pop_oldest_before(self.whole, most, before)
        assert larges, "the oldest of every type's wholly cached large pages"
        cached_per_large, stamps, ratio = self.cached_per_large, self.stamps, self.ratio
        for large in larges:
            cached_per_large[large] = 0
            for page in range(large * ratio, large * ratio + ratio):
                stamps[page] = None
                self._evict(page)
        self.whole_count -= len(larges)
        self.stamped_count -= ratio * len(larges)
        self.allocator.give_back_larges(larges)
        return len(larges)
