"""vllm-hybrid with prefix caching: blocks with identities in a shared pool (policies/hybrid/prefix_pool.py,
block_tables.py), each group's hit rule, and the coordinator's common hit (sim/kv/coordinator.py), worked
out by hand.

The model: a full-attention group and a sliding-window group (window 8 tokens) over one pool of blocks
of 4 tokens, prompts computed whole (prefill budget 4096). A sliding-window hit of ``n`` blocks needs
the ``ceil((8 - 1) / 4) = 2`` blocks before the hit point cached (vLLM
``SlidingWindowManager.find_longest_cache_hit``); the blocks before them are outside the window.

Block ids: the free queue hands out blank blocks 0, 1, 2, ... first (``FreeBlockQueue``), then the
cached blocks, least recently freed first.

Request A: a 12-token system prompt (content 1) and 2 tokens of its own (content 2), 2 tokens decoded
(its output stream, content 101). Admitted, it takes blocks 0-3 in the full group and 4-7 in the
window group (its prompt is shorter than what chunked prefill holds at once). Decoding its 15th token
(14 computed: 14 - 8 + 1 = 7 tokens skipped, one block) releases the window's block 4, its 16th block
5: both keep their identity (full blocks), so they are cached, not free. Freed, its blocks go back tail
first: the full group's 3, 2, 1, 0, then the window's 7, 6.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import NO_HIT, ChildSpec, MemoryBreakdown, PolicyInputError, PoolSpec, PrefixHit
from policies.hybrid.chunked_local import ChunkedLocalGroup
from policies.hybrid.full import FullAttentionGroup
from policies.hybrid.mamba import MambaGroup
from policies.hybrid.prefix_pool import PrefixCachingBlockPool
from policies.hybrid.sliding_window import SlidingWindowGroup
from sim.kv.coordinator import KVGroup, MultiGroupCoordinator, make_coordinator

BLOCK = 4
SYSTEM = (1, 12)  # three blocks every prompt below may share
A_PROMPT = (SYSTEM, (2, 2))


def hybrid(
    blocks: int,
) -> tuple[MultiGroupCoordinator, FullAttentionGroup, SlidingWindowGroup, PrefixCachingBlockPool]:
    pool = PrefixCachingBlockPool(blocks, BLOCK)
    spec = PoolSpec(blocks * BLOCK, BLOCK, 4096)
    full = FullAttentionGroup(spec, pool, 4096)
    window = SlidingWindowGroup(spec, pool, 4096, window=8)
    kv = make_coordinator([KVGroup("full", full), KVGroup("sliding", window)])
    assert isinstance(kv, MultiGroupCoordinator)
    return kv, full, window, pool


def breakdowns(kv: MultiGroupCoordinator) -> dict[str, tuple[int, ...]]:
    """Each entry's (used, reserved, internal, external, cached, free) slots; they sum to the pool."""
    split = {name: tuple(b.as_dict().values()) for name, b in kv.group_breakdowns().items()}
    assert sum(sum(values) for values in split.values()) == kv.pool_slots
    assert MemoryBreakdown(*kv.breakdown_values()).total == kv.pool_slots
    return split


def serve_and_free_a(kv: MultiGroupCoordinator) -> None:
    kv.admit(1, A_PROMPT, 16, 101)
    kv.grow(1, 1)
    kv.grow(1, 1)
    kv.free(1)


def test_a_finished_request_leaves_its_blocks_cached_per_group():
    kv, full, window, pool = hybrid(10)
    assert kv.admit(1, A_PROMPT, 16, 101) == 0  # nothing cached yet
    # 14 tokens in 4 blocks per group, 2 reserved for the tokens to come; 2 blank blocks free.
    assert breakdowns(kv) == {
        "full": (14, 2, 0, 0, 0, 0),
        "sliding": (14, 2, 0, 0, 0, 0),
        "shared pool": (0, 0, 0, 0, 0, 8),
    }
    kv.grow(1, 1)  # the window releases block 4 (position 0): cached
    assert window.held_blocks(1) == (1, 4)
    assert breakdowns(kv)["sliding"] == (11, 1, 0, 0, 4, 0)
    kv.grow(1, 1)  # block 5 (position 1) follows; position 3 is full: cached in both groups
    assert breakdowns(kv) == {
        "full": (16, 0, 0, 0, 0, 0),
        "sliding": (8, 0, 0, 0, 8, 0),
        "shared pool": (0, 0, 0, 0, 0, 8),
    }
    kv.free(1)
    assert breakdowns(kv) == {
        "full": (0, 0, 0, 0, 16, 0),
        "sliding": (0, 0, 0, 0, 16, 0),
        "shared pool": (0, 0, 0, 0, 0, 8),
    }
    # LRU: blank blocks first, then the window's early releases, then A's blocks tail first.
    assert pool.queue.order() == [8, 9, 4, 5, 3, 2, 1, 0, 7, 6]
    assert kv.evictions() == 0


def test_a_second_request_hits_the_three_shared_blocks_in_every_group():
    """B (17 tokens) shares the 3 system blocks with A. Full attention: the leading run, 3 blocks. The
    window: scanning from block 2, blocks 2 and 1 are cached, two in a row: 3 blocks. Common: 12
    tokens. B then holds the full group's hit blocks 0-2 and new blocks 8, 9 (blank); the window
    skips block 0 of the hit (12 - 8 + 1 = 5 tokens: one block) and holds the hit's blocks 5, 6 and
    two new blocks, taken from the queue's head past the blank ones: 4 (the window's) and 3 (the full
    group's), both evicted."""
    kv, full, window, pool = hybrid(10)
    serve_and_free_a(kv)
    b_prompt = (SYSTEM, (3, 5))
    assert full.lookup(b_prompt) == PrefixHit(12)
    assert window.lookup(b_prompt) == PrefixHit(12)
    assert kv.lookup(b_prompt) == PrefixHit(12)
    assert kv.admit(2, b_prompt, 18, 102) == 12
    assert window.held_blocks(2) == (1, 5)
    # full: 17 used in 5 blocks, 1 reserved (final 18), 2 never filled; the window holds 4 blocks
    # (tokens 4-16) and keeps A's block 7 cached; the pool has nothing left.
    assert breakdowns(kv) == {
        "full": (17, 1, 2, 0, 0, 0),
        "sliding": (13, 1, 2, 0, 4, 0),
        "shared pool": (0, 0, 0, 0, 0, 0),
    }
    assert pool.queue.order() == [7]
    stats = kv.stats
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits, stats.evictions) == (14 + 17, 12, 2)
    assert (full.stats.evictions, window.stats.evictions) == (1, 1)


def test_the_window_needs_only_its_last_blocks_and_an_evicted_one_shrinks_the_common_hit():
    """12 blocks. After A, D (an unrelated 12-token prompt) takes the 4 blank blocks and then the two
    oldest cached ones: the window's blocks 4 and 5 (A's positions 0 and 1), evicted in LRU order.

    G shares the 3 system blocks: full attention still serves 3 blocks, but the window needs
    positions 1 and 2, and position 1 is gone (position 2 alone is one in a row, then a miss): the
    window serves nothing, and so the common hit is 0.
    F continues A's conversation (A's prompt, A's two output tokens, 3 more): 4 blocks for full
    attention, and the window needs only positions 2 and 3, both cached: 16 tokens, although the
    window lost positions 0 and 1 (out of the window, vLLM's null blocks)."""
    kv, full, window, pool = hybrid(12)
    g_prompt = (SYSTEM, (7, 5))
    serve_and_free_a(kv)
    assert kv.lookup(g_prompt) == PrefixHit(12)  # before D: positions 1 and 2 cached
    kv.admit(4, ((9, 12),), 13, 104)
    assert (full.stats.evictions, window.stats.evictions) == (0, 2)
    assert breakdowns(kv) == {
        "full": (12, 0, 0, 0, 16, 0),
        "sliding": (12, 0, 0, 0, 8, 0),
        "shared pool": (0, 0, 0, 0, 0, 0),
    }
    assert full.lookup(g_prompt) == PrefixHit(12)
    assert window.lookup(g_prompt) == NO_HIT
    assert kv.lookup(g_prompt) == NO_HIT

    f_prompt = (SYSTEM, (2, 2), (101, 2), (5, 3))
    assert full.lookup(f_prompt) == PrefixHit(16)
    assert window.lookup(f_prompt) == PrefixHit(16)
    assert kv.lookup(f_prompt) == PrefixHit(16)


def test_the_common_hit_iterates_down_until_every_group_serves_it():
    """A 17-token prompt served and freed: both groups cache its blocks 0-3. Evict the window's block
    at position 2 alone. Full attention serves 4 blocks; the window, asked for 4, finds position 3
    alone, a miss, then positions 1 and 0 two in a row: 2 blocks. Full attention serves 2: the common
    hit is 8 tokens (the window's position 3, though cached, is past a block it lacks)."""
    kv, full, window, pool = hybrid(16)
    prompt = (SYSTEM, (2, 4), (6, 1))
    kv.admit(1, prompt, 17, 101)
    kv.free(1)
    tables = window.tables
    assert tables is not None
    block = pool.cached_block(tables.group, tables.prompt_chains(prompt, 0, 4)[2])
    # What an allocation does to the cached block it takes, the block then given back blank.
    pool.queue.remove_cached(block)
    pool._evict(block)
    pool.queue.appendleft(block)
    assert window.stats.evictions == 1
    assert full.lookup(prompt) == PrefixHit(16)
    assert window.lookup(prompt) == PrefixHit(8)
    assert kv.lookup(prompt) == PrefixHit(8)
    assert breakdowns(kv)["sliding"] == (0, 0, 0, 0, 12, 0)


def test_blocks_an_earlier_prefill_chunk_released_are_cached_too():
    """Prefill 4 tokens a step: a 20-token prompt holds at most ``ceil((8 - 1 + 4) / 4) + 1 = 4`` window
    blocks at once, positions 1-4, so vLLM's first chunk took position 0 and freed it once the window
    passed: cached (block 5, taken after the full group's 0-4 and given back at once). E (11 tokens)
    shares the first 2 blocks: the window needs positions 0 and 1, both cached: a hit of 8 tokens."""
    pool = PrefixCachingBlockPool(16, BLOCK)
    spec = PoolSpec(64, BLOCK, 4096)
    full = FullAttentionGroup(spec, pool, 4)
    window = SlidingWindowGroup(spec, pool, 4, window=8)
    kv = make_coordinator([KVGroup("full", full), KVGroup("sliding", window)])
    assert isinstance(kv, MultiGroupCoordinator)
    kv.admit(1, (SYSTEM, (2, 8)), 20, 101)
    assert window.held_blocks(1) == (1, 5)
    assert breakdowns(kv) == {
        "full": (20, 0, 0, 0, 0, 0),
        "sliding": (16, 0, 0, 0, 4, 0),
        "shared pool": (0, 0, 0, 0, 0, 24),
    }
    assert pool.queue.order() == [10, 11, 12, 13, 14, 15, 5]
    e_prompt = ((1, 8), (4, 3))
    assert window.lookup(e_prompt) == PrefixHit(8)
    assert kv.lookup(e_prompt) == PrefixHit(8)


def test_a_shared_block_counts_once_and_the_sharers_free_it_together():
    """Two live requests with the same 12-token system prompt: the second hits the first's three full
    blocks while the first still holds them, so the full group holds them once (excess references
    are sharing, not memory); they are cached once both are freed."""
    kv, full, window, pool = hybrid(16)
    kv.admit(1, (SYSTEM, (2, 1)), 13, 101)
    kv.admit(2, (SYSTEM, (3, 1)), 13, 102)
    # Full: 13 + 13 tokens written, 12 of them shared: 14 in 5 blocks (3 shared + 2 tails).
    used, reserved, internal, _, cached, _ = breakdowns(kv)["full"]
    assert (used, reserved, internal, cached) == (14, 0, 6, 0)
    assert full.sharing_slots() == (20, 32)
    kv.free(1)
    assert breakdowns(kv)["full"][4] == 0  # B still holds the shared blocks; A's tail held nothing full
    kv.free(2)
    assert breakdowns(kv)["full"][4] == 12
    assert breakdowns(kv)["full"][:3] == (0, 0, 0)


def test_a_fork_shares_full_blocks_and_copies_the_partly_filled_one():
    kv, full, window, pool = hybrid(16)
    kv.admit(1, (SYSTEM, (2, 2)), 20, 101)
    free_before = pool.free_blocks
    kv.fork(1, [ChildSpec(2, 20, 102)])
    # Each group copies one block (positions 3: 2 of its 4 slots written) and shares the rest.
    assert free_before - pool.free_blocks == 2
    assert full.stats.fork_copied_tokens == 2
    kv.grow_each([1, 2], [2, 2])  # both fill their own block 3, cached under different chains
    kv.free(1)
    kv.free(2)
    assert breakdowns(kv)["full"][:3] == (0, 0, 0)


def test_chunked_local_attention_serves_the_blocks_of_the_current_chunk():
    """Chunks of 8 tokens: a hit ending in a chunk needs only that chunk's blocks (vLLM
    ``ChunkedLocalAttentionManager.find_longest_cache_hit``); a hit on a chunk boundary needs none."""
    pool = PrefixCachingBlockPool(16, BLOCK)
    spec = PoolSpec(64, BLOCK, 4096)
    chunked = ChunkedLocalGroup(spec, pool, 4096, chunk=8)
    chunked.admit(1, (SYSTEM, (2, 2)), 14, 101)
    chunked.free(1)  # positions 0-2 cached
    # 17-token prompt sharing 12 tokens: at most 4 blocks; the chunk of 16 starts at block 4: 4 blocks
    # (all before the chunk), no block looked at.
    assert chunked.lookup((SYSTEM, (3, 5))) == PrefixHit(16)
    # 13 tokens: at most 3 blocks, the chunk of 12 starts at block 2: block 2 cached, 3 blocks.
    assert chunked.lookup((SYSTEM, (3, 1))) == PrefixHit(12)
    # A prompt of other content: its chunk starts at block 2 (max 3 blocks), block 2 not cached: 2.
    assert chunked.lookup(((5, 13),)) == PrefixHit(8)


def test_a_mamba_group_caching_prefixes_refuses_a_prefill_budget_under_a_block():
    """vLLM's align mode cuts prefill chunks to whole blocks (tests/test_mamba_prefix_caching.py has
    the rest): a budget under a block would never schedule a prompt past its first block."""
    pool = PrefixCachingBlockPool(8, BLOCK)
    with pytest.raises(PolicyInputError, match="mamba_cache_mode 'align'"):
        MambaGroup(PoolSpec(32, BLOCK, 4096), pool, BLOCK - 1)


KINDS = ["admit", "admit", "grow", "decode_step", "free", "preempt", "fork", "match"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 49), st.integers(0, 20)), max_size=80))
def test_prefix_caching_keeps_every_group_whole_and_every_hit_served(operations):
    """Random operations on full, sliding-window and chunked-local groups over one prefix-caching pool
    (tests/hybrid_driver.py, ``vllm-hybrid-prefix``): after every one, each group's part (held blocks
    counted once, its cached blocks) and the pool's free queue add up to the pool, every category
    per group and in total, a refused operation changes nothing, and the common hit of every probe
    prompt is served by every group (each holds, cached, the blocks of it its layers attend to)."""
    from tests.hybrid_driver import HybridDriver

    driver = HybridDriver("vllm-hybrid-prefix")
    for kind, choice, amount in operations:
        driver.apply(kind, choice, amount)
    driver.drain()


class _CachedPositions:
    """Stand-in block tables: chain ``i`` is block position ``i``, cached when listed."""

    def __init__(self, cached: set[int]):
        self.cached = cached

    def is_cached(self, chain: int) -> bool:
        return chain in self.cached


@pytest.mark.python_sources  # a stand-in for the compiled block tables
@pytest.mark.parametrize(("window", "hit_blocks"), [(8, 4), (9, 4), (12, 0), (13, 0)])
def test_a_window_hit_needs_ceil_of_window_minus_one_blocks_in_a_row(window, hit_blocks):
    # vLLM SlidingWindowManager.find_longest_cache_hit: the last token of a hit needs the W - 1
    # tokens before it, ceil((W - 1) / 4) blocks: 2 for W = 8 and 9, 3 for W = 12 and 13. Positions
    # 2 and 3 cached (0 and 1 evicted, out of the window): a hit of 4 blocks when 2 suffice, none
    # when 3 are needed (2 in a row, then a miss; no leading run).
    pool = PrefixCachingBlockPool(16, BLOCK)
    group = SlidingWindowGroup(PoolSpec(16 * BLOCK, BLOCK, 4096), pool, 4096, window=window)
    group.tables = _CachedPositions({2, 3})  # type: ignore[assignment]
    assert group.longest_cache_hit([0, 1, 2, 3], 4) == hit_blocks


class _ScriptedGroup:
    """A caching group that answers each length it is asked with a scripted hit (in blocks)."""

    block_size = BLOCK

    def __init__(self, answers: dict[int, int]):
        self.answers = answers
        self.asked: list[int] = []
        self.tables = self

    @staticmethod
    def prompt_chains(prompt, namespace: int, blocks: int) -> list[int]:
        return list(range(blocks))

    def longest_cache_hit(self, chains: list[int], max_blocks: int) -> int:
        self.asked.append(max_blocks)
        return self.answers[max_blocks]


@pytest.mark.python_sources  # stand-in groups for the compiled coordinator
def test_a_shortening_late_in_a_round_starts_another_round():
    # Full attention, a sliding window and a chunked-local group, a 17-token prompt (4 blocks at
    # most). Round 1: full keeps 4, the window shortens to 3 (its position 3 is gone), the chunked
    # group to 2 (the chunk starting at block 2 lacks it). Round 2 at 2: full keeps it, but the window
    # needs positions 0 and 1 and has only 1: no hit. Round 3 at 0 ends it. Stopping after round 1
    # would serve 8 tokens the window cannot (vLLM iterates until every group keeps the length).
    full = _ScriptedGroup({4: 4, 2: 2})
    window = _ScriptedGroup({3: 3, 2: 0, 4: 3})
    chunked = _ScriptedGroup({3: 2, 0: 0})
    coordinator = type("Coordinator", (), {"_caching": [full, window, chunked]})()
    hit = MultiGroupCoordinator._common_hit(coordinator, ((1, 17),), 0)  # type: ignore[arg-type]
    assert hit == NO_HIT
    assert (full.asked, window.asked, chunked.asked) == ([4, 2], [4, 2], [3, 0])


def test_a_hit_on_blocks_another_request_holds_takes_nothing_from_the_free_queue():
    """12 blocks. A (14 tokens) holds 4 in each group: 4 free. B shares the 12-token system prompt:
    its common hit is 3 blocks, all held by A (full attention positions 0-2, the window's 1-2), so
    they leave no free queue: B takes 5 - 3 = 2 new blocks in each group, the 4 that are free (vLLM
    ``get_num_blocks_to_allocate`` counts only the hit's blocks with no holder)."""
    kv, full, window, pool = hybrid(12)
    kv.admit(1, A_PROMPT, 16, 101)
    assert pool.free_blocks == 4
    b_prompt = (SYSTEM, (7, 5))
    assert kv.can_admit(b_prompt, 20)
    assert kv.admit(2, b_prompt, 20, 102) == 12
    assert pool.free_blocks == 0
    assert [group.policy.held_blocks(2) for group in kv.groups] == [(0, 5), (1, 5)]


def test_skipped_blocks_go_back_latest_first():
    """vLLM's ``remove_skipped_blocks`` frees a step's skipped blocks latest first: a 12-token prompt
    (window blocks 0-2) grown by 8 tokens at once releases all three, appended to the free queue's
    tail as 2, 1, 0, so the earliest of them is the last to be evicted."""
    kv, full, window, pool = hybrid(16)
    kv.admit(1, ((1, 12),), 40, 101)
    tables = window.tables
    assert tables is not None
    blocks = tables.by_seq[id(window.sequences[1])].table[:3]
    kv.grow(1, 8)
    assert window.held_blocks(1) == (3, 5)
    assert pool.queue.order()[-3:] == [blocks[2], blocks[1], blocks[0]]


def test_a_prompt_of_whole_blocks_never_hits_its_last_token():
    """A 16-token prompt (4 whole blocks) served and freed leaves all 4 cached in both groups; the same
    prompt again hits 3 (12 tokens): its last token is computed to sample the first output token
    (vLLM looks up ``len - 1`` tokens), so its block is not a hit however whole it is."""
    kv, full, window, pool = hybrid(16)
    prompt = ((1, 16),)
    kv.admit(1, prompt, 18, 101)
    kv.free(1)
    assert kv.lookup(prompt) == PrefixHit(12)
    assert kv.admit(2, prompt, 18, 102) == 12


def _tables(kv: MultiGroupCoordinator, seq_ids: list[int]) -> list[list[int]]:
    rows = []
    for group in kv.groups:
        tables = group.policy.tables
        rows += [list(tables.by_seq[id(group.policy.sequences[seq_id])].table) for seq_id in seq_ids]
    return rows


@pytest.mark.parametrize("blocks", [14, 16, 24])
def test_a_growth_of_several_sequences_is_committed_request_by_request(blocks):
    """vLLM allocates request by request: each frees its groups' skipped blocks, then takes its new
    ones. Growing two sequences in one call (event skipping flushes them together) must leave the pool
    as growing them one after the other (single steps): the same block tables, the same free queue
    (which cached blocks were evicted, in which order). Committing every release first, as kvsim did,
    let the second sequence's released blocks be taken by the first (a pool short enough to evict
    changed which cached blocks went; Marconi's eviction then differed between the step modes)."""
    pools = []
    for together in (True, False):
        kv, full, window, pool = hybrid(blocks)
        serve_and_free_a(kv)  # A's blocks stay cached: the takes below may evict them
        kv.admit(2, ((3, 12),), 40, 102)
        kv.admit(3, ((4, 12),), 40, 103)
        if together:
            kv.grow_each([2, 3], [8, 8])
        else:
            kv.grow(2, 8)
            kv.grow(3, 8)
        pools.append((_tables(kv, [2, 3]), pool.queue.order(), breakdowns(kv)))
    assert pools[0] == pools[1]


def test_a_growth_committed_request_by_request_reports_the_least_room_over_the_groups():
    """Each sequence's room after a growth (tokens before its next change: a new block, or a block the
    window lets go) is the least over the groups, as each group reports it; the window's is often
    the smaller (a release comes before the next block is needed), and the engine must wake up then."""
    kv, full, window, _ = hybrid(32)
    kv.admit(2, ((3, 10),), 60, 102)
    kv.admit(3, ((4, 7),), 60, 103)
    window_smaller = 0
    for _ in range(30):
        rooms = kv.grow_each([2, 3], [1, 1])
        expected = [min(full.growth_room(seq_id), window.growth_room(seq_id)) for seq_id in (2, 3)]
        assert rooms == expected
        window_smaller += sum(window.growth_room(seq_id) < full.growth_room(seq_id) for seq_id in (2, 3))
    assert window_smaller > 0  # (the case where the first group's room would not do)


def test_a_chunks_last_block_filled_and_passed_in_one_growth_is_cached():
    """Chunks of 12 tokens (3 blocks of 4), a 9-token prompt (blocks 0-2 held). Grown by 4 tokens in
    one call, as event skipping flushes a sequence at the token where the chunk passes, it fills block
    2, the chunk's last, and passes the chunk: blocks 0-2 leave. vLLM cached block 2 at the step that
    filled it (``cache_blocks`` at allocation), so it goes back cached, as when grown a token at a
    time: the chunk's three blocks are cached, and the pool is the same both ways. (The release came
    before the tokens were noted: block 2 went back blank, and event skipping's runs cached less than
    single stepping's; found by ``tests/fuzz_step_modes.py`` on a Llama-4-style model, chunks of 48.)"""
    pools = []
    for one_at_a_time in (False, True):
        pool = PrefixCachingBlockPool(32, BLOCK)
        spec = PoolSpec(32 * BLOCK, BLOCK, 4096)
        chunked = ChunkedLocalGroup(spec, pool, 4096, chunk=12)
        chunked.admit(1, ((1, 9),), 40, 101)
        if one_at_a_time:
            for _ in range(4):
                chunked.grow(1, 1)
        else:
            chunked.grow(1, 4)
        assert chunked.held_blocks(1) == (3, 4)
        pools.append((pool.cached_blocks, pool.queue.order(), tuple(chunked.breakdown_values())))
    assert pools[0] == pools[1]
    assert pools[0][0] == 3


# -- prompts cached as their chunks are scheduled (the engine drives: defer_prompt_keys) -------------
def test_a_prompt_is_hittable_in_every_group_as_far_as_it_was_scheduled():
    """A's 14 tokens take blocks 0-3 (full) and 4-7 (window); nothing is cached until a chunk is
    scheduled. 6 tokens scheduled: position 0 is full in both groups, a hit of 4 for B (which shares
    A's 12 system tokens); 9: positions 0 and 1, 8. A preempted then: its keyed blocks stay cached
    (1, 0 in the full group, 5, 4 in the window's, to the tail), the never-computed ones go back blank,
    to the head (3, 2, then 7, 6, each given back before the next), B still hits 8 tokens."""
    kv, full, window, pool = hybrid(10)
    assert kv.defer_prompt_keys()
    assert kv.admit(1, A_PROMPT, 16, 101) == 0
    b_prompt = (SYSTEM, (3, 5))
    assert kv.lookup(b_prompt) == NO_HIT
    kv.prompt_scheduled(1, 6)
    assert (full.lookup(b_prompt), window.lookup(b_prompt), kv.lookup(b_prompt)) == (PrefixHit(4),) * 3
    kv.prompt_scheduled(1, 9)
    assert kv.lookup(b_prompt) == PrefixHit(8)
    kv.prompt_scheduled(1, 5)  # (behind what was scheduled: nothing changes)
    assert kv.lookup(b_prompt) == PrefixHit(8)
    kv.free(1, finished=False)
    assert breakdowns(kv) == {
        "full": (0, 0, 0, 0, 8, 0),
        "sliding": (0, 0, 0, 0, 8, 0),
        "shared pool": (0, 0, 0, 0, 0, 24),
    }
    assert pool.queue.order() == [6, 7, 2, 3, 8, 9, 1, 0, 5, 4]
    assert kv.lookup(b_prompt) == PrefixHit(8)


def test_a_prompt_scheduled_whole_or_decoding_is_cached_whole():
    """The whole prompt scheduled: its 3 full blocks cached in both groups, B hits the 12 system
    tokens. Without a report (a policy driven directly), a sequence that grows, or forks, has been
    computed: its blocks are cached then."""
    kv, _, _, _ = hybrid(10)
    kv.defer_prompt_keys()
    kv.admit(1, A_PROMPT, 16, 101)
    kv.prompt_scheduled(1, 14)
    assert kv.lookup((SYSTEM, (3, 5))) == PrefixHit(12)
    for computed in (lambda kv: kv.grow(1, 1), lambda kv: kv.fork(1, [ChildSpec(2, 16, 102)])):
        kv, _, _, _ = hybrid(12)
        kv.defer_prompt_keys()
        kv.admit(1, A_PROMPT, 16, 101)
        computed(kv)
        assert kv.lookup((SYSTEM, (3, 5))) == PrefixHit(12)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_a_request_preempted_mid_prefill_hits_in_every_group_only_what_it_scheduled(step_mode):
    """16 blocks of 4 tokens shared by a full-attention group and a window of 8, 1 s an iteration, a
    budget of 9 tokens. R0 (4 prompt tokens, 7 output) decodes from 1.0. R1 (24 tokens) is admitted
    at 3.0 with every block left: 6 in the full group, 5 in the window's (positions 1-5: its last
    chunk, 18-23, and the 7 tokens before it), its position 0 passed through (cached); it schedules a
    first chunk of 8 tokens. At 4.0 R0's 9th token needs a block in each group, one (cached) is
    free: R1, the newest, is preempted, its positions 0 and 1 cached in both groups. Readmitted when
    R0 finishes at 7.0, it hits those 8 tokens and computes 16, 9 then 7: its first token at 9.0,
    its second at 10.0. Keyed at admission, it hit 20 tokens it had never computed and finished at
    7.0."""
    from sim.engine.core import Engine
    from sim.engine.knobs import EngineKnobs
    from tests.engine_helpers import ConstantCost, request

    pool = PrefixCachingBlockPool(16, BLOCK)
    spec = PoolSpec(16 * BLOCK, BLOCK, 64)
    kv = make_coordinator(
        [
            KVGroup("full", FullAttentionGroup(spec, pool, 9)),
            KVGroup("sliding", SlidingWindowGroup(spec, pool, 9, window=8)),
        ]
    )
    engine = Engine(
        kv,
        ConstantCost(1.0),
        EngineKnobs(max_model_len=64, step_mode=step_mode, max_num_batched_tokens=9),
        iter([request(0, 0.0, 4, 7), request(1, 2.5, 24, 2)]),
        block_size=BLOCK,
    )
    engine.run()
    r0, r1 = sorted(engine.records, key=lambda record: record.request_id)
    assert (r0.first_token_s, r0.finish_s, r0.preemptions) == (1.0, 7.0, 0)
    assert (r1.admitted_s, r1.first_token_s, r1.finish_s, r1.preemptions) == (3.0, 9.0, 10.0, 1)
    assert kv.stats.prefix_cache_hits == 8


def test_a_block_an_earlier_chunk_passed_through_is_cached_once_that_chunk_is_scheduled():
    """The setting of the test above (prefill 4 tokens a step, a window of 8, a 20-token prompt whose
    window holds positions 1-4), the engine reporting chunks: position 0, which the first chunk
    computes and the window then passes, is not taken at admission (the full group's blocks 0-4 and
    the window's 5-8 are: 9-15 stay blank). 3 tokens scheduled: still nothing. 4: block 9 is taken
    from the head, cached under position 0 and given back to the tail (free slots become cached
    ones, which the coordinator announced: ``scheduled_chunks_move_slots``); a prompt sharing the
    first block now hits it in both groups."""
    pool = PrefixCachingBlockPool(16, BLOCK)
    spec = PoolSpec(64, BLOCK, 4096)
    window = SlidingWindowGroup(spec, pool, 4, window=8)
    kv = make_coordinator([KVGroup("full", FullAttentionGroup(spec, pool, 4)), KVGroup("sliding", window)])
    assert kv.defer_prompt_keys()
    kv.admit(1, (SYSTEM, (2, 8)), 20, 101)
    assert window.held_blocks(1) == (1, 5)
    assert breakdowns(kv)["shared pool"] == (0, 0, 0, 0, 0, 28)
    assert pool.queue.order() == [9, 10, 11, 12, 13, 14, 15]
    kv.prompt_scheduled(1, 3)
    assert breakdowns(kv)["sliding"] == (16, 0, 0, 0, 0, 0) and kv.scheduled_chunks_move_slots()
    kv.prompt_scheduled(1, 4)
    assert breakdowns(kv) == {
        "full": (20, 0, 0, 0, 0, 0),
        "sliding": (16, 0, 0, 0, 4, 0),
        "shared pool": (0, 0, 0, 0, 0, 24),
    }
    assert pool.queue.order() == [10, 11, 12, 13, 14, 15, 9]
    assert not kv.scheduled_chunks_move_slots()
    assert kv.lookup(((1, 8), (4, 3))) == PrefixHit(4)
