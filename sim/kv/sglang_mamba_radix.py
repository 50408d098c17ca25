"""``policy: sglang-hybrid`` on a model with Mamba / linear-attention layers (Qwen3-Next, Nemotron-H):
SGLang's full-attention token pool and Mamba state pool (``HybridLinearKVPool``, ``MambaPool``;
sized in ``sim/hardware/sglang_mamba_capacity.py``), and with ``engine.enable_prefix_caching: true``
its ``MambaRadixCache`` over both, as SGLang's scheduler runs them.

Read at sgl-project/sglang commit 00df707e8de4ab0110fb5527bf3c9dffc535671a
(``mem_cache/mamba_radix_cache.py``: ``cache_unfinished_req``, ``cache_finished_req``,
``_alloc_mamba_slot``, ``_match_post_processor``'s copy of the hit's state; the tree itself is
:mod:`policies._mamba_radix_tree`), with ``alloc_req_slots`` (``mem_cache/common.py``: a request's
Mamba slot, ``evict_mamba`` for the shortfall first) and ``_get_mamba_token_info`` (the scheduler's
counts: free plus evictable per pool) from SGLang main in the public code index; its
``no_buffer`` strategy here, the extra buffers below (which strategy runs:
``sim/hardware/sglang_mamba_capacity.py``, step 5). No code is copied.

Every running request holds one Mamba slot of its own (``HybridReqToTokenPool.alloc``: the state its
Mamba layers update in place) and its tokens in the full pool, in pages of ``page_size`` tokens. What
happens when, in kvsim's terms (a prompt is allocated at admission):

- **Without the radix cache** (``--disable-radix-cache``, SGLang's ``ChunkCache``): admission needs
  the prompt's pages in the full pool and a free Mamba slot; both go back when the request ends.
- **Admission** with it: the prompt less its last token is matched
  (:meth:`~policies._mamba_radix_tree.MambaRadixTree.match_prefix`: the hit ends at the deepest node
  with a state; splits and refreshes the tree whether or not the request then fits); the matched
  node is locked; the request takes a Mamba slot (a copy of the hit's state; ``evict_mamba`` for the
  shortfall) and the prompt's new tokens full slots (full eviction for the shortfall). Then, as
  ``cache_unfinished_req`` runs after each prefill chunk, the prompt's tokens so far enter the tree
  with a copy of the request's state in a new Mamba slot (``_alloc_mamba_slot``: ``evict_mamba`` if
  none is free; freed again if that node had a state), and the request locks that node in place of
  the last. Under the engine the chunks are the ones it schedules, each inserted when the engine
  reports it (:meth:`MambaRadixCoordinator.prompt_scheduled`, after its batch ran:
  ``sim/engine/chunk_reports.py``), so a request preempted mid-prefill leaves only its computed
  chunks in the tree; used alone, the coordinator inserts them at admission, one chunk every
  ``prefill_tokens`` past the hit and the prompt's end. Either way a request needs two Mamba slots
  free or evictable to be admitted (three with two such chunks or more, less the hit's state when
  only its lock held it), and locks the state at its prompt's end while it decodes. (SGLang asserts
  that an insertion finds a slot, which its cap on running requests below ensures; should none be
  free nor evictable at a reported chunk, kvsim caches no state there.)
- **Decoding**: each token takes a full slot (evicting the shortfall); before a decode step the full
  pool evicts for a page per decoding request (as the ``radix`` policy does). The Mamba slot is
  updated in place: decoding never takes one.
- **Finishing** (``cache_finished_req``): all its tokens enter the tree with its own Mamba slot as the
  state at their end (freed if that node had one); its lock is released. A preempted or retracted
  request frees its own slots and inserts nothing (``is_insert=False``).
- **Forks** (``n > 1``): the parent's tokens enter the tree first (a state copy); each child takes a
  Mamba slot (a copy of the parent's state) and copies the parent's own tokens past its tree path.

Refusals: an admission without room in either pool raises ``OutOfKVMemory`` naming the pool (SGLang's
scheduler never gets there: it caps the running requests at a third of the Mamba pool, ``init_memory``;
kvsim's runner caps ``max_num_seqs`` the same way). Decoding never needs a Mamba slot, so only the
full pool retracts.

Accounting, per pool (each sums to its pool at every instant, :meth:`group_breakdown_values`): full
pool as the SWA radix cache's (**used** the tree's tokens a lock holds and the sequences' own,
**reserved** / **internal fragmentation** the empty slots of a last page a sequence will / will
never fill, **external** past the last whole page, **cached** the tree's evictable tokens);
Mamba pool: **used** the running requests' own slots and the tree's states a lock holds, **cached**
the tree's other states, **free** the rest. ``evictions`` counts full pages and states evicted.

The extra-buffer strategy (option ``mamba_scheduler_strategy: extra_buffer``, :class:`MambaTracking`;
read at sgl-project/sglang 64bca5315f59ae6b7e57cf4d8a13180f0e7e518f: ``HybridReqToTokenPool.alloc``,
``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend`` and ``prepare_for_decode``,
``MambaRadixCache.cache_unfinished_req`` / ``cache_finished_req``): a running request holds
tracking buffers besides its state (two with SGLang's overlap scheduler: 3 Mamba slots; one without
it, or with ``extra_buffer_lazy``), into which the kernels write the states the tree
will keep, and pages may hold more than one token. In a prefill chunk of at least ``cache_chunk``
tokens the state at its last multiple of ``cache_chunk`` past the chunk's start is tracked (or, when
the prompt left a cached path past its deepest state, at that branching point rounded down to
``cache_chunk``, if it falls inside the chunk on the grid), and ``cache_unfinished_req`` inserts the
prompt up to it (a chunk that tracked nothing inserts nothing); while decoding, the state at every
multiple of ``interval`` is tracked, and ``cache_finished_req`` inserts the sequence up to the last
one (its committed KV: its tokens less the last sampled one), freeing its KV past it rather than
caching it; a sequence that tracked nothing while decoding inserts nothing. So short prompts and
outputs leave less in the tree, and a prompt that shares a branch of a cached path gets a state where
it leaves it. A fork tracks no state (the children lock the parent's path; SGLang has no rule for
forks here). Admission needs the request's 3 slots, one more for its first insertion and one for a
second while the first is still locked.

Left out: the Mamba slot SGLang takes when it matches a waiting request (kvsim takes it at
admission), the admission check's chunk count (kvsim counts chunks of ``prefill_tokens`` past the
hit, not those the batch budget will cut), HiCache, speculative decoding's states.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies._mamba_radix_tree import MambaNode, MambaRadixTree
from policies._radix_tree import Key
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
from sim.hardware.sglang_mamba_capacity import SGLangMambaCapacity
from sim.kv.coordinator import Breakdown, KVGroup
from sim.kv.pool_view import PoolView
from sim.kv.sglang_tree import OwnSlots, SGLangTreeCoordinator, content_key, prompt_key, sequence_segments
from token_content import Segment, TokenContent, content_length

__all__ = ["NO_TRACKING", "MambaRadixCoordinator", "MambaSequence", "MambaTracking"]

FULL, MAMBA = 0, 1
_POOL_NAMES = ("full-attention pool", "Mamba pool")


@dataclass(frozen=True)
class MambaTracking:
    """The extra-buffer strategies' tracking (``buffers`` 0: ``no_buffer``): each
    running request holds ``buffers`` slots more, into which the states at multiples of
    ``cache_chunk`` in a prefill chunk and of ``interval`` while decoding are written; only those
    states enter the tree (module docstring)."""

    buffers: int = 0
    cache_chunk: int = 0
    interval: int = 0

    @staticmethod
    def of(capacity: SGLangMambaCapacity) -> MambaTracking:
        if not capacity.track_buffers:
            return NO_TRACKING
        return MambaTracking(capacity.track_buffers, capacity.cache_chunk, capacity.track_interval)


NO_TRACKING = MambaTracking()


@dataclass(eq=False, slots=True, init=False)
class MambaSequence:
    """A sequence: ``base`` (its prompt, or its parent's tokens at a fork) then its own output stream.
    Its first ``tree_len`` tokens are the tree path ending at ``last_node`` (locked, with the state
    there); it holds its own full slots from ``tree_len`` on, in whole pages, and one Mamba slot.
    (Its constructor is written out: compiled, it runs natively, where a dataclass's generated one
    stays interpreted; one is built per admission and fork.)"""

    seq_id: int
    final_len: int
    output_content_id: int
    namespace: int
    base: tuple[Segment, ...]
    base_len: int
    last_node: MambaNode
    tree_len: int
    num_tokens: int
    # Tokens of its prompt scheduled so far (``prompt_scheduled``): each report is a prefill chunk's
    # end, where ``cache_unfinished_req`` runs; ALL_PUBLISHED once its prompt was all computed.
    scheduled: int
    branching: int  # (extra buffer: where its prompt left a cached path, in whole cache chunks)

    def __init__(
        self,
        seq_id: int,
        final_len: int,
        output_content_id: int,
        namespace: int,
        base: tuple[Segment, ...],
        base_len: int,
        last_node: MambaNode,
        tree_len: int = 0,
        num_tokens: int = 0,
        scheduled: int = ALL_PUBLISHED,
        branching: int = 0,
    ) -> None:
        self.seq_id = seq_id
        self.final_len = final_len
        self.output_content_id = output_content_id
        self.namespace = namespace
        self.base = base
        self.base_len = base_len
        self.last_node = last_node
        self.tree_len = tree_len
        self.num_tokens = num_tokens
        self.scheduled = scheduled
        self.branching = branching

    def key(self, num_tokens: int) -> Key:
        """Its first ``num_tokens`` tokens as a tree key."""
        return content_key(sequence_segments(self), num_tokens)


class MambaRadixCoordinator(SGLangTreeCoordinator[MambaRadixTree]):
    """See the module docstring. ``full_tokens`` / ``mamba_slots``: the pools
    (``SGLangMambaCapacity``); ``prefill_tokens``: a prefill chunk (where ``cache_unfinished_req``
    caches states); ``slot_bytes``: one full-pool token's and one Mamba slot's bytes; ``names``: the
    two groups' names, full attention first; ``radix``: the radix cache (off: ``ChunkCache``)."""

    def __init__(
        self,
        full_tokens: int,
        mamba_slots: int,
        page_size: int,
        max_model_len: int,
        prefill_tokens: int,
        slot_bytes: tuple[int, int],
        names: tuple[str, str],
        radix: bool = True,
        tracking: MambaTracking = NO_TRACKING,
    ):
        if full_tokens < page_size or mamba_slots < 1 or prefill_tokens < 1:
            raise PolicyInputError(
                f"the full pool needs a page of {page_size} tokens ({full_tokens}), the Mamba pool a slot "
                f"({mamba_slots}), a prefill chunk a token ({prefill_tokens})"
            )
        if radix and page_size != 1 and not tracking.buffers:
            raise PolicyInputError(f"SGLang's Mamba radix cache runs pages of one token, got {page_size}")
        # (A prefill chunk shorter than the longest prompt must be whole pages, as SGLang asserts.)
        whole_chunks = prefill_tokens % page_size == 0 or prefill_tokens >= max_model_len
        if tracking.buffers and (
            not radix or tracking.cache_chunk % page_size or tracking.interval % page_size or not whole_chunks
        ):
            raise PolicyInputError(
                f"the extra-buffer strategy tracks whole pages of {page_size} tokens with the radix cache, "
                f"got cache chunk {tracking.cache_chunk}, interval {tracking.interval}, prefill chunk "
                f"{prefill_tokens}, radix cache {radix}"
            )
        self.tracking = tracking
        self.own_states = 1 + tracking.buffers  # a running request's Mamba slots
        self.page_size = page_size
        self.max_model_len = max_model_len
        self.prefill_tokens = prefill_tokens
        self.radix = radix
        self.tree = MambaRadixTree(page_size)
        self.pool_tokens = (full_tokens, mamba_slots)
        self.page_slots = [full_tokens // page_size * page_size, mamba_slots]
        self.pool_slots = full_tokens + mamba_slots
        self.context_tokens = full_tokens  # (the full-attention pool holds every token)
        self.slots_per_token = 1
        self.sequences: dict[int, MambaSequence] = {}
        self._own = OwnSlots()
        self._tree_held = 0  # tree tokens the sequences hold, counted once per sequence
        self._states_held = 0  # tree states the sequences' locks hold, counted once per sequence
        self._stats = PolicyStats()
        specs = (
            PoolSpec(full_tokens, page_size, max_model_len, slot_bytes[FULL]),
            PoolSpec(mamba_slots, 1, max_model_len, slot_bytes[MAMBA]),
        )
        self.groups = tuple(
            KVGroup(name, PoolView(spec, self._part(index)), spec.kv_bytes_per_token)
            for index, (name, spec) in enumerate(zip(names, specs, strict=True))
        )

    # -- pools ------------------------------------------------------------------------------------
    def _free(self, index: int) -> int:
        if index == FULL:
            return self.page_slots[FULL] - self.tree.full_tokens - self._own.slots
        return self.page_slots[MAMBA] - self.tree.states - len(self.sequences) * self.own_states

    def _room(self, index: int) -> int:
        """Free plus evictable slots of a pool (``_get_mamba_token_info``: available + evictable)."""
        evictable = self.tree.full_evictable if index == FULL else self.tree.states_evictable
        return self._free(index) + evictable

    def _make_free(self, index: int, needed: int) -> None:
        """Evict the pool's shortfall for ``needed`` slots (``evict_full`` / ``evict_mamba``)."""
        short = needed - self._free(index)
        if short > 0:
            full_freed, states_freed = (
                self.tree.evict(short, 0) if index == FULL else self.tree.evict(0, short)
            )
            self._stats.evictions += full_freed // self.page_size + states_freed

    def _refuse(
        self, what: str, needs: tuple[int, int], rooms: tuple[int, int], hit: int = 0
    ) -> OutOfKVMemory:
        self._stats.allocation_failures += 1
        index = FULL if needs[FULL] > rooms[FULL] else MAMBA
        unit = "slots" if index == FULL else "Mamba slots"
        return OutOfKVMemory(
            f"{what} needs {needs[index]} {unit} of the {_POOL_NAMES[index]}, {rooms[index]} available "
            "(free + evictable)",
            needed_slots=needs[index],
            free_slots=rooms[index],
            prefix_hit=PrefixHit(hit) if hit else NO_HIT,
        )

    # -- a sequence's own slots -------------------------------------------------------------------
    def _account(self, seq: MambaSequence, sign: int) -> None:
        """Add (+1) or remove (-1) the sequence's own full slots and what its lock holds."""
        end = self._pages(seq.num_tokens)
        own = self._own
        own.tokens += sign * (seq.num_tokens - seq.tree_len)
        own.slots += sign * (end - seq.tree_len)
        own.target += sign * (min(end, seq.final_len) - seq.tree_len)
        self._tree_held += sign * seq.tree_len
        self._states_held += sign * (seq.last_node is not self.tree.root)

    def _lock(self, seq: MambaSequence, node: MambaNode) -> None:
        seq.last_node = node
        self.tree.lock(node)

    def _cache_unfinished(self, seq: MambaSequence, upto: int) -> None:
        """``cache_unfinished_req``: its first ``upto`` tokens into the tree with a copy of its state in
        a new Mamba slot (freed again if that node had one), then their end locked in place of its path."""
        self._account(seq, -1)
        self._make_free(MAMBA, 1)  # _alloc_mamba_slot
        key = seq.key(upto)
        self.tree.insert(key, seq.namespace)
        node, length = self.tree.match_prefix(key, seq.namespace)
        assert length == upto, "a cached prefix ends at its state"
        self.tree.unlock(seq.last_node)
        self._lock(seq, node)
        seq.tree_len = upto
        self._account(seq, +1)

    def _chunk_ends(self, hit: int, prompt_len: int) -> list[int]:
        """Where ``cache_unfinished_req`` runs for a prompt prefilled from ``hit``: after each chunk."""
        return [*range(hit + self.prefill_tokens, prompt_len, self.prefill_tokens), prompt_len]

    def _cache_points(self, hit: int, prompt_len: int, branching: int) -> list[int]:
        """The lengths whose state a prefill in chunks of ``prefill_tokens`` from the hit puts into the
        tree (:meth:`_cache_point` of each chunk)."""
        points, start = [], hit
        for end in self._chunk_ends(hit, prompt_len):
            point = self._cache_point(start, end, branching)
            if point:
                points.append(point)
            start = end
        return points

    def _cache_point(self, start: int, end: int, branching: int) -> int:
        """The length whose state the prefill chunk of tokens ``[start, end)`` puts into the tree (0:
        none): its end; with the extra buffer, in a chunk of at least ``cache_chunk`` tokens its last
        multiple of it past the chunk's start, or the branching point
        (``_mamba_radix_cache_v2_req_prepare_for_extend``)."""
        chunk = self.tracking.cache_chunk
        if not chunk:
            return end
        if start < branching < end and (branching - start) % chunk == 0:
            return branching
        if end - start >= chunk:
            return start + (end - start) // chunk * chunk
        return 0

    def _branching(self, kv_length: int, hit: int) -> int:
        """Where a prompt leaves a cached path past its deepest state, in whole cache chunks (0: none)."""
        chunk = self.tracking.cache_chunk
        return kv_length // chunk * chunk if chunk and kv_length > hit else 0

    def _admission_needs(
        self, prompt_len: int, hit: int, state_unlocked: int, branching: int
    ) -> tuple[int, int]:
        """Full slots and Mamba slots (free or evictable) an admission needs (module docstring)."""
        if not self.radix:
            return self._pages(prompt_len), 1
        inserts = len(self._cache_points(hit, prompt_len, branching))
        mamba = self.own_states + min(inserts, 1) + (1 - state_unlocked if inserts >= 2 else 0)
        return self._pages(prompt_len - hit), mamba

    # -- sequences --------------------------------------------------------------------------------
    def can_admit(self, prompt: TokenContent, final_len: int) -> bool:
        prompt_len = content_length(prompt)
        branching = 0
        if self.radix:
            match = self.tree.longest_match(prompt_key(prompt, prompt_len, self.page_size), 0)
            hit, full_unlocked, state_unlocked = match.length, match.full_unlocked, match.state_unlocked
            branching = self._branching(match.kv_length, hit)
        else:
            hit = full_unlocked = state_unlocked = 0
        needs = self._admission_needs(prompt_len, hit, state_unlocked, branching)
        return (
            needs[FULL] <= self._room(FULL) - full_unlocked
            and needs[MAMBA] <= self._room(MAMBA) - state_unlocked
        )

    def admit(
        self, seq_id: int, prompt: TokenContent, final_len: int, output_content_id: int, namespace: int = 0
    ) -> int:
        prompt_len = self._check_new(seq_id, prompt, final_len)
        node, hit = self.tree.root, 0
        full_unlocked = state_unlocked = branching = 0
        if self.radix:
            key = prompt_key(prompt, prompt_len, self.page_size)
            if self.tracking.buffers:  # (where the prompt leaves the tree, before the match splits it)
                kv_length = self.tree.longest_match(key, namespace).kv_length
            node, hit = self.tree.match_prefix(key, namespace)
            full_unlocked, state_unlocked = self.tree.unlocked_by_lock(node)
            branching = self._branching(kv_length, hit) if self.tracking.buffers else 0
        needs = self._admission_needs(prompt_len, hit, state_unlocked, branching)
        rooms = (self._room(FULL) - full_unlocked, self._room(MAMBA) - state_unlocked)
        if needs[FULL] > rooms[FULL] or needs[MAMBA] > rooms[MAMBA]:
            raise self._refuse(f"admitting sequence {seq_id}", needs, rooms, hit)
        seq = MambaSequence(
            seq_id, final_len, output_content_id, namespace, tuple(prompt), prompt_len, node,
            tree_len=hit, num_tokens=prompt_len, branching=branching,
        )  # fmt: skip
        self._lock(seq, node)
        self._make_free(MAMBA, self.own_states)  # its own state (a copy of the hit's), and buffers
        self._make_free(FULL, self._pages(prompt_len - hit))
        self.sequences[seq_id] = seq
        self._account(seq, +1)
        if self._inserts_deferred:
            seq.scheduled = hit  # its chunks enter the tree as they are reported (prompt_scheduled)
        elif self.radix:
            for end in self._cache_points(hit, prompt_len, branching):
                self._cache_unfinished(seq, end)
        self._stats.prefix_cache_queries += prompt_len
        self._stats.prefix_cache_hits += hit
        return hit

    def defer_prompt_keys(self) -> bool:
        return self.radix and super().defer_prompt_keys()  # (ChunkCache caches no prompt)

    def _cache_chunk(self, seq: MambaSequence, start: int, end: int) -> None:
        """The prompt so far (with the extra buffer, up to the state the chunk tracked) enters the tree
        with a copy of the request's state in a new Mamba slot."""
        # (The tree holds whole pages: SGLang cuts its chunks on them, kvsim's engine need not.)
        point = self._cache_point(start, end, seq.branching) // self.page_size * self.page_size
        if point > seq.tree_len and self._room(MAMBA) > 0:
            self._cache_unfinished(seq, point)

    def _planned_growth(self, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> int:
        """The growths' new full slots (a Mamba slot is updated in place)."""
        return sum(
            self._pages(seq.num_tokens + tokens) - self._pages(seq.num_tokens)
            for seq, tokens in self._growths(seq_ids, num_tokens)
        )

    def grow_each(self, seq_ids: list[int], num_tokens: list[int]) -> list[int]:
        """Every sequence or none: the full pool is checked for the growths together, then evicts its
        shortfall."""
        needed = self._planned_growth(seq_ids, num_tokens)
        room = self._room(FULL)
        if needed > room:
            raise self._refuse(f"growing sequences {list(seq_ids)}", (needed, 0), (room, 0))
        self._make_free(FULL, needed)
        for seq_id, tokens in zip(seq_ids, num_tokens, strict=True):
            seq = self.sequences[seq_id]
            self._account(seq, -1)
            seq.num_tokens += tokens
            self._account(seq, +1)
        return [self.growth_room(seq_id) for seq_id in seq_ids]

    def fits_growth_each(self, seq_ids: list[int], num_tokens: list[int]) -> bool:
        return self._planned_growth(seq_ids, num_tokens) <= self._room(FULL)

    def fork(self, parent_id: int, children: Sequence[ChildSpec]) -> None:
        parent = self._fork_parent(parent_id, children)
        # (With the extra buffer no state is tracked at a fork: the children hold the parent's path.)
        caches = self.radix and not self.tracking.buffers and parent.num_tokens > parent.tree_len
        states = len(children) * self.own_states + caches  # (its copy cached at its end first)
        if states > self._room(MAMBA):
            raise self._refuse(f"forking sequence {parent_id}", (0, states), (0, self._room(MAMBA)))
        if caches:
            self._cache_unfinished(parent, parent.num_tokens)
        parent.scheduled = ALL_PUBLISHED  # (a fork follows its parent's prefill)
        end = self._pages(parent.num_tokens)
        needs = ((end - parent.tree_len) * len(children), len(children) * self.own_states)
        rooms = (self._room(FULL), self._room(MAMBA))
        if needs[FULL] > rooms[FULL] or needs[MAMBA] > rooms[MAMBA]:
            raise self._refuse(f"forking sequence {parent_id}", needs, rooms)
        self._make_free(MAMBA, needs[MAMBA])
        self._make_free(FULL, needs[FULL])
        for child in children:
            seq = MambaSequence(
                child.seq_id, child.final_len, child.output_content_id, parent.namespace,
                sequence_segments(parent), parent.num_tokens, parent.last_node,
                tree_len=parent.tree_len, num_tokens=parent.num_tokens,
            )  # fmt: skip
            self._lock(seq, parent.last_node)
            self.sequences[child.seq_id] = seq
            self._account(seq, +1)
            self._stats.fork_copied_tokens += parent.num_tokens - parent.tree_len

    def free(self, seq_id: int, finished: bool = True) -> None:
        """``cache_finished_req`` for a finished sequence (its tokens inserted, its own Mamba slot the
        state at their end unless that node has one); a preempted one only frees its own slots."""
        seq = self._get(seq_id)
        self._account(seq, -1)
        cached = self._cached_at_finish(seq) if finished and self.radix else 0
        if cached:
            self.tree.insert(seq.key(cached), seq.namespace)
        self.tree.unlock(seq.last_node)
        del self.sequences[seq_id]

    def _cached_at_finish(self, seq: MambaSequence) -> int:
        """The tokens ``cache_finished_req`` inserts: all of them; with the extra buffer, up to the
        last multiple of ``interval`` its decoding reached, and none without one (its KV past the
        tree is freed, not cached). SGLang's committed KV is its tokens less the last sampled one."""
        interval = self.tracking.interval
        if not interval:
            return seq.num_tokens
        tracked = (seq.num_tokens - 1) // interval * interval
        return tracked if tracked > seq.base_len else 0

    def growth_room(self, seq_id: int) -> int:
        """Tokens before its next new page."""
        seq = self._get(seq_id)
        return min(self._pages(seq.num_tokens), seq.final_len) - seq.num_tokens

    def available_slots(self) -> int:
        """The full pool's free plus evictable slots (the scheduler's token budget)."""
        return self._room(FULL)

    def available_slots_with_hit_locked(self, prompt: TokenContent) -> int:
        """The same once the matched node is locked (``add_one_req``): less the hit's full tokens that
        no sequence locks (without the radix cache nothing is matched)."""
        if not self.radix:
            return self._room(FULL)
        match = self.tree.longest_match(prompt_key(prompt, content_length(prompt), self.page_size), 0)
        return self._room(FULL) - match.full_unlocked

    def prepare_decode_step(self, num_sequences: int) -> None:
        """A page per decoding request free in the full pool before a decode step (the ``radix``
        policy's rule)."""
        self._make_free(FULL, num_sequences * self.page_size)

    # -- accounting -------------------------------------------------------------------------------
    def pool_breakdown(self, index: int) -> Breakdown:
        """Pool ``index``'s breakdown (0: full attention, 1: Mamba); sums to the pool."""
        tree = self.tree
        if index == MAMBA:
            return (
                tree.states_locked + len(self.sequences) * self.own_states,
                0,
                0,
                0,
                tree.states - tree.states_locked,
                self._free(MAMBA),
            )
        own = self._own
        return (
            tree.full_locked + own.tokens,
            own.target - own.tokens,
            own.slots - own.target,
            self.pool_tokens[FULL] - self.page_slots[FULL],
            tree.full_tokens - tree.full_locked,
            self._free(FULL),
        )

    def group_entries(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The two pools; a Mamba slot holds no token."""
        return tuple(group.name for group in self.groups), (True, False)

    def may_share(self) -> bool:
        return self.radix  # (without the radix cache nothing is shared: no tree path is locked)

    def sharing_slots(self) -> tuple[int, int]:
        tree, own, own_states = self.tree, self._own, len(self.sequences) * self.own_states
        physical = tree.full_locked + own.slots + tree.states_locked + own_states
        return physical, self._tree_held + own.slots + self._states_held + own_states
