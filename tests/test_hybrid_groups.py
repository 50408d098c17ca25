"""The KV-group managers of a hybrid model (policies/hybrid/) over one shared block pool, behind the
KV coordinator: the block runs worked out by hand from vLLM's rules (``remove_skipped_blocks``:
at a step that starts with ``n`` tokens computed, a sliding window of W releases the blocks wholly
before token ``n - W + 1``; chunked local attention those before ``(n // C) x C``), the pool shared
by every group, and the accounting per group and in total under random operations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import ChildSpec, OutOfKVMemory, PolicyInputError, PoolSpec
from policies.hybrid.block_pool import SharedBlockPool
from policies.hybrid.chunked_local import ChunkedLocalGroup
from policies.hybrid.full import FullAttentionGroup
from policies.hybrid.mamba import MambaGroup
from policies.hybrid.sliding_window import SlidingWindowGroup
from sim.kv.coordinator import KVGroup, MultiGroupCoordinator, make_coordinator

BLOCK = 4


def spec(blocks: int) -> PoolSpec:
    return PoolSpec(blocks * BLOCK, BLOCK, 4096)


def prompt(tokens: int, content: int = 1):
    return ((content, tokens),)


def test_full_attention_holds_a_block_for_every_token():
    pool = SharedBlockPool(10, BLOCK)
    full = FullAttentionGroup(spec(10), pool, prefill_tokens=4096)
    full.admit(1, prompt(10), 20, 101)
    assert full.held_blocks(1) == (0, 3) and pool.free_blocks == 7  # ceil(10 / 4) = 3
    full.grow(1, 3)
    assert full.held_blocks(1) == (0, 4) and pool.free_blocks == 6  # 13 tokens: 4 blocks
    # used 13, reserved min(16, 20) - 13 = 3, no fragmentation; the pool reports its 6 free blocks.
    assert full.breakdown_values() == (13, 3, 0, 0, 0, 0)
    assert pool.breakdown_values() == (0, 0, 0, 0, 0, 24)


def test_a_sliding_window_releases_exactly_the_blocks_that_left_it():
    """W = 8, blocks of 4. Prompt 10: blocks 0-2. Token 11 (computed 10: 10 - 8 + 1 = 3, block 0
    still in the window) changes nothing; token 12 (computed 11: first useful token 4) releases
    block 0; token 13 needs block 3; token 16 (computed 15: first useful token 8) releases block 1."""
    pool = SharedBlockPool(10, BLOCK)
    window = SlidingWindowGroup(spec(10), pool, prefill_tokens=4096, window=8)
    window.admit(1, prompt(10), 40, 101)
    assert window.held_blocks(1) == (0, 3)
    window.grow(1, 1)
    assert window.held_blocks(1) == (0, 3)
    assert window.growth_room(1) == 0  # the next token releases a block: an event of its own
    window.grow(1, 1)
    assert window.held_blocks(1) == (1, 3) and pool.free_blocks == 8
    # Room: block 2 holds up to token 12 (0 left); the next release is at 16 tokens.
    assert window.growth_room(1) == 0 and window.slots_needed_to_grow(1, 1) == BLOCK
    window.grow(1, 1)
    assert window.held_blocks(1) == (1, 4)
    assert window.growth_room(1) == 2  # tokens 14 and 15 fit; token 16 releases block 1
    window.grow(1, 3)
    assert window.held_blocks(1) == (2, 4) and pool.free_blocks == 8
    # Held: blocks 2-3, tokens 8..15 = 8 used; it will fill nothing more of them.
    assert window.breakdown_values() == (8, 0, 0, 0, 0, 0)


def test_a_long_prompt_holds_what_chunked_prefill_holds_at_once_then_only_the_window():
    """Prompt 40, W = 8, chunks of 8: vLLM holds at most cdiv(8 - 1 + 8, 4) + 1 = 5 blocks during the
    prompt (blocks 5-9 here, the prompt's last five). Its first decoded token (41 tokens, computed 40:
    first useful token 33, block 8) releases blocks 5-7 and takes block 10."""
    pool = SharedBlockPool(20, BLOCK)
    window = SlidingWindowGroup(spec(20), pool, prefill_tokens=8, window=8)
    assert window.slots_needed_to_admit(prompt(40)) == 5 * BLOCK
    window.admit(1, prompt(40), 60, 101)
    assert window.held_blocks(1) == (5, 10) and pool.free_blocks == 15
    assert window.slots_needed_to_grow(1, 1) == 0  # three released, one taken
    window.grow(1, 1)
    assert window.held_blocks(1) == (8, 11) and pool.free_blocks == 17
    # A short prompt holds all its blocks (fewer than the bound).
    window.admit(2, prompt(6), 20, 102)
    assert window.held_blocks(2) == (0, 2)


def test_chunked_local_attention_releases_the_blocks_before_the_current_chunk():
    """C = 8, blocks of 4. Prompt 10 holds blocks 0-2. Token 11 (computed 10: its chunk starts at 8)
    releases blocks 0-1. The next chunk starts at 16: token 17 releases block 2 and 3."""
    pool = SharedBlockPool(10, BLOCK)
    local = ChunkedLocalGroup(spec(10), pool, prefill_tokens=4096, chunk=8)
    local.admit(1, prompt(10), 40, 101)
    assert local.held_blocks(1) == (0, 3)
    local.grow(1, 1)
    assert local.held_blocks(1) == (2, 3) and pool.free_blocks == 9
    assert local.growth_room(1) == 1  # token 12 fills block 2; token 13 needs block 3
    local.grow(1, 2)
    assert local.held_blocks(1) == (2, 4)
    assert local.growth_room(1) == 3  # tokens 14-16; token 17 starts the chunk at 16
    local.grow(1, 3)
    local.grow(1, 1)
    assert local.held_blocks(1) == (4, 5) and pool.free_blocks == 9


def test_a_mamba_group_holds_one_block_per_request_whatever_its_length():
    pool = SharedBlockPool(4, BLOCK)
    mamba = MambaGroup(spec(4), pool, prefill_tokens=4096)
    mamba.admit(1, prompt(100), 300, 101)
    assert mamba.held_blocks(1) == (0, 1) and pool.free_blocks == 3
    assert mamba.growth_room(1) == 200
    mamba.grow(1, 150)
    assert mamba.held_blocks(1) == (0, 1) and mamba.breakdown_values() == (BLOCK, 0, 0, 0, 0, 0)
    mamba.fork(1, [ChildSpec(2, 300, -1)])
    assert pool.free_blocks == 2
    mamba.free(1)
    mamba.free(2)
    assert pool.free_blocks == 4


def hybrid(blocks: int = 24, prefill_tokens: int = 4096) -> MultiGroupCoordinator:
    """A gpt-oss-like pair (full + sliding window of 8) plus a chunked-local and a Mamba group, all
    drawing from one pool of ``blocks`` blocks."""
    pool = SharedBlockPool(blocks, BLOCK, pool_slots=blocks * BLOCK + 3)
    groups = [
        KVGroup("full", FullAttentionGroup(spec(blocks), pool, prefill_tokens), slot_bytes=64),
        KVGroup("sliding", SlidingWindowGroup(spec(blocks), pool, prefill_tokens, window=8), slot_bytes=64),
        KVGroup("chunked", ChunkedLocalGroup(spec(blocks), pool, prefill_tokens, chunk=8), slot_bytes=64),
        KVGroup("mamba", MambaGroup(spec(blocks), pool, prefill_tokens), slot_bytes=64),
    ]
    coordinator = make_coordinator(groups)
    assert isinstance(coordinator, MultiGroupCoordinator)
    return coordinator


def test_groups_sharing_a_pool_add_their_needs():
    """Prompt 10 needs 3 + 3 + 3 + 1 = 10 blocks of the 24. Two fit (20), a third does not (4 left),
    and the refusal changes nothing. The breakdown: each group's part plus the pool's 4 free blocks
    and its 3 split-off slots sum to the 99-slot pool."""
    kv = hybrid()
    kv.admit(1, prompt(10), 30, 101)
    kv.admit(2, prompt(10, 2), 30, 102)
    before = kv.breakdown_values()
    assert not kv.can_admit(prompt(10, 3), 30)
    with pytest.raises(OutOfKVMemory, match="needs 40 slots of the shared block pool, 16 available"):
        kv.admit(3, prompt(10, 3), 30, 103)
    assert kv.breakdown_values() == before
    assert kv.pool_slots == 99 and sum(kv.breakdown_values()) == 99
    used, reserved, internal, external, cached, free = before
    # full, sliding, chunked: 10 used + 2 reserved each; Mamba: its 4-slot block used.
    assert (used, reserved, internal, external, cached, free) == (2 * (3 * 10 + 4), 2 * 3 * 2, 0, 3, 0, 16)
    assert kv.group_breakdowns()["shared pool"].free == 16
    assert sum(kv.breakdown_bytes().values()) == 99 * 64
    # Room for growth: 16 free slots over the three groups that grow with each token.
    assert kv.available_slots() == 16 // 3


def test_a_hybrid_growth_releases_in_every_group_before_it_takes():
    """Two requests of 10 tokens hold 20 of 24 blocks. Growing both to 13 tokens: the full group
    needs block 3 (+1 each); the sliding group releases block 0 (13 - 8 = 5: block 1 onwards) and
    takes block 3 (net 0); the chunked group's chunk starts at 8, so blocks 0-1 go and block 3 comes
    (net -1); the Mamba state stays. Net 0: the 4 free blocks stay free."""
    kv = hybrid()
    kv.admit(1, prompt(10), 30, 101)
    kv.admit(2, prompt(10, 2), 30, 102)
    assert kv.fits_growth([1, 2], 3)
    kv.grow_each([1, 2], [3, 3])
    full, sliding, chunked = (group.policy for group in kv.groups[:3])
    assert full.held_blocks(1) == (0, 4)
    assert sliding.held_blocks(1) == (1, 4)
    assert chunked.held_blocks(1) == (2, 4)
    assert kv.group_breakdowns()["shared pool"].free == 4 * BLOCK


def shared(*managers_of) -> MultiGroupCoordinator:
    return make_coordinator([KVGroup(str(index), manager) for index, manager in enumerate(managers_of)])


def test_blocks_another_group_releases_pay_for_a_growth_in_a_full_pool():
    """Full + chunked local (C = 8) over 8 blocks: a 16-token prompt holds 4 + 4, none free. Token
    17 needs block 4 in the full group; the chunked group's chunk now starts at 16, so it releases
    blocks 0-3 and takes block 4: net -2, and the growth fits although no block was free (vLLM frees
    skipped blocks first)."""
    pool = SharedBlockPool(8, BLOCK)
    kv = shared(FullAttentionGroup(spec(8), pool, 4096), ChunkedLocalGroup(spec(8), pool, 4096, chunk=8))
    kv.admit(1, prompt(16), 40, 101)
    assert pool.free_blocks == 0
    assert kv.fits_growth([1], 1)
    kv.grow(1, 1)
    assert pool.free_blocks == 2


def test_a_pool_too_small_refuses_growth_and_changes_nothing():
    """Full + Mamba over 5 blocks: a 12-token prompt holds 3 + 1; token 13 takes the last block; token
    17 would need a fifth full block: refused, and nothing moves."""
    pool = SharedBlockPool(5, BLOCK)
    kv = shared(FullAttentionGroup(spec(5), pool, 4096), MambaGroup(spec(5), pool, 4096))
    kv.admit(1, prompt(12), 40, 101)
    kv.grow(1, 1)
    assert pool.free_blocks == 0
    before = kv.breakdown_values()
    assert not kv.fits_growth([1], 4)
    with pytest.raises(OutOfKVMemory, match="needs 4 slots of the shared block pool, 0 available"):
        kv.grow(1, 4)
    assert kv.breakdown_values() == before and kv.seq_len(1) == 13


OPERATIONS = st.lists(
    st.tuples(st.sampled_from(["admit", "grow", "free", "fork"]), st.integers(0, 7), st.integers(1, 30)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(OPERATIONS, st.sampled_from([2, 6, 64]))
def test_the_shared_pool_stays_whole_under_any_operations(operations, prefill_tokens):
    """Each group's part plus the pool's free blocks is the pool at every step; free blocks never go
    negative; every live sequence is in every group; a refused operation changes nothing."""
    kv = hybrid(blocks=40, prefill_tokens=prefill_tokens)
    live: dict[int, int] = {}
    next_id = 1
    for operation, pick, size in operations:
        before = kv.breakdown_values()
        try:
            if operation == "admit":
                seq_id, next_id = next_id, next_id + 1
                kv.admit(seq_id, prompt(size, seq_id), size + 40, 1000 + seq_id)
                live[seq_id] = size + 40
            elif live:
                seq_id = sorted(live)[pick % len(live)]
                if operation == "grow":
                    kv.grow(seq_id, max(1, min(size, live[seq_id] - kv.seq_len(seq_id))))
                elif operation == "free":
                    kv.free(seq_id)
                    del live[seq_id]
                else:
                    child, next_id = next_id, next_id + 1
                    kv.fork(seq_id, [ChildSpec(child, live[seq_id], -child)])
                    live[child] = live[seq_id]
        except (OutOfKVMemory, PolicyInputError):
            assert kv.breakdown_values() == before
        assert sum(kv.breakdown_values()) == kv.pool_slots == 40 * BLOCK + 3
        assert all(value >= 0 for value in kv.breakdown_values())
        for group in kv.groups:
            assert sorted(group.policy.live_sequences()) == sorted(live)


def test_a_chunk_that_is_no_multiple_of_the_block_releases_where_its_chunks_start():
    """C = 6, blocks of 4. Prompt 5 holds blocks 0-1. Token 7 (computed 6: chunk 6..11 starts in
    block 1) releases block 0, so the room before it is 1 token (token 6). Then block 1 stays until
    a chunk starts in block 2 or later: chunks start at 12 (block 3), so the release comes with
    token 13; the held blocks end at 8, so the room is 1 (token 8), then 4 more (block 2), then 0."""
    pool = SharedBlockPool(10, BLOCK)
    local = ChunkedLocalGroup(spec(10), pool, prefill_tokens=4096, chunk=6)
    local.admit(1, prompt(5), 40, 101)
    assert local.held_blocks(1) == (0, 2) and local.growth_room(1) == 1
    local.grow(1, 1)  # 6 tokens
    assert local.held_blocks(1) == (0, 2) and local.growth_room(1) == 0
    local.grow(1, 1)  # 7 tokens: computed 6, chunk from 6, block 1
    assert local.held_blocks(1) == (1, 2) and local.growth_room(1) == 1
    local.grow(1, 2)  # 9 tokens: block 2 taken
    assert local.held_blocks(1) == (1, 3) and local.growth_room(1) == 3  # tokens 10-12; 13 releases
    local.grow(1, 3)
    local.grow(1, 1)  # 13 tokens: computed 12, chunk from 12 = block 3
    assert local.held_blocks(1) == (3, 4) and pool.free_blocks == 9


def test_a_growth_is_refused_whole_for_a_bad_sequence_or_length():
    """Two 4-token sequences (final 10) in a pool of 4 blocks: 2 free. Each bad request changes
    nothing; growing both to 10 tokens needs 2 more blocks each, 4 > 2: refused whole."""
    pool = SharedBlockPool(4, BLOCK)
    full = FullAttentionGroup(spec(4), pool, 4096)
    full.admit(1, prompt(4), 10, 101)
    full.admit(2, prompt(4, 2), 10, 102)
    for seq_ids, tokens, message in [
        ([1, 1], [1, 1], "distinct sequence ids"),
        ([1, 2], [1], "one token count each"),
        ([1, 9], [1, 1], "unknown sequence id 9"),
        ([1, 2], [1, 7], "passes its final length 10"),
    ]:
        with pytest.raises(PolicyInputError, match=message):
            full.grow_each(seq_ids, tokens)
        assert (full.seq_len(1), full.seq_len(2), pool.free_blocks) == (4, 4, 2)
    with pytest.raises(OutOfKVMemory, match="needs 16 slots of the shared pool, 8 free"):
        full.grow_each([1, 2], [6, 6])
    assert (full.seq_len(1), full.seq_len(2), pool.free_blocks) == (4, 4, 2)
    assert full.stats.allocation_failures == 1


def test_the_coordinator_returns_each_sequences_least_room_over_the_groups():
    """Full and sliding (W = 8) over one pool, blocks of 4, prompt 10 (final 40), then 2 tokens:
    full holds blocks 0-2, room 0 (12 tokens fill them); sliding holds 1-2 after releasing block 0
    at token 12, room 0. Then one more: full room 3, sliding room min(3, 16 - 13 - 1 = 2) = 2."""
    pool = SharedBlockPool(20, BLOCK)
    kv = shared(FullAttentionGroup(spec(20), pool, 4096), SlidingWindowGroup(spec(20), pool, 4096, window=8))
    kv.admit(1, prompt(10), 40, 101)
    kv.admit(2, prompt(6, 2), 40, 102)
    assert kv.grow_each([1, 2], [2, 2]) == [0, 0]
    # seq 2: 8 tokens, blocks 0-1 full (room 0); sliding holds 0-1, releases block 0 at 12 tokens.
    assert kv.grow_each([1, 2], [1, 1]) == [2, 2]
    assert [kv.growth_room(1), kv.growth_room(2)] == [2, 2]


def test_a_fork_takes_the_parents_held_blocks_in_every_group_or_none():
    """A 20-token parent holds 5 full blocks and 3 sliding ones (W = 8: blocks 2-4 after 20 tokens
    decoded... at admission the prompt's last cdiv(8 - 1 + 20, 4) + 1 = 8 > 5: all 5). Its first
    token releases the sliding blocks before (21 - 8) // 4 = 3: held 3-5. A child copies 6 + 3 = 9
    blocks: of 20, 20 - 6 - 3 = 11 free, one child fits, a second does not, and changes nothing."""
    pool = SharedBlockPool(20, BLOCK)
    kv = shared(FullAttentionGroup(spec(20), pool, 4096), SlidingWindowGroup(spec(20), pool, 4096, window=8))
    kv.admit(1, prompt(20), 60, 101)
    kv.grow(1, 1)
    assert [group.policy.held_blocks(1) for group in kv.groups] == [(0, 6), (3, 6)]
    assert pool.free_blocks == 11
    kv.fork(1, [ChildSpec(2, 60, -2)])
    assert pool.free_blocks == 2 and [group.policy.held_blocks(2) for group in kv.groups] == [(0, 6), (3, 6)]
    # The child's copy holds the tokens of the parent's held blocks: all 21 in the full group, the 21 -
    # 3 x 4 = 9 past the released blocks in the sliding one.
    assert [group.policy.stats.fork_copied_tokens for group in kv.groups] == [21, 9]
    before = kv.breakdown_values()
    with pytest.raises(OutOfKVMemory, match="forking sequence 1 needs 36 slots of the shared block pool, 8"):
        kv.fork(1, [ChildSpec(3, 60, -3)])
    assert kv.breakdown_values() == before and sorted(kv.groups[0].policy.live_sequences()) == [1, 2]


def test_a_shared_pool_is_checked_when_it_is_made():
    with pytest.raises(PolicyInputError, match="needs blocks, got 0 of 4 slots"):
        SharedBlockPool(0, BLOCK)
    with pytest.raises(PolicyInputError, match="pool_slots=7 cannot hold 2 blocks of 4"):
        SharedBlockPool(2, BLOCK, pool_slots=7)
    pool = SharedBlockPool(2, BLOCK, pool_slots=10)
    assert pool.breakdown_values() == (0, 0, 0, 2, 0, 8)  # 2 slots past the last block
    with pytest.raises(OutOfKVMemory, match="admitting needs 3 blocks of the shared pool, 2 free"):
        pool.take(3, "admitting")
    with pytest.raises(PolicyInputError, match="block_size 8 differs from the shared pool's 4"):
        FullAttentionGroup(PoolSpec(64, 8, 64), pool, 4096)
    with pytest.raises(PolicyInputError, match="sliding window must be positive, got 0"):
        SlidingWindowGroup(spec(2), pool, 4096, window=0)
    with pytest.raises(PolicyInputError, match="attention chunk must be positive, got -1"):
        ChunkedLocalGroup(spec(2), pool, 4096, chunk=-1)
    other = SharedBlockPool(2, BLOCK)
    with pytest.raises(ValueError, match="share a block pool, so one page size, but their slot_bytes differ"):
        make_coordinator(
            [
                KVGroup("a", FullAttentionGroup(spec(2), other, 4096), slot_bytes=2),
                KVGroup("b", MambaGroup(spec(2), other, 4096), slot_bytes=3),
            ]
        )


@pytest.mark.parametrize(
    "layout",
    [
        "vllm-hybrid-groups",
        "vllm-hybrid-prefix",
        "vllm-hybrid-prefix-deferred",
        "vllm-hybrid-prefix-marconi-deferred",
        "sglang-hybrid-pools",
        "jenga-pages",
        "jenga-prefix",
        "jenga-prefix-deferred",
        "jenga-whole-pages",
        "sglang-mamba-extra-buffer",
        "sglang-mamba-no-buffer-deferred",
        "sglang-mamba-extra-buffer-deferred",
        "vllm-hybrid-prefix-lazy",
        "vllm-hybrid-prefix-lazy-deferred",
    ],
)
def test_fuzz_driver_keeps_every_group_whole(layout):
    """``make fuzz``'s hybrid variants, briefly: 3,000 seeded operations of its mix, each followed by
    the per-group checks of tests/hybrid_driver.py; memory must bind (some operations refused) and
    every kind of operation must run."""
    import numpy as np

    from tests.fuzz import WEIGHTS
    from tests.hybrid_driver import HybridDriver

    driver = HybridDriver(layout)
    rng = np.random.default_rng(5)
    kinds = list(WEIGHTS)
    for pick in rng.choice(len(kinds), size=3000, p=list(WEIGHTS.values())):
        driver.apply(kinds[pick], int(rng.integers(0, 50)), int(rng.integers(0, 21)))
    driver.drain()
    assert {"admit", "grow", "fork", "free", "preempt", "decode_step"} <= set(driver.done)
    assert ("schedule" in driver.done) == driver.defers
    assert driver.failed["admit"] > 0 and driver.failed["grow"] + driver.failed["decode_step"] > 0


def test_a_growth_fits_together_only_if_it_fits_request_by_request():
    """Full + chunked local (C = 8) over 10 blocks. Request 1's 16-token prompt holds 4 + 4 blocks,
    request 2's 4-token prompt 1 + 1: none free. Token 17 of request 1 needs full block 4 while its
    chunk moves on to 16 (blocks 0-3 go, block 4 comes): net -2. Token 5 of request 2 needs block 1 in
    both groups: +2. Together net 0, so the growth is allowed; but vLLM allocates request by request,
    so it fits in the order 1, 2 and not in the order 2, 1 (request 2 would find no free block and be
    preempted): the engine tells them together only when the order it tells them in fits."""
    pool = SharedBlockPool(10, BLOCK)
    kv = shared(FullAttentionGroup(spec(10), pool, 4096), ChunkedLocalGroup(spec(10), pool, 4096, chunk=8))
    kv.admit(1, prompt(16), 40, 101)
    kv.admit(2, prompt(4, 2), 40, 102)
    assert pool.free_blocks == 0
    assert kv.fits_growth_each([1, 2], [1, 1])
    assert not kv.fits_growth_each([2, 1], [1, 1])
    assert not kv.fits_growth_each([2], [1]) and kv.fits_growth_each([1], [1])
    kv.grow_each([1, 2], [1, 1])
    assert pool.free_blocks == 0
