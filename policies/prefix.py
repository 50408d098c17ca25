"""Paged allocation with prefix sharing and copy-on-write (vLLM V1 prefix caching + V0 forks).

- Every full block gets a cache key: its parent's *content chain* id, the token pieces it holds,
  and the namespace. Chain ids are interned exact identities of those keys (:class:`ContentChains`),
  so chained through the parents a key names the whole prefix by content, like vLLM's block hash
  chain (``hash_block_tokens`` over parent hash, token ids, extra keys), but it is only ever matched
  by equality (the cache is a dict keyed by it), so a lookup can never share wrong content.
- A hit is verified on *content*, never on placement: any block holding the same content chain
  verifies, wherever its parent sits (vLLM chains on content alone, ``find_longest_cache_hit``).
- Duplicates: vLLM never deduplicates (block tables are append-only), so one key can name several
  cached blocks. The lookup returns the one ``BlockHashToBlockMap.get_one_block`` returns: the
  earliest-cached block still cached under that key.
- Blocks are reference counted. When the last owner frees a full block it keeps its key and stays
  *cached* (hittable) in the free queue until it is handed out again, which evicts it: LRU.
  A freed sequence's blocks enter the queue tail-first, so its longest-prefix block is evicted first;
  a freed block holding no key goes to the head and is reused before any cached block (vLLM #42656).
- When: a prompt's blocks are allocated at admission, but with the engine driving
  (:meth:`PrefixCachingPolicy.defer_prompt_keys`) a full block is keyed, and so hittable, only once
  the chunk that computes it is scheduled (:meth:`PrefixCachingPolicy.prompt_scheduled`), as vLLM's
  ``allocate_slots`` calls ``cache_blocks`` up to the scheduled tokens; a request admitted later in
  the same step hits what the steps so far scheduled. A sequence freed mid-prefill (preempted,
  aborted) gives its unscheduled blocks back blank, to the head: they were never computed (vLLM never
  allocated them). Called directly, without the engine, a prompt is keyed whole at admission.
- A prefix hit never covers the prompt's last token: it must be computed to produce logits (vLLM's
  ``num_tokens - 1`` rule, ``KVCacheManager.get_computed_blocks``). Only full blocks are ever shared
  through the cache. :meth:`PrefixCachingPolicy.lookup` computes the hit without changing anything.
- Prefix-cache statistics (``prefix_cache_queries`` / ``prefix_cache_hits``, in tokens) count one
  query per *successful* admission: the prompt's tokens, and the tokens served from cache. A failed
  admission counts nothing; its :class:`~policies.base.OutOfKVMemory` carries the hit it computed
  (``prefix_hit``). This is vLLM's scheduler since #48860 (merged 2026-07-16, fixing #43736):
  ``Scheduler.schedule`` looks the prefix up with ``get_computed_blocks`` and calls
  ``KVCacheManager.record_prefix_cache_stats`` only after ``allocate_slots`` succeeded. Before
  #48860, ``get_computed_blocks`` recorded every lookup, so a request that waited for memory was
  counted once per retry. vLLM also records re-admissions of preempted requests into separate
  ``preempted_*`` counters that ``vllm:prefix_cache_queries/hits`` leave out; kvsim's policy cannot
  tell a re-admission from a first one and counts both.
- ``fork`` shares every parent block with the children. Writing into a shared, partly filled block
  copies it first (copy-on-write); a full shared block is never copied.
- ``pin_prefix`` keeps a warm-up prompt's blocks resident: they are never evicted.
- Lazy keys (a speed-up with identical results): on streams with little reuse nearly every key is
  created and evicted unused. Where a sequence's blocks first hold a key nothing holds (past its
  prefix hit), a *lazy run* starts: that block and the sequence's later full blocks are only marked
  cached (``_block_key`` holds the sequence itself), and the run is filed under that first new key.
  Any block after it can only be hit through that key, so the first lookup, fork or other sequence
  that reaches the key keys the run's still-cached blocks exactly as they would have been keyed
  (:meth:`PrefixCachingPolicy._key_lazy_run`). The run's keys are its own (they all descend from that
  key), so no caching order among duplicates is lost; the run holds its parent's content chain as
  its first block would. With a host tier every key is made at once (evictions store keys).
- With a host tier (:meth:`PrefixCachingPolicy.enable_host_tier`, ``offload:``), a cached block the
  GPU evicts is written to a host LRU pool under the same key (``policies/_host_tier.py``), unless the
  host holds that key already or another GPU block still does. Admission continues the prefix lookup
  into the host tier where the GPU hit ends, as vLLM's offloading connector does
  (``get_num_new_matched_tokens`` after ``num_computed_tokens``), within the same ``len - 1`` cap: the
  host-hit blocks take fresh GPU blocks (exactly as if computed, so memory needs are unchanged) and
  are counted as loaded; their host copies stay. ``lookup`` reports the host hit apart
  (``PrefixHit.host_tokens``); ``prefix_cache_hits`` stays the GPU hit, ``host_cache_hits`` counts the rest.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator
from typing import Final

from policies._host_tier import HostTier
from policies.base import (
    ALL_PUBLISHED,
    NO_HIT,
    PolicyInputError,
    PoolSpec,
    PrefixHit,
    register,
    scheduled_mark,
)
from policies.paged import PagedPolicy, SequenceState, ceil_div
from token_content import TokenContent, content_length, validate_content

Piece = tuple[int, int, int]  # (content_id, first offset, end offset) within one token stream
# A block's cache key: (parent's chain id or None, what it holds, namespace). What it holds is its
# single piece spelled out (content_id, first, end), or ``pieces`` (a tuple of pieces) when it spans
# several segments: keys of either kind never match.
ChainKey = tuple


def block_pieces(
    segments: list[tuple[int, int]], segment_ends: list[int], start: int, end: int
) -> tuple[Piece, ...]:
    """The token pieces covering positions ``[start, end)`` of a sequence."""
    pieces: list[Piece] = []
    index = bisect_right(segment_ends, start)
    position = start
    while position < end:
        content_id, length = segments[index]
        segment_start = segment_ends[index] - length
        piece_end = min(end, segment_ends[index])
        pieces.append((content_id, position - segment_start, piece_end - segment_start))
        position = piece_end
        index += 1
    return tuple(pieces)


class ChainEntry:
    """A content chain's key and how many hold its id (cached blocks, child chains, lazy runs)."""

    key: ChainKey
    holders: int

    def __init__(self, key: ChainKey) -> None:
        self.key = key
        self.holders = 1


class ContentChains:
    """Interned exact identities of block contents: a :data:`ChainKey` (parent's chain id, what the
    block holds, namespace) -> id.

    Two blocks with the same chain id hold the same tokens after the same prefix, in the same
    namespace, wherever they sit in the pool: this is what a prefix hit verifies. An id lives while
    a cached block holds it or a child chain names it as its parent, so a cached block whose parent
    was evicted verifies again once the parent's content is cached again, exactly as vLLM's content
    hashes do. Ids are never reused, so a stale id can never match new content."""

    def __init__(self) -> None:
        self._id_of: dict[ChainKey, int] = {}
        self._entry_of: dict[int, ChainEntry] = {}
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._id_of)

    def find(self, key: ChainKey) -> int | None:
        """The id of ``key`` if anything holds it now (no side effect)."""
        return self._id_of.get(key)

    def acquire(self, key: ChainKey) -> int:
        """One more holder of ``key`` (a block being cached): its id, interned if new."""
        chain = self._id_of.get(key)
        if chain is not None:
            self._entry_of[chain].holders += 1
            return chain
        return self.intern_new(key)

    def intern_new(self, key: ChainKey) -> int:
        """:meth:`acquire` of a key nothing holds yet (the caller checked): its new id."""
        chain = self._next_id
        self._next_id += 1
        self._id_of[key] = chain
        self._entry_of[chain] = ChainEntry(key)
        parent: int | None = key[0]
        if parent is not None:
            self._entry_of[parent].holders += 1
        return chain

    def hold(self, chain: int | None) -> None:
        """One more reference to an id that is held already (``None``: no parent, nothing to hold)."""
        if chain is not None:
            self._entry_of[chain].holders += 1

    def release(self, chain: int | None) -> None:
        """One holder fewer; an id nobody holds is forgotten, and releases its parent in turn."""
        entry_of = self._entry_of
        while chain is not None:
            entry = entry_of[chain]
            entry.holders -= 1
            if entry.holders:
                return
            del entry_of[chain]
            del self._id_of[entry.key]
            chain = entry.key[0]

    def release_each(self, chains: Iterable[int | None]) -> None:
        """:meth:`release` of each id in turn (evictions release many at once)."""
        for chain in chains:
            self.release(chain)


def block_contents(
    segments: list[tuple[int, int]], segment_ends: list[int], first: int, last: int, block_size: int
) -> Iterator[tuple]:
    """What blocks ``first`` to ``last - 1`` hold (the middle of their :data:`ChainKey`), walking the
    segments once: a block inside one segment (nearly all of them) is one piece,
    computed in a few operations."""
    index = bisect_right(segment_ends, first * block_size)
    for block in range(first, last):
        start = block * block_size
        end = start + block_size
        while segment_ends[index] <= start:
            index += 1
        segment_end = segment_ends[index]
        if end <= segment_end:
            content_id, length = segments[index]
            offset = start - segment_end + length
            yield (content_id, offset, offset + block_size)
        else:
            yield (block_pieces(segments, segment_ends, start, end),)


class PrefixCachingPolicy(PagedPolicy):
    """Paged blocks shared by prefix (cache key) and by fork, with LRU eviction of cached blocks."""

    _SHARES_BLOCKS = True
    _LAZY_KEYS = True  # False: every full block keyed at once (the reference the tests compare with)

    def __init__(self, pool: PoolSpec):
        super().__init__(pool)
        # A block's key; a lazy run's blocks hold their sequence instead (keyed when they could hit).
        self._block_key: list[ChainKey | SequenceState | None] = [None] * self.num_blocks
        self._block_chain: list[int | None] = [None] * self.num_blocks
        self._chains = ContentChains()
        self._cached_by_key: dict[ChainKey, int] = {}  # the first block cached under each key
        self._later_holders: dict[ChainKey, list[int]] = {}  # rare: more blocks under the same key
        self._cached_in_queue = 0
        self._pinned: set[int] = set()
        self._pinned_idle = 0
        # The first key of each lazy run (nothing else holds it) -> the run's sequence.
        self._lazy_runs: dict[ChainKey, SequenceState] = {}
        self._tier: HostTier | None = None  # the host tier, as its own type (``host_tier`` too)

    # ------------------------------------------------------------------------------------ accounting
    def _cached_blocks(self) -> int:
        return self._cached_in_queue + self._pinned_idle

    def available_slots(self) -> int:
        return len(self.free_queue) * self.block_size

    def free_queue_order(self) -> list[int]:
        return self.free_queue.order()

    # ---------------------------------------------------------------------------------- prefix lookup
    def lookup(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        validate_content(prompt, "looked-up prompt", PolicyInputError)
        prompt_len = content_length(prompt)
        if prompt_len <= 0:
            return NO_HIT
        max_blocks = (prompt_len - 1) // self.block_size
        hits = self._find_cached_prefix(prompt, max_blocks, namespace)
        return self._prefix_hit(hits, len(self._host_hits(prompt, prompt_len, hits, namespace, max_blocks)))

    # ------------------------------------------------------------------------------------- host tier
    def enable_host_tier(self, capacity_blocks: int, write_policy: str | None = None) -> None:
        if self.host_tier is not None:
            raise PolicyInputError("this policy already has a host tier")
        if write_policy not in (None, "write_back"):
            raise PolicyInputError(
                f"write_policy {write_policy!r}: the 'prefix' policy's host tier writes a block back "
                "when the GPU evicts it (write_back) only; write_through policies are the 'radix' "
                "policy's (SGLang HiCache)"
            )
        try:
            self._tier = HostTier(
                capacity_blocks, self._chains.acquire, self._chains.release, self.block_size
            )
            self.host_tier = self._tier
        except ValueError as error:
            raise PolicyInputError(str(error)) from None
        # Evictions store their keys to the tier: every key is made eagerly from now on.
        for run in list(self._lazy_runs.values()):
            self._key_lazy_run(run)

    def _host_hits(
        self,
        prompt: TokenContent,
        prompt_len: int,
        hit_blocks: list[int],
        namespace: int,
        max_hit_blocks: int,
    ) -> list[tuple]:
        tier = self._tier
        max_blocks = max_hit_blocks
        if tier is None or not tier.cached_blocks or len(hit_blocks) >= max_blocks:
            return []
        segments = [segment for segment in prompt if segment[1] > 0]
        ends = _cumulative_ends(segments)
        parent = self._block_chain[hit_blocks[-1]] if hit_blocks else None
        contents = block_contents(segments, ends, len(hit_blocks), max_blocks, self.block_size)
        return tier.continue_prefix(parent, contents, namespace)

    def _load_from_host(self, host_hits: list[tuple]) -> int:
        if not host_hits:
            return 0
        assert self._tier is not None
        self._tier.load(host_hits, self.block_size)
        return len(host_hits) * self.block_size

    def _blocks_needed_to_admit(
        self, prompt: TokenContent, namespace: int, max_hit_blocks: int
    ) -> tuple[int, list[int]]:
        hits = self._find_cached_prefix(prompt, max_hit_blocks, namespace)
        return self._blocks_needed_with(hits, content_length(prompt)), hits

    def _blocks_needed_by(
        self, seq: SequenceState, prompt_len: int, max_hit_blocks: int
    ) -> tuple[int, list[int]]:
        hits = self._walk_cached_prefix(seq.segments, seq.segment_ends, max_hit_blocks, seq.namespace)
        return self._blocks_needed_with(hits, prompt_len), hits

    def _blocks_needed_with(self, hits: list[int], prompt_len: int) -> int:
        """Free-queue blocks admitting a prompt of ``prompt_len`` tokens takes, with ``hits`` reused."""
        new_blocks = ceil_div(prompt_len, self.block_size) - len(hits)
        if not hits:
            return new_blocks
        # Touching an idle cached hit takes it out of the free queue, so it counts against the queue too.
        ref_count, pinned = self.ref_count, self._pinned
        for block_id in hits:
            if ref_count[block_id] == 0 and not (pinned and block_id in pinned):
                new_blocks += 1
        return new_blocks

    def _find_cached_prefix(self, prompt: TokenContent, max_blocks: int, namespace: int) -> list[int]:
        if prompt and prompt[0][1] >= self.block_size:
            # The first block lies inside the first segment: its key is known at once, and on streams
            # with little reuse nothing holds it (no hit), which needs no walk over the segments.
            first_key = (None, prompt[0][0], 0, self.block_size, namespace)
            if first_key not in self._cached_by_key and first_key not in self._lazy_runs:
                return []
        segments = [segment for segment in prompt if segment[1] > 0]
        return self._walk_cached_prefix(segments, _cumulative_ends(segments), max_blocks, namespace)

    def _walk_cached_prefix(
        self, segments: list[tuple[int, int]], ends: list[int], max_blocks: int, namespace: int
    ) -> list[int]:
        """The cached blocks holding the first blocks (at most ``max_blocks``) of the content laid
        out as ``segments`` ending at ``ends``: each key is looked up after its parent's hit. (The
        keys of :func:`block_contents`, made inline: this runs for every block of every prompt.)"""
        block_size = self.block_size
        whole_blocks = (ends[-1] if ends else 0) // block_size
        if whole_blocks < max_blocks:
            max_blocks = whole_blocks
        hits: list[int] = []
        parent: int | None = None
        cache, chain_of, lazy_runs = self._cached_by_key, self._block_chain, self._lazy_runs
        index = 0
        for block in range(max_blocks):
            start = block * block_size
            while ends[index] <= start:
                index += 1
            segment_end = ends[index]
            if start + block_size <= segment_end:
                content_id, length = segments[index]
                offset = start - segment_end + length
                key: ChainKey = (parent, content_id, offset, offset + block_size, namespace)
            else:
                key = (parent, block_pieces(segments, ends, start, start + block_size), namespace)
            block_id = cache.get(key)
            if block_id is None:
                lazy_run = lazy_runs.get(key)
                if lazy_run is None:
                    break  # no cached block holds this content after this prefix
                self._key_lazy_run(lazy_run)  # this lookup reaches it: its keys are made now
                block_id = cache[key]
            hits.append(block_id)
            parent = chain_of[block_id]
        return hits

    def _record_prefix_query(self, prompt_len: int, cached_tokens: int) -> None:
        self.stats.prefix_cache_queries += prompt_len
        self.stats.prefix_cache_hits += cached_tokens

    def _share_block(self, block_id: int) -> None:
        if self.ref_count[block_id] == 0:
            if block_id in self._pinned:
                self._pinned_idle -= 1
            else:
                self.free_queue.remove_cached(block_id)
                self._cached_in_queue -= 1
            # A cached block is full: it holds and will hold block_size token states.
            self._live_blocks += 1
            self._filled_sum += self.block_size
            self._target_sum += self.block_size
        self.ref_count[block_id] += 1
        if self.ref_count[block_id] == 2:
            self._shared_blocks += 1

    def _share_blocks(self, block_ids: list[int]) -> None:
        if self._pinned:
            for block_id in block_ids:
                self._share_block(block_id)
            return
        # Nothing pinned: the idle blocks leave the queue in turn and are counted once for all.
        ref_count, queue = self.ref_count, self.free_queue
        idle = 0
        for block_id in block_ids:
            if not ref_count[block_id]:
                queue.remove_cached(block_id)
                idle += 1
            ref_count[block_id] += 1
            if ref_count[block_id] == 2:
                self._shared_blocks += 1
        self._cached_in_queue -= idle
        self._live_blocks += idle
        self._filled_sum += idle * self.block_size
        self._target_sum += idle * self.block_size

    # ------------------------------------------------------------------------------- content and keys
    def _remember_content(self, seq: SequenceState, content: TokenContent) -> None:
        validate_content(content, f"content of sequence {seq.seq_id}", PolicyInputError)
        seq.fold_output()
        for segment in content:
            seq.append_segment(segment)

    def _lay_out_prompt(self, seq: SequenceState, prompt: TokenContent) -> None:
        # Its non-empty segments, as append_segment keeps them. (Copied whole when none is empty:
        # compiled, a filtered segment is unpacked and packed again, a new tuple each.)
        segments = list(prompt)
        if not all(segment[1] for segment in prompt):
            segments = [segment for segment in prompt if segment[1] > 0]
        seq.segments = segments
        seq.segment_ends = _cumulative_ends(segments)

    def _append_content(self, seq: SequenceState, num_tokens: int, content: TokenContent | None) -> None:
        if content is not None:
            self._remember_content(seq, content)
        else:
            seq.output_pending += num_tokens  # its own output: folded into segments when they are read

    def _on_blocks_filled(self, seq: SequenceState) -> None:
        """Cache every block of ``seq`` that became full and has no key yet (a hit or a block shared
        with a fork has one), segment by segment: a block inside one segment is keyed by a few
        integer operations (this loop runs for every block of every prompt), only a block across
        segments needs its pieces listed."""
        block_size = self.block_size
        filled = seq.num_tokens if seq.num_tokens < seq.publish_limit else seq.publish_limit
        block, last = seq.keyed_blocks, filled // block_size
        if block >= last:
            return
        if seq.lazy_key is not None:
            self._mark_lazy(seq, block, last)
            return
        seq.fold_output()
        table, segments, ends, namespace = seq.block_table, seq.segments, seq.segment_ends, seq.namespace
        keys, chain_of = self._block_key, self._block_chain
        chains, cache = self._chains, self._cached_by_key
        known = chains._id_of
        # The previous block is full and this sequence holds it, so it is cached: its chain is the
        # content chain of this sequence's prefix (hits and forks share only that).
        parent = chain_of[table[block - 1]] if block else None
        index = bisect_right(ends, block * block_size)
        while block < last:
            while ends[index] <= block * block_size:
                index += 1
            content_id, length = segments[index]
            inside = min(last, ends[index] // block_size)  # blocks before it end inside the segment
            offset = block * block_size - (ends[index] - length)
            for block_index, block_id in enumerate(table[block:inside], block):
                if keys[block_id] is None:
                    key: ChainKey = (parent, content_id, offset, offset + block_size, namespace)
                    if key in known or key in cache:
                        self._cache_under(block_id, key)
                    elif self._key_new(seq, block_index, key, last):
                        return  # a lazy run starts here
                parent = chain_of[block_id]
                offset += block_size
            block = max(block, inside)
            if block < last and block * block_size < ends[index]:  # it runs past the segment's end
                pieces = block_pieces(segments, ends, block * block_size, (block + 1) * block_size)
                block_id = table[block]
                if keys[block_id] is None:
                    key = (parent, pieces, namespace)
                    if key in known or key in cache:
                        self._cache_under(block_id, key)
                    elif self._key_new(seq, block, key, last):
                        return
                parent = chain_of[block_id]
                block += 1
        seq.keyed_blocks = last

    def _key_new(self, seq: SequenceState, index: int, key: ChainKey, last: int) -> bool:
        """Block ``index`` of ``seq`` becomes the first holder of ``key`` (nothing cached holds it).
        Returns True when a lazy run starts there (its blocks up to ``last`` are marked, the caller
        stops); a lazy run already filed under ``key`` (earlier content) is keyed first."""
        block_id = seq.block_table[index]
        lazy_run = self._lazy_runs.get(key)
        if lazy_run is not None:
            self._key_lazy_run(lazy_run)
            self._cache_under(block_id, key)
            return False
        if self._LAZY_KEYS and self.host_tier is None:
            self._lazy_runs[key] = seq
            seq.lazy_key, seq.lazy_from = key, index
            self._chains.hold(key[0])  # as the run's first block's key would hold its parent
            self._mark_lazy(seq, index, last)
            return True
        self._block_key[block_id] = key
        self._block_chain[block_id] = self._chains.intern_new(key)
        self._cached_by_key[key] = block_id
        return False

    def _mark_lazy(self, seq: SequenceState, first: int, last: int) -> None:
        """Blocks ``first`` to ``last - 1`` of a lazy run are full: cached, keyed if ever reached."""
        keys, table = self._block_key, seq.block_table
        for index in range(first, last):  # (no slice: usually one block, at each decode flush)
            keys[table[index]] = seq
        seq.lazy_cached_blocks += last - first
        seq.keyed_blocks = last

    def _key_lazy_run(self, run: SequenceState) -> None:
        """Key the blocks of a lazy run that are still cached, in order, as they would have been keyed
        when they filled. Those are its leading blocks: a run is freed tail first into the free
        queue and none of its blocks is touched while it is lazy (a touch is a hit, which needs a
        key), so its blocks are evicted last block first."""
        first_key = run.lazy_key
        assert first_key is not None
        del self._lazy_runs[first_key]
        run.lazy_key = None
        cached = run.block_table[run.lazy_from : run.lazy_from + run.lazy_cached_blocks]
        run.lazy_cached_blocks = 0
        run.fold_output()
        assert all(self._block_key[block_id] is run for block_id in cached), "evicted out of order"
        contents = block_contents(
            run.segments, run.segment_ends, run.lazy_from, run.lazy_from + len(cached), self.block_size
        )
        parent = first_key[0]
        for block_id, content in zip(cached, contents, strict=True):
            self._cache_under(block_id, (parent, *content, run.namespace))
            parent = self._block_chain[block_id]
        self._chains.release(first_key[0])  # the run's hold: its first block's key holds it now

    def _cache_under(self, block_id: int, key: ChainKey) -> None:
        """A fresh block registers (a block reached by a hit or a fork is already cached). Identical
        content cached twice stays twice (vLLM does not deduplicate)."""
        self._block_key[block_id] = key
        self._block_chain[block_id] = self._chains.acquire(key)
        if self._cached_by_key.setdefault(key, block_id) != block_id:
            self._later_holders.setdefault(key, []).append(block_id)

    def defer_prompt_keys(self) -> bool:
        self._prompt_keys_deferred = True
        return True

    def prompt_scheduled(self, seq_id: int, tokens: int) -> None:
        """vLLM caches a prompt's full blocks as its chunks are scheduled (``allocate_slots`` calls
        ``cache_blocks`` up to the scheduled tokens): a request admitted after this, in this step or
        a later one, can hit them; blocks of chunks not yet scheduled it cannot."""
        seq = self._get(seq_id)
        limit = scheduled_mark(seq.publish_limit, tokens, seq.num_tokens)
        if limit == seq.publish_limit:
            return  # (already scheduled that far)
        seq.publish_limit = limit
        self._on_blocks_filled(seq)

    def _release_unpublished(self, seq: SequenceState, released: list[int]) -> list[int]:
        """Preempted or aborted mid-prefill: its blocks past the scheduled chunks were never computed
        (vLLM never allocated them) and hold no key. They hold nothing reusable: to the head, as
        hash-less blocks; the keyed ones stay cached."""
        keys = self._block_key
        self.free_queue.extendleft([block_id for block_id in released if keys[block_id] is None])
        return [block_id for block_id in released if keys[block_id] is not None]

    # ---------------------------------------------------------------------------------- free queue
    def _take_free_blocks(self, count: int) -> list[int]:
        # Blank blocks come first; past them the queue holds cached blocks, evicted oldest first.
        cached = count - self.free_queue.blank
        blocks = self.free_queue.take(count)
        if cached > 0:
            self._evict(blocks, count - cached)
        return blocks

    def _evict(self, block_ids: list[int], start: int) -> None:
        """Cached blocks taken from the queue, ``block_ids[start:]``, forget their content (written
        to the host tier first, when there is one). (An index, not a slice: once the cache fills,
        every block a decoding sequence takes is one eviction.)"""
        keys, chain_of, cache, later = (
            self._block_key,
            self._block_chain,
            self._cached_by_key,
            self._later_holders,
        )
        tier = self._tier
        released = []
        # Blocks of one lazy run come off the queue together (a run is freed tail first, in one go):
        # they are counted off their run as one group.
        run: SequenceState | None = None
        run_blocks = 0
        for index in range(start, len(block_ids)):
            block_id = block_ids[index]
            key = keys[block_id]
            keys[block_id] = None
            if key is run:
                run_blocks += 1
                continue
            if run is not None:
                self._evict_lazy(run, run_blocks)
                run = None
            if isinstance(key, SequenceState):  # a block of a lazy run: nothing was keyed
                run, run_blocks = key, 1
                continue
            assert key is not None, "only blocks holding a key are cached"
            first = cache.pop(key)
            if later and key in later:
                self._drop_holder(key, first, block_id)
            if tier is not None and key not in cache:
                tier.store(key)  # before the chains are released below: the chain's id carries over
            released.append(chain_of[block_id])
            chain_of[block_id] = None
        if run is not None:
            self._evict_lazy(run, run_blocks)
        if released:
            self._chains.release_each(released)
        self._cached_in_queue -= len(block_ids) - start
        self.stats.evictions += len(block_ids) - start

    def _evict_lazy(self, run: SequenceState, blocks: int) -> None:
        """``blocks`` cached blocks of the lazy run ``run`` were evicted; the run is forgotten with
        its last one."""
        run.lazy_cached_blocks -= blocks
        if not run.lazy_cached_blocks:  # the run is freed and all of it evicted
            first_key = run.lazy_key
            assert first_key is not None
            del self._lazy_runs[first_key]
            self._chains.release(first_key[0])

    def _drop_holder(self, key: ChainKey, first: int, block_id: int) -> None:
        """``block_id`` no longer holds ``key``, which other blocks hold too (``first``, the first
        cached, was just taken out of the cache): the earliest remaining holder stands for it."""
        holders = self._later_holders[key]
        if first == block_id:
            first = holders.pop(0)
        else:
            holders.remove(block_id)
        self._cached_by_key[key] = first
        if not holders:
            del self._later_holders[key]

    def _release_full_blocks(self, block_ids: list[int]) -> None:
        # Every full block a sequence holds has its key, or its lazy run's mark (_on_blocks_filled
        # keys each block as it fills): all stay cached, at the tail, unless pinned. No key needs
        # reading (the property tests check that every full block of a live sequence holds one).
        if self._pinned:
            for block_id in block_ids:
                if block_id in self._pinned:
                    self._pinned_idle += 1
                else:
                    self.free_queue.append(block_id)
                    self._cached_in_queue += 1
            return
        self.free_queue.extend(block_ids)
        self._cached_in_queue += len(block_ids)

    # ------------------------------------------------------------------------------- fork and COW
    def _blocks_needed_to_fork(self, parent: SequenceState, num_children: int) -> int:
        return 0

    def _give_child_blocks(self, parent: SequenceState, child: SequenceState) -> None:
        if parent.publish_limit != ALL_PUBLISHED:
            self.prompt_scheduled(parent.seq_id, parent.num_tokens)  # (a fork follows its prefill)
        if parent.lazy_key is not None:
            self._key_lazy_run(parent)  # the children share its blocks and key theirs after them
        child.block_table = list(parent.block_table)
        self._logical_blocks += len(child.block_table)
        for block_id in child.block_table:
            self.ref_count[block_id] += 1
            if self.ref_count[block_id] == 2:
                self._shared_blocks += 1
        if parent.num_tokens % self.block_size:
            self._share_tail(parent, child)
            self._tails_shared = True

    def _blocks_needed_to_grow(self, seq: SequenceState, num_tokens: int) -> int:
        # Runs once per block a sequence fills: the paged count and the tail check written out here.
        block_size, table = self.block_size, seq.block_table
        needed = -(-(seq.num_tokens + num_tokens + self.lookahead_slots) // block_size) - len(table)
        if seq.num_tokens % block_size and self.ref_count[table[-1]] > 1:
            needed += 1  # the shared tail is copied first (a partly filled sequence has a tail)
        return needed

    def _copy_shared_tail_before_write(self, seq: SequenceState) -> None:
        if not seq.num_tokens % self.block_size or self.ref_count[seq.block_table[-1]] < 2:
            return  # the tail is full, or this sequence's alone: nothing to copy
        shared = seq.block_table[-1]
        (copy,) = self._take_free_blocks(1)
        self._drop_reference(seq, shared)
        self.ref_count[copy] = 1
        self._live_blocks += 1
        seq.block_table[-1] = copy
        self._add_own_tail(seq)
        self.stats.cow_copies += 1

    # ------------------------------------------------------------------------------------- pinning
    def pin_prefix(self, prompt: TokenContent, namespace: int = 0) -> int:
        """Cache and pin every full block of ``prompt`` (the warm-up of a shared system prompt).

        Returns the slots newly pinned. Pinned blocks count as cached while no live sequence uses
        them, and are never evicted."""
        validate_content(prompt, "pinned prompt", PolicyInputError)
        full_blocks = content_length(prompt) // self.block_size
        if full_blocks == 0:
            raise PolicyInputError(f"pinned prompt is shorter than one block ({self.block_size} tokens)")
        hits = self._find_cached_prefix(prompt, full_blocks, namespace)
        hits_in_queue = sum(
            1 for block_id in hits if self.ref_count[block_id] == 0 and block_id not in self._pinned
        )
        self._ensure_free_blocks(full_blocks - len(hits) + hits_in_queue, "pinning a prefix")
        pinned_len = full_blocks * self.block_size
        holder = SequenceState(_PIN_HOLDER_ID, 0, pinned_len, output_content_id=0, namespace=namespace)
        self._remember_content(holder, _truncate(prompt, pinned_len))
        for block_id in hits:
            self._share_block(block_id)
            holder.block_table.append(block_id)
        self._logical_blocks += len(hits)
        holder.num_tokens = len(hits) * self.block_size
        self.sequences[_PIN_HOLDER_ID] = holder
        self._extend(holder, pinned_len - holder.num_tokens)
        newly_pinned = [block_id for block_id in holder.block_table if block_id not in self._pinned]
        self._pinned.update(newly_pinned)
        self.free(_PIN_HOLDER_ID)
        return len(newly_pinned) * self.block_size


_PIN_HOLDER_ID: Final = -(2**62)  # a private sequence id, held only inside pin_prefix


def _cumulative_ends(segments: list[tuple[int, int]]) -> list[int]:
    ends: list[int] = []
    total = 0
    for segment in segments:  # (indexed: see content_length)
        total += segment[1]
        ends.append(total)
    return ends


def _truncate(content: TokenContent, num_tokens: int) -> TokenContent:
    out: list[tuple[int, int]] = []
    remaining = num_tokens
    for content_id, length in content:
        if remaining <= 0:
            break
        out.append((content_id, min(length, remaining)))
        remaining -= length
    return tuple(out)


register("prefix", PrefixCachingPolicy)
