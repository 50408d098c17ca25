"""``policy: jenga`` with ``engine.enable_prefix_caching: true``: Jenga's prefix caching over its
two-level allocator (``sim/kv/jenga.py``).

Sources: the paper (Zhang et al., "Jenga: Effective Memory Management for Serving LLM with
Heterogeneity", SOSP 2025, arXiv 2503.18292: a prefix hit must be served by every layer type, each
type caches by its own rule, eviction is request-aware and layer-aware) and its artifact,
heheda12345/Jenga-SOSP25-AE, branch ``vllm-v0-jenga`` at commit
bb5cee614b054e54cd2a4791cb214051cde46fda: ``vllm/core/block_v3/custom_block_manager.py``
(``get_common_computed_block_ids``, ``set_large_block_quota``, ``determine_sliding_window_mode``,
``init_allocator``), ``vllm/core/block_v3/custom_block.py`` (each type's ``get_possible_hit_lens``
and ``free_skipped_blocks``), ``vllm/core/evictor_v2.py`` and ``vllm/core/block/prefix_caching_block.py``
(the eviction: ``policies/hybrid/jenga_cache.py``).

What is modelled:

* **Pages with identities per type.** Each type's manager (``policies/hybrid/``) keeps its sequences'
  small pages as block tables (``policies/hybrid/block_tables.py``, as ``vllm-hybrid`` with prefix
  caching keeps its blocks) over the type's :class:`~policies.hybrid.jenga_cache.JengaPageCache`: a
  full block's page is named by its content chain (one set of chains for every type), a page nobody
  holds keeps it (cached), and the types' caches are apart (the artifact's one
  ``PrefixCachingBlockAllocator`` per type).
* **The hit** is the longest prefix every type serves by its own rule
  (:func:`~sim.kv.coordinator.longest_common_hit`, shared with ``vllm-hybrid``): full attention its
  leading run of cached pages; a sliding window only the pages of the last window before the hit's
  end (the artifact's ``SlidingWindowManager.get_possible_hit_lens``: a run of cached pages long
  enough for the window, or a leading run); an attention chunk the pages of the chunk the hit ends
  in. The artifact intersects each type's ranges of possible hit ends and takes the longest
  common end (``intersect_multiple_sets``): the same length. Never the prompt's last token.
* **Admission** holds the hit's pages in every type before any type takes new ones, and a prompt is
  allocated whole in every type (the artifact's sliding-window ``allocation_mode`` is ``"full"``
  with prefix caching, ``determine_sliding_window_mode``): a window's pages before the last window
  go back, cached, at the first decode step (``free_skipped_blocks``), so the next prompt with that
  prefix can hit them. With the engine driving, a held page is cached only once the chunk that
  computes it is scheduled (vLLM v0's ``mark_blocks_as_computed``, :meth:`JengaPrefixCoordinator.
  defer_prompt_keys`). Room is Jenga's quota rule with a wholly cached large page counted as free
  and the other cached pages as their type's free small pages (``set_large_block_quota``), each
  checked exactly for one request, as it stands after the hit's pages are held.
* **Eviction** (``policies/hybrid/jenga_cache.py``): a page is stamped when given back, the same
  stamp for a request's pages of every type (aligned across types: a hit needs every type), its
  released out-of-window pages older; a new large page is made by evicting the wholly cached large
  page whose latest stamp is oldest, whatever its type, before another request's free pages or a
  single cached page (least recently used within the type) are taken.

Accounting: a type's cached small pages are *cached* in its entry of the breakdown (their large
pages stay the type's until every small page is evicted or blank), its blank free small pages
external fragmentation, as without caching; so per type used + reserved + internal + external +
cached = its large pages, and with the free large pages, the pool.

Left out: Mamba and linear-attention types (refused: the artifact's ``LinearAttentionManager``
caches a state every ``chunk_size`` tokens, its hit aligned to that chunk, a rule kvsim's Mamba
groups, vLLM's align mode, do not have); the margin of 12 blocks the
artifact keeps before freeing a window's pages (marked as an evaluation setting there), and its
window of ``(window - 1) // block_size + 2`` pages (vLLM's ``cdiv(window - 1, block_size)`` here, as
``vllm-hybrid`` counts it); the null page each type takes at start-up; the common-prefix predictor
and the cache simulator that the paper describes for trading hits against batch size (not in the
artifact's allocator); a clock of the artifact's scheduler steps (``jenga_cache.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from policies.base import NO_HIT, ChildSpec, PolicyInputError, PolicyStats, PrefixHit
from policies.hybrid.group import GroupManager, GrowthStep, moves
from policies.hybrid.jenga_cache import SKIPPED_AGE, EvictionClock, JengaPageCache, LargePageEvictor
from policies.hybrid.jenga_pages import SmallPageAllocator, TypePages, quotas
from policies.hybrid.prefix_pool import NO_BLOCK, LazyRun
from policies.prefix import ChainKey, ContentChains
from sim.hardware.jenga_capacity import JengaCapacity
from sim.kv.coordinator import Breakdown, group_token_sharing, longest_common_hit
from sim.kv.jenga import JengaCoordinator
from token_content import TokenContent, content_length

__all__ = ["JengaPrefixCoordinator"]


class JengaPrefixCoordinator(JengaCoordinator):
    def __init__(self, capacity: JengaCapacity, names: Sequence[str], lazy_keys: bool = True):
        """``lazy_keys``: a page past a sequence's first key nothing holds is keyed only when reached
        (``policies/hybrid/prefix_pool.py``); False: every full page keyed at once (the reference)."""
        states = [group.kind.label for group in capacity.groups if not group.holds_tokens]
        if states:
            raise PolicyInputError(
                f"jenga's prefix caching has no rule for the {', '.join(states)} layers of {capacity.model}"
            )
        self.clock = EvictionClock()
        self.evictor = LargePageEvictor()
        self.chains = ContentChains()
        # Every type's lazy runs (None: no lazy keys).
        self.lazy_runs: dict[ChainKey, list[LazyRun]] | None = {} if lazy_keys else None
        self.caches: list[JengaPageCache] = []  # per type, filled by _type_pool
        # (A prompt is allocated whole: the chunk a prefill holds at once is the longest prompt.)
        super().__init__(capacity, names, capacity.max_model_len)
        managers = self.managers
        self._hit_order = [m for m in managers if m.kind == "full"] + [
            m for m in managers if m.kind != "full"
        ]

    def follow_steps(self, steps: Callable[[], int]) -> None:
        self.clock.steps = steps

    def _type_pages(self, ratio: int) -> TypePages:
        """Pages by id for every type, whole ones too: a cached page is found by its id."""
        return SmallPageAllocator(self.large_pages, ratio)

    def _type_pool(self, allocator: TypePages) -> JengaPageCache:
        assert isinstance(allocator, SmallPageAllocator), "_type_pages() names every page"
        cache = JengaPageCache(
            allocator, self.block_size, self.chains, self.clock, self.evictor, self.lazy_runs
        )
        self.caches.append(cache)
        return cache

    def _free_large(self) -> int:
        return self.large_pages.free + self.evictor.whole_large_pages()

    def _free_pages(self, group: int) -> int:
        return self.caches[group].free_pages()

    # -- prefix hits ------------------------------------------------------------------------------
    def lookup(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        hit = longest_common_hit(self._hit_order, prompt, namespace)
        return PrefixHit(hit * self.block_size) if hit else NO_HIT

    def match(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        return self.lookup(prompt, namespace)

    # -- admission --------------------------------------------------------------------------------
    def can_admit(self, prompt: TokenContent, final_len: int) -> bool:
        hit = self.lookup(prompt).cached_tokens // self.block_size
        return self._admission_quota(prompt, 0, hit)[1] is not None

    def admit(
        self, seq_id: int, prompt: TokenContent, final_len: int, output_content_id: int, namespace: int = 0
    ) -> int:
        cached = self.lookup(prompt, namespace)
        hit = cached.cached_tokens // self.block_size
        needs, quota = self._admission_quota(prompt, namespace, hit)
        if quota is None:
            self._refuse(f"admitting sequence {seq_id}", needs, cached)
        # Every type holds its hit before any takes new pages (vLLM's ``allocate_slots``), so that no
        # type's new page evicts another's hit. (The first checks the sequence: nothing changes if
        # it is bad.)
        for manager in self.managers:
            manager.hold_cached_prefix(
                seq_id, prompt, final_len, output_content_id, namespace, hit * self.block_size
            )
        request = self._new_request(seq_id)
        self.clock.tick()
        for cache, manager, pages in zip(self.caches, self.managers, quota, strict=True):
            cache.serve(request, pages)
            manager.take_admission_blocks(seq_id)
        return cached.cached_tokens

    def defer_prompt_keys(self) -> bool:
        """A prompt's pages are cached in every type as its chunks are scheduled (vLLM v0, which
        the artifact runs, marks a chunk's blocks computed once it is scheduled), not at admission:
        a request preempted mid-prefill leaves cached only what it had scheduled."""
        for manager in self.managers:
            manager.defer_prompt_keys()
        return True

    def prompt_scheduled(self, seq_id: int, tokens: int) -> None:
        for manager in self.managers:
            manager.prompt_scheduled(seq_id, tokens)

    def _admission_quota(
        self, prompt: TokenContent, namespace: int, hit: int
    ) -> tuple[list[int], list[int] | None]:
        """The new small pages each type takes to admit ``prompt`` with a hit of ``hit`` blocks, and
        their quota of new large pages as the pools stand once the hit is held (None: it does not
        fit). Changes nothing."""
        length = content_length(prompt)
        free_large = self._free_large()
        needs: list[int] = []
        rule: list[tuple[int, int, int]] = []
        for cache, manager in zip(self.caches, self.managers, strict=True):
            first, end = manager.prefill_run(length)
            lost, free_pages = cache.after_touch(self._free_hit_pages(cache, manager, prompt, namespace, hit))
            free_large -= lost
            needs.append(end - max(first, hit))
            rule.append((needs[-1], cache.ratio, free_pages))
        return needs, quotas(free_large, rule)

    def _free_hit_pages(
        self, cache: JengaPageCache, manager: GroupManager, prompt: TokenContent, namespace: int, hit: int
    ) -> list[int]:
        """The cached pages nobody holds that a hit of ``hit`` blocks holds in a type: those from the
        first block its prefill attends to (a window's: the last window before the hit's end)."""
        tables = manager.tables
        if not hit or tables is None:
            return []
        chains = tables.prompt_chains(prompt, namespace, hit)
        first = manager.skipped_blocks(hit * self.block_size)
        pages = [cache.cached_block(tables.group, chains[position]) for position in range(first, hit)]
        return [page for page in pages if cache.ref_count[page] == 0]

    def fork(self, parent_id: int, children: Sequence[ChildSpec]) -> None:
        """Each child shares the parent's full pages and copies its partly filled ones, each child a
        request with its own quota (``policies/hybrid/block_tables.py``)."""
        first = self.managers[0]
        first._check_children(parent_id, first.seq_len(parent_id), children)
        copied = []
        for manager in self.managers:
            tables = manager.tables
            assert tables is not None
            copied.append(
                tables.partial_blocks(id(manager.sequences[parent_id]), *manager.held_blocks(parent_id))
            )
        if not self._new_requests_fit([copied] * len(children)):
            self._refuse(f"forking sequence {parent_id}", [n * len(children) for n in copied])
        self.clock.tick()
        for child in children:
            request = self._new_request(child.seq_id)
            quota = quotas(
                self._free_large(),
                [(n, c.ratio, c.free_pages()) for n, c in zip(copied, self.caches, strict=True)],
            )
            assert quota is not None, "a fork that was checked to fit"
            for cache, manager, pages in zip(self.caches, self.managers, quota, strict=True):
                cache.serve(request, pages)
                manager.fork(parent_id, [child])

    # -- growth -----------------------------------------------------------------------------------
    def _one_fits(self, seq_id: int, plans: list[list[GrowthStep]], index: int) -> list[int] | None:
        """The quota of growing the ``index``-th planned sequence once the pages it gives back are
        cached or blank, exactly as the pools stand now; None when it does not fit."""
        free_large = self._free_large()
        needs = []
        for group, cache in enumerate(self.caches):
            seq, _, first, end = plans[group][index]
            freed, gained, free_pages = cache.after_release(*self._released_pages(group, plans[group][index]))
            free_large += freed + gained
            needs.append((moves(seq, first, end)[1], cache.ratio, free_pages))
        return quotas(free_large, needs)

    def _released_pages(self, group: int, planned: tuple) -> tuple[list[int], int]:
        """The pages a planned growth gives back to the type: those that left its window or chunk and
        that no other sequence holds; and how many of them (the first) its tokens fill first. The
        growth is told before any page goes back (``GroupManager.release_skipped``), so a page it
        fills (a fork's copy of a partly filled block) goes back cached, not blank."""
        seq, tokens, first, _ = planned
        tables = self.managers[group].tables
        assert tables is not None
        table, ref_count = tables.by_seq[id(seq)].table, self.caches[group].ref_count
        filled_end = (seq.num_tokens + tokens) // self.block_size  # (blocks the grown sequence fills)
        released: list[int] = []
        keyed = 0
        for position in range(seq.first_block, min(first, seq.end_block)):
            page = table[position]
            if page != NO_BLOCK and ref_count[page] == 1:
                released.append(page)
                keyed += position < filled_end
        return released, keyed

    def grow_each(self, seq_ids: list[int], num_tokens: list[int]) -> list[int]:
        plans = self._plans(seq_ids, num_tokens)
        if not self._fits(seq_ids, plans):
            needs = [sum(moves(seq, first, end)[1] for seq, _, first, end in plan) for plan in plans]
            self._refuse(f"growing sequences {list(seq_ids)}", needs)
        self.clock.tick()
        # Every type's pages that left a window go back, cached, before any type takes new ones (vLLM's
        # order; the artifact frees them at the start of each step, stamped SKIPPED_AGE older).
        for index, seq_id in enumerate(seq_ids):
            self.clock.serve(self._requests[seq_id], SKIPPED_AGE)
            for manager, plan in zip(self.managers, plans, strict=True):
                manager.release_skipped([plan[index]])
        return [self._take_growth(seq_id, plans, index) for index, seq_id in enumerate(seq_ids)]

    def _take_growth(self, seq_id: int, plans: list[list[GrowthStep]], index: int) -> int:
        """The new pages of one planned sequence, each type within its quota; its growth room after."""
        quota = self._one_fits(seq_id, plans, index)
        assert quota is not None, "a growth that was checked to fit"
        request = self._requests[seq_id]
        rooms = []
        for cache, manager, plan, pages in zip(self.caches, self.managers, plans, quota, strict=True):
            cache.serve(request, pages)
            rooms += manager.commit_growth([plan[index]])
        return min(rooms)

    def free(self, seq_id: int, finished: bool = True) -> None:
        """Every type's pages go back, tail first, one stamp for all (a request's pages leave the cache
        together); full ones cached."""
        self.clock.tick()
        self.clock.serve(self._requests.get(seq_id, -1))
        for manager in self.managers:
            manager.free(seq_id, finished)  # (the first checks the sequence)
        request = self._requests.pop(seq_id)
        for allocator in self.allocators:
            allocator.remove_request(request)

    # -- accounting -------------------------------------------------------------------------------
    def group_breakdown_values(self) -> list[int]:
        """Per type its manager's used, reserved, internal and cached pages (a page several sequences
        hold counted once), its blank free small pages external; then the free large pages."""
        values: list[int] = []
        for manager, allocator, slots in zip(self.managers, self.allocators, self.page_slots, strict=True):
            weight = slots // self.block_size  # (the manager counts one slot per token of its type)
            used, reserved, internal, _, cached, _ = manager.breakdown_values()
            values += [used * weight, reserved * weight, internal * weight, allocator.free_small * slots]
            values += [cached * weight, 0]
        values += [0, 0, 0, 0, 0, self.large_pages.free * self.large_slots]
        return values

    def may_share(self) -> bool:
        return self._hit_order[0].kind == "full"

    def token_sharing(self) -> tuple[int, int]:
        # (In tokens: a type's manager counts one slot per token of its layers.)
        full = self._hit_order[0]
        return group_token_sharing(full if full.kind == "full" else None)

    def sharing_slots(self) -> tuple[int, int]:
        physical = logical = 0
        for manager, slots in zip(self.managers, self.page_slots, strict=True):
            held, unshared = manager.sharing_slots()
            physical += held * (slots // self.block_size)
            logical += unshared * (slots // self.block_size)
        return physical, logical

    def sharing_slots_of(self, breakdown: Breakdown) -> tuple[int, int]:
        return self.sharing_slots()  # (cached blocks are shared: the breakdown does not say how much)

    @property
    def stats(self) -> PolicyStats:
        """Every type records the same query and the same common hit: those are one type's."""
        every = [manager.stats for manager in self.managers]
        return PolicyStats(
            prefix_cache_queries=every[0].prefix_cache_queries,
            prefix_cache_hits=every[0].prefix_cache_hits,
            evictions=sum(s.evictions for s in every),
            fork_copied_tokens=sum(s.fork_copied_tokens for s in every),
            allocation_failures=sum(s.allocation_failures for s in every) + self._stats.allocation_failures,
        )

    def evictions(self) -> int:
        return sum(manager.stats.evictions for manager in self.managers)
