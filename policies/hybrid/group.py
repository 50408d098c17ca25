"""What every KV-group manager of a shared block pool does alike (vLLM's
``SingleTypeKVCacheManager``): per sequence, a run of held blocks ``[first_block, end_block)`` of its
block positions; blocks before ``first_block`` were released (vLLM's null blocks in the block table).
A layer kind says only which run a sequence must hold (:meth:`GroupManager.held_run`) and when that
run next starts later (:meth:`GroupManager.next_release`).

Accounting, in the pool's slots: a sequence's held blocks hold its tokens past ``first_block``
(*used*), slots it will fill up to its final length (*reserved*) and slots past its final length
(*internal fragmentation*). The pool reports the free blocks; the coordinator adds them once.

Prompts: kvsim allocates a prompt at admission (``sim/engine/core.py``); a group whose layers see
only part of the prompt holds, from admission until its first decoded token, the most that vLLM's
chunked prefill holds at once (:meth:`GroupManager.prefill_run`), then what the kind keeps.

Prefix caching (a :class:`~policies.hybrid.prefix_pool.PrefixCachingBlockPool`): the group also keeps
each sequence's block ids (``block_tables.py``), and a layer kind says which prompt prefixes it can
serve from its cached blocks (:meth:`GroupManager.longest_cache_hit`, vLLM's
``find_longest_cache_hit`` of its ``SingleTypeKVCacheManager``) and which blocks of a hit it skips
(:meth:`GroupManager.skipped_blocks`, vLLM's ``get_num_skipped_tokens``), both in
``vllm/v1/core/single_type_kv_cache_manager.py`` (vLLM main as of late 2025, read in the public code
index). Without it, nothing here changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from mypy_extensions import mypyc_attr

from policies.base import (
    NO_HIT,
    ChildSpec,
    OutOfKVMemory,
    PolicyInputError,
    PoolSpec,
    PrefixHit,
    SequenceTable,
    grow_each_arguments_error,
)
from policies.hybrid.block_pool import SharedBlockPool
from policies.hybrid.block_tables import GroupBlockTables
from policies.hybrid.prefix_pool import PrefixCachingBlockPool
from token_content import TokenContent, content_length, validate_content

NEVER: Final = 1 << 61  # (below 2**62: compiled, a native int, not a boxed one)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class GroupSequence:
    num_tokens: int
    final_len: int
    first_block: int  # blocks before it were released
    end_block: int  # one past its last held block
    checked_in: int  # the last checked growth that listed it (GroupManager.growth_moves)

    def __init__(self, num_tokens: int, final_len: int, first_block: int, end_block: int) -> None:
        self.num_tokens = num_tokens
        self.final_len = final_len
        self.first_block = first_block
        self.end_block = end_block
        self.checked_in = 0


GrowthStep = tuple[GroupSequence, int, int, int]
"""One sequence's planned growth (``GroupManager.plan_growth``): the sequence, the tokens it grows
by, and the run of blocks it holds after it (first, end)."""


def moves(seq: GroupSequence, first: int, end: int) -> tuple[int, int]:
    """``(blocks released, blocks taken)`` when ``seq``'s run becomes ``[first, end)``: a run that
    jumps past its last held block releases only what it held."""
    return min(first, seq.end_block) - seq.first_block, end - max(first, seq.end_block)


def held_change(seq: GroupSequence, first: int, end: int) -> int:
    """The blocks the run ``[first, end)`` holds beyond ``seq``'s run now (negative: fewer)."""
    return (end - first) - (seq.end_block - seq.first_block)


@mypyc_attr(allow_interpreted_subclasses=True)
class GroupManager(SequenceTable[GroupSequence]):
    """One KV group's blocks, taken from a pool other groups share. Subclasses: one layer kind each."""

    kind: str = ""

    def __init__(self, pool: PoolSpec, shared_pool: SharedBlockPool, prefill_tokens: int):
        """``prefill_tokens``: the most prompt tokens one iteration computes for one request (the
        engine's ``max_num_batched_tokens`` with chunked prefill, else ``max_model_len``)."""
        super().__init__(pool)
        if pool.block_size != shared_pool.block_size:
            raise PolicyInputError(
                f"{self.kind} group: block_size {pool.block_size} differs from the shared pool's "
                f"{shared_pool.block_size}"
            )
        self.shared_pool = shared_pool
        self.block_size = pool.block_size
        self.prefill_tokens = prefill_tokens
        self.sequences = {}
        self._used = self._reserved = self._held_blocks = 0  # running sums: the breakdown is O(1)
        self.tables: GroupBlockTables | None = None  # block ids, with a prefix-caching pool only
        self._admitting: dict[int, int] = {}  # sequence id -> its hit, between the admission's steps
        self._growths_checked = 0  # growth_moves' stamps
        # Unbacked decode growth (defer_unbacked): what reads the decoded tokens no block holds yet.
        self._pending_tokens: Callable[[], int] | None = None
        if isinstance(shared_pool, PrefixCachingBlockPool):
            self.tables = GroupBlockTables(
                shared_pool, shared_pool.add_group(self.stats), self.block_size, self.kind
            )

    # -- what a layer kind decides ------------------------------------------------------------------
    def held_run(self, num_tokens: int) -> tuple[int, int]:
        """``(first_block, end_block)`` a decoding sequence of ``num_tokens`` tokens must hold."""
        raise NotImplementedError

    def next_release(self, seq: GroupSequence) -> int:
        """The token count at which ``seq``'s first held block is next released (``NEVER``: never)."""
        return NEVER

    def releases_while_decoding(self) -> bool:
        """Whether a decoding sequence gives blocks back as it grows (:meth:`next_release`): a window
        or a chunk moving on, a Mamba state written into a later block."""
        return False

    def takes_blocks_as_it_grows(self) -> bool:
        """Whether a growing sequence takes a new block in this group at each block boundary it
        crosses (the engine's cheap bound on a flush counts every such group)."""
        return True

    def prefill_run(self, prompt_len: int) -> tuple[int, int]:
        """``(first_block, end_block)`` a prompt of ``prompt_len`` tokens holds from admission to its
        first decoded token."""
        return self.held_run(prompt_len)

    def prompt_tail_run(self, prompt_len: int, span: int) -> tuple[int, int]:
        """The prompt's last blocks that chunked prefill holds at most at once for a layer that attends
        to the ``span`` tokens before each (a window, or an attention chunk): the span before a prefill
        chunk plus the chunk, ``cdiv(span - 1 + chunk, block_size) + 1`` blocks (vLLM's
        ``max_memory_usage_bytes`` of such a spec), or the whole prompt when it is shorter."""
        end = ceil_div(prompt_len, self.block_size)
        prefill_chunk = min(prompt_len, self.prefill_tokens)
        in_flight = ceil_div(span - 1 + prefill_chunk, self.block_size) + 1
        return max(0, end - in_flight), end

    # -- prefix caching: what a layer kind decides ------------------------------------------------
    def longest_cache_hit(self, chains: list[int], max_blocks: int) -> int:
        """The most leading blocks (at most ``max_blocks``) of a prompt whose block chains are
        ``chains`` (those some block holds) this group can serve from its cached blocks.

        Full attention (vLLM ``FullAttentionManager.find_longest_cache_hit``): the leading run of
        cached blocks. Kinds that skip blocks override it."""
        tables = self.tables
        assert tables is not None
        hit = 0
        for chain in chains[:max_blocks]:
            if not tables.is_cached(chain):
                break
            hit += 1
        return hit

    def skipped_blocks(self, num_tokens: int) -> int:
        """Leading blocks a sequence with ``num_tokens`` tokens computed no longer attends to (vLLM's
        ``get_num_skipped_tokens``, in whole blocks): a hit need not hold them. Full attention: none."""
        return 0

    # -- sequences ------------------------------------------------------------------------------------
    def slots_needed_to_admit(self, prompt: TokenContent) -> int:
        first, end = self.prefill_run(content_length(prompt))
        return (end - first) * self.block_size

    def slots_needed_to_admit_cached(self, prompt: TokenContent, namespace: int, cached_tokens: int) -> int:
        """:meth:`slots_needed_to_admit` with a prefix hit of ``cached_tokens`` (one this group can
        serve): the new blocks, and the hit's free cached blocks, which leave the free queue."""
        tables = self.tables
        if tables is None:
            return self.slots_needed_to_admit(prompt)
        hit = cached_tokens // self.block_size
        chains = tables.prompt_chains(prompt, namespace, hit)
        run = self._cached_prefill_run(content_length(prompt), hit)
        prefill_from = self.skipped_blocks(hit * self.block_size)
        return tables.blocks_needed_to_admit(chains, prefill_from, run, hit) * self.block_size

    def _cached_prefill_run(self, prompt_len: int, hit: int) -> tuple[int, int]:
        """The prefill run of a prompt whose first ``hit`` blocks are a prefix hit: the blocks of the
        hit it skips are never held (vLLM's null blocks)."""
        first, end = self.prefill_run(prompt_len)
        if hit:
            skipped = self.skipped_blocks(hit * self.block_size)
            if skipped > first:
                first = skipped if skipped < end else end
        return first, end

    def lookup(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        tables = self.tables
        if tables is None:
            return super().lookup(prompt, namespace)
        validate_content(prompt, "looked-up prompt", PolicyInputError)
        max_blocks = (content_length(prompt) - 1) // self.block_size  # (the last token is computed)
        hit = self.longest_cache_hit(tables.prompt_chains(prompt, namespace, max_blocks), max_blocks)
        return PrefixHit(hit * self.block_size) if hit else NO_HIT

    def can_admit(self, prompt: TokenContent, final_len: int, namespace: int = 0) -> bool:
        if self.tables is not None:
            cached = self.lookup(prompt, namespace).cached_tokens
            return (
                self.slots_needed_to_admit_cached(prompt, namespace, cached) <= self.shared_pool.free_slots()
            )
        return self.slots_needed_to_admit(prompt) <= self.shared_pool.free_slots()

    def can_admit_capped(
        self, prompt: TokenContent, final_len: int, namespace: int, max_cached_tokens: int
    ) -> bool:
        if self.tables is None:
            return super().can_admit_capped(prompt, final_len, namespace, max_cached_tokens)
        cached = self._capped_hit(prompt, namespace, max_cached_tokens)
        return self.slots_needed_to_admit_cached(prompt, namespace, cached) <= self.shared_pool.free_slots()

    def _capped_hit(self, prompt: TokenContent, namespace: int, max_cached_tokens: int) -> int:
        """The longest hit this group serves within ``max_cached_tokens`` (the KV coordinator's common
        hit, which every group serves whole)."""
        tables = self.tables
        assert tables is not None
        max_blocks = min(content_length(prompt) - 1, max_cached_tokens) // self.block_size
        return self.longest_cache_hit(tables.prompt_chains(prompt, namespace, max_blocks), max_blocks) * (
            self.block_size
        )

    def admit_capped(
        self,
        seq_id: int,
        prompt: TokenContent,
        final_len: int,
        output_content_id: int,
        namespace: int,
        max_cached_tokens: int,
    ) -> int:
        if self.tables is None:
            return super().admit_capped(
                seq_id, prompt, final_len, output_content_id, namespace, max_cached_tokens
            )
        cached = self._capped_hit(prompt, namespace, max_cached_tokens)
        return self._admit_cached(seq_id, prompt, final_len, output_content_id, namespace, cached)

    def _admit_cached(
        self,
        seq_id: int,
        prompt: TokenContent,
        final_len: int,
        output_content_id: int,
        namespace: int,
        cached_tokens: int,
    ) -> int:
        """Admission with a prefix hit of ``cached_tokens`` this group serves, in the two steps the KV
        coordinator runs across the groups of a pool (:meth:`hold_cached_prefix`, then
        :meth:`take_admission_blocks`)."""
        needed = self.slots_needed_to_admit_cached(prompt, namespace, cached_tokens)
        if needed > self.shared_pool.free_slots():
            raise OutOfKVMemory(
                f"admitting sequence {seq_id} into the {self.kind} group needs {needed} slots of the "
                f"shared pool, {self.shared_pool.free_slots()} free",
                needed_slots=needed,
                free_slots=self.shared_pool.free_slots(),
            )
        self.hold_cached_prefix(seq_id, prompt, final_len, output_content_id, namespace, cached_tokens)
        return self.take_admission_blocks(seq_id)

    def hold_cached_prefix(
        self,
        seq_id: int,
        prompt: TokenContent,
        final_len: int,
        output_content_id: int,
        namespace: int,
        cached_tokens: int,
    ) -> None:
        """The first step of an admission with a prefix hit of ``cached_tokens`` (one this group serves,
        the pool checked for room): the hit's blocks in the sequence's run are held."""
        tables = self.tables
        assert tables is not None
        prompt_len = self._check_new_sequence(seq_id, prompt, final_len)
        hit = cached_tokens // self.block_size
        first, end = self._cached_prefill_run(prompt_len, hit)
        chains = tables.prompt_chains(prompt, namespace, hit)
        seq = GroupSequence(prompt_len, final_len, first, end)
        prefill_from = self.skipped_blocks(hit * self.block_size)  # (the window at the hit's end)
        tables.hold_hit(
            id(seq), seq_id, prompt, output_content_id, namespace, (first, end), chains, hit, prefill_from
        )
        self.sequences[seq_id] = seq
        self._admitting[seq_id] = hit

    def take_admission_blocks(self, seq_id: int) -> int:
        """The second step: the run's new blocks. The query is counted once the admission succeeded
        (``policies/prefix.py``: vLLM's scheduler records it after the allocation); returns the
        tokens served from cache."""
        tables = self.tables
        assert tables is not None
        hit = self._admitting.pop(seq_id)
        seq = self.sequences[seq_id]
        prefill_from = self.skipped_blocks(hit * self.block_size)
        tables.take_new(id(seq), (seq.first_block, seq.end_block), hit, prefill_from)
        self._account(seq, 1)
        cached_tokens = hit * self.block_size
        self.stats.prefix_cache_queries += seq.num_tokens
        self.stats.prefix_cache_hits += cached_tokens
        return cached_tokens

    def admit(
        self, seq_id: int, prompt: TokenContent, final_len: int, output_content_id: int, namespace: int = 0
    ) -> int:
        if self.tables is not None:
            cached = self.lookup(prompt, namespace).cached_tokens
            return self._admit_cached(seq_id, prompt, final_len, output_content_id, namespace, cached)
        prompt_len = self._check_new_sequence(seq_id, prompt, final_len)
        first, end = self.prefill_run(prompt_len)
        self.shared_pool.take(end - first, f"admitting sequence {seq_id} into the {self.kind} group")
        seq = GroupSequence(prompt_len, final_len, first, end)
        self.sequences[seq_id] = seq
        self._account(seq, 1)
        return 0

    def grow(self, seq_id: int, num_tokens: int, content: TokenContent | None = None) -> None:
        if content is not None:
            validate_content(content, f"content grown into sequence {seq_id}", PolicyInputError)
            if self.tables is not None:
                raise PolicyInputError(
                    f"{self.kind} group: a prefix-caching pool grows a sequence by its own output only"
                )
        self.grow_each([seq_id], [num_tokens])

    def grow_each(self, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> list[int]:
        """All or nothing: the blocks released and taken are netted (vLLM frees a step's skipped blocks
        before it allocates), and the pool must hold what is left."""
        net_blocks, plan = self.plan_growth(seq_ids, num_tokens)
        if net_blocks > self.shared_pool.spare_blocks():
            self.stats.allocation_failures += 1
            needed, free = net_blocks * self.block_size, self.shared_pool.free_slots()
            raise OutOfKVMemory(
                f"growing sequences {list(seq_ids)} in the {self.kind} group needs {needed} slots of the "
                f"shared pool, {free} free",
                needed_slots=needed,
                free_slots=free,
            )
        self.shared_pool.adjust(net_blocks)
        self.release_skipped(plan)
        return self.commit_growth(plan)

    def plan_growth(self, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> tuple[int, list[GrowthStep]]:
        """What growing ``seq_ids[i]`` by ``num_tokens[i]`` tokens does, changing nothing: the net blocks
        the pool gives (negative: gets back) and, per sequence, its new run. Raises
        :class:`PolicyInputError` for an unknown sequence, one listed twice, or growth past its final
        length. A KV coordinator adds the groups' nets of one pool before it commits any."""
        self.check_growth(seq_ids, num_tokens)
        return self.plan_checked_growth(seq_ids, num_tokens)

    def check_growth(self, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> None:
        """Raises what :meth:`plan_growth` raises for a growth it refuses; nothing else."""
        if len(seq_ids) != len(num_tokens) or (len(seq_ids) > 1 and len(set(seq_ids)) != len(seq_ids)):
            raise grow_each_arguments_error(seq_ids, num_tokens)
        for seq_id, tokens in zip(seq_ids, num_tokens):  # noqa: B905 (lengths checked above; compiled, strict=True costs a call with keywords)
            seq = self._get(seq_id)
            self._check_growth(seq_id, tokens, seq.num_tokens, seq.final_len)

    def plan_checked_growth(
        self, seq_ids: Sequence[int], num_tokens: Sequence[int]
    ) -> tuple[int, list[GrowthStep]]:
        """:meth:`plan_growth` of a growth already checked (by the same plan in another group of the
        coordinator: every group holds the same sequences at the same lengths)."""
        plan: list[GrowthStep] = []
        sequences = self.sequences
        net = 0
        for index in range(len(seq_ids)):
            seq = sequences[seq_ids[index]]
            tokens = num_tokens[index]
            first, end = self._run_after(seq, seq.num_tokens + tokens)
            net += held_change(seq, first, end)
            plan.append((seq, tokens, first, end))
        if self.tables is not None:
            net = self.planned_net_blocks(plan)  # (a released block another sequence holds stays taken)
        return net, plan

    def growth_moves(self, seq_ids: list[int], num_tokens: list[int], check: bool) -> tuple[int, int]:
        """:func:`moves` of growing every ``seq_ids[i]`` by ``num_tokens[i]``, summed: ``(blocks
        released, blocks taken)``, changing nothing; in a pool that caches nothing, :meth:`grow_checked`
        then grows (a coordinator's fast path: ``sim/kv/multi_group.py``, ``sim/kv/jenga.py``). With
        ``check``, it first raises what :meth:`check_growth` raises (one group checks for all: every
        group holds the same sequences at the same lengths)."""
        assert self.tables is None, "a prefix-caching pool's net depends on what other sequences hold"
        if check:
            if len(seq_ids) != len(num_tokens):
                raise grow_each_arguments_error(seq_ids, num_tokens)
            # A sequence met twice in one growth is listed twice: a stamp per growth, not a set of ids
            # (this runs at every flush).
            self._growths_checked += 1
        stamp = self._growths_checked
        sequences = self.sequences
        released = taken = 0
        for index in range(len(seq_ids)):
            tokens = num_tokens[index]
            if check:
                seq = self._get(seq_ids[index])
                if seq.checked_in == stamp:
                    raise grow_each_arguments_error(seq_ids, num_tokens)
                seq.checked_in = stamp
                self._check_growth(seq_ids[index], tokens, seq.num_tokens, seq.final_len)
            else:
                seq = sequences[seq_ids[index]]
            first, end = self._run_after(seq, seq.num_tokens + tokens)
            gives, takes = moves(seq, first, end)
            released += gives
            taken += takes
        return released, taken

    def grow_checked(self, seq_ids: list[int], num_tokens: list[int], rooms: list[int] | None) -> list[int]:
        """:meth:`plan_checked_growth` and :meth:`commit_growth` in one pass, in a pool that caches
        nothing, its net blocks moved by the caller (:meth:`growth_moves`); returns each sequence's
        growth room after it, the least of it and ``rooms[i]`` (other groups' rooms, lowered in place)
        when given. (No plan is built: at every flush of every group, its tuples were a third of the
        growth's time.)"""
        assert self.tables is None, "a prefix-caching pool releases before it takes: commit_growth"
        assert rooms is None or len(rooms) == len(seq_ids)
        sequences = self.sequences
        least: list[int] = [] if rooms is None else rooms
        for index in range(len(seq_ids)):
            seq = sequences[seq_ids[index]]
            tokens = num_tokens[index]
            first, end = self._run_after(seq, seq.num_tokens + tokens)
            room = self._grow_to(seq, tokens, first, end)
            if rooms is None:
                least.append(room)
            elif room < least[index]:
                least[index] = room
        return least

    def planned_net_blocks(self, plan: list[GrowthStep]) -> int:
        """The net blocks a plan (or the part of it for some of its sequences) takes from the pool."""
        tables = self.tables
        net = 0
        if tables is not None:
            # (A released block another sequence still holds gives the pool nothing back.)
            shared: dict[int, int] = {}
            for seq, _, first, end in plan:
                net += tables.net_blocks_of(id(seq), seq.first_block, seq.end_block, first, end, shared)
            return net + tables.shared_net(shared) if shared else net
        for seq, _, first, end in plan:
            net += held_change(seq, first, end)
        return net

    @staticmethod
    def planned_new_blocks(plan: list[GrowthStep]) -> int:
        """The blocks a plan takes, whatever it releases."""
        taken = 0
        for seq, _, first, end in plan:
            start = seq.end_block if seq.end_block > first else first
            if end > start:
                taken += end - start
        return taken

    def release_skipped(self, plan: list[GrowthStep]) -> None:
        """With a prefix-caching pool, the blocks a planned growth releases go back (cached) before any
        group of the pool takes new ones (vLLM's ``remove_skipped_blocks``, then
        ``allocate_new_blocks``); without one, the pool's count moved already."""
        if self.tables is None:
            return
        for step in plan:
            self.release_skipped_of(step)

    def release_skipped_of(self, step: GrowthStep) -> None:
        """:meth:`release_skipped` of one sequence's planned growth (a prefix-caching pool's)."""
        tables = self.tables
        assert tables is not None
        seq, tokens, first, _ = step
        # The tokens come first: a block they fill was cached at the step that filled it (vLLM's
        # ``cache_blocks`` at allocation), before a later step's ``remove_skipped_blocks`` lets it
        # go. A growth of several tokens at once (event skipping's flushes) may fill a block and
        # pass it (a chunk's last block, one token before the next chunk): cached, not blank.
        tables.note_growth(id(seq), tokens)
        if first > seq.first_block:
            tables.release_skipped(id(seq), seq.first_block, seq.end_block, first)

    def commit_growth(self, plan: list[GrowthStep]) -> list[int]:
        """Apply a :meth:`plan_growth` whose net blocks the caller has moved in or out of the pool (with
        a prefix-caching pool, after :meth:`release_skipped`); returns each sequence's growth room
        after it."""
        return [self.commit_step(step) for step in plan]

    def commit_step(self, step: GrowthStep) -> int:
        """:meth:`commit_growth` of one sequence's planned growth; returns its growth room after."""
        seq, tokens, first, end = step
        if self.tables is not None:
            self.tables.take_for_growth(id(seq), seq.end_block, first, end, tokens)
        return self._grow_to(seq, tokens, first, end)

    def _grow_to(self, seq: GroupSequence, tokens: int, first: int, end: int) -> int:
        """``seq`` grows by ``tokens`` to the run ``[first, end)``; returns its growth room after."""
        self._account_growth(seq, tokens, first, end)
        seq.num_tokens += tokens
        seq.first_block = first
        seq.end_block = end
        return self._room(seq)

    def _run_after(self, seq: GroupSequence, num_tokens: int) -> tuple[int, int]:
        """The run ``seq`` holds once it has ``num_tokens`` tokens: released blocks stay released, and
        held ones stay held until the kind releases them (a growth past the whole run holds only the
        new blocks)."""
        first, end = self.held_run(num_tokens)
        if first < seq.first_block:
            first = seq.first_block
        if end < seq.end_block:
            end = seq.end_block
        return first, end

    def slots_needed_to_grow(self, seq_id: int, num_tokens: int) -> int:
        return max(0, self.net_slots_to_grow(seq_id, num_tokens))

    def net_slots_to_grow(self, seq_id: int, num_tokens: int) -> int:
        """Slots the pool gives (positive) or gets back (negative) when ``seq_id`` grows."""
        seq = self._get(seq_id)
        if self.tables is not None:
            return self.plan_checked_growth([seq_id], [num_tokens])[0] * self.block_size
        first, end = self._run_after(seq, seq.num_tokens + num_tokens)
        return held_change(seq, first, end) * self.block_size

    def growth_room(self, seq_id: int) -> int:
        """Tokens before the next change of its run: a new block needed, or one released (a release
        is an event too: the blocks vLLM frees at that step are free from then on)."""
        return self._room(self._get(seq_id))

    def _room(self, seq: GroupSequence) -> int:
        if self._pending_tokens is None:
            room = min(seq.end_block * self.block_size, seq.final_len) - seq.num_tokens
        else:
            room = seq.final_len - seq.num_tokens  # every token to its end is deferred, up to a release
        release_at = self.next_release(seq)
        if release_at != NEVER and release_at - seq.num_tokens - 1 < room:
            room = max(0, release_at - seq.num_tokens - 1)
        return room

    def slots_needed_to_fork(self, parent_id: int, num_children: int) -> int:
        parent = self._get(parent_id)
        if self.tables is not None:  # the children share its full blocks
            copied = self.tables.partial_blocks(id(parent), parent.first_block, parent.end_block)
            return copied * num_children * self.block_size
        return (parent.end_block - parent.first_block) * num_children * self.block_size

    def fork(self, parent_id: int, children: Sequence[ChildSpec]) -> None:
        """Each child gets its own copy of the parent's held blocks (no prefix cache to share through)."""
        parent = self._get(parent_id)
        self._check_children(parent_id, parent.num_tokens, children)
        if self.tables is not None:
            self._fork_cached(parent_id, parent, children)
            return
        held = parent.end_block - parent.first_block
        self.shared_pool.take(held * len(children), f"forking sequence {parent_id} in the {self.kind} group")
        for child in children:
            seq = GroupSequence(parent.num_tokens, child.final_len, parent.first_block, parent.end_block)
            self.sequences[child.seq_id] = seq
            self._account(seq, 1)
        self.stats.fork_copied_tokens += (parent.num_tokens - parent.first_block * self.block_size) * len(
            children
        )

    def _fork_cached(self, parent_id: int, parent: GroupSequence, children: Sequence[ChildSpec]) -> None:
        tables = self.tables
        assert tables is not None
        copied = tables.partial_blocks(id(parent), parent.first_block, parent.end_block)
        if copied * len(children) > self.shared_pool.spare_blocks():
            raise OutOfKVMemory(
                f"forking sequence {parent_id} in the {self.kind} group needs {copied * len(children)} "
                f"blocks of the shared pool, {self.shared_pool.spare_blocks()} free",
                needed_slots=copied * len(children) * self.block_size,
                free_slots=self.shared_pool.free_slots(),
            )
        partial_tokens = parent.num_tokens - (parent.end_block - copied) * self.block_size
        for child in children:
            seq = GroupSequence(parent.num_tokens, child.final_len, parent.first_block, parent.end_block)
            tables.fork(id(parent), id(seq), child, parent.first_block, parent.end_block)
            self.sequences[child.seq_id] = seq
            self._account(seq, 1)
            self.stats.fork_copied_tokens += max(0, partial_tokens)

    def defer_prompt_keys(self) -> bool:
        """With a prefix-caching pool, a prompt's held blocks are cached as its chunks are scheduled
        (``GroupBlockTables.defer_keys``)."""
        if self.tables is None:
            return False
        self.tables.defer_keys()
        return True

    def prompt_scheduled(self, seq_id: int, tokens: int) -> None:
        if self.tables is not None:
            self.tables.scheduled(id(self._get(seq_id)), tokens)

    def free(self, seq_id: int, finished: bool = True) -> None:
        seq = self._get(seq_id)
        self._account(seq, -1)
        if self.tables is not None:
            self.tables.free(id(seq), seq.first_block, seq.end_block)
        else:
            self.shared_pool.give_back(seq.end_block - seq.first_block)
        del self.sequences[seq_id]

    # -- accounting -----------------------------------------------------------------------------------
    def _account(self, seq: GroupSequence, sign: int) -> None:
        block_size = self.block_size
        start, end = seq.first_block * block_size, seq.end_block * block_size
        self._used += sign * (seq.num_tokens - start)
        self._reserved += sign * (min(end, seq.final_len) - seq.num_tokens)
        self._held_blocks += sign * (seq.end_block - seq.first_block)

    def _account_growth(self, seq: GroupSequence, tokens: int, first: int, end: int) -> None:
        """What ``_account(seq, -1)``, the growth, then ``_account(seq, 1)`` would add up to, in one
        step (this runs once per group for every block a decoding sequence fills)."""
        block_size = self.block_size
        final_len = seq.final_len
        before, after = seq.num_tokens, seq.num_tokens + tokens
        held_before, held_after = seq.end_block * block_size, end * block_size
        self._used += tokens - (first - seq.first_block) * block_size
        self._reserved += ((held_after if held_after < final_len else final_len) - after) - (
            (held_before if held_before < final_len else final_len) - before
        )
        self._held_blocks += held_change(seq, first, end)

    def breakdown_values(self) -> tuple[int, int, int, int, int, int]:
        """What this group holds; the shared pool reports its free blocks (the coordinator adds them)."""
        held = self._held_blocks * self.block_size
        tables = self.tables
        if tables is None:
            # Unbacked tokens count as reserved (the engine moves its pending tokens to used); the
            # pool counts them out of its free blocks.
            pending = 0 if self._pending_tokens is None else self._pending_tokens()
            return self._used, self._reserved + pending, held - self._used - self._reserved, 0, 0, 0
        # Blocks several sequences hold count once; free blocks keeping an identity are cached.
        shared = tables.excess * self.block_size
        used = self._used - shared
        cached = tables.pool.cached_in(tables.group) * self.block_size
        return used, self._reserved, held - shared - used - self._reserved, 0, cached, 0

    def sharing_slots(self) -> tuple[int, int]:
        # (From the breakdown, whose reserved slots already hold unbacked pending tokens.)
        physical, logical = super().sharing_slots()
        if self.tables is not None:
            logical += self.tables.excess * self.block_size
        return physical, logical

    def can_defer_unbacked(self) -> bool:
        """Blocks of one token (SGLang's pages) without a prefix cache: the pending tokens take free
        blocks, and with nothing cached nothing is evicted for them."""
        return self.block_size == 1 and self.tables is None and self.kind != "mamba"

    def defer_unbacked(self, pending_tokens: Callable[[], int] | None) -> None:
        if pending_tokens is not None and not self.can_defer_unbacked():
            super().defer_unbacked(pending_tokens)
        self._pending_tokens = pending_tokens

    def shared_slots(self) -> int:
        return 0 if self.tables is None else self.tables.shared_blocks * self.block_size

    def available_slots(self) -> int:
        return self.shared_pool.free_slots()

    def held_blocks(self, seq_id: int) -> tuple[int, int]:
        """``(first_block, end_block)``: the run of block positions ``seq_id`` holds."""
        seq = self._get(seq_id)
        return seq.first_block, seq.end_block

    def held_block_count(self, seq_id: int) -> int:
        """The blocks ``seq_id`` holds: its run's (a Mamba group's prefill may hold the run's two ends
        only, null blocks between them)."""
        seq = self._get(seq_id)
        return seq.end_block - seq.first_block

    @property
    def pool_slots(self) -> int:
        """The slots this group holds now: its part of the shared pool (which the coordinator counts),
        its cached blocks with it."""
        tables = self.tables
        if tables is None:
            return self._held_blocks * self.block_size
        held = self._held_blocks - tables.excess + tables.pool.cached_in(tables.group)
        return held * self.block_size
