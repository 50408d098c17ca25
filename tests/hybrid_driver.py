"""Random operations on a hybrid allocator's KV groups behind their coordinator, every invariant checked
after every one: the driver of ``make fuzz``'s hybrid variants (``tests/fuzz.py``) and of the fast
test below it in ``tests/test_hybrid_groups.py``.

Invariants (issue 39: "the accounting identity holds per group under 10^6 fuzzed operations"):

- the pool is whole: the breakdown sums to the pool's slots, every category of every entry (each
  group, each shared pool's free slots) is non-negative, and per category the entries add up to the
  pool-wide breakdown;
- each group's part is what its sequences hold: used + reserved + internal fragmentation of a group is
  its held blocks' slots, and the shared pools' held blocks are the groups' held blocks;
- every live sequence is in every group, at the same length;
- a refused operation (``OutOfKVMemory``) changes nothing.

With prefix caching (``vllm-hybrid-prefix``, ``vllm-hybrid-prefix-mamba`` with a Mamba group's states,
``vllm-hybrid-prefix-mamba-all`` with a state at every block boundary (vLLM's ``mamba_cache_mode:
all``), ``vllm-hybrid-prefix-marconi`` with Marconi's choice of them:
blocks with identities, ``policies/hybrid/prefix_pool.py``),
a group's part counts a block several sequences hold once and adds its cached blocks; the pool's free
queue is its blank and cached blocks; and the common prefix hit of every probe prompt is one that every
group serves: each group holds, cached, every block of it that its kind attends to. Jenga's
layouts (``jenga-pages``; ``jenga-prefix`` with its prefix cache) are checked by their own identity
(tests/test_jenga.py, tests/test_jenga_prefix.py), the latter's common hit as above.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from policies.base import ALL_PUBLISHED, ChildSpec, OutOfKVMemory, PolicyInputError, PoolSpec
from policies.hybrid.block_pool import SharedBlockPool
from policies.hybrid.block_tables import NO_BLOCK
from policies.hybrid.chunked_local import ChunkedLocalGroup
from policies.hybrid.full import FullAttentionGroup
from policies.hybrid.group import GroupManager
from policies.hybrid.mamba import MambaGroup
from policies.hybrid.marconi import MarconiBlockPool, MarconiCosts, MarconiEvictor, MarconiMambaGroup
from policies.hybrid.prefix_pool import PrefixCachingBlockPool
from policies.hybrid.sglang_sliding_window import SGLangSlidingWindowGroup
from policies.hybrid.sliding_window import SlidingWindowGroup
from sim.kv.coordinator import KVCoordinator, KVGroup, MultiGroupCoordinator, make_coordinator

BLOCK = 4
CATEGORIES = 6


def vllm_groups(blocks: int = 64, prefill_tokens: int = 24) -> MultiGroupCoordinator:
    """vLLM's hybrid manager over one pool: full, sliding window (8), chunked local (8) and Mamba
    groups; prompts computed 24 tokens a step (chunked prefill's hold)."""
    pool = SharedBlockPool(blocks, BLOCK, pool_slots=blocks * BLOCK + 3)
    spec = PoolSpec(blocks * BLOCK, BLOCK, 4096)
    kv = make_coordinator(
        [
            KVGroup("full", FullAttentionGroup(spec, pool, prefill_tokens)),
            KVGroup("sliding(8)", SlidingWindowGroup(spec, pool, prefill_tokens, window=8)),
            KVGroup("chunked(8)", ChunkedLocalGroup(spec, pool, prefill_tokens, chunk=8)),
            KVGroup("mamba", MambaGroup(spec, pool, prefill_tokens)),
        ]
    )
    assert isinstance(kv, MultiGroupCoordinator)
    return kv


def vllm_prefix_groups(
    blocks: int = 64, prefill_tokens: int = 24, lazy_keys: bool = False
) -> MultiGroupCoordinator:
    """:func:`vllm_groups` with prefix caching: full, sliding window (8) and chunked local (8) groups
    over a pool of blocks with identities (the Mamba group's states: :func:`vllm_prefix_mamba_groups`);
    ``lazy_keys``: blocks past a sequence's first new key keyed only when reached (as vllm-hybrid runs)."""
    pool = PrefixCachingBlockPool(blocks, BLOCK, pool_slots=blocks * BLOCK + 3, lazy_keys=lazy_keys)
    spec = PoolSpec(blocks * BLOCK, BLOCK, 4096)
    kv = make_coordinator(
        [
            KVGroup("full", FullAttentionGroup(spec, pool, prefill_tokens)),
            KVGroup("sliding(8)", SlidingWindowGroup(spec, pool, prefill_tokens, window=8)),
            KVGroup("chunked(8)", ChunkedLocalGroup(spec, pool, prefill_tokens, chunk=8)),
        ]
    )
    assert isinstance(kv, MultiGroupCoordinator)
    return kv


def vllm_prefix_mamba_groups(blocks: int = 64, prefill_tokens: int = 10) -> MultiGroupCoordinator:
    """A Mamba hybrid with prefix caching (vLLM's ``mamba_cache_mode: align``): full, sliding window
    (8) and Mamba groups over a pool of blocks with identities; prompts computed 10 tokens a step, so
    a prompt's chunks end every 8 tokens (2 blocks) and its states there are cached."""
    pool = PrefixCachingBlockPool(blocks, BLOCK, pool_slots=blocks * BLOCK + 3)
    spec = PoolSpec(blocks * BLOCK, BLOCK, 4096)
    kv = make_coordinator(
        [
            KVGroup("full", FullAttentionGroup(spec, pool, prefill_tokens)),
            KVGroup("sliding(8)", SlidingWindowGroup(spec, pool, prefill_tokens, window=8)),
            KVGroup("mamba", MambaGroup(spec, pool, prefill_tokens)),
        ]
    )
    assert isinstance(kv, MultiGroupCoordinator)
    return kv


def vllm_prefix_mamba_all_groups(blocks: int = 64, prefill_tokens: int = 10) -> MultiGroupCoordinator:
    """:func:`vllm_prefix_mamba_groups` in vLLM's ``mamba_cache_mode: all``: a prompt's chunks of 10
    tokens uncut, a state cached at every block boundary, a prompt holding every block of its last
    chunk."""
    pool = PrefixCachingBlockPool(blocks, BLOCK, pool_slots=blocks * BLOCK + 3)
    spec = PoolSpec(blocks * BLOCK, BLOCK, 4096)
    kv = make_coordinator(
        [
            KVGroup("full", FullAttentionGroup(spec, pool, prefill_tokens)),
            KVGroup("sliding(8)", SlidingWindowGroup(spec, pool, prefill_tokens, window=8)),
            KVGroup("mamba", MambaGroup(spec, pool, prefill_tokens, "all")),
        ]
    )
    assert isinstance(kv, MultiGroupCoordinator)
    return kv


def vllm_marconi_mamba_groups(blocks: int = 64, prefill_tokens: int = 10) -> MultiGroupCoordinator:
    """:func:`vllm_prefix_mamba_groups` with Marconi's admission and eviction of the Mamba group's
    states (``mamba_prefix_policy: marconi``, ``policies/hybrid/marconi.py``): a branch point's state
    and each sequence's last boundary's cached, evictions among the states by utility (alpha 1, so that the ranking is exercised)."""
    pool = MarconiBlockPool(blocks, BLOCK, pool_slots=blocks * BLOCK + 3)
    spec = PoolSpec(blocks * BLOCK, BLOCK, 4096)
    evictor = MarconiEvictor(MarconiCosts(10.0, 1.0, 1, 2, BLOCK), alpha=1.0)
    kv = make_coordinator(
        [
            KVGroup("full", FullAttentionGroup(spec, pool, prefill_tokens)),
            KVGroup("sliding(8)", SlidingWindowGroup(spec, pool, prefill_tokens, window=8)),
            KVGroup("mamba", MarconiMambaGroup(spec, pool, prefill_tokens, evictor)),
        ]
    )
    assert isinstance(kv, MultiGroupCoordinator)
    return kv


def sglang_pools(full_tokens: int = 240, swa_tokens: int = 160, page: int = 2) -> MultiGroupCoordinator:
    """SGLang's two pools: a full-attention pool and a sliding-window (6) pool of their own, prompts
    computed in chunks of 20 tokens."""
    full_pool = SharedBlockPool(full_tokens // page, page)
    swa_pool = SharedBlockPool(swa_tokens // page, page)
    full_spec = PoolSpec(full_tokens, page, 4096)
    swa_spec = PoolSpec(swa_tokens, page, 4096)
    kv = make_coordinator(
        [
            KVGroup("full", FullAttentionGroup(full_spec, full_pool, 20)),
            KVGroup("sliding(6)", SGLangSlidingWindowGroup(swa_spec, swa_pool, 20, 6)),
        ]
    )
    assert isinstance(kv, MultiGroupCoordinator)
    return kv


def jenga_capacity(large_pages: int = 40, max_model_len: int = 128):
    """Full attention in 2 layers and an 8-token window in 3 (small pages of 8 and 12 slots, large
    pages of lcm = 24 slots; tests/test_jenga.py's pool, larger)."""
    from sim.hardware.jenga_capacity import JengaCapacity, JengaGroupSpec
    from sim.hardware.layers import FullAttention, SlidingWindow

    groups = (JengaGroupSpec(FullAttention(), 2, 8, 3, 16), JengaGroupSpec(SlidingWindow(8), 3, 12, 2, 6))
    return JengaCapacity("fuzz", max_model_len, 4, 24, groups, large_pages, 1, 24 * large_pages, 24)


def jenga_pages(large_pages: int = 40) -> KVCoordinator:
    """Jenga's two-level allocator over :func:`jenga_capacity`."""
    from sim.kv.jenga import JengaCoordinator

    return JengaCoordinator(jenga_capacity(large_pages), ["full", "sliding(8)"], 24)


def jenga_prefix_pages(large_pages: int = 40, lazy_keys: bool = True) -> KVCoordinator:
    """The same with prefix caching (``sim/kv/jenga_prefix.py``): cached small pages, whole large
    pages evicted first; prompts start with up to 60 shared tokens. ``lazy_keys``: as jenga runs
    (False: the eager reference, tests/test_hybrid_lazy_keys.py)."""
    from sim.kv.jenga_prefix import JengaPrefixCoordinator

    capacity = jenga_capacity(large_pages, max_model_len=192)
    return JengaPrefixCoordinator(capacity, ["full", "sliding(8)"], lazy_keys=lazy_keys)


def jenga_prefix_whole_pages(lazy_keys: bool = True) -> KVCoordinator:
    """Prefix caching over pages that are each a whole large page (gpt-oss's shape)."""
    from sim.hardware.jenga_capacity import JengaCapacity, JengaGroupSpec
    from sim.hardware.layers import FullAttention, SlidingWindow
    from sim.kv.jenga_prefix import JengaPrefixCoordinator

    groups = (JengaGroupSpec(FullAttention(), 2, 8, 1, 32), JengaGroupSpec(SlidingWindow(8), 2, 8, 1, 9))
    capacity = JengaCapacity("fuzz-whole", 192, 4, 8, groups, 60, 1, 8 * 60, 8)
    return JengaPrefixCoordinator(capacity, ["full", "sliding(8)"], lazy_keys=lazy_keys)


def jenga_whole_pages(large_pages: int = 60) -> KVCoordinator:
    """Two types of equal pages (gpt-oss's shape: as many full-attention as 8-token-window layers), so
    each small page is a whole large page, kept by count (``WholeHoldings``)."""
    from sim.hardware.jenga_capacity import JengaCapacity, JengaGroupSpec
    from sim.hardware.layers import FullAttention, SlidingWindow
    from sim.kv.jenga import JengaCoordinator

    groups = (JengaGroupSpec(FullAttention(), 2, 8, 1, 32), JengaGroupSpec(SlidingWindow(8), 2, 8, 1, 9))
    capacity = JengaCapacity("fuzz", 128, 4, 8, groups, large_pages, 1, 8 * large_pages, 8)
    return JengaCoordinator(capacity, ["full", "sliding(8)"], 24)


def sglang_mamba_extra_buffer() -> KVCoordinator:
    """SGLang's Mamba radix cache under the extra-buffer strategy (``sim/kv/sglang_mamba_radix.py``):
    pages of 2 tokens, prefill chunks of 12, states tracked at multiples of 4 in a chunk and of 8
    while decoding; 3 Mamba slots a running request."""
    from sim.kv.sglang_mamba_radix import MambaRadixCoordinator, MambaTracking

    tracking = MambaTracking(2, 4, 8)
    return MambaRadixCoordinator(160, 24, 2, 192, 12, (1, 1), ("full", "mamba2"), tracking=tracking)


def sglang_mamba_no_buffer() -> KVCoordinator:
    """SGLang's Mamba radix cache under its no-buffer strategy: pages of 1 token, prefill chunks of
    12, a state at each chunk's end."""
    from sim.kv.sglang_mamba_radix import MambaRadixCoordinator

    return MambaRadixCoordinator(160, 24, 1, 192, 12, (1, 1), ("full", "mamba2"))


LAYOUTS: dict[str, Callable[[], KVCoordinator]] = {
    "vllm-hybrid-groups": vllm_groups,
    "vllm-hybrid-prefix": vllm_prefix_groups,
    "vllm-hybrid-prefix-lazy": lambda: vllm_prefix_groups(lazy_keys=True),
    "vllm-hybrid-prefix-lazy-deferred": lambda: vllm_prefix_groups(lazy_keys=True),
    "vllm-hybrid-prefix-mamba": vllm_prefix_mamba_groups,
    "vllm-hybrid-prefix-mamba-all": vllm_prefix_mamba_all_groups,
    "vllm-hybrid-prefix-marconi": vllm_marconi_mamba_groups,
    # Prompts' held blocks cached as the engine reports their chunks scheduled (defer_prompt_keys).
    "vllm-hybrid-prefix-deferred": vllm_prefix_groups,
    "vllm-hybrid-prefix-mamba-deferred": vllm_prefix_mamba_groups,
    "vllm-hybrid-prefix-marconi-deferred": vllm_marconi_mamba_groups,
    "sglang-hybrid-pools": sglang_pools,
    "jenga-pages": jenga_pages,
    "jenga-prefix": jenga_prefix_pages,
    "jenga-prefix-deferred": jenga_prefix_pages,
    "jenga-prefix-eager": lambda: jenga_prefix_pages(lazy_keys=False),
    "jenga-prefix-eager-deferred": lambda: jenga_prefix_pages(lazy_keys=False),
    "jenga-prefix-whole": jenga_prefix_whole_pages,
    "jenga-prefix-whole-deferred": jenga_prefix_whole_pages,
    "jenga-prefix-whole-eager": lambda: jenga_prefix_whole_pages(lazy_keys=False),
    "jenga-prefix-whole-eager-deferred": lambda: jenga_prefix_whole_pages(lazy_keys=False),
    "jenga-whole-pages": jenga_whole_pages,
    "sglang-mamba-extra-buffer": sglang_mamba_extra_buffer,
    "sglang-mamba-no-buffer-deferred": sglang_mamba_no_buffer,
    "sglang-mamba-extra-buffer-deferred": sglang_mamba_extra_buffer,
}
SHARED = 1  # the content every prefix-caching prompt starts with, at lengths that vary
PROBES = [((SHARED, length), (2, 3)) for length in (3, 4, 8, 13, 20, 33, 60)]


class HybridDriver:
    """Applies ``(kind, choice, amount)`` operations (``tests/fuzz.py``'s mix) and checks after each."""

    def __init__(self, layout: str):
        self.kv = LAYOUTS[layout]()
        self.jenga = layout.startswith("jenga")
        self.sglang_tree = layout.startswith("sglang-mamba")
        self.caching = layout.startswith(("vllm-hybrid-prefix", "jenga-prefix")) or self.sglang_tree
        self.policy = self.kv  # (what tests/fuzz.py reads its eviction count from)
        # Tokens of each live sequence's prompt reported scheduled (the "-deferred" layouts).
        self.defers = layout.endswith("-deferred")
        if self.defers:
            assert self.kv.defer_prompt_keys()
        self.scheduled: dict[int, int] = {}
        self.names, _ = self.kv.group_entries()
        self.final_len: dict[int, int] = {}
        self.next_id = 1
        self.done: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.check()

    def apply(self, kind: str, choice: int, amount: int) -> None:
        before = self.kv.group_breakdown_values()
        try:
            applied = self._apply(kind, choice, amount)
        except OutOfKVMemory:
            self.failed[kind] += 1
            assert self.kv.group_breakdown_values() == before, f"a refused {kind} changed the pool"
        else:
            if applied:
                self.done[kind] += 1
        self.check()

    def _apply(self, kind: str, choice: int, amount: int) -> bool:
        live = sorted(self.final_len)
        if kind == "admit":
            seq_id, self.next_id = self.next_id, self.next_id + 1
            prompt_len = 1 + amount * 3
            final_len = prompt_len + 1 + choice
            prompt: tuple[tuple[int, int], ...] = ((seq_id, prompt_len),)
            if self.caching:  # a shared start of 0 to 60 tokens, then the request's own
                prompt = ((SHARED, 3 * (choice % 21)), (seq_id, prompt_len))
                final_len += 3 * (choice % 21)
            self.scheduled[seq_id] = self.kv.admit(seq_id, prompt, final_len, 1000 + seq_id)
            self.final_len[seq_id] = final_len
            return True
        if not live:
            return False
        seq_id = live[choice % len(live)]
        if kind == "grow":
            room = self.final_len[seq_id] - self.kv.seq_len(seq_id)
            if room <= 0:
                return False
            self.kv.grow(seq_id, min(room, 1 + amount % 5))
            return True
        if kind == "decode_step":
            growing = [seq for seq in live if self.kv.seq_len(seq) < self.final_len[seq]]
            if not growing:
                return False
            self.kv.grow_each(growing, [1] * len(growing))
            return True
        if kind in ("free", "preempt"):
            self.kv.free(seq_id, finished=kind == "free")
            del self.final_len[seq_id]
            self.scheduled.pop(seq_id, None)
            return True
        if kind == "schedule" and self.defers:
            # The engine reports a chunk: held blocks gain identities, and the blocks earlier chunks
            # passed through are cached (free slots become cached ones), which the coordinator
            # says beforehand (the engine then steps those iterations).
            before = self.kv.group_breakdown_values()
            moves = self.kv.scheduled_chunks_move_slots()
            self.scheduled[seq_id] = self.scheduled.get(seq_id, 0) + 1 + amount
            self.kv.prompt_scheduled(seq_id, self.scheduled[seq_id])
            after = self.kv.group_breakdown_values()
            if not moves:
                assert after == before, "a chunk moved slots where the coordinator said none would"
            held = [value for index, value in enumerate(before) if index % CATEGORIES < 3]
            now_held = [value for index, value in enumerate(after) if index % CATEGORIES < 3]
            if self.sglang_tree:
                # SGLang's Mamba radix cache takes a Mamba slot for the chunk's state, and frees the
                # sequence's own copies of tokens the tree held already: its full pool (the first
                # entry) holds no more than it did.
                assert sum(now_held[:3]) <= sum(held[:3])
            else:
                assert held == now_held
            return True
        if kind == "fork":
            child, self.next_id = self.next_id, self.next_id + 1
            self.kv.fork(seq_id, [ChildSpec(child, self.final_len[seq_id], -child)])
            self.final_len[child] = self.final_len[seq_id]
            return True
        if kind == "match" and self.caching:  # (jenga's lookup changes nothing either)
            self.kv.match(PROBES[choice % len(PROBES)])
            return True
        return False  # evict (and match without a prefix cache): nothing to do

    def drain(self) -> None:
        for seq_id in sorted(self.final_len):
            self.kv.free(seq_id)
        self.final_len.clear()
        self.check()
        used, reserved, internal, external, cached, free = self.kv.breakdown_values()
        # (a pool's slots past its last whole block are external fragmentation, always; with prefix
        # caching, the freed blocks stay cached)
        assert (used, reserved, internal) == (0, 0, 0), "an empty pool holds slots"
        assert cached == 0 or self.caching
        assert external + cached + free == self.kv.pool_slots

    def check(self) -> None:
        kv = self.kv
        total = kv.breakdown_values()
        assert sum(total) == kv.pool_slots, f"breakdown {total} is not the pool's {kv.pool_slots} slots"
        entries = kv.group_breakdown_values()
        assert len(entries) == CATEGORIES * len(self.names)
        assert min(entries) >= 0, (
            f"a negative category: {dict(zip(self.names, _chunks(entries), strict=True))}"
        )
        for category in range(CATEGORIES):
            assert sum(entries[category::CATEGORIES]) == total[category], (
                f"category {category} does not add up"
            )
        # The observer reads what is shared from the breakdown it has read (StateObserver.averaged).
        assert kv.sharing_slots_of(total) == kv.sharing_slots()
        if self.jenga:
            self._check_jenga()
            return
        if self.sglang_tree:
            from tests.test_sglang_mamba import check_tree, pools

            pools(kv)  # type: ignore[arg-type]
            check_tree(kv.tree)  # type: ignore[attr-defined]
            assert sorted(kv.sequences) == sorted(self.final_len)  # type: ignore[attr-defined]
            return
        if self.caching:
            self._check_prefix_caching(entries)
            return
        held_by_groups = 0
        for index, group in enumerate(kv.groups):
            manager = group.policy
            used, reserved, internal = entries[CATEGORIES * index : CATEGORIES * index + 3]
            held = 0
            for seq_id in self.final_len:
                first, end = manager.held_blocks(seq_id)
                assert 0 <= first <= end, (
                    f"group {group.name}: sequence {seq_id} holds blocks [{first}, {end})"
                )
                held += end - first
                try:
                    length = manager.seq_len(seq_id)
                except PolicyInputError:  # pragma: no cover - a live sequence missing from a group
                    raise AssertionError(f"sequence {seq_id} is missing from group {group.name}") from None
                assert length == kv.seq_len(seq_id)
            assert used + reserved + internal == held * manager.block_size, (
                f"group {group.name} holds {held} blocks"
            )
            assert sorted(manager.live_sequences()) == sorted(self.final_len)
            held_by_groups += held
        pools = {id(group.policy.shared_pool): group.policy.shared_pool for group in kv.groups}
        assert sum(pool.num_blocks - pool.free_blocks for pool in pools.values()) == held_by_groups

    def _check_prefix_caching(self, entries: tuple[int, ...]) -> None:
        """Each group's part is its held blocks, a shared one once, and its cached blocks; the pool's
        free queue is its blank and cached blocks; every probe's common hit is served by every group."""
        kv = self.kv
        physical = logical = cached = 0
        pool = None
        for index, group in enumerate(kv.groups):
            manager = group.policy
            assert isinstance(manager, GroupManager) and manager.tables is not None
            tables = manager.tables
            pool = tables.pool
            held = sum(map(manager.held_block_count, self.final_len))
            used, reserved, internal, _, group_cached, _ = entries[
                CATEGORIES * index : CATEGORIES * (index + 1)
            ]
            assert used + reserved + internal == (held - tables.excess) * BLOCK, f"group {group.name}"
            assert group_cached == pool.cached_in(tables.group) * BLOCK
            assert sorted(manager.live_sequences()) == sorted(self.final_len)
            for seq_id in self.final_len:
                assert manager.seq_len(seq_id) == kv.seq_len(seq_id)
            physical += held - tables.excess
            logical += held
            if self.defers:
                self._check_unscheduled_blocks_have_no_identity(manager)
            assert tables.pending_passes == sum(len(record.passes) for record in tables.by_seq.values())
            cached += pool.cached_in(tables.group)
            # The blocks of this group two or more sequences hold, each once (the shared-read credit's)
            holders = Counter(
                block for record in tables.by_seq.values() for block in record.table if block != NO_BLOCK
            )
            shared = sum(1 for count in holders.values() if count >= 2)
            assert manager.shared_slots() == shared * BLOCK, f"group {group.name}"
        assert pool is not None
        assert sum(pool.ref_count) == logical, "a block's reference count is not its holders"
        assert pool.num_blocks - pool.free_blocks == physical
        assert pool.free_blocks == len(pool.queue) and pool.cached_blocks == cached
        if isinstance(pool, MarconiBlockPool):
            # Marconi's candidates are the group's free cached states, each stamped no later than now,
            # and it knows the depth of every state the group caches.
            for group, evictor in enumerate(pool.evictors):
                if evictor is None:
                    continue
                identified = {b for b in range(pool.num_blocks) if pool.block_group[b] == group}
                free = {b for b in identified if pool.ref_count[b] == 0}
                assert set(evictor.depth) == identified and set(evictor.stamp) == free
                assert all(0 < stamp <= pool.clock for stamp in evictor.stamp.values())
        for probe in PROBES:
            self._check_common_hit(probe)

    def _check_unscheduled_blocks_have_no_identity(self, manager: GroupManager) -> None:
        """A held block past what its sequence scheduled was never computed: nothing can hit it."""
        tables = manager.tables
        assert tables is not None
        for seq_id in self.final_len:
            record = tables.by_seq[id(manager.sequences[seq_id])]
            if record.keyed_end == ALL_PUBLISHED:
                continue
            assert record.keyed_end * BLOCK <= self.scheduled[seq_id], f"group {manager.kind}"
            for position in range(record.keyed_end, len(record.table)):
                block = record.table[position]
                assert block == NO_BLOCK or not tables.pool.has_identity(block), (
                    f"group {manager.kind}: sequence {seq_id}'s block at position {position} is cached, "
                    f"{self.scheduled[seq_id]} tokens scheduled"
                )

    def _check_common_hit(self, prompt: tuple[tuple[int, int], ...]) -> None:
        """The common hit never exceeds what a group holds: every block of it that a group's kind
        attends to (past its skipped blocks) is cached in that group."""
        hit = self.kv.lookup(prompt).cached_tokens
        assert hit % BLOCK == 0 and hit < sum(length for _, length in prompt)
        blocks = hit // BLOCK
        for group in self.kv.groups:
            manager = group.policy
            assert isinstance(manager, GroupManager) and manager.tables is not None
            assert hit <= manager.lookup(prompt).cached_tokens or manager.kind != "full"
            chains = manager.tables.prompt_chains(prompt, 0, blocks)
            for position in range(manager.skipped_blocks(hit) if blocks else 0, blocks):
                assert position < len(chains) and manager.tables.is_cached(chains[position]), (
                    f"group {group.name} lacks block {position} of a {hit}-token hit"
                )

    def _check_jenga(self) -> None:
        """Jenga's own identity (tests/test_jenga.py; with prefix caching tests/test_jenga_prefix.py):
        per type its large pages are its small pages, held, free or cached; every live sequence in every
        type's manager at the coordinator's length; with caching, every type serves the common hit."""
        from tests import test_jenga, test_jenga_prefix

        kv = self.kv
        if self.caching:
            test_jenga_prefix.check_identity(kv)  # type: ignore[arg-type]
            if self.defers:
                for manager in kv.managers:  # type: ignore[attr-defined]
                    self._check_unscheduled_blocks_have_no_identity(manager)
            for probe in PROBES:
                self._check_common_hit(probe)
        else:
            test_jenga.check_identity(kv)  # type: ignore[arg-type]
        for manager in kv.managers:  # type: ignore[attr-defined]
            assert sorted(manager.live_sequences()) == sorted(self.final_len)
            for seq_id in self.final_len:
                assert manager.seq_len(seq_id) == kv.seq_len(seq_id)


def _chunks(values: tuple[int, ...]) -> list[tuple[int, ...]]:
    return [values[start : start + CATEGORIES] for start in range(0, len(values), CATEGORIES)]
