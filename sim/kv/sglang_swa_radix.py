"""``policy: sglang-hybrid`` with ``engine.enable_prefix_caching: true``: SGLang's ``SWARadixCache`` over
its two token pools (full attention, sliding window), as SGLang's scheduler runs it.

Read at sgl-project/sglang commit 019cfc0f9617007e17cbb0bcff2545ce3e0aea45
(``mem_cache/swa_radix_cache.py``: ``cache_unfinished_req``, ``cache_finished_req``, ``evict``,
``inc_lock_ref`` / ``dec_lock_ref``; the tree itself is :mod:`policies._swa_radix_tree`) and 0057abea
(``mem_cache/common.py``: ``evict_from_tree_cache``, ``free_swa_out_of_window_slots``), with the
budget of ``managers/schedule_policy.py`` (``PrefillAdder``: the free plus evictable tokens of the
scarcer pool) as kvsim's SGLang scheduler reads it through :meth:`SWARadixCoordinator.available_slots`.
No code is copied.

A sequence's tokens are the tree path it locks (its first ``tree_len`` tokens, whole pages) and its
own tokens after them, in whole pages of both pools (``SWATokenToKVPoolAllocator``: every token a
slot in each). What happens when, in kvsim's terms (a prompt is allocated at admission):

- **Admission**: the prompt (less its last token, in whole pages) is matched
  (:meth:`~policies._swa_radix_tree.SWARadixTree.match_prefix`: the window rule, a split, the path
  refreshed, whether or not the request then fits, as the ``radix`` policy matches); the matched node
  is locked; each pool evicts its shortfall for the new tokens (``evict_from_tree_cache``: full
  eviction first, then SWA) and they take slots in both. With the engine driving
  (:meth:`SWARadixCoordinator.defer_prompt_keys`), the prompt's whole pages then enter the tree as its
  chunks are scheduled (``cache_unfinished_req``, which SGLang runs after each prefill chunk: tokens
  the tree held already are freed, tombstones past the hit take the prompt's SWA slots back) and the
  request locks the end of what entered; called directly, the whole prompt enters at admission.
  With the prompt in the tree, SGLang's out-of-window SWA freeing frees none of it
  (``free_swa_out_of_window_slots`` never frees below ``cache_protected_len``): the tree's lock keeps
  the prompt's last window, the rest is SWA-evictable (tombstoned under pressure).
- **Decoding**: new tokens take a slot in each pool (evicting the shortfall); every ``W`` decode
  steps (``maybe_evict_swa``: steps ``i`` with ``i % W == 1``) the sequence frees its own SWA slots
  before ``pre_len - max(W, page)``, floored to a page (the radix cache's threshold). Before each
  decode step each pool evicts for a page per decoding request (``alloc_token_slots`` /
  ``alloc_paged_token_slots_decode``, as the ``radix`` policy does). With pages of one token and the
  engine skipping events, decode growth is deferred unbacked (:meth:`SWARadixCoordinator.defer_unbacked`,
  ``sim/engine/unbacked.py``): a decoded token takes a free slot of each pool, evicting at the step
  SGLang would, and a sequence is told of its tokens at its decode evictions and when it leaves.
- **Finishing** (``cache_finished_req``): its whole pages are inserted, those whose SWA slots it
  freed as a tombstone; its partial last page is freed; its lock is released. A preempted or
  retracted request frees its own slots and inserts nothing (``release_kv_cache(is_insert=False)``).
- **Forks** (``n > 1``, beams; SGLang has no beam search, and shares an ``n > 1`` prompt through the
  tree): the parent's whole pages are inserted and every child locks their end, each copying the
  parent's partly filled page in both pools. A parent that has freed own SWA slots (decoding past a
  window) is not inserted (its lock would reach the tombstone its insertion makes): each child copies
  its own tokens. A fork refused for memory leaves the parent's pages inserted (SGLang inserts them
  at each prefill chunk anyway).

Accounting, per pool (each sums to its pool at every instant, :meth:`group_breakdown_values`):
**used** = the tree's slots a lock holds + the sequences' own tokens; **reserved** / **internal
fragmentation** = the empty slots of a sequence's last page it will / will never fill; **external
fragmentation** = slots past the pool's last whole page; **cached** = the tree's evictable slots;
**free** = the rest. A tombstone's SWA slots are free. Statistics: queries and hits per successful
admission, in tokens; ``evictions`` counts the pages evicted in both pools.

The scheduler's budget is checked with the hit locked (:meth:`SWARadixCoordinator.available_slots_with_hit_locked`,
``add_one_req``'s ``_lock_node``). Left out: the early release of a decoding request's SWA lock
(``dec_swa_lock_only``, which SGLang runs only with ``SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW``
set: off by default in ``environ.py``), HiCache, and the overlap scheduler's one-token lag.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from policies._radix_tree import Key
from policies._swa_radix_tree import NO_UUID, SWANode, SWARadixTree
from policies.base import (
    ALL_PUBLISHED,
    NO_HIT,
    ChildSpec,
    OutOfKVMemory,
    PolicyInputError,
    PolicyStats,
    PoolSpec,
    PrefixHit,
)
from policies.hybrid.group import NEVER
from policies.hybrid.sglang_sliding_window import last_decode_eviction, next_decode_eviction
from sim.kv.coordinator import Breakdown, KVGroup
from sim.kv.pool_view import PoolView
from sim.kv.sglang_tree import (
    OwnSlots,
    SGLangTreeCoordinator,
    check_growth,
    check_growth_lists,
    content_key,
    prompt_key,
    sequence_segments,
)
from token_content import Segment, TokenContent, content_length

__all__ = ["SWARadixCoordinator", "SWASequence"]


@dataclass(eq=False, slots=True, init=False)
class SWASequence:
    """A sequence: ``base`` (its prompt, or its parent's tokens at a fork) then its own output stream.
    Its first ``tree_len`` tokens are the tree path ending at ``last_node`` (locked); it holds its own
    SWA slots from ``swa_start`` on, its own full slots from ``tree_len`` on, in whole pages. (Its
    constructor is written out: compiled, it runs natively, where a dataclass's generated one stays
    interpreted; one is built per admission and fork.)"""

    seq_id: int
    final_len: int
    output_content_id: int
    namespace: int
    base: tuple[Segment, ...]
    base_len: int
    prompt_len: int  # where decoding began: SWA's decode evictions count steps from here
    last_node: SWANode
    swa_uuid: int
    swa_locked: int  # SWA tokens its lock covers (its window of the tree path)
    tree_len: int
    num_tokens: int
    swa_start: int
    # Tokens of its content scheduled so far: its prompt enters the tree only that far
    # (``SWARadixCoordinator.defer_prompt_keys``).
    scheduled: int

    def __init__(
        self,
        seq_id: int,
        final_len: int,
        output_content_id: int,
        namespace: int,
        base: tuple[Segment, ...],
        base_len: int,
        prompt_len: int,
        last_node: SWANode,
        swa_uuid: int,
        swa_locked: int,
        tree_len: int = 0,
        num_tokens: int = 0,
        swa_start: int = 0,
        scheduled: int = ALL_PUBLISHED,
    ) -> None:
        self.seq_id = seq_id
        self.final_len = final_len
        self.output_content_id = output_content_id
        self.namespace = namespace
        self.base = base
        self.base_len = base_len
        self.prompt_len = prompt_len
        self.last_node = last_node
        self.swa_uuid = swa_uuid
        self.swa_locked = swa_locked
        self.tree_len = tree_len
        self.num_tokens = num_tokens
        self.swa_start = swa_start
        self.scheduled = scheduled

    def key(self, num_tokens: int) -> Key:
        """Its first ``num_tokens`` tokens as a tree key."""
        return content_key(sequence_segments(self), num_tokens)


class SWARadixCoordinator(SGLangTreeCoordinator[SWARadixTree]):
    """See the module docstring. ``full_tokens`` / ``swa_tokens``: the pools (``SGLangHybridCapacity``);
    ``names``: the two groups' names, full attention first; ``max_model_len``: the longest sequence."""

    def __init__(
        self,
        full_tokens: int,
        swa_tokens: int,
        page_size: int,
        window: int,
        max_model_len: int,
        slot_bytes: int,
        names: tuple[str, str],
    ):
        if min(full_tokens, swa_tokens) < page_size:
            raise PolicyInputError(
                f"each pool needs a page of {page_size} tokens: {full_tokens}, {swa_tokens}"
            )
        self.page_size = page_size
        self.window = window
        self.max_model_len = max_model_len
        self.tree = SWARadixTree(page_size, window)
        self.pool_tokens = (full_tokens, swa_tokens)
        self.page_slots = [full_tokens // page_size * page_size, swa_tokens // page_size * page_size]
        self.pool_slots = full_tokens + swa_tokens
        self.context_tokens = full_tokens  # (the full-attention pool holds every token)
        self.slots_per_token = 2
        self.sequences: dict[int, SWASequence] = {}
        # (By pool index, in lists: compiled, indexing a tuple attribute by a variable boxes the whole
        # tuple first, and the free slots are read at every query and growth.)
        self._own = [OwnSlots(), OwnSlots()]
        self._tree_held = 0  # tree tokens the sequences hold, counted once per sequence
        self._swa_held = 0  # SWA tokens the sequences' locks cover, counted once per sequence
        self._stats = PolicyStats()
        self.groups = tuple(
            KVGroup(
                name,
                PoolView(PoolSpec(tokens, page_size, max_model_len, slot_bytes), self._part(index)),
                slot_bytes,
            )
            for index, (name, tokens) in enumerate(zip(names, self.pool_tokens, strict=True))
        )

    # -- pools ------------------------------------------------------------------------------------
    def _free(self, index: int) -> int:
        """A pool's free slots, less those the pending tokens of unbacked growth took."""
        pending = self._pending_tokens
        return self._free_of(index, 0 if pending is None else pending())

    def _free_of(self, index: int, unbacked: int) -> int:
        """A pool's free slots, less ``unbacked`` pending tokens (read once by a caller of both)."""
        tree = self.tree.full_tokens if index == 0 else self.tree.swa_tokens
        return self.page_slots[index] - tree - self._own[index].slots - unbacked

    def _rooms(self) -> tuple[int, int]:
        """Free plus evictable slots of each pool (``full_available_size() + full_evictable_size()``,
        and SWA's)."""
        pending = self._pending_tokens
        unbacked = 0 if pending is None else pending()
        return (
            self._free_of(0, unbacked) + self.tree.full_evictable,
            self._free_of(1, unbacked) + self.tree.swa_evictable,
        )

    def _make_free(self, full_needed: int, swa_needed: int) -> None:
        """``evict_from_tree_cache``: evict each pool's shortfall (full eviction first, then SWA)."""
        pending = self._pending_tokens
        unbacked = 0 if pending is None else pending()
        full_short = max(0, full_needed - self._free_of(0, unbacked))
        swa_short = max(0, swa_needed - self._free_of(1, unbacked))
        if full_short or swa_short:
            full_freed, swa_freed = self.tree.evict(full_short, swa_short)
            self._stats.evictions += (full_freed + swa_freed) // self.page_size

    def _refuse(
        self, what: str, needs: tuple[int, int], rooms: tuple[int, int], hit: int = 0
    ) -> OutOfKVMemory:
        self._stats.allocation_failures += 1
        pool = "full" if needs[0] > rooms[0] else "SWA"
        index = 0 if pool == "full" else 1
        return OutOfKVMemory(
            f"{what} needs {needs[index]} slots of the {pool} pool, {rooms[index]} available (free + evictable)",
            needed_slots=needs[index],
            free_slots=rooms[index],
            prefix_hit=PrefixHit(hit) if hit else NO_HIT,
        )

    # -- a sequence's own slots -------------------------------------------------------------------
    def _swa_start(self, seq: SWASequence, num_tokens: int) -> int:
        """The first token whose SWA slot the sequence itself holds at ``num_tokens`` tokens: past its
        tree path and its last decode eviction's ``pre_len - max(W, page)``, floored to a page."""
        last = last_decode_eviction(num_tokens - seq.prompt_len - 1, self.window)
        frontier = 0
        if last:
            threshold = seq.prompt_len + last - max(self.window, self.page_size)
            frontier = max(0, threshold) // self.page_size * self.page_size
        return max(frontier, seq.tree_len, seq.swa_start)

    def _account(self, seq: SWASequence, sign: int) -> None:
        """Add (+1) or remove (-1) the sequence's own slots from each pool's sums."""
        end = self._pages(seq.num_tokens)
        filled = min(end, seq.final_len)
        # (Each pool written out, not zip(strict=True): compiled, that is a call with keywords, and this
        # runs twice at every growth of every sequence.)
        full, swa = self._own
        full.add(sign, seq.num_tokens, seq.tree_len, end, filled)
        swa.add(sign, seq.num_tokens, seq.swa_start, end, filled)
        self._tree_held += sign * seq.tree_len
        self._swa_held += sign * seq.swa_locked

    def _planned_growth(
        self, seq_ids: Sequence[int], num_tokens: Sequence[int]
    ) -> tuple[int, int, list[SWASequence], list[int]]:
        """The growths' new slots in each pool (SWA: net of the decode evictions that run first), the
        sequences, checked, and where each then holds its own SWA slots from."""
        check_growth_lists(seq_ids, num_tokens)
        sequences, swa_starts = [], []
        full = swa = 0
        # (Typed sequences, read by index: compiled, the shared generator's are untyped attribute
        # reads, and this runs at every growth.)
        for index in range(len(seq_ids)):
            seq = self._get(seq_ids[index])
            held, tokens = seq.num_tokens, num_tokens[index]
            check_growth(seq.seq_id, held, tokens, seq.final_len)
            grown = held + tokens
            swa_start = self._swa_start(seq, grown)
            held_pages, grown_pages = self._pages(held), self._pages(grown)
            full += grown_pages - held_pages
            swa += (grown_pages - swa_start) - (held_pages - seq.swa_start)
            sequences.append(seq)
            swa_starts.append(swa_start)
        return full, swa, sequences, swa_starts

    # -- the tree ---------------------------------------------------------------------------------
    def _lock(self, seq: SWASequence, node: SWANode) -> None:
        seq.last_node = node
        seq.swa_uuid, seq.swa_locked = self.tree.lock(node)

    def _insertable(self, seq: SWASequence) -> int:
        """Its tokens that may enter the tree: its whole pages, as far as they were scheduled."""
        tokens = seq.num_tokens if seq.num_tokens < seq.scheduled else seq.scheduled
        return tokens // self.page_size * self.page_size

    def _insert(self, seq: SWASequence, swa_evicted: int) -> SWANode:
        """Its whole pages into the tree (``insert``): returns the node ending them."""
        return self.tree.insert(seq.key(self._insertable(seq)), seq.namespace, seq.tree_len, swa_evicted)

    def _cache_unfinished(self, seq: SWASequence) -> None:
        """``cache_unfinished_req``: insert its whole pages, then lock their end in place of its path."""
        self._account(seq, -1)
        node = self._insert(seq, seq.swa_start)
        self.tree.unlock(seq.last_node, seq.swa_uuid)
        self._lock(seq, node)
        seq.tree_len = self._insertable(seq)
        seq.swa_start = max(seq.swa_start, seq.tree_len)
        self._account(seq, +1)

    # -- sequences --------------------------------------------------------------------------------
    def can_admit(self, prompt: TokenContent, final_len: int) -> bool:
        self._take_unbacked()
        prompt_len = content_length(prompt)
        match = self.tree.longest_match(prompt_key(prompt, prompt_len, self.page_size), 0)
        needed = self._pages(prompt_len - match.length)
        full_room, swa_room = self._rooms()
        return needed <= full_room - match.full_unlocked and needed <= swa_room - match.swa_unlocked

    def admit(
        self, seq_id: int, prompt: TokenContent, final_len: int, output_content_id: int, namespace: int = 0
    ) -> int:
        prompt_len = self._check_new(seq_id, prompt, final_len)
        self._take_unbacked()
        node, hit = self.tree.match_prefix(prompt_key(prompt, prompt_len, self.page_size), namespace)
        needed = self._pages(prompt_len - hit)
        full_unlocked, swa_unlocked = self.tree.unlocked_by_lock(node)
        full_room, swa_room = self._rooms()
        rooms = (full_room - full_unlocked, swa_room - swa_unlocked)
        if needed > rooms[0] or needed > rooms[1]:
            raise self._refuse(f"admitting sequence {seq_id}", (needed, needed), rooms, hit)
        seq = SWASequence(
            seq_id, final_len, output_content_id, namespace, tuple(prompt), prompt_len, prompt_len, node,
            NO_UUID, 0, tree_len=hit, num_tokens=prompt_len, swa_start=hit,
        )  # fmt: skip
        self._lock(seq, node)
        # (alloc_paged_token_slots_extend over-asks a page per request when pages are larger than 1)
        spare = self.page_size if self.page_size > 1 else 0
        self._make_free(needed + spare, needed + spare)
        self.sequences[seq_id] = seq
        self._account(seq, +1)
        if self._inserts_deferred:
            seq.scheduled = hit  # the rest as its chunks are scheduled (prompt_scheduled)
        else:
            self._cache_unfinished(seq)  # the prompt's prefill is done
        self._stats.prefix_cache_queries += prompt_len
        self._stats.prefix_cache_hits += hit
        return hit

    def grow_each(self, seq_ids: list[int], num_tokens: list[int]) -> list[int]:
        """Every sequence or none: both pools are checked for the growths together (SWA: net of the
        decode evictions that run first, ``maybe_evict_swa``), then each pool evicts its shortfall."""
        self._take_unbacked()
        full, swa, sequences, swa_starts = self._planned_growth(seq_ids, num_tokens)
        full_room, swa_room = self._rooms()
        if full > full_room or swa > swa_room:
            raise self._refuse(f"growing sequences {list(seq_ids)}", (full, swa), (full_room, swa_room))
        # (SWA's shortfall after the decode evictions free their slots is the net need's.)
        self._make_free(full, swa)
        rooms = []
        for index in range(len(sequences)):
            seq = sequences[index]
            self._account(seq, -1)
            seq.swa_start = swa_starts[index]
            seq.num_tokens += num_tokens[index]
            self._account(seq, +1)
            rooms.append(self._growth_room(seq))
        return rooms

    def fits_growth_each(self, seq_ids: list[int], num_tokens: list[int]) -> bool:
        self._take_unbacked()
        full, swa, _, _ = self._planned_growth(seq_ids, num_tokens)
        full_room, swa_room = self._rooms()
        return full <= full_room and swa <= swa_room

    def fork(self, parent_id: int, children: Sequence[ChildSpec]) -> None:
        parent = self._fork_parent(parent_id, children)
        self._take_unbacked()
        parent.scheduled = ALL_PUBLISHED  # (a fork follows its parent's prefill)
        if parent.swa_start == parent.tree_len:
            # (It holds every own token's SWA slot, so its pages enter the tree whole and its lock's
            # window stays clear of tombstones; otherwise the children copy its own tokens.)
            self._cache_unfinished(parent)
        end = self._pages(parent.num_tokens)
        needs = ((end - parent.tree_len) * len(children), (end - parent.swa_start) * len(children))
        rooms = self._rooms()
        if needs[0] > rooms[0] or needs[1] > rooms[1]:
            raise self._refuse(f"forking sequence {parent_id}", needs, rooms)
        self._make_free(*needs)
        for child in children:
            seq = SWASequence(
                child.seq_id, child.final_len, child.output_content_id, parent.namespace,
                sequence_segments(parent), parent.num_tokens,
                parent.prompt_len, parent.last_node, NO_UUID, 0,
                tree_len=parent.tree_len, num_tokens=parent.num_tokens, swa_start=parent.swa_start,
            )  # fmt: skip
            self._lock(seq, parent.last_node)
            self.sequences[child.seq_id] = seq
            self._account(seq, +1)
            self._stats.fork_copied_tokens += parent.num_tokens - parent.tree_len

    def free(self, seq_id: int, finished: bool = True) -> None:
        """``cache_finished_req`` for a finished sequence (its whole pages inserted, those whose SWA
        slots it freed as a tombstone); a preempted one only frees its own slots."""
        seq = self._get(seq_id)
        self._take_unbacked()
        self._account(seq, -1)
        if finished:
            seq.scheduled = ALL_PUBLISHED  # (every token was computed)
            self._insert(seq, seq.swa_start)
        self.tree.unlock(seq.last_node, seq.swa_uuid)
        del self.sequences[seq_id]

    def _cache_chunk(self, seq: SWASequence, start: int, end: int) -> None:
        """The prompt's whole pages scheduled so far enter the tree; its SWA slots outside the window
        its lock covers move from used to cached."""
        if self._insertable(seq) > seq.tree_len:
            self._cache_unfinished(seq)

    def growth_room(self, seq_id: int) -> int:
        """Tokens before its next new page (with unbacked growth: its end), or its next decode eviction
        (an event: the slots it frees are free from then on)."""
        return self._growth_room(self._get(seq_id))

    def _growth_room(self, seq: SWASequence) -> int:
        if self._pending_tokens is None:
            room = min(self._pages(seq.num_tokens), seq.final_len) - seq.num_tokens
        else:
            room = seq.final_len - seq.num_tokens
        step = next_decode_eviction(seq.num_tokens - seq.prompt_len - 1, self.window)
        if step != NEVER:
            room = min(room, max(0, seq.prompt_len + step - seq.num_tokens))
        return room

    def available_slots(self) -> int:
        """The scarcer pool's free plus evictable slots (``PrefillAdder``'s ``rem_total_tokens`` and
        ``rem_swa_tokens``): a token needs a slot in each."""
        full_room, swa_room = self._rooms()
        return min(full_room, swa_room)

    def available_slots_with_hit_locked(self, prompt: TokenContent) -> int:
        """The same once the matched node is locked (``add_one_req``): in each pool, less the hit's
        tokens there that no sequence locks."""
        self._take_unbacked()
        prompt_len = content_length(prompt)
        match = self.tree.longest_match(prompt_key(prompt, prompt_len, self.page_size), 0)
        full_room, swa_room = self._rooms()
        return min(full_room - match.full_unlocked, swa_room - match.swa_unlocked)

    def prepare_decode_step(self, num_sequences: int) -> None:
        """A page per decoding request free in each pool before a decode step (the ``radix`` policy's
        rule). With unbacked growth the step's tokens are pending already: they evict what they need."""
        if self._pending_tokens is not None:
            self._take_unbacked()
            return
        needed = num_sequences * self.page_size
        self._make_free(needed, needed)

    # -- unbacked decode growth (sim/engine/unbacked.py) ------------------------------------------
    def can_defer_unbacked(self) -> bool:
        """Pages of one token leave no sequence room past its next token (larger pages give room
        already), so its decode growth may go unbacked: a pending token takes a free slot of each
        pool, evicting as SGLang's decode allocation would (:meth:`defer_unbacked`)."""
        return self.page_size == 1 and not self.lookahead_slots

    def defer_unbacked(self, pending_tokens: Callable[[], int] | None) -> None:
        """From now on (``None``: no longer) the pending tokens take free slots of both pools.

        SGLang evicts before each decode step what the step's tokens need beyond the free slots,
        each pool's shortfall in one ``evict_from_tree_cache`` call (full first, then SWA). Unlike
        the ``radix`` policy's single LRU order, two shortfalls evicted together need not free what
        the same tokens evicted step by step free (a full eviction may free the SWA slots a step's
        SWA eviction would have taken elsewhere). So the engine asks for each step's evictions at
        that step (:meth:`evict_for_unbacked`, ``UnbackedGrowth.evict_inside``, and
        :meth:`prepare_decode_step` at a wake-up), and every query and operation first takes what
        the pending tokens need (they are those of steps already evicted for): the same calls with
        the same shortfalls as growth told token by token. A sequence's decode evictions stay events
        of its own (:meth:`growth_room`)."""
        if pending_tokens is not None and not self.can_defer_unbacked():
            raise PolicyInputError(
                f"pages of {self.page_size} tokens cannot defer decode growth past held slots"
            )
        self._take_unbacked()
        self._pending_tokens = pending_tokens

    def evict_for_unbacked(self, ahead_tokens: int) -> int:
        if self._pending_tokens is None:
            raise PolicyInputError("decode growth is not deferred: nothing to evict for")
        self._take_unbacked(ahead_tokens)
        return min(self._free(0), self._free(1))

    def unbacked_draws(self) -> tuple[int, ...]:
        return (1, 1)  # (a pending token takes a free slot of each pool)

    def _take_unbacked(self, ahead_tokens: int = 0) -> None:
        if self._pending_tokens is not None:
            self._make_free(ahead_tokens, ahead_tokens)

    # -- accounting -------------------------------------------------------------------------------
    def pool_breakdown(self, index: int) -> Breakdown:
        """Pool ``index``'s breakdown (0: full attention, 1: SWA); sums to the pool. Unbacked tokens
        are counted as reserved (where the engine moves decoded tokens it has not told the pool of to
        used) and taken from the free slots."""
        self._take_unbacked()
        tree, own = self.tree, self._own[index]
        pending = self._pending_tokens
        unbacked = 0 if pending is None else pending()
        if index == 0:
            pool, tokens, locked = self.pool_tokens[0], tree.full_tokens, tree.full_locked
        else:
            pool, tokens, locked = self.pool_tokens[1], tree.swa_tokens, tree.swa_locked
        return (
            locked + own.tokens,
            own.target - own.tokens + unbacked,
            own.slots - own.target,
            pool - self.page_slots[index],
            tokens - locked,
            self._free_of(index, unbacked),
        )

    def sharing_slots(self) -> tuple[int, int]:
        own = self._own[0].slots + self._own[1].slots
        pending = self._pending_tokens
        if pending is not None:
            own += 2 * pending()  # (an unbacked token holds a slot of each pool)
        return self.tree.full_locked + self.tree.swa_locked + own, self._tree_held + self._swa_held + own
