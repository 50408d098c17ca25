"""A Mamba or linear-attention group (vLLM's ``MambaManager``): a block holds one request's state
(conv + SSM) whatever its length. The state is live memory: a held block counts as used.

**Without prefix caching** (vLLM's ``mamba_cache_mode: none``): one block per request, from admission
to its end.

**With prefix caching over a** :class:`~policies.hybrid.prefix_pool.PrefixCachingBlockPool`
(vLLM's ``mamba_cache_mode: align``, what vLLM runs with prefix caching for a model whose Mamba layers
do not support "all", Qwen3-Next among them, or when asked for it). What vLLM does, read in
``vllm-project/vllm``:

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
earlier chunk ends are taken, cached and given back there and then, in order (vLLM frees each at the
chunk after it); a hit's state that the prefill moves past is given back likewise.

Not modelled: a chunk shorter than the budget because the step's budget is shared with other
requests (vLLM's chunk ends, and so the intermediate states it caches, then differ; the state at the
prompt's last whole block is cached either way); a preempted request's recompute, which vLLM does not
align (``_mamba_block_aligned_split`` only aligns requests with no output yet) and kvsim aligns as a
new prompt; speculative decoding's extra state blocks (refused with hybrid groups); ``mamba_cache_mode:
all`` (a state at every block boundary of a prefill, Mamba2-style kernels' chunked states: refused).
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import PolicyInputError, PoolSpec
from policies.hybrid.block_pool import SharedBlockPool
from policies.hybrid.block_tables import CachedSequence, GroupBlockTables
from policies.hybrid.group import NEVER, GroupManager, GroupSequence, ceil_div
from policies.hybrid.prefix_pool import NO_BLOCK, PrefixCachingBlockPool
from token_content import TokenContent, content_length

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
        self._extend_chains(record)
        table, chains = record.table, record.chains
        if hit and table[hit - 1] != NO_BLOCK and (hit - 1) not in held:
            self._release(table[hit - 1])
            table[hit - 1] = NO_BLOCK
        for position in passed:
            if not self.admits(record, position):
                continue
            (block,) = pool.take_blocks(1, f"prefilling in the {self.kind} group")
            self.cache_state(block, chains[position], position)
            pool.release(block)
        for position in held:
            if table[position] == NO_BLOCK:
                (table[position],) = pool.take_blocks(1, f"admitting into the {self.kind} group")
        self._cache_held(record, done)

    def admits(self, record: CachedSequence, position: int) -> bool:
        """Whether the state at the end of block ``position`` enters the cache (align: every one a
        prefill chunk or a decode step writes; ``policies/hybrid/marconi.py`` chooses)."""
        return True

    def cache_state(self, block: int, chain: int, position: int) -> None:
        """``block``, the state after blocks ``0..position``, cached under ``chain``."""
        self.pool.cache_block(self.group, block, chain)

    def released_by(self, key: int, first_block: int, end_block: int, first: int) -> list[int]:
        table = self.by_seq[key].table
        return [
            table[position]
            for position in range(min(first, end_block) - 1, first_block - 1, -1)
            if table[position] != NO_BLOCK
        ]

    def release_skipped(self, key: int, first_block: int, end_block: int, first: int) -> None:
        table = self.by_seq[key].table
        for position in range(min(first, end_block) - 1, first_block - 1, -1):
            if table[position] != NO_BLOCK:
                self._release(table[position])
                table[position] = NO_BLOCK

    def free(self, key: int, first_block: int, end_block: int) -> None:
        record = self.by_seq.pop(key)
        for position in range(end_block - 1, first_block - 1, -1):
            if record.table[position] != NO_BLOCK:
                self._release(record.table[position])
        self.pool.chains.release_each(record.chains)


class MambaGroup(GroupManager):
    kind = "mamba"

    def __init__(self, pool: PoolSpec, shared_pool: SharedBlockPool, prefill_tokens: int):
        super().__init__(pool, shared_pool, prefill_tokens)
        self._splitting = 0  # (the chunk end :meth:`branch_blocks` adds, while a prompt's run is held)
        self._splits: dict[int, int] = {}  # sequence id -> that chunk end, until its states are taken
        tables = self.tables
        if tables is not None:
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

    def next_release(self, seq: GroupSequence) -> int:
        if self.tables is None:
            return NEVER
        return (seq.first_block + 1) * self.block_size + 2

    def takes_blocks_as_it_grows(self) -> bool:
        """Caching prefixes, a decode step that crosses a block boundary writes its state into a new
        block (the one before is given back at the next step); without, the one state block stays."""
        return self.tables is not None

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
        """The blocks a sequence holds: the ends of its run (null blocks between them)."""
        span = seq.end_block - seq.first_block
        return span if span < 2 else 2

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
        and free (it leaves the queue: vLLM's ``get_num_blocks_to_allocate`` counts it)."""
        tables = self.tables
        if tables is None:
            return self.slots_needed_to_admit(prompt)
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
        span = end - first
        change = (span if span < 2 else 2) - self._held(seq)
        self._used += change * self.block_size
        self._held_blocks += change
