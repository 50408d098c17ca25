"""SGLang's RadixAttention cache: one pool of token slots shared by running requests and a radix
tree of cached token content (``python/sglang/srt/mem_cache/radix_cache.py``; the tree itself is
:mod:`policies._radix_tree`).

How a request's KV lives here, and which SGLang code each rule follows:

- **Admission** matches the prompt in the tree (``match_prefix``, splitting a node where the match
  ends inside it and refreshing the matched path's access time) and locks the matched node
  (``inc_lock_ref``). The match covers at most ``len - 1`` tokens, floored to whole pages
  (``Req._compute_max_prefix_len`` / ``adjust_max_prefix_ids`` in ``managers/schedule_batch.py``):
  the last prompt token is computed for its logits. The rest of the prompt takes fresh slots. SGLang
  matches a waiting request when it schedules it, before its budget decides (``get_new_batch_prefill``
  calls ``Req.init_next_round_input``; ``lpm`` matches the whole queue to order it), so the split and
  the refreshed path stay when the request is refused: a failed :meth:`admit` keeps them, and
  :meth:`match` is that match alone. :meth:`lookup` (routers) changes nothing.
- **Allocation** takes free slots; when too few are free it first evicts the shortfall from the
  tree (``mem_cache/common.py:evict_from_tree_cache``: ``evict(num_tokens - available)``),
  least recently used unlocked leaves first. With ``page_size`` > 1 a sequence's own tokens take
  whole pages, so its last page can be partly empty, and the allocator over-asks by a page per
  request: an admission evicts for its new tokens plus a page (``alloc_paged_token_slots_extend``),
  and every decode step for a page per decoding request, whether or not their next tokens fit the
  pages they hold (``alloc_paged_token_slots_decode``; :meth:`prepare_decode_step`).
- **Insertion.** SGLang inserts a request's prompt into the tree when its prefill (or each chunk of
  it) is done (``cache_unfinished_req``, called by the scheduler after a prefill batch and for a
  chunked request), and its prompt plus output when it finishes (``cache_finished_req``). Only whole
  pages enter the tree; tokens already in the tree are deduplicated: the request's own copies are
  freed and it adopts the tree's (SGLang does, vLLM does not). An insertion walks the whole path, so
  it refreshes the access time of every node on it even when nothing is new. kvsim allocates a
  prompt at admission; with the engine driving (:meth:`RadixPolicy.defer_prompt_keys`) its whole
  pages enter the tree as the engine reports its chunks (:meth:`RadixPolicy.prompt_scheduled`): under
  SGLang's scheduler once the chunk's batch has run, as SGLang inserts it (a request admitted in the
  same round computes its own copy and dedups it on insertion); under vLLM's as it is scheduled
  (``sim/engine/chunk_reports.py``). Called directly, without the engine, a prompt is inserted whole
  at admission.
  A sequence freed ``finished`` is inserted; one freed otherwise (preempted, retracted, aborted) is
  not: its own slots are freed (``release_kv_cache(..., is_insert=False)``, as ``retract_decode``
  releases a request), and only what of its prompt was scheduled stays cached.
- **Decoding** appends the sequence's own tokens; they enter the tree when it finishes.
- **Forks** (``n > 1``, beams): the parent's whole pages are inserted into the tree and every child
  locks the same node, so all share the prompt (and any generated prefix) at token granularity with
  no copy-on-write. A partly filled last page (``page_size`` > 1) is copied into each child. (SGLang
  shares an ``n > 1`` prompt through the tree too: the tokenizer manager sends the prompt first; it
  has no beam search in the runtime.)
- **Statistics**: one prefix-cache query per successful admission (prompt tokens) and its matched
  tokens as hits, as the ``prefix`` policy counts them; ``evictions`` counts evicted pages (tokens
  when ``page_size`` is 1).

- **HiCache** (``offload:``, :meth:`RadixPolicy.enable_host_tier`): SGLang's hierarchical cache
  (``--enable-hierarchical-cache``; ``mem_cache/hiradix_cache.py`` ``HiRadixCache``). Tree nodes are
  backed up to a host pool of ``offload.host_memory_gib`` (``--hicache-size``) per
  ``offload.write_policy`` (``--hicache-write-policy``, default ``write_through``); see
  :mod:`policies._radix_tree` for the tree's rules. The host pool must be larger than the device pool
  (``memory_pool_host.py`` asserts it). Admission's match continues into host-only nodes; when they
  hold at least ``load_back_threshold`` (10) tokens they are loaded back (``init_load_back`` /
  ``load_back``): they take device slots (evicting as needed) before the rest of the prompt, and
  count as host hits (``host_cache_hits``; ``prefix_cache_hits`` stays the device hit). Fewer are
  recomputed. ``lookup`` reports them as ``PrefixHit.host_tokens``. Writes cost no time (a side
  stream); loads are charged by the engine over the host link.

SGLang's scheduler (``PrefillAdder``'s ``new_token_ratio`` budget, ``lpm`` ordering,
``retract_decode``) is the engine's ``scheduler: sglang`` (``sim/engine/schedulers/sglang.py``), not
this policy's.

Breakdown (slots, sums to the pool): **used** = tokens in locked tree nodes (each once, however many
sequences hold them) + every sequence's own tokens; **reserved** / **internal fragmentation** = the
empty slots of a sequence's last own page that it will / will never fill; **cached** = unlocked tree
nodes (evictable); **external fragmentation** = pool slots past the last whole page; **free** = the
rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from policies._radix_tree import HiCachePool, Key, PrefixMatch, RadixNode, RadixTree
from policies.base import (
    ALL_PUBLISHED,
    NO_HIT,
    ChildSpec,
    PolicyInputError,
    PoolSpec,
    PrefixHit,
    SequenceTable,
    grow_each_arguments_error,
    register,
    scheduled_mark,
    unknown_sequence,
)
from policies.prefix import block_pieces
from token_content import Segment, TokenContent, content_length, validate_content


def page_size_option(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PolicyInputError(
            f"radix: page_size must be a positive integer (tokens per page), got {value!r}"
        )
    return value


# HiRadixCache.load_back_threshold: a shorter host hit is recomputed rather than loaded.
LOAD_BACK_THRESHOLD: Final = 10


@dataclass(slots=True, eq=False, init=False)
class RadixSequence:
    """A sequence's first ``tree_len`` tokens are the tree path ending at ``last_node`` (locked);
    the rest are its own, in whole pages. (Its constructor is written out: compiled, it runs
    natively, once per sequence.)"""

    seq_id: int
    final_len: int
    output_content_id: int
    namespace: int
    last_node: RadixNode
    tree_len: int
    num_tokens: int
    segments: list[Segment]
    segment_ends: list[int]
    # Tokens of its content scheduled so far: the prompt enters the tree only that far
    # (``RadixPolicy.defer_prompt_keys``).
    scheduled: int

    def __init__(
        self,
        seq_id: int,
        final_len: int,
        output_content_id: int,
        namespace: int,
        last_node: RadixNode,
        tree_len: int = 0,
        num_tokens: int = 0,
        segments: list[Segment] | None = None,
        segment_ends: list[int] | None = None,
        scheduled: int = ALL_PUBLISHED,
    ) -> None:
        self.seq_id = seq_id
        self.final_len = final_len
        self.output_content_id = output_content_id
        self.namespace = namespace
        self.last_node = last_node
        self.tree_len = tree_len
        self.num_tokens = num_tokens
        self.segments = [] if segments is None else segments
        self.segment_ends = [] if segment_ends is None else segment_ends
        self.scheduled = scheduled

    def append(self, segment: Segment) -> None:
        """Extend the content; the sequence's own output stream grows in place."""
        content_id, length = segment
        if length == 0:
            return
        end = (self.segment_ends[-1] if self.segment_ends else 0) + length
        if self.segments and content_id == self.output_content_id == self.segments[-1][0]:
            self.segments[-1] = (content_id, self.segments[-1][1] + length)
            self.segment_ends[-1] = end
        else:
            self.segments.append(segment)
            self.segment_ends.append(end)

    def key(self, num_tokens: int) -> Key:
        """The first ``num_tokens`` tokens as a tree key."""
        return block_pieces(self.segments, self.segment_ends, 0, num_tokens)


class RadixPolicy(SequenceTable[RadixSequence]):
    """SGLang's radix-tree prefix cache; see the module docstring."""

    @classmethod
    def pool_slots_from_memory(cls, memory_slots: int, block_size: int, options: Mapping[str, object]) -> int:
        """Whole pages (SGLang rounds ``max_total_num_tokens`` down to ``page_size``); the engine's
        ``block_size`` plays no part."""
        page_size = page_size_option(options.get("page_size", 1))
        return memory_slots // page_size * page_size

    def __init__(self, pool: PoolSpec, page_size: object = 1):  # object: checked here (see contiguous)
        super().__init__(pool)
        self.page_size = page_size_option(page_size)
        if self.page_size > pool.kv_pool_tokens:
            raise PolicyInputError(
                f"radix: page_size={page_size} exceeds the pool ({pool.kv_pool_tokens} slots)"
            )
        self.tree = RadixTree(self.page_size)
        self.sequences: dict[int, RadixSequence] = {}
        self._page_slots = pool.kv_pool_tokens // self.page_size * self.page_size
        # Sums over live sequences of their own tokens, own slots (whole pages), the slots of those
        # they will fill, and their tree tokens (for the logical side of sharing).
        self._own_tokens = 0
        self._own_slots = 0
        self._own_target = 0
        self._tree_tokens_held = 0
        self._hicache: HiCachePool | None = None
        # Unbacked decode growth (defer_unbacked): what reads the decoded tokens no slot holds yet.
        self._pending_tokens: Callable[[], int] | None = None
        self._inserts_deferred = False  # (defer_prompt_keys)

    # ---------------------------------------------------------------------------------------- queries
    def available_slots(self) -> int:
        return self._free_slots() + self._cached_slots()

    def available_slots_with_hit_locked(self, prompt: TokenContent) -> int:
        """Free plus evictable slots once the matched node is locked (``add_one_req``'s
        ``_lock_node`` before its budget check): the hit's device tokens no sequence locks are not
        evictable then."""
        self._take_unbacked()
        prompt_len = content_length(prompt)
        if prompt_len <= 0:
            return self.available_slots()
        match = self.tree.longest_match(self._prompt_key(prompt, prompt_len), 0)
        return self.available_slots() - match.unlocked_tokens

    def lookup(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        validate_content(prompt, "looked-up prompt", PolicyInputError)
        self._take_unbacked()
        prompt_len = content_length(prompt)
        if prompt_len <= 0:
            return NO_HIT
        match = self.tree.longest_match(self._prompt_key(prompt, prompt_len), namespace)
        host = self._loaded(match.host_tokens)
        return PrefixHit(match.length - match.host_tokens, (), host)

    def match(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        """SGLang's ``match_prefix`` as the scheduler runs it on a waiting request
        (``Req.init_next_round_input``, and ``SchedulePolicy._compute_prefix_matches`` for ``lpm``):
        the node where the match ends inside it is split and the matched path's access time
        refreshed, whether or not the request is then admitted."""
        validate_content(prompt, "matched prompt", PolicyInputError)
        self._take_unbacked()
        prompt_len = content_length(prompt)
        if prompt_len <= 0:
            return NO_HIT
        node, matched = self.tree.match_prefix(self._prompt_key(prompt, prompt_len), namespace)
        if self._hicache is None:
            return PrefixHit(matched)
        _device_node, host = self.tree.device_end(node)
        return PrefixHit(matched - host, (), self._loaded(host))

    def can_admit(self, prompt: TokenContent, final_len: int, namespace: int = 0) -> bool:
        self._take_unbacked()
        prompt_len = content_length(prompt)
        match = self.tree.longest_match(self._prompt_key(prompt, prompt_len), namespace)
        return self._admission_slots(prompt_len, match) <= self.available_slots() - match.unlocked_tokens

    def slots_needed_to_grow(self, seq_id: int, num_tokens: int) -> int:
        seq = self._get(seq_id)
        own = seq.num_tokens - seq.tree_len
        return self._pages(own + num_tokens) - self._pages(own)

    def growth_room(self, seq_id: int) -> int:
        seq = self._get(seq_id)
        if self._pending_tokens is not None:
            return seq.final_len - seq.num_tokens  # every token to its end is deferred
        return min(seq.tree_len + self._pages(seq.num_tokens - seq.tree_len), seq.final_len) - seq.num_tokens

    def breakdown_values(self) -> tuple[int, int, int, int, int, int]:
        # Unbacked tokens are counted as reserved, where the engine looks for decoded tokens it has
        # not told the pool of (it moves them to used), and taken from the free slots.
        self._take_unbacked()
        unbacked = 0 if self._pending_tokens is None else self._pending_tokens()
        return (
            self.tree.locked_tokens + self._own_tokens,
            self._own_target - self._own_tokens + unbacked,
            self._own_slots - self._own_target,
            self.pool.kv_pool_tokens - self._page_slots,
            self._cached_slots(),
            self._free_slots(),
        )

    def sharing_slots(self) -> tuple[int, int]:
        own = self._own_slots if self._pending_tokens is None else self._own_slots + self._pending_tokens()
        return self.tree.locked_tokens + own, self._tree_tokens_held + own

    def shared_slots(self) -> int:
        return self.tree.shared_tokens

    def may_share(self) -> bool:
        return True

    # ------------------------------------------------------------------------------------- operations
    def admit(
        self, seq_id: int, prompt: TokenContent, final_len: int, output_content_id: int, namespace: int = 0
    ) -> int:
        prompt_len = self._check_new_sequence(seq_id, prompt, final_len)
        self._take_unbacked()
        # The scheduler matches the request before it checks the budget: the split and the refreshed
        # path stay whether or not the request fits.
        node, matched = self.tree.match_prefix(self._prompt_key(prompt, prompt_len), namespace)
        device_node, host = node, 0
        if self._hicache is not None:
            device_node, host = self.tree.device_end(node)
            if host < LOAD_BACK_THRESHOLD:  # recomputed: the match ends on the device
                node, matched, host = device_node, matched - host, 0
        needed = self._pages(prompt_len - matched) + host
        # Locking the match takes its unlocked nodes out of the evictable cache.
        self._ensure_available(
            needed,
            self.available_slots() - self.tree.unlocked_tokens_above(device_node),
            f"admitting sequence {seq_id}",
            matched - host,
            host,
        )
        if host:
            # Loaded back first (``init_load_back`` at scheduling): the nodes count as device tokens
            # at once, locked below, and the evictions below make their room too.
            self.tree.load_back(node)
        self.tree.lock(node)
        self._make_free(self._extend_eviction_target(prompt_len - matched))
        seq = RadixSequence(seq_id, final_len, output_content_id, namespace, node, tree_len=matched)
        for segment in prompt:
            seq.append(segment)
        seq.num_tokens = prompt_len
        self.sequences[seq_id] = seq
        self._account(seq, +1)
        if self._inserts_deferred:
            seq.scheduled = matched  # the rest enters the tree as its chunks are scheduled
        else:
            self._insert_into_tree(seq)  # as if its prefill were done (see the module docstring)
        self.stats.prefix_cache_queries += prompt_len
        self.stats.prefix_cache_hits += matched - host
        return matched

    def grow(self, seq_id: int, num_tokens: int, content: TokenContent | None = None) -> None:
        seq = self._get(seq_id)
        self._check_growth(seq_id, num_tokens, seq.num_tokens, seq.final_len)
        segments: TokenContent = ((seq.output_content_id, num_tokens),) if content is None else content
        validate_content(segments, f"content of sequence {seq_id}", PolicyInputError)
        if content_length(segments) != num_tokens:
            raise PolicyInputError(
                f"sequence {seq_id}: content holds a different number of tokens than {num_tokens}"
            )
        needed = self.slots_needed_to_grow(seq_id, num_tokens)
        self._ensure_available(needed, self.available_slots(), f"growing sequence {seq_id}")
        self._make_free(needed)
        self._account(seq, -1)
        for segment in segments:
            seq.append(segment)
        seq.num_tokens += num_tokens
        self._account(seq, +1)

    def grow_each(self, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> list[int]:
        """As the base class's, in one pass when the free slots hold every sequence's new pages.

        With pages of one token the engine calls this at every decode iteration for every running
        sequence (no sequence has room past its next token), so the per-sequence work is written out
        here. Nothing is evicted then, so the order of the grows cannot change the outcome; when
        the tree must give slots back, each grow runs in turn, evicting as SGLang would."""
        if len(seq_ids) != len(num_tokens) or len(set(seq_ids)) != len(seq_ids):
            raise grow_each_arguments_error(seq_ids, num_tokens)
        sequences = self.sequences
        grown: list[RadixSequence] = []
        needed = 0
        for seq_id, tokens in zip(seq_ids, num_tokens):  # noqa: B905 (lengths checked above; compiled, strict=True costs a call with keywords)
            seq = sequences.get(seq_id)
            if seq is None:
                raise unknown_sequence(seq_id)
            self._check_growth(seq_id, tokens, seq.num_tokens, seq.final_len)
            own = seq.num_tokens - seq.tree_len
            needed += self._pages(own + tokens) - self._pages(own)
            grown.append(seq)
        if needed > self._free_slots():
            return super().grow_each(seq_ids, num_tokens)  # evictions: one grow at a time
        rooms = []
        target_change = 0
        assert len(grown) == len(num_tokens)
        for seq, tokens in zip(grown, num_tokens):  # noqa: B905 (lengths checked above; compiled, strict=True costs a call with keywords)
            # (What _account's -1 then +1 would change, written as the difference.)
            own_limit = seq.final_len - seq.tree_len
            own_slots_before = self._pages(seq.num_tokens - seq.tree_len)
            seq.append((seq.output_content_id, tokens))
            seq.num_tokens += tokens
            own_slots = self._pages(seq.num_tokens - seq.tree_len)
            target_change += min(own_slots, own_limit) - min(own_slots_before, own_limit)
            rooms.append(min(seq.tree_len + own_slots, seq.final_len) - seq.num_tokens)
        self._own_tokens += sum(num_tokens)
        self._own_slots += needed
        self._own_target += target_change
        return rooms

    def fork(self, parent_id: int, children: Sequence[ChildSpec]) -> None:
        parent = self._get(parent_id)
        self._check_children(parent_id, parent.num_tokens, children)
        self._take_unbacked()
        whole_pages = self._page_floor(parent.num_tokens)
        partial_page = parent.num_tokens - whole_pages
        needed = self._pages(partial_page) * len(children)
        if needed:
            # Inserting the parent's whole pages frees its copies of tokens the tree already holds
            # and locks those tree nodes: count both before deciding.
            match = self.tree.longest_match(parent.key(whole_pages), parent.namespace)
            deduplicated = match.length - match.host_tokens - parent.tree_len
            available = self.available_slots() + deduplicated - match.unlocked_tokens
            self._ensure_available(needed, available, f"forking sequence {parent_id}")
        parent.scheduled = ALL_PUBLISHED  # (a fork follows its prefill: it inserts all it holds)
        self._insert_into_tree(parent)
        self._make_free(needed)
        for child in children:
            state = RadixSequence(
                child.seq_id,
                child.final_len,
                child.output_content_id,
                parent.namespace,
                parent.last_node,
                tree_len=parent.tree_len,
                num_tokens=parent.num_tokens,
                segments=list(parent.segments),
                segment_ends=list(parent.segment_ends),
            )
            self.tree.lock(state.last_node)
            self.sequences[child.seq_id] = state
            self._account(state, +1)
            self.stats.fork_copied_tokens += partial_page

    def prepare_decode_step(self, num_sequences: int) -> None:
        """``alloc_paged_token_slots_decode`` (``mem_cache/allocation.py``; ``alloc_token_slots`` with
        pages of 1) makes a page per decoding request free before every decode step, evicting the
        shortfall from the tree, whether or not a request's token still fits in its last page.
        (With unbacked growth the step's tokens are pending already: they evict what they need.)"""
        if self._pending_tokens is None:
            self._make_free(num_sequences * self.page_size)
        else:
            self._take_unbacked()

    def free(self, seq_id: int, finished: bool = True) -> None:
        """A finished sequence's whole pages go into the tree (``cache_finished_req``); a preempted
        or aborted one's own slots are freed and nothing is inserted (``release_kv_cache`` with
        ``is_insert=False``, as ``retract_decode`` and aborts release a request)."""
        seq = self._get(seq_id)
        self._take_unbacked()
        if finished:
            seq.scheduled = ALL_PUBLISHED  # (finished: every token was computed)
            self._insert_into_tree(seq)
        self._account(seq, -1)
        self.tree.unlock(seq.last_node)
        del self.sequences[seq_id]

    def defer_prompt_keys(self) -> bool:
        self._inserts_deferred = True
        return True

    def prompt_scheduled(self, seq_id: int, tokens: int) -> None:
        """The prompt's whole pages enter the tree as far as its chunks are scheduled, each insertion
        refreshing the path (SGLang inserts a chunk once its prefill batch ran,
        ``cache_unfinished_req``; see the module docstring). A sequence preempted mid-prefill leaves
        in the tree only what it had scheduled."""
        seq = self._get(seq_id)
        scheduled = scheduled_mark(seq.scheduled, tokens, seq.num_tokens)
        if scheduled == seq.scheduled:
            return
        self._take_unbacked()
        seq.scheduled = scheduled
        self._insert_into_tree(seq)

    def can_defer_unbacked(self) -> bool:
        """With pages of one token no sequence holds room past its next token (pages of several give
        room already). With HiCache the evictions the pending tokens make move backed-up nodes to the
        host pool, in the same order whenever they are made."""
        return self.page_size == 1

    def defer_unbacked(self, pending_tokens: Callable[[], int] | None) -> None:
        """The pending tokens take free slots, evicting as SGLang would token by token: its decode
        allocation evicts least recently used leaves until the step's tokens are free, so by any
        later instant the evicted nodes are the shortest prefix of the eviction order that frees
        every token decoded by then, whether evicted a step at a time or at once. Nothing else
        touches the tree in between (every query and operation takes the pending tokens first), so
        the evictions are SGLang's."""
        if pending_tokens is not None and not self.can_defer_unbacked():
            super().defer_unbacked(pending_tokens)
        self._take_unbacked()
        self._pending_tokens = pending_tokens

    def evict_for_unbacked(self, ahead_tokens: int) -> int:
        if self._pending_tokens is None:
            super().evict_for_unbacked(ahead_tokens)
        self._take_unbacked(ahead_tokens)
        return self._free_slots()

    def enable_host_tier(self, capacity_blocks: int, write_policy: str | None = None) -> None:
        """SGLang's HiCache (see the module docstring): a host pool of ``capacity_blocks`` engine
        blocks, written per ``write_policy`` (default ``write_through``, SGLang's)."""
        if self._hicache is not None:
            raise PolicyInputError("this policy already has a host tier")
        if self.tree.total_tokens or self.sequences:
            raise PolicyInputError("radix: a host tier must be enabled before anything is cached")
        try:
            pool = HiCachePool(
                capacity_blocks, self.pool.block_size, self.page_size, write_policy or "write_through"
            )
        except ValueError as error:
            raise PolicyInputError(f"radix: {error}") from None
        if pool.capacity_tokens <= self._page_slots:
            raise PolicyInputError(
                f"radix: the host pool ({pool.capacity_tokens} tokens) must be larger than the device "
                f"pool ({self._page_slots} tokens): SGLang's HiCache host pool asserts it "
                "(memory_pool_host.py; --hicache-ratio > 1)"
            )
        self._hicache = pool
        self.host_tier = pool
        self.tree.enable_hicache(pool)

    def pin_prefix(self, prompt: TokenContent) -> int:
        raise PolicyInputError(
            "policy 'radix' cannot pin prefixes: SGLang's radix cache has no pinning (only eviction priorities)"
        )

    # ------------------------------------------------------------------------------------- internals
    def _pages(self, tokens: int) -> int:
        """Slots of the whole pages holding ``tokens`` tokens."""
        return -(-tokens // self.page_size) * self.page_size

    def _page_floor(self, tokens: int) -> int:
        return tokens - tokens % self.page_size

    def _prompt_key(self, prompt: TokenContent, prompt_len: int) -> Key:
        """What admission matches: the prompt without its last token, in whole pages."""
        segments = [segment for segment in prompt if segment[1] > 0]
        ends: list[int] = []
        total = 0
        for _, length in segments:
            total += length
            ends.append(total)
        return block_pieces(segments, ends, 0, self._page_floor(prompt_len - 1))

    def _free_slots(self) -> int:
        free = self._page_slots - self.tree.total_tokens - self._own_slots
        return free if self._pending_tokens is None else free - self._pending_tokens()

    def _take_unbacked(self, ahead_tokens: int = 0) -> None:
        """Unbacked growth: evict what the pending tokens, and ``ahead_tokens`` more, need beyond the
        free slots (the free slots count the pending tokens out)."""
        if self._pending_tokens is not None:
            self._make_free(ahead_tokens)

    def _cached_slots(self) -> int:
        return self.tree.total_tokens - self.tree.locked_tokens

    def _ensure_available(
        self, needed: int, available: int, action: str, hit_tokens: int = 0, host_tokens: int = 0
    ) -> None:
        if needed > available:
            raise self._allocation_failure(
                f"{action} needs {needed} slots, {available} available (free + evictable)",
                needed,
                available,
                PrefixHit(hit_tokens, (), host_tokens) if hit_tokens or host_tokens else NO_HIT,
            )

    def _loaded(self, host_tokens: int) -> int:
        """The host hit admission loads back: none below ``load_back_threshold``."""
        return host_tokens if host_tokens >= LOAD_BACK_THRESHOLD else 0

    def _admission_slots(self, prompt_len: int, match: PrefixMatch) -> int:
        """Device slots admitting a prompt with this match takes: its new tokens in whole pages, plus
        a host hit loaded back (a shorter one is recomputed with the new tokens)."""
        host = match.host_tokens
        if host and host < LOAD_BACK_THRESHOLD:
            return self._pages(prompt_len - match.length + host)
        return self._pages(prompt_len - match.length) + host

    def _extend_eviction_target(self, extend_tokens: int) -> int:
        """Free slots an admission's allocation evicts for: ``alloc_paged_token_slots_extend`` asks
        for one spare page per request beyond its new tokens (``extend_num_tokens + bs * page_size``);
        with pages of 1, ``alloc_token_slots`` asks for the new tokens alone."""
        if self.page_size == 1:
            return extend_tokens
        return extend_tokens + self.page_size

    def _make_free(self, needed: int) -> None:
        """Evict the shortfall from the tree when fewer than ``needed`` slots are free."""
        shortfall = needed - self._free_slots()
        if shortfall > 0:
            self.stats.evictions += self.tree.evict(shortfall) // self.page_size

    def _insert_into_tree(self, seq: RadixSequence) -> None:
        """Put the sequence's whole pages into the tree (SGLang's ``cache_unfinished_req`` /
        ``cache_finished_req``): new tokens become tree nodes, tokens the tree already holds are
        deduplicated (the sequence's copies are freed), and the sequence locks the new path end.
        The insertion walks the whole path even when nothing is new (``_insert_helper``), so the
        path's access time is refreshed."""
        tokens = seq.num_tokens if seq.num_tokens < seq.scheduled else seq.scheduled
        whole_pages = self._page_floor(tokens)
        self._account(seq, -1)
        # (Its first tree_len tokens are the path to its locked node: only the rest is matched.)
        rest = block_pieces(seq.segments, seq.segment_ends, seq.tree_len, whole_pages)
        node = self.tree.extend(seq.last_node, rest, seq.namespace)
        if node is not seq.last_node:
            self.tree.lock(node)
            self.tree.unlock(seq.last_node)
        seq.last_node, seq.tree_len = node, whole_pages
        self._account(seq, +1)

    def _account(self, seq: RadixSequence, sign: int) -> None:
        """Add (+1) or remove (-1) the sequence's own tokens and slots from the running sums."""
        own_tokens = seq.num_tokens - seq.tree_len
        own_slots = self._pages(own_tokens)
        self._own_tokens += sign * own_tokens
        self._own_slots += sign * own_slots
        self._own_target += sign * min(own_slots, seq.final_len - seq.tree_len)
        self._tree_tokens_held += sign * seq.tree_len


register("radix", RadixPolicy)
