"""Marconi's admission and eviction of Mamba states, as an option of ``vllm-hybrid``'s align mode.

Marconi: Prefix Caching for the Era of Hybrid LLMs. Rui Pan, Zhuang Wang, Zhen Jia, Can Karakus,
Luca Zancato, Tri Dao, Yida Wang, Ravi Netravali. MLSys 2025, arXiv:2411.19379. The authors' code,
``ruipeterpan/marconi`` (commit 0801661), read for what the paper leaves open: ``radix_cache_hybrid.py``
(``insert``, ``match_prefix``, ``evict_v2``, ``_evict_intermediate_node``), ``utils.py``
(``get_attn_flops``, ``get_mamba1_flops``, ``get_flops_efficiency``, ``_normalize``),
``config_tuner.py`` (the search for alpha). Nothing is copied from it.

What Marconi does. A hybrid model's SSM state is rewritten in place, so a prefix hit needs the state
at exactly the hit's end, and caching one at every block boundary (what vLLM's align mode does at its
chunk ends and decode block boundaries) fills memory with states that are rarely reused. Marconi keeps
every sequence in one radix tree (KV and SSM states) and:

* **admits** (speculative insertion) an SSM state only where reuse is likely: (a) *purely input*:
  where a new prompt's insertion splits an edge of the tree, i.e. at the end of the prefix it shares
  with sequences seen before (a system prompt, a few-shot preamble), that state is checkpointed during
  the prefill; (b) *input and output*: the state after a sequence's last decoded token, for the next
  turn of a conversation. No other state is kept.
* **evicts** the entry of least utility ``S(n) = recency(n) + alpha x flop_efficiency(n)``, both
  min-max normalised over the candidates (all equal: 1 each). ``recency = 1 / (now - last access)``
  on a logical clock; ``flop_efficiency`` = the FLOPs a hit on the entry saves per byte the entry
  holds (the prefix's SSM states and KV), with attention's FLOPs quadratic in the prefix and SSM and
  MLP layers' linear, so long prefixes are kept against short ones that recency alone would keep.
  Candidates are the tree's nodes with at most one child (a leaf goes with its KV; a node with one
  child loses its SSM state only and merges into it). ``alpha`` starts at 0 (LRU) and is tuned once:
  after the first eviction Marconi records 5x as many requests as the cache held until then, replays
  them from a snapshot for each alpha of 0, 0.1, ..., 2.0 and keeps the one that saved the most FLOPs.

What kvsim models, over vLLM's block pool (``policies/hybrid/mamba.py``: a state is one block,
cached under the identity of the block of tokens it ends; the attention groups' blocks cached as vLLM
caches them):

* **Admission**: of the states align mode writes (it still writes each chunk end and decode block
  boundary: a running sequence needs them), a Mamba group caches only (a) the state at the end of the
  prompt's prefix shared with any block the pool holds (``branch_blocks``: the prompt's leading blocks
  whose content chain some block holds, cached or in use, when they reach past the hit), the prefill
  ending a chunk there so that the state is computed; (b) the state at the last block boundary the
  sequence reaches (``final_len // block``: the state after its last decoded token, as block-aligned
  states can hold it). A state not admitted goes back blank (a chunk-end state of an earlier chunk
  takes no block at all). A fork child's own last boundary is admitted; a preempted sequence is
  admitted again when it is readmitted.
* **Eviction**: the pool's free queue stays vLLM's LRU over every group's cached blocks; when the
  block it would evict is a Marconi group's state, the group's evictor takes instead its free cached
  state of least utility (:class:`MarconiEvictor`; ties: the least recently released, then the lower
  block id). An entry is a state at ``d`` blocks: it saves ``F(d x block)`` FLOPs, the prefill of the
  whole prefix (``MarconiCosts``: the FLOPs kvsim's roofline costs a prompt with, from the model's
  description: ``2 x active parameters`` per token, the state layers' scan, ``6`` FLOPs per state
  element per token, and attention's ``4 x layers x width x L^2 / 2``), and holds the state blocks
  of the prefix in every Mamba group and its ``d`` KV blocks in every attention group (the bytes a
  block holds are the same in every group, so blocks are the bytes' measure). Recency is the pool's
  logical clock: a tick per block released into the cache; a state's stamp is when it was last
  released (a hit takes it out of the candidates until released again).
* **alpha**: the option ``marconi_alpha``, default :data:`DEFAULT_ALPHA`, 0: the paper's value until
  its tuning runs (LRU among the states), and the value its tuning picks on kvsim's Qwen3-Next
  streams: in pools small enough to evict (3, 4, 6 GB on the multi-turn example, 8 GB on shared
  system prompts) the hit rate falls as alpha grows (0: 65 / 70 / 76 / 56 %; 0.2: 40 / - / 49 / 43 %;
  1: 38 / 42 / 51 / 40 %; 2: 34 / 42 / 45 / 37 %). ``1 / (now - stamp)`` normalised leaves every
  candidate but the latest few near 0, so with alpha > 0 the ranking is FLOP efficiency's: the long
  prefixes of conversations that have ended stay, the short states of the shared system prompts and
  of live conversations go. The paper's retrospective tuning is not modelled: it replays a window of
  requests 21 times from a snapshot of the cache, which an allocator inside a running simulation
  cannot do; run the grid as variants instead.

Not modelled: the radix tree's node granularity (kvsim's states and prefixes are whole blocks: a
branch point inside a block is the block before it); evicting a leaf's KV together with its state
(the attention groups' blocks keep vLLM's LRU order, the eviction policy chooses among states only);
the paper's protection of nodes with two or more children (every free cached state is a candidate);
savings counted from a node's parent (the whole prefix's FLOPs are counted: the paper's
``get_flops_efficiency``); a server that does not know a request's final length would hold the last
boundary state until the end (one more block per decoding request), kvsim decides at the boundary.

Why an option of ``vllm-hybrid`` (``options: {mamba_prefix_policy: marconi}``) rather than a policy
of its own: Marconi changes which of the states align mode writes are kept and which are evicted, on
the same block pool, groups, chunking and hit rule; the option is validated next to
``mamba_cache_mode`` (``sim/kv/allocators.py``: it needs that mode to be ``align``, so a model with
Mamba layers and prefix caching on, and one whose layers vLLM runs in ``all`` by default, Nemotron-H,
with ``mamba_cache_mode: align`` set), and the same stream replays under both with one key changed.
"""

from __future__ import annotations

from policies.base import ChildSpec, PolicyInputError, PoolSpec
from policies.hybrid.block_pool import SharedBlockPool
from policies.hybrid.block_tables import CachedSequence
from policies.hybrid.mamba import MambaGroup, StateBlockTables
from policies.hybrid.prefix_pool import NO_BLOCK, PrefixCachingBlockPool
from token_content import TokenContent, content_length

DEFAULT_ALPHA = 0.0
"""Marconi's weight of FLOP efficiency against recency when not set: the paper's before its tuning
(which searches 0, 0.1, ..., 2), and what that tuning picks on kvsim's example streams."""


class MarconiCosts:
    """What a hit on a cached prefix saves and what the prefix holds, from the model's description:
    ``flops(L) = token_flops x L + pair_flops x L^2 / 2`` (kvsim's roofline prefill of ``L`` tokens from
    the start), held in ``state_groups + attention_groups x blocks`` blocks of the pool."""

    def __init__(
        self, token_flops: float, pair_flops: float, state_groups: int, attention_groups: int, block_size: int
    ) -> None:
        if token_flops < 0 or pair_flops < 0 or state_groups < 1 or block_size < 1:
            raise PolicyInputError(
                f"Marconi's costs need FLOPs >= 0, a state group and a block: got {token_flops}, "
                f"{pair_flops}, {state_groups} state groups, block {block_size}"
            )
        self.token_flops = token_flops
        self.pair_flops = pair_flops
        self.state_groups = state_groups
        self.attention_groups = attention_groups
        self.block_size = block_size

    def flops(self, tokens: int) -> float:
        """FLOPs a prefill of ``tokens`` tokens from the start costs: what a hit on them saves."""
        return self.token_flops * tokens + self.pair_flops * tokens * tokens / 2.0

    def blocks(self, blocks: int) -> int:
        """Pool blocks a cached prefix of ``blocks`` blocks holds: a state in every Mamba group, its
        KV in every attention group."""
        return self.state_groups + self.attention_groups * blocks

    def efficiency(self, blocks: int) -> float:
        """FLOPs saved per block held (Marconi's FLOP efficiency, per block rather than per byte)."""
        return self.flops(blocks * self.block_size) / self.blocks(blocks)


def normalized(values: list[float]) -> list[float]:
    """Min-max normalisation (the paper's): 1 for each when fewer than two or all equal."""
    if len(values) > 1:
        low, high = min(values), max(values)
        if low != high:
            return [(value - low) / (high - low) for value in values]
    return [1.0] * len(values)


class MarconiEvictor:
    """One Mamba group's free cached states and the choice among them: ``stamp`` (block -> when it was
    last released into the cache) for the candidates, ``depth`` (block -> the blocks of the prefix it
    ends) for every state block with an identity."""

    def __init__(self, costs: MarconiCosts, alpha: float = DEFAULT_ALPHA) -> None:
        if not alpha >= 0.0:
            raise PolicyInputError(f"Marconi's alpha must be >= 0, got {alpha!r}")
        self.costs = costs
        self.alpha = alpha
        self.stamp: dict[int, int] = {}
        self.depth: dict[int, int] = {}

    def utilities(self, now: int) -> dict[int, float]:
        """Each candidate's ``S = recency + alpha x flop_efficiency``, both normalised (higher: kept)."""
        blocks = list(self.stamp)
        recency = normalized([1.0 / (now - self.stamp[block]) for block in blocks])
        efficiency = normalized([self.costs.efficiency(self.depth[block]) for block in blocks])
        alpha = self.alpha
        return {block: recency[i] + alpha * efficiency[i] for i, block in enumerate(blocks)}

    def victim(self, now: int) -> int:
        """The candidate of least utility (ties: the oldest stamp, then the lower block id)."""
        scores = self.utilities(now)
        stamp = self.stamp
        best = NO_BLOCK
        for block, score in scores.items():
            if best == NO_BLOCK:
                best = block
                continue
            key = (score, stamp[block], block)
            if key < (scores[best], stamp[best], best):
                best = block
        return best


class MarconiBlockPool(PrefixCachingBlockPool):
    """vLLM's block pool whose eviction of a governed group's state asks that group's evictor which
    state goes (:meth:`take_blocks`); ``clock`` ticks once per block released into the cache."""

    def __init__(self, num_blocks: int, block_size: int, pool_slots: int | None = None):
        super().__init__(num_blocks, block_size, pool_slots)
        self.clock = 0
        self.evictors: list[MarconiEvictor | None] = []

    def govern(self, group: int, evictor: MarconiEvictor) -> None:
        while len(self.evictors) <= group:
            self.evictors.append(None)
        self.evictors[group] = evictor

    def _evictor(self, group: int) -> MarconiEvictor | None:
        return self.evictors[group] if 0 <= group < len(self.evictors) else None

    def take_blocks(self, count: int, what: str) -> list[int]:
        """As vLLM's pool: blank blocks first, then the cached ones at the queue's head, except that
        a governed group's state there is replaced by that group's victim."""
        queue = self.queue
        if count <= queue.blank or count > self.free_blocks:
            return super().take_blocks(count, what)
        blocks: list[int] = []
        for _ in range(count):
            if queue.blank:
                (block,) = queue.take(1)
            else:
                head = queue.oldest_cached()
                evictor = self._evictor(self.block_group[head])
                block = head if evictor is None else evictor.victim(self.clock + 1)
                if block == head:
                    queue.take(1)
                else:
                    queue.remove_cached(block)
                self._evict(block)
            self.ref_count[block] = 1
            blocks.append(block)
        self.free_blocks -= count
        return blocks

    def _evict(self, block: int) -> None:
        evictor = self._evictor(self.block_group[block])
        if evictor is not None:
            del evictor.stamp[block]
            del evictor.depth[block]
        super()._evict(block)

    def touch(self, block: int) -> bool:
        if self.ref_count[block] == 0:
            evictor = self._evictor(self.block_group[block])
            if evictor is not None:
                del evictor.stamp[block]
        return super().touch(block)

    def release_each(self, blocks: list[int]) -> bool:
        return self.release_one_by_one(blocks)  # (each release does more here)

    def release(self, block: int) -> bool:
        held = super().release(block)
        if not held and self.block_chain[block] != NO_BLOCK:
            self.clock += 1
            evictor = self._evictor(self.block_group[block])
            if evictor is not None:
                evictor.stamp[block] = self.clock
        return held


class MarconiStateTables(StateBlockTables):
    """A Mamba group's block tables caching only the states Marconi admits: per sequence (keyed by
    its record), the position of its branch-point state and of its last block boundary's."""

    def __init__(
        self, pool: PrefixCachingBlockPool, group: int, block_size: int, kind: str, evictor: MarconiEvictor
    ):
        super().__init__(pool, group, block_size, kind)
        self.evictor = evictor
        self.kept: dict[int, tuple[int, int]] = {}  # id(record) -> (branch position, last boundary's)

    def keep(self, key: int, branch: int, last: int) -> None:
        self.kept[id(self.by_seq[key])] = (branch, last)

    def admits(self, record: CachedSequence, position: int) -> bool:
        branch, last = self.kept[id(record)]
        return position in (branch, last)

    def cache_state(self, block: int, chain: int, position: int) -> None:
        self.pool.cache_block(self.group, block, chain)
        self.evictor.depth[block] = position + 1

    def _cache_held(self, record: CachedSequence, done: int) -> None:
        pool = self.pool
        table = record.table
        for position in range(done, self.key_end(record)):
            block = table[position]
            if block != NO_BLOCK and not pool.has_identity(block) and self.admits(record, position):
                self.cache_state(block, record.chains[position], position)

    def free(self, key: int, first_block: int, end_block: int) -> None:
        del self.kept[id(self.by_seq[key])]
        super().free(key, first_block, end_block)

    def fork(
        self, parent_key: int, child_key: int, child: ChildSpec, first_block: int, end_block: int
    ) -> None:
        super().fork(parent_key, child_key, child, first_block, end_block)
        self.keep(child_key, NO_BLOCK, child.final_len // self.block_size - 1)


class MarconiMambaGroup(MambaGroup):
    """A Mamba group in align mode whose cached states Marconi admits and evicts."""

    def __init__(
        self, pool: PoolSpec, shared_pool: SharedBlockPool, prefill_tokens: int, evictor: MarconiEvictor
    ):
        self.evictor = evictor
        super().__init__(pool, shared_pool, prefill_tokens)
        tables = self.tables
        if not isinstance(tables, MarconiStateTables) or not isinstance(shared_pool, MarconiBlockPool):
            raise PolicyInputError(
                "Marconi's Mamba group needs a prefix-caching pool with Marconi's eviction (MarconiBlockPool)"
            )
        shared_pool.govern(tables.group, evictor)

    def state_tables(self, pool: PrefixCachingBlockPool, group: int) -> StateBlockTables:
        return MarconiStateTables(pool, group, self.block_size, self.kind, self.evictor)

    def branch_blocks(self, prompt: TokenContent, namespace: int, hit: int) -> int:
        """The prompt's leading blocks whose content some block of the pool holds (the prefix it
        shares with sequences seen before, cached or running), when they reach past the hit: the
        branch point where Marconi checkpoints a state; else 0."""
        tables = self.tables
        assert tables is not None
        max_blocks = (content_length(prompt) - 1) // self.block_size
        shared = len(tables.prompt_chains(prompt, namespace, max_blocks))
        return shared if shared > hit else 0

    def hold_cached_prefix(
        self,
        seq_id: int,
        prompt: TokenContent,
        final_len: int,
        output_content_id: int,
        namespace: int,
        cached_tokens: int,
    ) -> None:
        super().hold_cached_prefix(seq_id, prompt, final_len, output_content_id, namespace, cached_tokens)
        tables = self.tables
        assert isinstance(tables, MarconiStateTables)
        branch = self._splits.get(seq_id, 0)
        tables.keep(id(self.sequences[seq_id]), branch - 1, final_len // self.block_size - 1)
