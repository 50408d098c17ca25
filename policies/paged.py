"""Paged allocation (PagedAttention): a pool of fixed-size blocks, a block table per sequence, blocks
taken on demand as tokens arrive.

This module also holds the block bookkeeping the prefix-caching policy builds on (``prefix.py``):
reference counts, the free-block queue and the per-block accounting. Plain paging never shares a
block, so every reference count here is 0 or 1 and a fork copies the parent's tokens.

Accounting is kept per physical block so that a block shared by several sequences counts once:
a live block holds ``filled`` token states and will hold ``target`` (``filled <= target <= block_size``)
by the time its owners finish. Summed over live blocks: used = Σ filled, reserved = Σ (target − filled),
internal fragmentation = Σ (block_size − target). Only a sequence's last block can be partly filled,
so only those blocks need tracking beyond "full", and even they need no record of their own: a
sequence of ``t`` tokens holds ``ceil(t / block_size)`` blocks, so its tail holds ``t mod block_size``
tokens and will hold what the sequence's final length leaves for it. Only a tail that forks share
(prefix caching) lists its owners: its target is the most any of them will fill.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.base import (
    ALL_PUBLISHED,
    NO_HIT,
    ChildSpec,
    OutOfKVMemory,
    PolicyInputError,
    PoolSpec,
    PrefixHit,
    SequenceTable,
    grow_each_arguments_error,
    register,
)
from token_content import Segment, TokenContent, content_length


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _none_held(ref_count: list[int], blocks: list[int], start: int) -> bool:
    """Whether nobody holds any of ``blocks[start:]``."""
    return all(not ref_count[blocks[index]] for index in range(start, len(blocks)))


class FreeBlockQueue:
    """Free block ids in the order they are handed out (head first), as vLLM's free block queue.

    Blocks holding nothing reusable come first, the last one freed first; then blocks holding cached
    prefix content, least recently used first (only the prefix policy has those; a prefix hit takes
    one out of the middle). The first part is a list used as a stack, the second a list read from a
    moving head, so taking many blocks, or giving back a sequence's blocks, is one slice: every
    block of every prompt passes through the cached part when prefix caching is on (2.2 M blocks
    each way on the Mooncake conversation trace).

    A hit leaves its entry in the cached part, counted as stale (O(1) rather than a scan): a block's
    entries are in the order it was freed, and all but its last are stale, so the head skips
    exactly as many of a block's entries as it has stale ones. (The counts are a list indexed by
    block id, not a dict: a hit or a take then boxes no block id.) Entries before the head (taken) and
    stale ones are dropped once they outnumber the live ones, so memory stays bounded by the pool."""

    COMPACT_AFTER: ClassVar[int] = 1024  # dead entries (at least) before the cached part is rebuilt

    def __init__(self, block_ids: Iterable[int], compact_after: int = COMPACT_AFTER):
        self.compact_after = compact_after
        self._blank: list[int] = list(block_ids)[::-1]  # its end is the head of the queue
        self._ids = max(self._blank) + 1 if self._blank else 0
        self._cached: list[int] = []  # from index _head on: the cached part, oldest first
        self._head = 0
        self._cached_count = 0  # live entries of _cached
        self._stale: list[int] = [0] * self._ids  # per block id: its entries in _cached left by hits
        self._stale_entries = 0

    def __len__(self) -> int:
        return len(self._blank) + self._cached_count

    def __contains__(self, block_id: int) -> bool:
        return block_id in self.order()  # O(free blocks): tests only

    @property
    def blank(self) -> int:
        """Blocks at the head that hold nothing reusable (taking them evicts nothing)."""
        return len(self._blank)

    def entries(self) -> int:
        """Entries the cached part keeps in memory: live, stale and already taken ones."""
        return len(self._cached)

    def take(self, count: int) -> list[int]:
        """The ``count`` blocks at the head, in order (``count <= len(self)``)."""
        blank = self._blank
        if count <= len(blank):
            if count == 1:
                return [blank.pop()]  # a sequence's next block: by far the most common
            if count <= 0:
                return []
            blocks = blank[-count:]
            del blank[-count:]
            blocks.reverse()
            return blocks
        cached = self._cached
        head = self._head
        if count == 1 and self._cached_count:
            # A decoding sequence's next block once no blank block is left: the oldest cached one,
            # past the entries hits left behind.
            stale = self._stale
            block_id = cached[head]
            while stale[block_id]:
                stale[block_id] -= 1
                self._stale_entries -= 1
                head += 1
                block_id = cached[head]
            self._cached_count -= 1
            self._head = head + 1
            blocks = [block_id]
        else:
            blocks = self._take_through_cached(count)
        if self._head > self.compact_after and self._head > self._cached_count:
            del cached[: self._head]  # (stale entries stay, with their counts)
            self._head = 0
        return blocks

    def _take_through_cached(self, count: int) -> list[int]:
        """``take`` of more blocks than the blank part holds: all of it, then the oldest cached."""
        blank = self._blank
        oldest = count - len(blank)
        if oldest > self._cached_count:
            raise IndexError(f"take({count}) from a queue of {len(blank) + self._cached_count} blocks")
        blocks = blank[::-1]
        blank.clear()
        self._cached_count -= oldest
        cached = self._cached
        head = self._head
        if not self._stale_entries:
            end = head + oldest
            blocks += cached[head:end]
            self._head = end
            return blocks
        stale = self._stale
        while oldest:
            block_id = cached[head]
            head += 1
            left = stale[block_id]
            if left:  # an entry a hit left behind
                self._stale_entries -= 1
                stale[block_id] = left - 1
                continue
            blocks.append(block_id)
            oldest -= 1
        self._head = head
        return blocks

    def oldest_cached(self) -> int:
        """The cached block ``take`` would hand out first once no blank one is left (the queue has
        one), left in the queue; the stale entries before it are dropped as ``take`` drops them."""
        cached, stale = self._cached, self._stale
        head = self._head
        block_id = cached[head]
        while stale[block_id]:
            stale[block_id] -= 1
            self._stale_entries -= 1
            head += 1
            block_id = cached[head]
        self._head = head
        return block_id

    def append(self, block_id: int) -> None:
        """At the tail: a block that holds cached content."""
        self._cached.append(block_id)
        self._cached_count += 1

    def extend(self, block_ids: list[int]) -> None:
        """``append`` of each block in turn."""
        self._cached.extend(block_ids)
        self._cached_count += len(block_ids)

    def appendleft(self, block_id: int) -> None:
        """At the head: a block that holds nothing reusable."""
        self._blank.append(block_id)

    def extendleft(self, block_ids: list[int]) -> None:
        """``appendleft`` of each block in turn: the last one ends up at the head."""
        self._blank.extend(block_ids)

    def remove_cached(self, block_id: int) -> None:
        """``block_id``, a free block holding cached content (appended, not taken since), leaves
        the queue: a prefix hit."""
        self._stale[block_id] += 1
        self._cached_count -= 1
        self._stale_entries += 1
        if self._stale_entries > max(self.compact_after, self._cached_count):
            # Hits without evictions would grow the list without bound: drop the stale entries
            # (linear, once per as many hits as live entries).
            self._cached = self._live_cached()
            self._head = 0
            self._stale = [0] * self._ids
            self._stale_entries = 0

    def order(self) -> list[int]:
        return self._blank[::-1] + self._live_cached()

    def _live_cached(self) -> list[int]:
        stale = list(self._stale)
        live = []
        for block_id in self._cached[self._head :]:
            if stale[block_id]:
                stale[block_id] -= 1
            else:
                live.append(block_id)
        return live


@dataclass(slots=True, eq=False, init=False)
class SequenceState:
    """A sequence's block table and, for policies that share blocks, its token content and keys.
    (Its constructor is written out: the compiled build runs it natively, once per sequence, where
    a dataclass's generated one would stay interpreted.)"""

    seq_id: int
    num_tokens: int
    final_len: int
    output_content_id: int
    block_table: list[int]
    # Token content and cache keys are only kept by policies that share blocks.
    segments: list[Segment]
    segment_ends: list[int]
    keyed_blocks: int  # leading full blocks whose cache key is known
    namespace: int
    # Prefix caching keys a sequence's blocks lazily from its first block whose key nothing holds
    # (policies/prefix.py): that key, that block's index, and how many of them are still cached.
    lazy_key: tuple | None
    lazy_from: int
    lazy_cached_blocks: int
    # Tokens of its own output stream appended since ``segments`` were last brought up to date: a
    # decoding sequence grows at every flush, and only keying, forks and lazy runs read the segments.
    output_pending: int
    # Tokens whose blocks may be cached (keyed): a prompt's blocks are allocated at admission, but
    # vLLM caches a chunk's blocks only when the chunk is scheduled (``defer_prompt_keys``).
    # ALL_PUBLISHED once the whole prompt was scheduled.
    publish_limit: int

    def __init__(
        self,
        seq_id: int,
        num_tokens: int,
        final_len: int,
        output_content_id: int,
        *,
        segments: list[Segment] | None = None,
        segment_ends: list[int] | None = None,
        keyed_blocks: int = 0,
        namespace: int = 0,
    ) -> None:
        self.seq_id = seq_id
        self.num_tokens = num_tokens
        self.final_len = final_len
        self.output_content_id = output_content_id
        self.block_table = []
        self.segments = [] if segments is None else segments
        self.segment_ends = [] if segment_ends is None else segment_ends
        self.keyed_blocks = keyed_blocks
        self.namespace = namespace
        self.lazy_key = None
        self.lazy_from = self.lazy_cached_blocks = self.output_pending = 0
        self.publish_limit = ALL_PUBLISHED

    def fold_output(self) -> None:
        """Bring ``segments`` up to date with the output tokens appended since (``output_pending``)."""
        pending = self.output_pending
        if not pending:
            return
        self.output_pending = 0
        segments = self.segments
        if segments and segments[-1][0] == self.output_content_id:
            segments[-1] = (self.output_content_id, segments[-1][1] + pending)
            self.segment_ends[-1] += pending
        else:
            self.append_segment((self.output_content_id, pending))

    def append_segment(self, segment: Segment) -> None:
        """Its content continues with ``segment`` (an empty one adds nothing)."""
        if segment[1] == 0:
            return
        self.segments.append(segment)
        self.segment_ends.append((self.segment_ends[-1] if self.segment_ends else 0) + segment[1])


class PagedPolicy(SequenceTable[SequenceState]):
    """PagedAttention block tables without sharing: O(1) allocation and free per block."""

    _SHARES_BLOCKS = False  # True: blocks are shared (prefix cache, forks): the sharing hooks run
    HOLDS_LOOKAHEAD = True  # a growing sequence takes the blocks for its lookahead slots too

    def __init__(self, pool: PoolSpec):
        super().__init__(pool)
        self.block_size = pool.block_size
        self.num_blocks = pool.kv_pool_blocks
        self.free_queue = FreeBlockQueue(range(self.num_blocks))
        self.ref_count = [0] * self.num_blocks
        # Partly filled tails shared by forks -> their owners. (No per-block fill or target: a block
        # reused in LRU order is cold in memory, and each such list cost a cache miss per block.)
        self._tail_sharers: dict[int, list[SequenceState]] = {}
        self._live_blocks = 0
        self._logical_blocks = 0  # Σ block-table lengths: what the live sequences would hold unshared
        self._shared_blocks = 0  # blocks two or more live sequences hold
        self._filled_sum = 0  # Σ filled over live blocks
        self._target_sum = 0  # Σ target over live blocks
        self.sequences: dict[int, SequenceState] = {}
        # Set once a fork shares a partly filled tail (prefix caching): until then no write can need
        # a copy-on-write, and the per-sequence check of the tail's references is skipped.
        self._tails_shared = False
        self._prompt_keys_deferred = False  # (defer_prompt_keys: prefix caching only)

    # ---------------------------------------------------------------------------------------- queries
    def block_table(self, seq_id: int) -> list[int]:
        return list(self._get(seq_id).block_table)

    def available_slots(self) -> int:
        return len(self.free_queue) * self.block_size

    def can_admit(self, prompt: TokenContent, final_len: int, namespace: int = 0) -> bool:
        return self._prompt_fits(prompt, namespace, None)

    def can_admit_capped(
        self, prompt: TokenContent, final_len: int, namespace: int, max_cached_tokens: int
    ) -> bool:
        return self._prompt_fits(prompt, namespace, max_cached_tokens)

    def _prompt_fits(self, prompt: TokenContent, namespace: int, max_cached_tokens: int | None) -> bool:
        free = len(self.free_queue)
        prompt_len = content_length(prompt)
        if ceil_div(prompt_len, self.block_size) <= free:
            return True  # a prefix hit never needs more blocks than the prompt fills: no lookup needed
        return (
            self._blocks_needed_to_admit(
                prompt, namespace, self._max_hit_blocks(prompt_len, max_cached_tokens)
            )[0]
            <= free
        )

    def _max_hit_blocks(self, prompt_len: int, max_cached_tokens: int | None) -> int:
        """Cached blocks an admission may reuse: never the prompt's last token (it must be computed to
        produce logits), and within ``max_cached_tokens`` when a KV coordinator caps the hit."""
        max_hit_blocks = (prompt_len - 1) // self.block_size
        if max_cached_tokens is not None and max_cached_tokens // self.block_size < max_hit_blocks:
            return max(0, max_cached_tokens // self.block_size)
        return max_hit_blocks

    def slots_needed_to_grow(self, seq_id: int, num_tokens: int) -> int:
        return self._blocks_needed_to_grow(self._get(seq_id), num_tokens) * self.block_size

    def growth_room(self, seq_id: int) -> int:
        return self._room(self._get(seq_id))

    def _room(self, seq: SequenceState) -> int:
        if seq.num_tokens % self.block_size and self.ref_count[seq.block_table[-1]] > 1:
            return 0  # the next write copies the shared tail first
        held = len(seq.block_table) * self.block_size
        return (held if held < seq.final_len else seq.final_len) - self.lookahead_slots - seq.num_tokens

    def breakdown_values(self) -> tuple[int, int, int, int, int, int]:
        block_size = self.block_size
        cached_blocks = self._cached_blocks()
        return (
            self._filled_sum,
            self._target_sum - self._filled_sum,
            self._live_blocks * block_size - self._target_sum,
            # Slots past the last whole block can never hold a block: they are split-off memory.
            self.pool.kv_pool_tokens - self.num_blocks * block_size,
            cached_blocks * block_size,
            (self.num_blocks - self._live_blocks - cached_blocks) * block_size,
        )

    def _cached_blocks(self) -> int:
        return 0

    def sharing_slots(self) -> tuple[int, int]:
        return self._live_blocks * self.block_size, self._logical_blocks * self.block_size

    def shared_slots(self) -> int:
        return self._shared_blocks * self.block_size

    def may_share(self) -> bool:
        return self._SHARES_BLOCKS

    # ------------------------------------------------------------------------------------- operations
    def admit(
        self, seq_id: int, prompt: TokenContent, final_len: int, output_content_id: int, namespace: int = 0
    ) -> int:
        return self._admit(seq_id, prompt, final_len, output_content_id, namespace, None)

    def admit_capped(
        self,
        seq_id: int,
        prompt: TokenContent,
        final_len: int,
        output_content_id: int,
        namespace: int,
        max_cached_tokens: int,
    ) -> int:
        return self._admit(seq_id, prompt, final_len, output_content_id, namespace, max_cached_tokens)

    def _admit(
        self,
        seq_id: int,
        prompt: TokenContent,
        final_len: int,
        output_content_id: int,
        namespace: int,
        max_cached_tokens: int | None,
    ) -> int:
        prompt_len = self._check_new_sequence(seq_id, prompt, final_len)
        max_hit_blocks = self._max_hit_blocks(prompt_len, max_cached_tokens)
        # Registered only once its blocks are allocated (a failed admission changes nothing); its
        # content is laid out first, and the prefix lookup walks that layout.
        seq = SequenceState(seq_id, 0, final_len, output_content_id, namespace=namespace)
        self._lay_out_prompt(seq, prompt)
        blocks_needed, hit_blocks = self._blocks_needed_by(seq, prompt_len, max_hit_blocks)
        host_hits = self._host_hits(prompt, prompt_len, hit_blocks, namespace, max_hit_blocks)
        if blocks_needed > len(self.free_queue):  # (the hit is described only for the error)
            self._ensure_free_blocks(
                blocks_needed, "admitting sequence", seq_id, self._prefix_hit(hit_blocks, len(host_hits))
            )
        self._share_blocks(hit_blocks)
        seq.block_table = hit_blocks
        self._logical_blocks += len(hit_blocks)
        cached_tokens = len(hit_blocks) * self.block_size
        seq.num_tokens = cached_tokens
        seq.keyed_blocks = len(hit_blocks)  # every block a hit reuses holds its key
        self.sequences[seq_id] = seq
        self._record_prefix_query(prompt_len, cached_tokens)
        # Host hits are loaded into fresh blocks, taken as if computed (they get their keys as they fill).
        loaded_tokens = self._load_from_host(host_hits)
        if self._prompt_keys_deferred and cached_tokens + loaded_tokens < prompt_len:
            seq.publish_limit = cached_tokens + loaded_tokens  # the rest as its chunks are scheduled
        self._extend(seq, prompt_len - cached_tokens)
        return cached_tokens + loaded_tokens

    def grow(self, seq_id: int, num_tokens: int, content: TokenContent | None = None) -> None:
        self._grow(self._get(seq_id), num_tokens, content)

    def grow_each(self, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> list[int]:
        # The engine's hottest path (once per block a decoding sequence fills): checked once for
        # all, then grown without looking anything up twice; the hooks only sharing policies need
        # are skipped for plain paging. (Methods are called on self, not through local aliases, and
        # zip() is not strict: compiled, both are several times faster; the lengths are checked.)
        try:
            sequences = [self.sequences[seq_id] for seq_id in seq_ids]
        except KeyError:
            sequences = [self._get(seq_id) for seq_id in seq_ids]  # names the unknown id
        self._check_grow_each_of(seq_ids, sequences, num_tokens)
        rooms = []
        if self._tails_shared:
            # A fork shared a partly filled tail: a write may copy it first, and leaves it no room.
            for seq, tokens in zip(sequences, num_tokens):  # noqa: B905 (lengths checked)
                self._copy_shared_tail_before_write(seq)
                self._append_content(seq, tokens, None)
                self._extend(seq, tokens, self.lookahead_slots)
                rooms.append(self._room(seq))
            return rooms
        block_size = self.block_size
        shares = self._SHARES_BLOCKS
        lookahead = self.lookahead_slots
        for seq, tokens in zip(sequences, num_tokens):  # noqa: B905 (lengths checked)
            if shares:
                self._append_content(seq, tokens, None)
            self._extend(seq, tokens, lookahead)
            held = len(seq.block_table) * block_size
            rooms.append((held if held < seq.final_len else seq.final_len) - lookahead - seq.num_tokens)
        return rooms

    def _check_grow_each_of(
        self, seq_ids: Sequence[int], sequences: list[SequenceState], num_tokens: Sequence[int]
    ) -> None:
        count = len(sequences)
        if count != len(num_tokens) or (count > 1 and len(set(seq_ids)) != count):
            raise grow_each_arguments_error(seq_ids, num_tokens)
        total = 0
        for seq, tokens in zip(sequences, num_tokens):  # noqa: B905 (lengths checked above)
            if tokens <= 0 or seq.num_tokens + tokens > seq.final_len:
                self._check_growth(seq.seq_id, tokens, seq.num_tokens, seq.final_len)
            total += tokens
        free = len(self.free_queue)
        # A sequence growing by t tokens takes at most t // block_size + 1 new blocks, plus one copy
        # of a shared tail: when the pool holds that many, the exact count is not needed.
        if total // self.block_size + 2 * count <= free:
            return
        blocks = 0
        for seq, tokens in zip(sequences, num_tokens):  # noqa: B905 (lengths checked above)
            blocks += self._blocks_needed_to_grow(seq, tokens)
        if blocks > free:
            self._ensure_free_blocks(blocks, "growing sequences", sequences[0].seq_id if count == 1 else None)

    def _grow(self, seq: SequenceState, num_tokens: int, content: TokenContent | None) -> None:
        self._check_growth(seq.seq_id, num_tokens, seq.num_tokens, seq.final_len)
        if content is not None and content_length(content) != num_tokens:
            raise PolicyInputError(
                f"sequence {seq.seq_id}: content holds a different number of tokens than {num_tokens}"
            )
        self._ensure_free_blocks(self._blocks_needed_to_grow(seq, num_tokens), "growing sequence", seq.seq_id)
        self._copy_shared_tail_before_write(seq)
        self._append_content(seq, num_tokens, content)
        self._extend(seq, num_tokens, self.lookahead_slots)

    def fork(self, parent_id: int, children: Sequence[ChildSpec]) -> None:
        parent = self._get(parent_id)
        self._check_children(parent_id, parent.num_tokens, children)
        self._ensure_free_blocks(
            self._blocks_needed_to_fork(parent, len(children)), "forking sequence", parent_id
        )
        parent.fold_output()
        for child in children:
            state = SequenceState(
                child.seq_id,
                parent.num_tokens,
                child.final_len,
                child.output_content_id,
                segments=list(parent.segments),
                segment_ends=list(parent.segment_ends),
                keyed_blocks=parent.keyed_blocks,
                namespace=parent.namespace,
            )
            self.sequences[child.seq_id] = state
            self._give_child_blocks(parent, state)

    def free(self, seq_id: int, finished: bool = True) -> None:
        # ``finished`` plays no part: vLLM keeps a preempted request's full blocks cached too.
        seq = self._get(seq_id)
        if self.lookahead_slots:
            self._drop_lookahead_blocks(seq)
        table = seq.block_table
        full_blocks = table
        if seq.num_tokens % self.block_size:  # its tail is partly filled
            self._drop_reference(seq, table[-1])
            full_blocks = table[:-1]
        # Reverse order: with prefix caching the tail (longest prefix, least reusable) is evicted first.
        ref_count = self.ref_count
        if self._SHARES_BLOCKS:
            released_count = 0
            for block_id in full_blocks:
                references = ref_count[block_id] - 1
                ref_count[block_id] = references
                if not references:
                    released_count += 1
                elif references == 1:
                    self._shared_blocks -= 1
            # Usually the sequence held every block alone: the list is then one slice. (Compiled,
            # appending block ids one by one would box each of them anew.)
            kept = len(full_blocks) - released_count
            if not kept:
                released = full_blocks[::-1]
            elif _none_held(ref_count, full_blocks, kept):
                # Others still hold its first blocks (a shared prompt prefix, the usual case): the
                # rest is a slice as well.
                released = full_blocks[kept:]
                released.reverse()
            else:
                released = [block_id for block_id in reversed(full_blocks) if not ref_count[block_id]]
        else:
            # Plain paging: the sequence alone holds each of its blocks.
            released = full_blocks[::-1]
            for block_id in released:
                ref_count[block_id] = 0
        if released:
            slots = len(released) * self.block_size
            self._live_blocks -= len(released)
            self._filled_sum -= slots
            self._target_sum -= slots
            if seq.publish_limit < seq.num_tokens:
                released = self._release_unpublished(seq, released)
            self._release_full_blocks(released)
        self._logical_blocks -= len(table)
        del self.sequences[seq_id]

    def _drop_lookahead_blocks(self, seq: SequenceState) -> None:
        """Blocks held past the sequence's last token for drafts hold nothing to keep: freed first,
        to the head of the queue, so that what remains is laid out as without speculation."""
        table = seq.block_table
        keep = -(-seq.num_tokens // self.block_size)
        while len(table) > keep:
            block_id = table.pop()
            self.ref_count[block_id] = 0
            self._live_blocks -= 1
            self._logical_blocks -= 1
            self._target_sum -= self._owner_target(seq, len(table))
            self._release_tail(block_id)

    def _prefix_hit(self, hit_blocks: list[int], host_blocks: int = 0) -> PrefixHit:
        if not hit_blocks and not host_blocks:
            return NO_HIT
        block_size = self.block_size
        return PrefixHit(len(hit_blocks) * block_size, tuple(hit_blocks), host_blocks * block_size)

    # ------------------------------------------------------------------- hooks the prefix policy overrides
    def _blocks_needed_to_admit(
        self, prompt: TokenContent, namespace: int, max_hit_blocks: int
    ) -> tuple[int, list[int]]:
        """Free-queue blocks an admission consumes, and the cached blocks (at most ``max_hit_blocks``)
        it would reuse."""
        return ceil_div(content_length(prompt), self.block_size), []

    def _blocks_needed_by(
        self, seq: SequenceState, prompt_len: int, max_hit_blocks: int
    ) -> tuple[int, list[int]]:
        """:meth:`_blocks_needed_to_admit` for a sequence being admitted, its prompt laid out
        (:meth:`_lay_out_prompt`), reusing at most ``max_hit_blocks`` cached blocks; the list of
        cached blocks becomes its block table."""
        return ceil_div(prompt_len, self.block_size), []

    def _host_hits(
        self,
        prompt: TokenContent,
        prompt_len: int,
        hit_blocks: list[int],
        namespace: int,
        max_hit_blocks: int,
    ) -> list[tuple]:
        """The host-tier blocks that continue the GPU hit (their keys) up to ``max_hit_blocks`` blocks
        in all; plain paging has no tier."""
        return []

    def _load_from_host(self, host_hits: list[tuple]) -> int:
        """Load ``host_hits`` back (counted, touched); returns their tokens."""
        return 0

    def _blocks_needed_to_grow(self, seq: SequenceState, num_tokens: int) -> int:
        return ceil_div(seq.num_tokens + num_tokens + self.lookahead_slots, self.block_size) - len(
            seq.block_table
        )

    def _blocks_needed_to_fork(self, parent: SequenceState, num_children: int) -> int:
        return len(parent.block_table) * num_children

    def _give_child_blocks(self, parent: SequenceState, child: SequenceState) -> None:
        # Without sharing, a child is a physical copy of its parent.
        self.stats.fork_copied_tokens += parent.num_tokens
        child.num_tokens = 0
        self._extend(child, parent.num_tokens)

    def _share_block(self, block_id: int) -> None:
        raise AssertionError("plain paging never shares blocks")

    def _share_blocks(self, block_ids: list[int]) -> None:
        """:meth:`_share_block` of each block (a prefix hit's); plain paging never has one."""
        for block_id in block_ids:
            self._share_block(block_id)

    def _copy_shared_tail_before_write(self, seq: SequenceState) -> None:
        """Plain paging owns every block alone: nothing to copy."""

    def _remember_content(self, seq: SequenceState, content: TokenContent) -> None:
        """Plain paging does not need token content."""

    def _lay_out_prompt(self, seq: SequenceState, prompt: TokenContent) -> None:
        """A new sequence's content is its (validated) prompt; plain paging does not need it."""

    def _append_content(self, seq: SequenceState, num_tokens: int, content: TokenContent | None) -> None:
        """Plain paging does not need token content."""

    def _on_blocks_filled(self, seq: SequenceState) -> None:
        """Called after a sequence's tokens grew; the prefix policy caches newly full blocks."""

    def _record_prefix_query(self, prompt_len: int, cached_tokens: int) -> None:
        """Plain paging has no prefix cache to query."""

    def _take_free_blocks(self, count: int) -> list[int]:
        return self.free_queue.take(count)

    def _release_full_blocks(self, block_ids: list[int]) -> None:
        """Full blocks nobody holds any more (a sequence's, last block first) go back to the queue:
        here to its head in turn, reused first (vLLM puts hash-less freed blocks at the head too)."""
        self.free_queue.extendleft(block_ids)

    def _release_unpublished(self, seq: SequenceState, released: list[int]) -> list[int]:
        """``seq`` was freed before its whole prompt was scheduled (``defer_prompt_keys``): its
        blocks past what was scheduled go back blank; returns the rest of ``released``. Plain paging
        keys nothing: all of them."""
        return released

    def _release_tail(self, block_id: int) -> None:
        """A partly filled tail nobody holds any more: it holds nothing reusable, to the head."""
        self.free_queue.appendleft(block_id)

    # ------------------------------------------------------------------------------ block accounting
    def _ensure_free_blocks(
        self, blocks_needed: int, action: str, seq_id: int | None = None, prefix_hit: PrefixHit = NO_HIT
    ) -> None:
        if blocks_needed > len(self.free_queue):
            self.stats.allocation_failures += 1
            # The message is only formatted on failure: this check runs on every block.
            subject = action if seq_id is None else f"{action} {seq_id}"
            raise OutOfKVMemory(
                f"{subject} needs {blocks_needed} free blocks, {len(self.free_queue)} available",
                needed_slots=blocks_needed * self.block_size,
                free_slots=len(self.free_queue) * self.block_size,
                prefix_hit=prefix_hit,
            )

    def _extend(self, seq: SequenceState, num_tokens: int, lookahead: int = 0) -> None:
        """Append ``num_tokens`` token states, taking blocks as they are needed (for ``lookahead``
        slots beyond them too: speculative decoding's). A partly filled tail is the sequence's own
        here (a shared one was copied first), so every new token adds one filled slot, and only new
        blocks change the targets: full ones hold block_size, a new tail what its owner will fill."""
        block_size = self.block_size
        table = seq.block_table
        before = seq.num_tokens
        after = before + num_tokens
        seq.num_tokens = after
        self._filled_sum += num_tokens
        held = len(table) * block_size
        wanted = after + lookahead
        if wanted > held:
            count = -(-wanted // block_size) - len(table)
            new_blocks = self._take_free_blocks(count)
            ref_count = self.ref_count
            for block_id in new_blocks:
                ref_count[block_id] = 1
            table += new_blocks
            self._live_blocks += count
            self._logical_blocks += count
            held += count * block_size
            # Full new blocks will hold block_size each; the last one up to the final length.
            # (Conditional expressions, not min(): this runs for every block a sequence takes.)
            final_len = seq.final_len
            self._target_sum += (final_len if final_len < held else held) - held + count * block_size
        if self._SHARES_BLOCKS:
            self._on_blocks_filled(seq)

    def _owner_target(self, seq: SequenceState, block_index: int) -> int:
        return min(self.block_size, max(0, seq.final_len - block_index * self.block_size))

    def _tail_fill(self, seq: SequenceState) -> int:
        """Tokens in ``seq``'s partly filled tail (its last block)."""
        return seq.num_tokens - (len(seq.block_table) - 1) * self.block_size

    def _tail_target(self, owners: list[SequenceState], block_index: int) -> int:
        """What a partly filled tail at ``block_index`` will hold: the most any owner will fill."""
        return max(self._owner_target(owner, block_index) for owner in owners)

    def _share_tail(self, seq: SequenceState, sharer: SequenceState) -> None:
        """``sharer`` (a fork of ``seq``) shares ``seq``'s partly filled tail, which holds the same
        tokens for both: only the tail's target can grow."""
        tail, index = seq.block_table[-1], len(seq.block_table) - 1
        owners = self._tail_sharers.setdefault(tail, [seq])
        before = self._tail_target(owners, index)
        owners.append(sharer)
        self._target_sum += self._tail_target(owners, index) - before

    def _add_own_tail(self, seq: SequenceState) -> None:
        """``seq``'s partly filled tail is a fresh copy of its own (copy-on-write): it counts."""
        self._filled_sum += self._tail_fill(seq)
        self._target_sum += self._owner_target(seq, len(seq.block_table) - 1)

    def _drop_reference(self, seq: SequenceState, block_id: int) -> None:
        """``seq`` stops referencing its partly filled tail ``block_id``; the block is freed when
        nobody else does."""
        index = len(seq.block_table) - 1
        self.ref_count[block_id] -= 1
        if self.ref_count[block_id] == 1:
            self._shared_blocks -= 1
        if self.ref_count[block_id] > 0:
            owners = self._tail_sharers[block_id]
            before = self._tail_target(owners, index)
            owners.remove(seq)
            self._target_sum += self._tail_target(owners, index) - before
            if len(owners) == 1:
                del self._tail_sharers[block_id]  # its one owner again: derived from that one
            return
        assert block_id not in self._tail_sharers, "only a tail still owned by several is listed"
        self._live_blocks -= 1
        self._filled_sum -= self._tail_fill(seq)
        self._target_sum -= self._owner_target(seq, index)
        self._release_tail(block_id)


register("paged", PagedPolicy)
