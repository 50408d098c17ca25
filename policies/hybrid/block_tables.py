"""One KV group's block tables when its pool caches prefixes (vLLM's ``SingleTypeKVCacheManager`` with
``enable_caching``): per sequence, the block id at each position of its held run and the content chain
of each of its full blocks.

A :class:`~policies.hybrid.group.GroupManager` keeps the run ``[first_block, end_block)`` a sequence
holds and its accounting; with a :class:`~policies.hybrid.prefix_pool.PrefixCachingBlockPool` it also
keeps these tables, so that the blocks it releases keep their identity (cached) and later prompts can
hit them:

* **Admission** (``KVCacheManager.allocate_slots``): the hit's blocks inside the run are touched (a
  free one leaves the free queue and counts against it, ``get_num_blocks_to_allocate``), the rest of
  the run is taken new from the head of the queue (evicting the cached blocks it reaches); the
  prompt's full blocks are then cached (``cache_blocks``).
* **Growth**: every group's skipped blocks are released before any group takes new ones
  (``remove_skipped_blocks`` before ``allocate_new_blocks``); a block that fills is cached.
* **Free**: the held blocks go back tail first (``SingleTypeKVCacheManager.free``), full ones cached.
* **Chunks** (with the engine driving, :meth:`GroupBlockTables.defer_keys`): a held block of the
  prompt is cached only once the chunk that computes it is scheduled (:meth:`GroupBlockTables.scheduled`,
  vLLM's ``cache_blocks`` up to the scheduled tokens), so a request preempted mid-prefill leaves
  cached only what it had scheduled: its other blocks go back blank, to the queue's head. The blocks
  earlier chunks pass through (:meth:`GroupBlockTables._pass_through`: a window's, a Mamba group's
  states) are taken, cached and given back as their chunk is scheduled too (a pool that has no
  block left to take then caches nothing there).
* **Fork**: the children share the parent's full blocks (reference counts) and copy its partly filled
  one (kvsim's fork; vLLM's parallel samples share their prompt through the prefix cache alike).

Physical accounting: a block held by several sequences of the group is counted once; ``excess`` is
the references past the first, which the group subtracts from what its runs add up to.
"""

from __future__ import annotations

from policies.base import ALL_PUBLISHED, ChildSpec
from policies.hybrid.prefix_pool import LAZY, NO_BLOCK, LazyRun, PrefixCachingBlockPool, acquire_chains
from policies.paged import SequenceState
from policies.prefix import block_contents
from token_content import TokenContent


class CachedSequence:
    """One sequence's blocks in one group: ``table[p]`` is the block at position ``p`` (``NO_BLOCK``:
    released, or never held), ``chains[p]`` the content chain of full block ``p`` (every full block,
    held or not: the next block's key needs it). Its held blocks at positions from ``keyed_end`` on
    wait for their chunk to be scheduled before they are cached (``ALL_PUBLISHED``: none wait). Its
    chains from ``lazy.first`` on are :data:`~policies.hybrid.prefix_pool.LAZY` while its lazy run
    is not keyed (``policies/hybrid/prefix_pool.py``)."""

    content: SequenceState  # its token segments (``block_table`` unused)
    table: list[int]
    chains: list[int]
    keyed_end: int
    passes: list[int]  # positions earlier chunks pass through, waiting for their chunk (ascending)
    lazy: LazyRun | None

    def __init__(self, content: SequenceState, table: list[int], chains: list[int]) -> None:
        self.content = content
        self.table = table
        self.chains = chains
        self.keyed_end = ALL_PUBLISHED
        self.passes = []
        self.lazy = None

    def lazy_run(self) -> LazyRun | None:
        """Its lazy run, while not keyed (a lookup may have keyed it since)."""
        run = self.lazy
        if run is not None and run.keyed:
            self.lazy = run = None
        return run


class GroupBlockTables:
    """The block tables of one group's sequences over a prefix-caching pool (group ``group`` of it)."""

    def __init__(self, pool: PrefixCachingBlockPool, group: int, block_size: int, kind: str):
        self.pool = pool
        self.group = group
        self.block_size = block_size
        self.kind = kind
        # What a take is for, should it fail: made once, not at every take (a growth's own cost).
        self._prefill_take = f"prefilling in the {kind} group"
        self._admission_take = f"admitting into the {kind} group"
        self._growth_take = f"growing in the {kind} group"
        self.excess = 0  # references to held blocks past the first (shared blocks counted once)
        self.shared_blocks = 0  # blocks two or more sequences hold
        self.by_seq: dict[int, CachedSequence] = {}  # id(GroupSequence) -> its blocks
        self.defers_keys = False  # (defer_keys)
        self.pending_passes = 0  # positions of every sequence waiting to be passed through

    def defer_keys(self) -> None:
        """From now on a prompt's held blocks are cached as its chunks are scheduled
        (:meth:`scheduled`), not at admission."""
        self.defers_keys = True

    def scheduled(self, key: int, tokens: int) -> None:
        """The sequence's first ``tokens`` tokens are scheduled: its held blocks they fill are cached."""
        record = self.by_seq[key]
        if record.keyed_end == ALL_PUBLISHED:
            return
        keyed = record.keyed_end
        record.keyed_end = (
            ALL_PUBLISHED if tokens >= record.content.num_tokens else max(keyed, tokens // self.block_size)
        )
        self._pass_scheduled(record)
        self._cache_held(record, keyed)

    def _publish_all(self, record: CachedSequence) -> None:
        """Every token of the sequence was computed (it decodes, or forks): nothing waits any more."""
        if record.keyed_end != ALL_PUBLISHED:
            keyed = record.keyed_end
            record.keyed_end = ALL_PUBLISHED
            self._pass_scheduled(record)
            self._cache_held(record, keyed)

    def _pass_scheduled(self, record: CachedSequence) -> None:
        """The waiting positions the scheduled chunks passed through (``keyed_end``), in order."""
        passes = record.passes
        done = 0
        while done < len(passes) and passes[done] < record.keyed_end:
            if self.pool.free_blocks:  # (else vLLM's chunk would have waited: nothing is cached)
                self._pass(record, passes[done])
            done += 1
        if done:
            del passes[:done]
            self.pending_passes -= done

    def _pass(self, record: CachedSequence, position: int) -> None:
        """A block of an earlier chunk at ``position``: taken from the queue's head (evicting what it
        reaches), cached and given back, to the tail."""
        (block,) = self.pool.take_blocks(1, self._prefill_take)
        chain = record.chains[position]
        if chain == LAZY:
            self._mark(record, block, position)
        else:
            self.cache_passed(block, chain, position)
        self.pool.release(block)

    def cache_passed(self, block: int, chain: int, position: int) -> None:
        """``block`` holds what an earlier chunk computed at ``position``: cached under ``chain``."""
        self.pool.cache_block(self.group, block, chain)

    def _wait_to_pass(self, record: CachedSequence, positions: list[int]) -> None:
        """``positions`` (ascending) are passed through now, or, deferring, as their chunks are
        scheduled (:meth:`_pass_scheduled`)."""
        if not self.defers_keys:
            for position in positions:
                self._pass(record, position)
            return
        record.passes = positions
        self.pending_passes += len(positions)

    def key_end(self, record: CachedSequence) -> int:
        """The end of the positions whose held blocks may be cached now: full, and scheduled."""
        end = min(len(record.chains), len(record.table))
        return end if end < record.keyed_end else record.keyed_end

    # -- prefix hits -----------------------------------------------------------------------------
    def prompt_chains(self, prompt: TokenContent, namespace: int, max_blocks: int) -> list[int]:
        """The chains of the prompt's first ``max_blocks`` blocks that some block holds, in order."""
        content = _content_of(0, prompt, 0, namespace)
        return self.pool.find_chains(content.segments, content.segment_ends, max_blocks, namespace)

    def is_cached(self, chain: int) -> bool:
        return self.pool.cached_block(self.group, chain) != NO_BLOCK

    def blocks_needed_to_admit(
        self, chains: list[int], prefill_from: int, run: tuple[int, int], hit: int
    ) -> int:
        """Blocks the free queue gives to admit a run ``[first, end)`` whose positions before ``hit``
        are cached: the new ones, and the free ones of the hit from ``prefill_from`` (they leave the
        queue: vLLM's ``get_num_blocks_to_allocate`` counts every evictable computed block)."""
        first, end = run
        pool = self.pool
        evictable = 0
        for position in range(prefill_from, hit):
            if pool.ref_count[pool.cached_block(self.group, chains[position])] == 0:
                evictable += 1
        return end - max(first, hit) + evictable

    # -- sequences -------------------------------------------------------------------------------
    def hold_hit(
        self,
        key: int,
        seq_id: int,
        prompt: TokenContent,
        output_content_id: int,
        namespace: int,
        run: tuple[int, int],
        hit_chains: list[int],
        hit: int,
        prefill_from: int,
    ) -> None:
        """A new sequence that will hold ``run`` of its prompt: first, the blocks of its prefix hit
        (before ``hit``, cached under ``hit_chains``) that its prefill attends to, from
        ``prefill_from``, are touched (those before the run go back in :meth:`take_new`). Every group
        of a pool touches its hit before any group takes new blocks (vLLM ``allocate_slots``: the
        computed blocks of every group, then the new ones), so that no group's new block evicts
        another group's hit."""
        end = run[1]
        table = [NO_BLOCK] * end
        pool = self.pool
        for position in range(prefill_from, hit):
            block = pool.cached_block(self.group, hit_chains[position])
            if pool.touch(block):
                self.excess += 1
                if pool.ref_count[block] == 2:
                    self.shared_blocks += 1
            table[position] = block
        content = _content_of(seq_id, prompt, output_content_id, namespace)
        self.by_seq[key] = CachedSequence(content, table, [])

    def take_new(self, key: int, run: tuple[int, int], hit: int, prefill_from: int) -> None:
        """Then the prompt's blocks before the run that chunked prefill computed and released (from
        ``prefill_from``, the first block the prefill attends to: :meth:`_pass_through`), and the
        rest of the run, new blocks from the queue's head; the prompt's full blocks cached. (The
        caller checked that the pool holds the run.)"""
        first, end = run
        record = self.by_seq[key]
        done = len(record.chains)
        if self.defers_keys:
            record.keyed_end = hit  # (the hit's blocks are cached already)
        self._extend_chains(record)
        self._pass_through(record, prefill_from, first, hit)
        start = max(first, hit)
        record.table[start:end] = self.pool.take_blocks(end - start, self._admission_take)
        self._cache_held(record, done)

    def _pass_through(self, record: CachedSequence, prefill_from: int, first: int, hit: int) -> None:
        """A prompt longer than chunked prefill holds at once: vLLM's earlier chunks took the blocks
        before the run, and ``remove_skipped_blocks`` freed them once the window (or chunk) passed,
        full, so cached. Each is taken from the queue's head (evicting what it reaches) and given back
        to its tail, cached; a block of the hit there (held since :meth:`hold_hit`) is given back.
        (In block order; vLLM frees each chunk's skipped blocks latest first.)"""
        table = record.table
        for position in range(prefill_from, min(first, hit)):
            self._release(table[position])
            table[position] = NO_BLOCK
        self._wait_to_pass(record, list(range(max(prefill_from, hit), first)))

    def cache_full_blocks(self, record: CachedSequence) -> None:
        """Chains for the sequence's blocks that filled since, and its held new ones cached under them."""
        done = len(record.chains)
        self._extend_chains(record)
        self._cache_held(record, done)

    def _extend_chains(self, record: CachedSequence) -> None:
        """The content chains of the sequence's full blocks that have none yet (held by it); with lazy
        keys, past its first key nothing holds, a lazy run's marks (:meth:`_extend_lazily`)."""
        content = record.content
        content.fold_output()
        last = (content.segment_ends[-1] if content.segment_ends else 0) // self.block_size
        done = len(record.chains)
        if done >= last:
            return
        if self.pool.lazy_keys:
            self._extend_lazily(record, done, last)
            return
        record.chains += acquire_chains(
            self.pool.chains,
            content.segments,
            content.segment_ends,
            done,
            last,
            self.block_size,
            record.chains[-1] if record.chains else None,
            content.namespace,
        )

    def _extend_lazily(self, record: CachedSequence, done: int, last: int) -> None:
        """:meth:`_extend_chains` with lazy keys: each key is acquired while something holds it; the
        first that nothing holds starts the sequence's lazy run in this group (unless a run of this
        group is filed under it: then those are keyed, and it is acquired), and the rest are marks."""
        chains = record.chains
        if record.lazy_run() is not None:
            chains += [LAZY] * (last - done)
            return
        pool = self.pool
        content = record.content
        namespace = content.namespace
        parent = chains[-1] if chains else None
        position = done
        for piece in block_contents(content.segments, content.segment_ends, done, last, self.block_size):
            key = (parent, *piece, namespace)
            chain = pool.chains.find(key)
            if chain is None and pool.reaches_run_of(key, self.group):
                chain = pool.chains.find(key)  # (keyed just now)
            if chain is None:
                record.lazy = pool.file_run(LazyRun(pool, key, parent, position, self.group, content, chains))
                chains += [LAZY] * (last - position)
                return
            pool.chains.hold(chain)
            chains.append(chain)
            parent = chain
            position += 1

    def _cache_held(self, record: CachedSequence, done: int) -> None:
        """The held blocks at full positions from ``done`` on without an identity get theirs (a lazy
        run's positions: its mark)."""
        pool = self.pool
        table = record.table
        chains = record.chains
        end = self.key_end(record)
        run = record.lazy
        # A run not yet keyed holds every chain from its first position on (all LAZY), so the
        # positions split in two: those before it get their chains, the rest are marked in one call.
        keyed_end = end if run is None or run.keyed or run.first >= end else max(done, run.first)
        for position in range(done, keyed_end):
            block = table[position]
            if block != NO_BLOCK and not pool.has_identity(block):
                chain = chains[position]
                if chain == LAZY:
                    self._mark(record, block, position)
                else:
                    pool.cache_block(self.group, block, chain)
        if keyed_end < end:
            assert run is not None
            pool.mark_lazy_each(table, keyed_end, end, run)

    def _mark(self, record: CachedSequence, block: int, position: int) -> None:
        """A held block at ``position`` of the sequence's lazy run is full: marked cached."""
        run = record.lazy
        assert run is not None  # (a LAZY chain belongs to a run not yet keyed)
        self.pool.mark_lazy(block, run, position)

    def release_skipped(self, key: int, first_block: int, end_block: int, first: int) -> None:
        """A sequence holding ``[first_block, end_block)`` whose run now starts at ``first`` gives back
        the blocks before it, the latest first (vLLM's ``remove_skipped_blocks``)."""
        table = self.by_seq[key].table
        end = min(first, end_block)
        if end > first_block:
            self._release_run(table, first_block, end)
            table[first_block:end] = [NO_BLOCK] * (end - first_block)

    def note_growth(self, key: int, tokens: int) -> None:
        """The sequence grew by ``tokens`` of its own output: the held blocks they filled are cached
        (before any is released: :meth:`release_skipped`)."""
        record = self.by_seq[key]
        if record.keyed_end != ALL_PUBLISHED:  # (this runs at every growth a sequence is told of)
            self._publish_all(record)
        record.content.output_pending += tokens
        self._cache_if_filled(record)

    def take_for_growth(self, key: int, end_block: int, first: int, end: int, tokens: int) -> None:
        """The new blocks of a growth by ``tokens`` (told already: :meth:`note_growth`) to the run
        ``[first, end)``; those the tokens filled are cached."""
        record = self.by_seq[key]
        start = max(end_block, first)
        if end > len(record.table):
            record.table += [NO_BLOCK] * (end - len(record.table))
        if end > start:
            record.table[start:end] = self.pool.take_blocks(end - start, self._growth_take)
            self._cache_held(record, start)  # (their chains exist: note_growth extended them)

    def _cache_if_filled(self, record: CachedSequence) -> None:
        if (record.content.segment_ends[-1] + record.content.output_pending) // self.block_size > len(
            record.chains
        ):
            self.cache_full_blocks(record)

    def free(self, key: int, first_block: int, end_block: int) -> None:
        """Every held block back, the last first; the sequence's chains released (a lazy run's marks
        stay, for a lookup that may reach them)."""
        record = self._forget(key)
        if end_block > first_block:
            self._release_run(record.table, first_block, end_block)
        run = record.lazy_run()
        if run is None:
            self.pool.chains.release_each(record.chains)
            return
        self.pool.chains.release_each(record.chains[: run.first])
        run.live = False
        if not run.identified:
            self.pool.drop_run(run)

    def _forget(self, key: int) -> CachedSequence:
        """The freed sequence's record, out of the tables; the blocks it had yet to pass through were
        never computed: nothing caches them."""
        record = self.by_seq.pop(key)
        self.pending_passes -= len(record.passes)
        return record

    def _release(self, block: int) -> None:
        if self.pool.release(block):
            self.excess -= 1
            if self.pool.ref_count[block] == 1:
                self.shared_blocks -= 1

    def _release_run(self, table: list[int], start: int, end: int) -> None:
        """:meth:`_release` of the blocks at positions ``start`` to ``end - 1``, the last first (as
        vLLM frees them), each held (no null entry among them)."""
        blocks = table[start:end]
        blocks.reverse()
        if self.pool.release_each(blocks):  # some stay held by other sequences: shared ones
            ref_count = self.pool.ref_count
            for block in blocks:
                count = ref_count[block]
                if count:
                    self.excess -= 1
                    if count == 1:
                        self.shared_blocks -= 1

    # -- forks -----------------------------------------------------------------------------------
    def partial_blocks(self, key: int, first_block: int, end_block: int) -> int:
        """Held blocks not yet full: what each fork child copies."""
        return end_block - max(first_block, len(self.by_seq[key].chains))

    def fork(
        self, parent_key: int, child_key: int, child: ChildSpec, first_block: int, end_block: int
    ) -> None:
        """A child sharing the parent's full blocks, with copies of its partly filled ones. (A null
        entry inside the run, a Mamba group's unwritten states between the two it holds, is shared
        as nothing.)"""
        parent = self.by_seq[parent_key]
        pool = self.pool
        self._publish_all(parent)  # (a fork follows its parent's prefill)
        run = parent.lazy_run()
        if run is not None:
            pool.key_runs(run.key)  # (the children share its blocks and key theirs after them)
        parent.content.fold_output()
        full = len(parent.chains)
        table = list(parent.table)
        for position in range(first_block, min(full, end_block)):
            if table[position] != NO_BLOCK:
                pool.touch(table[position])
                self.excess += 1
                if pool.ref_count[table[position]] == 2:
                    self.shared_blocks += 1
        copy_from = max(first_block, full)
        if end_block > copy_from:
            table[copy_from:end_block] = pool.take_blocks(end_block - copy_from, "forking")
        for chain in parent.chains:
            pool.chains.hold(chain)
        source = parent.content
        content = SequenceState(
            child.seq_id,
            0,
            child.final_len,
            child.output_content_id,
            segments=list(source.segments),
            segment_ends=list(source.segment_ends),
            namespace=source.namespace,
        )
        self.by_seq[child_key] = CachedSequence(content, table, list(parent.chains))

    def net_blocks_of(
        self, key: int, first_block: int, end_block: int, first: int, end: int, shared: dict[int, int]
    ) -> int:
        """One growth's part of the blocks the pool gives (negative: gets back) for a growth of
        several sequences: a sequence holding ``[first_block, end_block)`` grows to ``[first, end)``.
        Its new positions, less the released blocks it alone holds; the released blocks others may
        hold too are counted into ``shared`` (block -> times released), for :meth:`shared_net`."""
        net = end - max(end_block, first)
        table = self.by_seq[key].table
        ref_count = self.pool.ref_count
        # (The blocks it releases, read in place: this runs at every growth of every sequence.)
        for position in range(first_block, min(first, end_block)):
            block = table[position]
            if block == NO_BLOCK:
                continue  # (a Mamba group's null entry between its states: nothing released)
            if ref_count[block] == 1:
                net -= 1  # (its one holder releases it: listed once, no count needed)
            else:
                shared[block] = shared.get(block, 0) + 1
        return net

    def shared_net(self, shared: dict[int, int]) -> int:
        """The blocks :meth:`net_blocks_of` found released by several holders that every holder
        releases: they go back to the pool (negative)."""
        ref_count = self.pool.ref_count
        net = 0
        for block, count in shared.items():
            if ref_count[block] == count:
                net -= 1
        return net


def _content_of(seq_id: int, prompt: TokenContent, output_content_id: int, namespace: int) -> SequenceState:
    segments = [segment for segment in prompt if segment[1] > 0]
    ends: list[int] = []
    total = 0
    for segment in segments:
        total += segment[1]
        ends.append(total)
    return SequenceState(
        seq_id, total, total, output_content_id, segments=segments, segment_ends=ends, namespace=namespace
    )
