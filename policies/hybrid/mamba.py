"""A Mamba or linear-attention group (vLLM's ``MambaManager``): a block holds one request's state
(conv + SSM) whatever its length. The state is live memory: a held block counts as used.

**Without prefix caching** (vLLM's ``mamba_cache_mode: none``): one block per request, from admission
to its end.

**With prefix caching** over a :class:`~policies.hybrid.prefix_pool.PrefixCachingBlockPool`, one of
vLLM's two modes (``MambaGroup(..., cache_mode=)``; which one vLLM runs for a model:
``sim/kv/allocators.py``, ``vllm_mamba_cache_mode``).

**Align** (vLLM's ``mamba_cache_mode: align``, what vLLM runs with prefix caching for a model whose
Mamba layers do not support "all", Qwen3-Next among them, or when asked for it). What vLLM does, read
in ``vllm-project/vllm``:

* ``vllm/v1/core/single_type_kv_cache_manager.py`` (commit 129ab7c60cbb8eb11e875373e67f7e521b74aa30),
  ``MambaManager``: a request's block table has a position per block of its tokens, null except where
  a state sits. A step that computes up to token ``n`` writes its state into a new block at position
  ``cdiv(n, block) - 1`` (``allocate_new_blocks``: one new block per step that reaches a new position,
  ``get_num_blocks_to_allocate``: that block plus a free cached block of a hit) and reads the state
  the previous step wrote; at the next step that one is freed (``remove_skipped_blocks``:
  ``get_num_skipped_tokens(n) = n - 1``, and ``last_state_block_idx``). So a request holds at most 2
  blocks: the state it reads and the one it writes. A full block is cached under the hash of its
  block of tokens (``cache_blocks``: the state after exactly ``(p + 1) x block`` tokens), and a freed
  one keeps its identity in the free queue, evictable, as every group's blocks do.
* ``find_longest_cache_hit``: the right-most cached state within the prefix (scanning from the
  right, the first block cached in the group): a hit of ``p + 1`` blocks, the ``p`` before it null.
  Not a run from the start: the states before it need not be cached.
* ``vllm/v1/core/sched/scheduler.py`` (commit b4622cf924bc72504aed99e486062d6633fde39e),
  ``_mamba_block_aligned_split``: while a request has no output, a prefill chunk ending before the
  prompt's last whole block (``last_cache_position = L - L % block``) is cut down to whole blocks; the
  chunk that would cross that position ends there; the rest of the prompt follows in one chunk. So the
  states cached during a prefill are those at the ends of its chunks, all on block boundaries, the
  last one at ``L - L % block``.
* ``vllm/v1/core/kv_cache_coordinator.py`` (commit 52b9a57da84e0b9e3ee807f1fcbe5f5a2aec853f),
  ``HybridKVCacheCoordinator.find_longest_cache_hit``: full attention's hit first, then the Mamba
  group's within it (one round for one full and one Mamba spec; kvsim's coordinator iterates, which
  ends at the same length since full attention keeps any shorter prefix it serves).

How kvsim runs it: decoding, exactly as vLLM (``held_run``: the block of the last token and, at the
step that crosses into a new block, the one before it; a release is a decode event); a block that
fills is cached (a state at every block boundary a decode crosses). A prompt is computed at
admission, so its chunks are derived from the engine's per-request prefill budget
(``prefill_tokens``): each chunk is that budget cut down to whole blocks, as vLLM's aligned split cuts
it, from the hit's end. From admission to its first decoded token a prompt holds what vLLM holds at
its last chunk (the states of its last two chunk ends: for a prompt that is not a whole number of
blocks, its last whole block and the block of its last token, contiguous; for one that is, the
previous chunk's state and the last block, with null blocks between them); the states of the
earlier chunk ends are taken, cached and given back in order, at admission, or, with the engine
reporting chunks, as the chunk that writes each is scheduled (vLLM frees each at the chunk after
it); a hit's state that the prefill moves past is given back at admission.

**All** (vLLM's ``mamba_cache_mode: all``, its default with prefix caching for a model whose Mamba
layers support it, ``SupportsMambaPrefixCaching``: Mamba, Mamba2, Nemotron-H among them; the block
size is then a multiple of the kernel's chunk, ``sim/hardware/hybrid_capacity.py``, so that the
chunked scan ends a chunk at every block boundary). What vLLM does, read in the same files:

* ``MambaManager`` leaves "all" to ``SingleTypeKVCacheManager`` (its "align" branches aside, commit
  129ab7c above): ``get_num_blocks_to_allocate`` and ``allocate_new_blocks`` give a request a block
  per block of its tokens, as full attention's; ``remove_skipped_blocks``, with
  ``get_num_skipped_tokens(n) = n - 1``, frees every block before the one of the last computed token
  at the start of each step. The prefill kernels read the state in the block of the last computed
  token and write the state at each block boundary the chunk crosses into that block's position and
  the state at the chunk's end into the block of its last token (the Mamba attention metadata's
  ``block_idx_last_computed_token``, ``block_idx_first_scheduled_token_p`` and
  ``block_idx_last_scheduled_token``, "only used for prefix caching in all mode", which the mixer's
  causal conv and chunked scan write through; read in copies of vLLM main in the public code index
  whose commit is not recorded there); ``cache_blocks`` caches every full block. So a chunk from
  ``c`` to ``e`` holds blocks ``(c - 1) // block`` to ``cdiv(e, block) - 1``, contiguous, and the
  next chunk frees all of them but the last: every block boundary of the prompt leaves a cached
  state.
* A hit: the same right-most cached state (``find_longest_cache_hit`` is one for both modes); its
  block is touched and the ones before it are null (``allocate_new_computed_blocks``: the hit's
  skipped blocks, ``get_num_skipped_tokens(hit) // block``). ``get_num_blocks_to_allocate``: the new
  blocks and the hit's block when it is free.
* No aligned split: the scheduler cuts chunks only in "align" (``need_mamba_block_aligned_split``,
  ``scheduler.py`` above), and "all" does not need chunked prefill (``MambaModelConfig.
  verify_and_update_config`` asserts it for "align" only).
* Decoding is align's: at a step the block of the last computed token and the block of the new one
  (the same block, except at the step that crosses a block boundary: two).

How kvsim runs it: decoding and hits as in align (the same ``held_run``, ``skipped_blocks``,
``longest_cache_hit``); a prompt's chunks are the engine's per-request prefill budget from the hit's
end, uncut; from admission to its first decoded token it holds what vLLM holds at its last chunk
(:meth:`MambaGroup.last_chunk_run`: from the block of the state that chunk reads to the block of the
last token, one block per block of tokens, no null block between), over the plain
:class:`~policies.hybrid.block_tables.GroupBlockTables`; a hit's state the prefill moves past is given
back at admission, and the blocks of the earlier chunks are taken, cached and given back in block
order as their chunks are scheduled (as a sliding window's, ``GroupBlockTables._pass_through``), so
that every full block of the prompt is a cached state and a later prompt may hit at any block
boundary full attention serves.

Not modelled: a chunk shorter than the budget because the step's budget is shared with other
requests (align: vLLM's chunk ends, and so the intermediate states it caches, then differ; the state
at the prompt's last whole block is cached either way; all: the same states are cached, the blocks
held at the last chunk differ); a preempted request's recompute, which vLLM does not align
(``_mamba_block_aligned_split`` only aligns requests with no output yet) and kvsim aligns as a new
prompt; in all mode, an earlier chunk holding more blocks at once than the last (a budget's worth
and the state it reads: kvsim checks room for the last chunk's, as for a sliding window's prompt);
speculative decoding's extra state blocks (refused with hybrid groups).
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import PolicyInputError, PoolSpec
from policies.hybrid.block_pool import SharedBlockPool
from policies.hybrid.block_tables import CachedSequence, GroupBlockTables
from policies.hybrid.group import NEVER, GroupManager, GroupSequence, ceil_div
from policies.hybrid.prefix_pool import NO_BLOCK, PrefixCachingBlockPool
from token_content import TokenContent, content_length

MAMBA_CACHE_MODES = ("none", "align", "all")
"""vLLM's ``mamba_cache_mode`` values (``none``: no prefix caching)."""

ALIGN_NEEDS_A_BLOCK = (
    "vLLM's mamba_cache_mode 'align' cuts every prefill chunk down to whole blocks, so a prefill budget "
    "smaller than a block never schedules a prompt past its first block"
)


class StateBlockTables(GroupBlockTables):
    """A Mamba group's block tables: a sequence's held positions may have null blocks between them
    (the two states of a prefill), so every walk over a run skips them."""

    def take_states(self, key: int, hit: int, passed: Sequence[int], held: Sequence[int]) -> None:
        """A prompt's states after its hit (held since :meth:`hold_hit`): the hit's state given back
        when the prefill moved past it, the states of earlier chunk ends at ``passed`` taken from the
        queue's head, cached and given back, then new blocks at the ``held`` positions that have
        none; the full ones cached. (The caller checked that the pool holds them.)"""
        record = self.by_seq[key]
        pool = self.pool
        done = len(record.chains)
        if self.defers_keys:
            record.keyed_end = hit  # (the hit's state is cached already)
        self._extend_chains(record)
        table = record.table
        if hit and table[hit - 1] != NO_BLOCK and (hit - 1) not in held:
            self._release(table[hit - 1])
            table[hit - 1] = NO_BLOCK
        self._wait_to_pass(record, [position for position in passed if self.admits(record, position)])
        for position in held:
            if table[position] == NO_BLOCK:
                (table[position],) = pool.take_blocks(1, f"admitting into the {self.kind} group")
        self._cache_held(record, done)

    def cache_passed(self, block: int, chain: int, position: int) -> None:
        """The state an earlier chunk wrote at ``position``: a cached state."""
        self.cache_state(block, chain, position)

    def admits(self, record: CachedSequence, position: int) -> bool:
        """Whether the state at the end of block ``position`` enters the cache (align: every one a
        prefill chunk or a decode step writes; ``policies/hybrid/marconi.py`` chooses)."""
        return True

    def cache_state(self, block: int, chain: int, position: int) -> None:
        """``block``, the state after blocks ``0..position``, cached under ``chain``."""
        self.pool.cache_block(self.group, block, chain)

    def release_skipped(self, key: int, first_block: int, end_block: int, first: int) -> None:
        table = self.by_seq[key].table
        for position in range(min(first, end_block) - 1, first_block - 1, -1):
            if table[position] != NO_BLOCK:
                self._release(table[position])
                table[position] = NO_BLOCK

    def free(self, key: int, first_block: int, end_block: int) -> None:
        record = self._forget(key)
        for position in range(end_block - 1, first_block - 1, -1):
            if record.table[position] != NO_BLOCK:
                self._release(record.table[position])
        self.pool.chains.release_each(record.chains)


class MambaGroup(GroupManager):
    kind = "mamba"

    def __init__(
        self,
        pool: PoolSpec,
        shared_pool: SharedBlockPool,
        prefill_tokens: int,
        cache_mode: str | None = None,
    ):
        """``cache_mode``: vLLM's ``mamba_cache_mode``, "none" over a pool without prefix caching,
        "align" or "all" over one that caches them (None: "none" or "align", by the pool)."""
        super().__init__(pool, shared_pool, prefill_tokens)
        self._splitting = 0  # (the chunk end :meth:`branch_blocks` adds, while a prompt's run is held)
        self._splits: dict[int, int] = {}  # sequence id -> that chunk end, until its states are taken
        tables = self.tables
        if cache_mode is None:
            cache_mode = "none" if tables is None else "align"
        if cache_mode not in MAMBA_CACHE_MODES or (cache_mode == "none") != (tables is None):
            raise PolicyInputError(
                f"Mamba group: mamba_cache_mode {cache_mode!r} over a pool "
                f"{'without' if tables is None else 'with'} prefix caching (vLLM runs 'none' without, "
                "'align' or 'all' with)"
            )
        self.cache_mode = cache_mode
        # "all": a state at every block boundary; a prompt holds a block per block of its last chunk.
        self.every_boundary = cache_mode == "all"
        if tables is not None and not self.every_boundary:
            if prefill_tokens < self.block_size <= pool.max_model_len:
                raise PolicyInputError(
                    f"a Mamba group caching prefixes needs a prefill budget of at least a block "
                    f"({prefill_tokens} < {self.block_size} tokens): {ALIGN_NEEDS_A_BLOCK}"
                )
            assert isinstance(shared_pool, PrefixCachingBlockPool)
            self.tables = self.state_tables(shared_pool, tables.group)

    def state_tables(self, pool: PrefixCachingBlockPool, group: int) -> StateBlockTables:
        """The group's block tables over ``pool`` (Marconi's choose which states are cached)."""
        return StateBlockTables(pool, group, self.block_size, self.kind)

    # -- which blocks a sequence holds ---------------------------------------------------------------
    def held_run(self, num_tokens: int) -> tuple[int, int]:
        if self.tables is None:
            return 0, 1
        # The block of the last token and, at the step that crossed into it, the one before.
        return max(0, (num_tokens - 2) // self.block_size), ceil_div(num_tokens, self.block_size)

    def releases_while_decoding(self) -> bool:
        return self.tables is not None

    def next_release(self, seq: GroupSequence) -> int:
        if self.tables is None:
            return NEVER
        return (seq.first_block + 1) * self.block_size + 2

    def takes_blocks_as_it_grows(self) -> bool:
        """Caching prefixes, a decode step that crosses a block boundary writes its state into a new
        block (the one before is given back at the next step); without, the one state block stays."""
        return self.tables is not None

    def last_chunk_run(self, prompt_len: int, hit: int) -> tuple[int, int]:
        """All mode: the blocks a prompt of ``prompt_len`` tokens holds at its last prefill chunk after
        a hit of ``hit`` blocks. Its chunks are the prefill budget from the hit's end, uncut; the last
        one reads the state at its start (the block of the token before it) and writes one into
        every block up to the block of the prompt's last token."""
        block = self.block_size
        start = hit * block
        start += (prompt_len - start - 1) // self.prefill_tokens * self.prefill_tokens
        return (start - 1) // block if start else 0, ceil_div(prompt_len, block)

    def prefill_states(self, prompt_len: int, hit: int, split: int = 0) -> tuple[list[int], list[int]]:
        """``(passed, held)``: the block positions of the states a prompt of ``prompt_len`` tokens
        computes after a hit of ``hit`` blocks that are cached and given back during its prefill, and
        those it holds at its last chunk (the hit's, when it is one of the last two). A state's
        position is its chunk end's block, ``cdiv(end, block) - 1``. ``split`` (blocks, 0: none): a
        chunk also ends there (:meth:`branch_blocks`)."""
        block = self.block_size
        last_whole = prompt_len - prompt_len % block
        points = [hit - 1] if hit else []
        start = hit * block
        while start < prompt_len:
            end = min(start + self.prefill_tokens, prompt_len)
            if end < last_whole:
                end = start + (end - start) // block * block
            elif start < last_whole < end:
                end = last_whole
            if start < split * block < end:
                end = split * block
            points.append(ceil_div(end, block) - 1)
            start = end
        held = points[-2:]
        passed = points[1:-2] if hit else points[:-2]
        return passed, held

    def branch_blocks(self, prompt: TokenContent, namespace: int, hit: int) -> int:
        """Blocks after which a prompt admitted with a hit of ``hit`` blocks ends a prefill chunk of
        its own accord, 0 for none (align mode: none; Marconi's branch point)."""
        return 0

    def _cached_prefill_run(self, prompt_len: int, hit: int) -> tuple[int, int]:
        if self.tables is None:
            return super()._cached_prefill_run(prompt_len, hit)
        if self.every_boundary:
            return self.last_chunk_run(prompt_len, hit)
        held = self.prefill_states(prompt_len, hit, self._splitting)[1]
        return held[0], held[-1] + 1

    def hold_cached_prefix(
        self,
        seq_id: int,
        prompt: TokenContent,
        final_len: int,
        output_content_id: int,
        namespace: int,
        cached_tokens: int,
    ) -> None:
        split = self.branch_blocks(prompt, namespace, cached_tokens // self.block_size)
        self._splitting = split
        super().hold_cached_prefix(seq_id, prompt, final_len, output_content_id, namespace, cached_tokens)
        self._splitting = 0
        if split:
            self._splits[seq_id] = split

    def held_block_count(self, seq_id: int) -> int:
        return 1 if self.tables is None else self._held(self._get(seq_id))

    def _held(self, seq: GroupSequence) -> int:
        return self._held_in(seq.first_block, seq.end_block)

    def _held_in(self, first: int, end: int) -> int:
        """The blocks a run ``[first, end)`` holds: in align mode its ends (null blocks between them);
        in all mode every one."""
        span = end - first
        return span if span < 2 or self.every_boundary else 2

    # -- prefix caching ---------------------------------------------------------------------------
    def skipped_blocks(self, num_tokens: int) -> int:
        # vLLM MambaManager.get_num_skipped_tokens: every token's state but the last one's.
        return max(0, num_tokens - 1) // self.block_size

    def longest_cache_hit(self, chains: list[int], max_blocks: int) -> int:
        """vLLM ``MambaManager.find_longest_cache_hit``: the right-most cached state within the
        prefix (the blocks before it are null)."""
        tables = self.tables
        assert tables is not None
        for position in range(min(max_blocks, len(chains)) - 1, -1, -1):
            if tables.is_cached(chains[position]):
                return position + 1
        return 0

    def slots_needed_to_admit_cached(self, prompt: TokenContent, namespace: int, cached_tokens: int) -> int:
        """New blocks for the states held at the last chunk, and the hit's state when it is one of them
        and free (it leaves the queue: vLLM's ``get_num_blocks_to_allocate`` counts it). All mode: a
        run of blocks, counted as every group's (the hit's state counted when it is free)."""
        tables = self.tables
        if tables is None or self.every_boundary:
            return super().slots_needed_to_admit_cached(prompt, namespace, cached_tokens)
        hit = cached_tokens // self.block_size
        held = self.prefill_states(content_length(prompt), hit, self.branch_blocks(prompt, namespace, hit))[1]
        needed = len(held)
        if hit and hit - 1 in held:
            chains = tables.prompt_chains(prompt, namespace, hit)
            pool = tables.pool
            shared = pool.ref_count[pool.cached_block(tables.group, chains[hit - 1])] > 0
            needed -= 1 if shared else 0
        return needed * self.block_size

    def take_admission_blocks(self, seq_id: int) -> int:
        tables = self.tables
        if not isinstance(tables, StateBlockTables):
            return super().take_admission_blocks(seq_id)
        hit = self._admitting.pop(seq_id)
        seq = self.sequences[seq_id]
        passed, held = self.prefill_states(seq.num_tokens, hit, self._splits.pop(seq_id, 0))
        tables.take_states(id(seq), hit, passed, held)
        self._account(seq, 1)
        cached_tokens = hit * self.block_size
        self.stats.prefix_cache_queries += seq.num_tokens
        self.stats.prefix_cache_hits += cached_tokens
        return cached_tokens

    # -- accounting: a held block is a state, used whole ---------------------------------------------
    def _room(self, seq: GroupSequence) -> int:
        if self.tables is None:
            return seq.final_len - seq.num_tokens
        return super()._room(seq)

    def _account(self, seq: GroupSequence, sign: int) -> None:
        held = 1 if self.tables is None else self._held(seq)
        self._used += sign * held * self.block_size
        self._held_blocks += sign * held

    def _account_growth(self, seq: GroupSequence, tokens: int, first: int, end: int) -> None:
        """Without prefix caching a growth leaves the state as it is: one block, used."""
        if self.tables is None:
            return
        change = self._held_in(first, end) - self._held(seq)
        self._used += change * self.block_size
        self._held_blocks += change
