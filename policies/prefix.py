"""Paged allocation with prefix sharing and copy-on-write (vLLM V1 prefix caching + V0 forks).

- Every full block gets a hash chained over (parent block hash, the token pieces it holds, the
  namespace), as vLLM's ``hash_block_tokens`` chains over (parent hash, token ids, extra keys). A
  hash map finds cached blocks (vLLM's ``BlockHashToBlockMap``).
- A hit is verified on *content*, never on placement: every cached block also carries an interned
  exact *chain identity* (:class:`ContentChains`: parent's chain, pieces, namespace), and a block
  verifies when its chain is the one the prompt spells. Any block holding the same content chain
  verifies, wherever its parent sits (vLLM chains on content alone, ``find_longest_cache_hit``), and
  a colliding hash can never share wrong content (vLLM trusts its sha256; kvsim's ``hash_fn`` may
  collide on purpose in tests).
- Duplicates: vLLM never deduplicates (block tables are append-only), so one hash can name several
  cached blocks. The lookup returns the one ``BlockHashToBlockMap.get_one_block`` returns: the
  earliest-cached block still cached under that hash (``next(iter(...))`` of an insertion-ordered
  dict; ``insert`` appends, ``pop`` removes in place), among those whose chain verifies.
- Blocks are reference counted. When the last owner frees a full block it keeps its hash and stays
  *cached* (hittable) in the free queue until it is handed out again, which evicts it: LRU.
  A freed sequence's blocks enter the queue tail-first, so its longest-prefix block is evicted first;
  a freed block holding no hash goes to the head and is reused before any cached block (vLLM #42656).
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
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Hashable

from policies.base import (
    NO_HIT,
    PolicyInputError,
    PoolSpec,
    PrefixHit,
    TokenContent,
    content_length,
    register,
    validate_content,
)
from policies.paged import PagedPolicy, SequenceState, ceil_div

Piece = tuple[int, int, int]  # (content_id, first offset, end offset) within one token stream
ChainKey = tuple[int | None, tuple[Piece, ...], int]  # (parent's chain id, the block's pieces, namespace)


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


class ContentChains:
    """Interned exact identities of block contents: ``(parent's chain id, pieces, namespace)`` -> id.

    Two blocks with the same chain id hold the same tokens after the same prefix, in the same
    namespace, wherever they sit in the pool: this is what a prefix hit verifies. An id lives while
    a cached block holds it or a child chain names it as its parent, so a cached block whose parent
    was evicted verifies again once the parent's content is cached again, exactly as vLLM's content
    hashes do. Ids are never reused, so a stale id can never match new content."""

    def __init__(self) -> None:
        self._id_of: dict[ChainKey, int] = {}
        self._entry_of: dict[int, list] = {}  # chain id -> [its key, its holders]
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
            self._entry_of[chain][1] += 1
            return chain
        chain = self._next_id
        self._next_id += 1
        self._id_of[key] = chain
        self._entry_of[chain] = [key, 1]
        if key[0] is not None:
            self._entry_of[key[0]][1] += 1
        return chain

    def release(self, chain: int | None) -> None:
        """One holder fewer; an id nobody holds is forgotten, and releases its parent in turn."""
        while chain is not None:
            entry = self._entry_of[chain]
            entry[1] -= 1
            if entry[1]:
                return
            del self._entry_of[chain]
            del self._id_of[entry[0]]
            chain = entry[0][0]


@register("prefix")
class PrefixCachingPolicy(PagedPolicy):
    """Paged blocks shared by prefix hash and by fork, with LRU eviction of cached blocks."""

    def __init__(self, pool: PoolSpec, hash_fn: Callable[[Hashable], int] = hash):
        super().__init__(pool)
        self.hash_fn = hash_fn
        self._block_hash: list[int | None] = [None] * self.num_blocks
        self._block_chain: list[int | None] = [None] * self.num_blocks
        self._chains = ContentChains()
        # Blocks cached under each hash, earliest-cached first (vLLM's BlockHashToBlockMap order).
        self._cached_by_hash: dict[int, list[int]] = {}
        self._cached_in_queue = 0
        self._pinned: set[int] = set()
        self._pinned_idle = 0

    # ------------------------------------------------------------------------------------ accounting
    def _cached_blocks(self) -> int:
        return self._cached_in_queue + self._pinned_idle

    def available_slots(self) -> int:
        return len(self.free_queue) * self.block_size

    def free_queue_order(self) -> list[int]:
        return self.free_queue.order()

    # ---------------------------------------------------------------------------------- prefix lookup
    def lookup(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        validate_content(prompt, "looked-up prompt")
        prompt_len = content_length(prompt)
        if prompt_len <= 0:
            return NO_HIT
        return self._prefix_hit(
            self._find_cached_prefix(prompt, (prompt_len - 1) // self.block_size, namespace)
        )

    def _blocks_needed_to_admit(self, prompt: TokenContent, namespace: int) -> tuple[int, list[int]]:
        prompt_len = content_length(prompt)
        hits = self._find_cached_prefix(prompt, (prompt_len - 1) // self.block_size, namespace)
        hits_in_queue = sum(
            1 for block_id in hits if self.ref_count[block_id] == 0 and block_id not in self._pinned
        )
        # Touching an idle cached hit takes it out of the free queue, so it counts against the queue too.
        new_blocks = ceil_div(prompt_len, self.block_size) - len(hits)
        return new_blocks + hits_in_queue, hits

    def _find_cached_prefix(self, prompt: TokenContent, max_blocks: int, namespace: int) -> list[int]:
        segments = [segment for segment in prompt if segment[1] > 0]
        ends = _cumulative_ends(segments)
        block_size = self.block_size
        hits: list[int] = []
        parent_hash: int | None = None
        parent_chain: int | None = None
        for index in range(max_blocks):
            pieces = block_pieces(segments, ends, index * block_size, (index + 1) * block_size)
            chain = self._chains.find((parent_chain, pieces, namespace))
            if chain is None:
                break  # no cached block holds this content after this prefix
            block_hash = self.hash_fn((parent_hash, pieces, namespace))
            block_id = self._first_cached_block(block_hash, chain)
            if block_id is None:
                break
            hits.append(block_id)
            parent_hash, parent_chain = block_hash, chain
        return hits

    def _first_cached_block(self, block_hash: int, chain: int) -> int | None:
        """``BlockHashToBlockMap.get_one_block(block_hash)``: the earliest-cached block under the hash,
        skipping blocks whose content differs (only a deliberately colliding ``hash_fn`` has any)."""
        for block_id in self._cached_by_hash.get(block_hash, ()):
            if self._block_chain[block_id] == chain:
                return block_id
        return None

    def _record_prefix_query(self, prompt_len: int, cached_tokens: int) -> None:
        self.stats.prefix_cache_queries += prompt_len
        self.stats.prefix_cache_hits += cached_tokens

    def _share_block(self, block_id: int) -> None:
        if self.ref_count[block_id] == 0:
            if block_id in self._pinned:
                self._pinned_idle -= 1
            else:
                self.free_queue.remove(block_id)
                self._cached_in_queue -= 1
            self._live_blocks += 1
            self._set_fill(block_id, self.block_size, self.block_size)
        self.ref_count[block_id] += 1

    # ----------------------------------------------------------------------------- content and hashes
    def _remember_content(self, seq: SequenceState, content: TokenContent) -> None:
        validate_content(content, f"content of sequence {seq.seq_id}")
        for segment in content:
            self._append_segment(seq, segment)

    def _append_content(self, seq: SequenceState, num_tokens: int, content: TokenContent | None) -> None:
        if content is not None:
            self._remember_content(seq, content)
            return
        segments = seq.segments
        if segments and segments[-1][0] == seq.output_content_id:
            segments[-1] = (seq.output_content_id, segments[-1][1] + num_tokens)
            seq.segment_ends[-1] += num_tokens
        else:
            self._append_segment(seq, (seq.output_content_id, num_tokens))

    @staticmethod
    def _append_segment(seq: SequenceState, segment: tuple[int, int]) -> None:
        if segment[1] == 0:
            return
        seq.segments.append(segment)
        seq.segment_ends.append((seq.segment_ends[-1] if seq.segment_ends else 0) + segment[1])

    def _on_blocks_filled(self, seq: SequenceState) -> None:
        """Cache every block of ``seq`` that became full and has no hash yet."""
        block_size = self.block_size
        for index in range(len(seq.block_hashes), seq.num_tokens // block_size):
            block_id = seq.block_table[index]
            pieces = block_pieces(
                seq.segments, seq.segment_ends, index * block_size, (index + 1) * block_size
            )
            if index:
                # The previous block is full and this sequence holds it, so it is cached: its chain
                # is the content chain of this sequence's prefix (hits and forks share only that).
                parent_hash: int | None = seq.block_hashes[-1]
                parent_chain = self._block_chain[seq.block_table[index - 1]]
            else:
                parent_hash, parent_chain = None, None
            block_hash = self.hash_fn((parent_hash, pieces, seq.namespace))
            seq.block_hashes.append(block_hash)
            if self._block_hash[block_id] is None:
                # A block reached by a hit or a fork is already cached; only fresh blocks register.
                # Identical content cached twice stays twice (vLLM does not deduplicate).
                self._block_hash[block_id] = block_hash
                self._block_chain[block_id] = self._chains.acquire((parent_chain, pieces, seq.namespace))
                self._cached_by_hash.setdefault(block_hash, []).append(block_id)

    # ---------------------------------------------------------------------------------- free queue
    def _take_free_block(self) -> int:
        block_id = self.free_queue.popleft()
        if self._block_hash[block_id] is not None:
            self._evict(block_id)
        return block_id

    def _evict(self, block_id: int) -> None:
        block_hash = self._block_hash[block_id]
        assert block_hash is not None
        same_hash = self._cached_by_hash[block_hash]
        same_hash.remove(block_id)
        if not same_hash:
            del self._cached_by_hash[block_hash]
        self._block_hash[block_id] = None
        self._chains.release(self._block_chain[block_id])
        self._block_chain[block_id] = None
        self._cached_in_queue -= 1
        self.stats.evictions += 1

    def _return_free_block(self, block_id: int) -> None:
        if block_id in self._pinned:
            self._pinned_idle += 1
        elif self._block_hash[block_id] is not None:
            self.free_queue.append(block_id)
            self._cached_in_queue += 1
        else:
            self.free_queue.appendleft(block_id)

    # ------------------------------------------------------------------------------- fork and COW
    def _blocks_needed_to_fork(self, parent: SequenceState, num_children: int) -> int:
        return 0

    def _give_child_blocks(self, parent: SequenceState, child: SequenceState) -> None:
        child.block_table = list(parent.block_table)
        self._logical_blocks += len(child.block_table)
        for block_id in child.block_table:
            self.ref_count[block_id] += 1
        if parent.block_table and parent.num_tokens % self.block_size:
            tail = parent.block_table[-1]
            self._partial_owners[tail].append(child)
            self._retarget_tail(tail, child)

    def _blocks_needed_to_grow(self, seq: SequenceState, num_tokens: int) -> int:
        return super()._blocks_needed_to_grow(seq, num_tokens) + int(self._tail_is_shared_and_partial(seq))

    def _tail_is_shared_and_partial(self, seq: SequenceState) -> bool:
        return (
            bool(seq.block_table)
            and seq.num_tokens % self.block_size != 0
            and self.ref_count[seq.block_table[-1]] > 1
        )

    def _copy_shared_tail_before_write(self, seq: SequenceState) -> None:
        if not self._tail_is_shared_and_partial(seq):
            return
        shared = seq.block_table[-1]
        copy = self._take_free_block()
        self._drop_reference(seq, shared)
        self.ref_count[copy] = 1
        self._live_blocks += 1
        seq.block_table[-1] = copy
        self._partial_owners[copy] = [seq]
        self._retarget_tail(copy, seq)
        self.stats.cow_copies += 1

    # ------------------------------------------------------------------------------------- pinning
    def pin_prefix(self, prompt: TokenContent, namespace: int = 0) -> int:
        """Cache and pin every full block of ``prompt`` (the warm-up of a shared system prompt).

        Returns the slots newly pinned. Pinned blocks count as cached while no live sequence uses
        them, and are never evicted."""
        validate_content(prompt, "pinned prompt")
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


_PIN_HOLDER_ID = -(2**62)  # a private sequence id, held only inside pin_prefix


def _cumulative_ends(segments: list[tuple[int, int]]) -> list[int]:
    ends: list[int] = []
    total = 0
    for _, length in segments:
        total += length
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
