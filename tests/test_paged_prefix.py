"""Hand-worked scenarios for the paged and prefix-caching policies (exact block ids and breakdowns)."""

from __future__ import annotations

import pytest

from policies import ChildSpec, OutOfKVMemory, PolicyInputError, PoolSpec, make_policy
from policies.base import MemoryBreakdown
from policies.paged import PagedPolicy
from policies.prefix import PrefixCachingPolicy
from token_content import token_ids


def ids(first: int, last: int):
    return token_ids(range(first, last + 1))


def prefix_pool(num_blocks: int = 10, block_size: int = 4, max_model_len: int = 64) -> PrefixCachingPolicy:
    policy = make_policy("prefix", PoolSpec(num_blocks * block_size, block_size, max_model_len))
    assert isinstance(policy, PrefixCachingPolicy)
    return policy


def assert_sums(policy) -> None:
    assert policy.breakdown().total == policy.pool_slots


class TestVllmPrefixCachingDesignDoc:
    """docs/design/prefix_caching.md in vllm-project/vllm: block size 4, 10 blocks (ids 0-9)."""

    def drive_to_time_6(self) -> PrefixCachingPolicy:
        policy = prefix_pool()
        policy.admit(0, ids(1, 15), 40, output_content_id=1000)
        assert policy.block_table(0) == [0, 1, 2, 3]
        policy.grow(0, 1, token_ids([16]))
        policy.grow(0, 1, token_ids([17]))
        assert policy.block_table(0) == [0, 1, 2, 3, 4]
        # Time 3: 14 tokens sharing the first 10 with request 0 hit exactly 2 blocks (8 tokens).
        cached = policy.admit(1, ids(1, 10) + ids(101, 104), 40, output_content_id=1001)
        assert cached == 8
        assert policy.block_table(1) == [0, 1, 5, 6]
        policy.grow(0, 3, token_ids([18, 19, 20]))
        policy.grow(1, 2, token_ids([105, 106]))
        for seq in (0, 1):
            policy.free(seq)
            assert_sums(policy)
        return policy

    def test_free_queue_at_time_6(self):
        policy = self.drive_to_time_6()
        assert policy.free_queue_order() == [7, 8, 9, 4, 3, 2, 6, 5, 1, 0]
        # Every block is free or cached: 7 full blocks with hashes (0-6), 3 never used (7-9).
        assert policy.breakdown().as_dict() == {
            "used": 0,
            "reserved": 0,
            "internal_fragmentation": 0,
            "external_fragmentation": 0,
            "cached": 28,
            "free": 12,
        }

    def test_request_2_hits_three_blocks_and_evicts_4_and_3(self):
        policy = self.drive_to_time_6()
        cached = policy.admit(2, ids(1, 12) + ids(201, 217), 40, output_content_id=1002)
        assert cached == 12
        assert policy.block_table(2) == [0, 1, 2, 7, 8, 9, 4, 3]
        assert policy.stats.evictions == 2
        # 29 tokens in 8 blocks (32 slots); final length 40 > 32, so the 3 empty slots are reserved.
        # Cached: blocks 5 and 6 (full, hashed, no owner) = 8 slots.
        assert policy.breakdown().as_dict() == {
            "used": 29,
            "reserved": 3,
            "internal_fragmentation": 0,
            "external_fragmentation": 0,
            "cached": 8,
            "free": 0,
        }
        assert policy.stats.prefix_cache_queries == 15 + 14 + 29
        assert policy.stats.prefix_cache_hits == 8 + 12


def test_freed_partial_block_goes_to_the_head_and_cached_blocks_to_the_tail_in_reverse():
    """vLLM #42656: a freed block with no hash is reused before any cached block."""
    policy = prefix_pool(num_blocks=6)
    policy.admit(0, ids(1, 10), 12, output_content_id=500)  # blocks 0,1 full; 2 holds 2 tokens
    assert policy.free_queue_order() == [3, 4, 5]
    policy.free(0)
    # Reverse order: 2 (no hash) to the head; then 1, 0 appended to the tail.
    assert policy.free_queue_order() == [2, 3, 4, 5, 1, 0]
    assert policy.breakdown().cached == 8


def test_last_prompt_token_is_always_computed():
    policy = prefix_pool()
    policy.admit(0, ids(1, 8), 8, output_content_id=500)  # exactly 2 full blocks
    policy.free(0)
    # The same 8-token prompt may hit only (8 - 1) // 4 = 1 block.
    assert policy.admit(1, ids(1, 8), 8, output_content_id=501) == 4
    assert policy.block_table(1) == [0, 2]


def test_a_key_held_twice_falls_to_the_second_block_when_the_first_is_evicted():
    """The capped hit above leaves two blocks under one key (tokens 5-8 after block 0): the first
    cached answers hits; once evicted, the other one does."""
    policy = prefix_pool(num_blocks=6)
    policy.admit(0, ids(1, 8), 8, output_content_id=500)
    policy.free(0)
    assert policy.admit(1, ids(1, 8), 8, output_content_id=501) == 4
    assert policy.block_table(1) == [0, 2]  # block 2 holds what block 1 holds, under the same key
    policy.free(1)
    assert policy.free_queue_order() == [3, 4, 5, 1, 2, 0]
    policy.admit(2, ids(100, 115), 16, output_content_id=502)  # 3 blank blocks, then evicts block 1
    assert policy.block_table(2) == [3, 4, 5, 1] and policy.stats.evictions == 1
    policy.free(2)
    assert policy.admit(3, ids(1, 12), 12, output_content_id=503) == 8
    assert policy.block_table(3)[:2] == [0, 2]
    assert_sums(policy)


def test_namespace_separates_caches():
    policy = prefix_pool()
    policy.admit(0, ids(1, 9), 9, output_content_id=500, namespace=7)
    assert policy.admit(1, ids(1, 9), 9, output_content_id=501, namespace=8) == 0
    assert policy.admit(2, ids(1, 9), 9, output_content_id=502, namespace=7) == 8


def test_only_identical_content_is_shared():
    """Blocks are matched by their whole key (pieces, namespace, parent block), never by a hash."""
    policy = make_policy("prefix", PoolSpec(40, 4, 64))
    policy.admit(0, ids(1, 9), 9, output_content_id=500)
    # Different first block: must miss.
    assert policy.admit(1, ids(11, 19), 9, output_content_id=501) == 0
    # Same first block, different second block: 1 block only.
    assert policy.admit(2, ids(1, 4) + ids(21, 25), 9, output_content_id=502) == 4
    # The true repeat of request 0 hits both of its blocks.
    assert policy.admit(3, ids(1, 9), 9, output_content_id=503) == 8
    assert policy.block_table(3)[:2] == policy.block_table(0)[:2]
    assert_sums(policy)


def test_same_block_after_a_different_prefix_is_not_shared():
    policy = make_policy("prefix", PoolSpec(40, 4, 64))
    policy.admit(0, ids(1, 4) + ids(50, 54), 9, output_content_id=500)
    # Same second block, different first block: the second block must not be shared.
    assert policy.admit(1, ids(11, 14) + ids(50, 54), 9, output_content_id=501) == 0


def test_segments_share_exactly_the_common_tokens():
    policy = prefix_pool(num_blocks=20, block_size=4)
    system = (7, 10)  # the first 10 tokens of stream 7
    policy.admit(0, (system, (100, 6)), 16, output_content_id=500)
    # A prompt with only the first 9 tokens of stream 7 shares 2 full blocks (8 tokens).
    assert policy.admit(1, ((7, 9), (101, 7)), 16, output_content_id=501) == 8
    # 10 shared tokens still give only 2 full blocks: block 2 mixes streams 7 and 100.
    assert policy.admit(2, (system, (102, 6)), 16, output_content_id=502) == 8


def test_decode_blocks_are_cached_for_the_next_conversation_turn():
    policy = prefix_pool(num_blocks=20, block_size=4)
    policy.admit(0, ((7, 6),), 14, output_content_id=900)
    policy.grow(0, 8)  # generated tokens: first 8 tokens of stream 900
    policy.free(0)
    # Turn 2 = turn 1's prompt + its answer + a new user message: 14 tokens reusable -> 3 blocks.
    assert policy.admit(1, ((7, 6), (900, 8), (901, 5)), 19, output_content_id=902) == 12


def test_fork_shares_blocks_and_copies_only_partial_shared_tail():
    """Seed 003 §4.2: a write into a shared partly filled block copies it; full blocks never."""
    policy = prefix_pool(num_blocks=10, block_size=4)
    policy.admit(0, ids(1, 6), 12, output_content_id=500)  # blocks 0 (full), 1 (2 tokens)
    policy.fork(0, [ChildSpec(1, 12, 501), ChildSpec(2, 10, 502)])
    assert policy.block_table(1) == policy.block_table(2) == [0, 1]
    assert policy.ref_count[0] == 3 and policy.ref_count[1] == 3
    # Shared tail: 2 filled; the owners reach 12, 12 and 10 -> the block's target is full (4).
    assert policy.breakdown().as_dict() == {
        "used": 6,
        "reserved": 2,
        "internal_fragmentation": 0,
        "external_fragmentation": 0,
        "cached": 0,
        "free": 32,
    }
    policy.grow(1, 1)  # copy-on-write: child 1 gets its own copy of block 1
    assert policy.stats.cow_copies == 1
    assert policy.block_table(1) == [0, 2]
    assert policy.ref_count[1] == 2 and policy.ref_count[0] == 3
    policy.grow(0, 2)  # still shared with child 2 -> another copy
    policy.grow(2, 2)  # now the last owner: writes in place, no copy
    assert policy.stats.cow_copies == 2
    assert policy.block_table(2) == [0, 1]
    policy.grow(0, 4)  # parent's block 3 is full: the next tokens take a new block, no copy
    assert policy.stats.cow_copies == 2
    assert_sums(policy)
    for seq in (0, 1, 2):
        policy.free(seq)
    assert policy.breakdown().used == 0 and policy.breakdown().reserved == 0


def test_a_shared_tails_target_is_the_most_its_remaining_owners_will_fill():
    """Forks whose final lengths end inside the shared tail: its target follows its owners as they
    join and leave (block size 4; each breakdown worked out by hand)."""
    policy = prefix_pool(num_blocks=10, block_size=4)
    policy.admit(0, ids(1, 6), 7, output_content_id=500)  # block 0 full, block 1 holds 2 of 3 to come
    split = ("used", "reserved", "internal_fragmentation")

    def breakdown() -> tuple[int, int, int]:
        values = policy.breakdown().as_dict()
        return tuple(values[name] for name in split)

    assert breakdown() == (6, 1, 1)
    # Children reaching 8 and 6 tokens: the tail will hold max(3, 4, 2) = 4.
    policy.fork(0, [ChildSpec(1, 8, 501), ChildSpec(2, 6, 502)])
    assert breakdown() == (6, 2, 0)
    policy.free(1)  # the owner reaching 8 leaves: max(3, 2) = 3
    assert breakdown() == (6, 1, 1)
    # The parent writes its 7th token: it copies the tail (3 of 3); child 2 keeps the old one, 2 of 2.
    policy.grow(0, 1)
    assert policy.stats.cow_copies == 1 and policy.block_table(2) == [0, 1]
    assert breakdown() == (4 + 3 + 2, 0, 3 * 4 - (4 + 3 + 2))
    policy.free(2)  # block 1 freed (2 of 2)
    assert breakdown() == (7, 0, 1)
    policy.free(0)
    assert breakdown() == (0, 0, 0)
    assert_sums(policy)


def test_fork_of_full_tail_never_copies():
    policy = prefix_pool()
    policy.admit(0, ids(1, 8), 16, output_content_id=500)
    policy.fork(0, [ChildSpec(1, 16, 501)])
    policy.grow(0, 1)
    policy.grow(1, 1)
    assert policy.stats.cow_copies == 0
    assert policy.block_table(0)[:2] == policy.block_table(1)[:2]
    assert policy.block_table(0)[2] != policy.block_table(1)[2]


def test_beam_search_prunes_and_forks_mid_generation():
    policy = prefix_pool(num_blocks=16)
    policy.admit(0, ids(1, 5), 16, output_content_id=500)
    policy.fork(0, [ChildSpec(1, 16, 501)])
    policy.grow(0, 3)
    policy.grow(1, 3)
    # Beam 1 is pruned; beam 0 survives and is forked into beams 2 and 3.
    policy.free(1)
    policy.fork(0, [ChildSpec(2, 16, 502), ChildSpec(3, 16, 503)])
    for seq in (0, 2, 3):
        policy.grow(seq, 1)
    assert_sums(policy)
    assert sorted(policy.live_sequences()) == [0, 2, 3]


def test_pinned_prefix_is_never_evicted():
    policy = prefix_pool(num_blocks=4, block_size=4)
    assert policy.pin_prefix(ids(1, 9)) == 8  # two full blocks pinned; the 9th token is not
    assert policy.breakdown().cached == 8
    assert policy.available_slots() == 8
    # Fill all the rest, then free: the pinned blocks must survive any amount of churn.
    policy.admit(0, ids(50, 57), 8, output_content_id=500)
    with pytest.raises(OutOfKVMemory):
        policy.admit(1, ids(60, 61), 2, output_content_id=501)
    policy.free(0)
    policy.admit(2, ids(70, 77), 8, output_content_id=502)
    policy.free(2)
    assert policy.admit(3, ids(1, 9) + ids(80, 81), 11, output_content_id=503) == 8
    assert_sums(policy)


def test_seed_003_block_arithmetic():
    """Seed 003: 50 tokens in 16-token blocks take 4 blocks; 150 tokens take 10, tail waste 10/160."""
    policy = make_policy("paged", PoolSpec(16 * 20, 16, 256))
    policy.admit(0, ((1, 50),), 50, output_content_id=500)
    assert len(policy.block_table(0)) == 4
    policy.admit(1, ((2, 150),), 150, output_content_id=501)
    assert len(policy.block_table(1)) == 10
    policy.free(0)
    breakdown = policy.breakdown()
    assert breakdown.used == 150
    assert breakdown.internal_fragmentation == 10
    assert breakdown.internal_fragmentation / (len(policy.block_table(1)) * 16) == pytest.approx(10 / 160)


def test_paged_free_puts_a_sequences_blocks_back_first_block_first():
    """Plain paging returns a freed sequence's blocks to the head of the queue, the partly filled tail
    first and the first block last, so the next sequence takes them in their old order."""
    policy = make_policy("paged", PoolSpec(4 * 8, 4, 64))
    policy.admit(0, ((1, 10),), 10, output_content_id=500)  # blocks 0, 1 (full) and 2 (2 of 4)
    policy.admit(1, ((2, 4),), 4, output_content_id=501)  # block 3
    policy.free(0)
    assert policy.free_queue.order()[:4] == [0, 1, 2, 4]
    policy.admit(2, ((3, 9),), 9, output_content_id=502)
    assert policy.block_table(2) == [0, 1, 2]


def test_design_doc_accounting_example():
    """design.md: block 16, prompt 20, final 50, now at 30 -> used 30, reserved 2, internal 0; at the end
    the 4th block carries 14 slots of internal fragmentation."""
    policy = make_policy("paged", PoolSpec(16 * 8, 16, 2048))
    policy.admit(0, ((1, 20),), 50, output_content_id=500)
    policy.grow(0, 10)
    breakdown = policy.breakdown()
    assert (breakdown.used, breakdown.reserved, breakdown.internal_fragmentation) == (30, 2, 0)
    policy.grow(0, 20)
    breakdown = policy.breakdown()
    assert (breakdown.used, breakdown.reserved, breakdown.internal_fragmentation) == (50, 0, 14)
    assert breakdown.free == 16 * 4


def test_paged_fork_copies_tokens():
    policy = make_policy("paged", PoolSpec(16 * 8, 16, 256))
    policy.admit(0, ((1, 20),), 40, output_content_id=500)
    policy.fork(0, [ChildSpec(1, 40, 501)])
    assert policy.stats.fork_copied_tokens == 20
    assert len(policy.block_table(1)) == 2
    assert set(policy.block_table(0)).isdisjoint(policy.block_table(1))


def test_out_of_memory_leaves_state_unchanged():
    policy = make_policy("paged", PoolSpec(16 * 3, 16, 256))
    policy.admit(0, ((1, 40),), 60, output_content_id=500)
    before = policy.breakdown()
    with pytest.raises(OutOfKVMemory) as error:
        policy.grow(0, 20)  # needs 2 more blocks, 0 free
    assert (error.value.needed_slots, error.value.free_slots) == (16, 0)
    assert policy.breakdown() == before
    assert policy.seq_len(0) == 40
    assert policy.stats.allocation_failures == 1


@pytest.mark.parametrize("name", ["paged", "prefix"])
def test_bad_input_names_the_value_and_changes_nothing(name):
    policy = make_policy(name, PoolSpec(16 * 4, 16, 64))
    policy.admit(0, ((1, 10),), 20, output_content_id=500)
    before = policy.breakdown()
    with pytest.raises(PolicyInputError, match="99"):
        policy.grow(99, 1)
    with pytest.raises(PolicyInputError, match="final length 20"):
        policy.grow(0, 11)
    with pytest.raises(PolicyInputError, match="-3"):
        policy.grow(0, -3)
    with pytest.raises(PolicyInputError, match="already allocated"):
        policy.admit(0, ((1, 10),), 20, output_content_id=500)
    with pytest.raises(PolicyInputError, match="max_model_len=64"):
        policy.admit(1, ((1, 10),), 65, output_content_id=501)
    assert policy.breakdown() == before
    policy.free(0)
    with pytest.raises(PolicyInputError, match="unknown sequence id 0"):
        policy.free(0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kv_pool_tokens": 64, "block_size": 0, "max_model_len": 64}, "block_size"),
        ({"kv_pool_tokens": 8, "block_size": 16, "max_model_len": 64}, "smaller than one block"),
        ({"kv_pool_tokens": 64, "block_size": 16, "max_model_len": -1}, "max_model_len"),
    ],
)
def test_bad_pool(kwargs, message):
    with pytest.raises(PolicyInputError, match=message):
        PoolSpec(**kwargs)


def test_unknown_policy_lists_known_ones():
    with pytest.raises(PolicyInputError, match="known policies: .*paged"):
        make_policy("pagd", PoolSpec(64, 16, 64))


def test_paged_is_not_prefix():
    assert type(make_policy("paged", PoolSpec(64, 16, 64))) is PagedPolicy


def test_breakdown_in_bytes():
    policy = make_policy("paged", PoolSpec(64, 16, 64, kv_bytes_per_token=131_072))
    policy.admit(0, ((1, 20),), 30, output_content_id=500)
    assert policy.breakdown().in_bytes(131_072) == {
        "used_bytes": 20 * 131_072,
        "reserved_bytes": 10 * 131_072,
        "internal_fragmentation_bytes": 2 * 131_072,
        "external_fragmentation_bytes": 0,
        "cached_bytes": 0,
        "free_bytes": 32 * 131_072,
    }


def test_pool_spec_limits_and_out_of_memory_message() -> None:
    from policies.base import OutOfKVMemory, PolicyInputError, PoolSpec

    assert PoolSpec(16, 16, 16).kv_pool_blocks == 1  # exactly one block is a pool
    with pytest.raises(PolicyInputError, match="smaller than one block"):
        PoolSpec(15, 16, 16)
    error = OutOfKVMemory("no room", needed_slots=4, free_slots=1)
    assert (str(error), error.needed_slots, error.free_slots) == ("no room", 4, 1)


def test_pin_prefix_messages_and_room():
    policy = prefix_pool(num_blocks=10, block_size=4)
    with pytest.raises(PolicyInputError) as error:
        policy.pin_prefix(ids(1, 3))
    assert str(error.value) == "pinned prompt is shorter than one block (4 tokens)"
    with pytest.raises(PolicyInputError, match=r"^pinned prompt: segment 0 is \(1, -1\)"):
        policy.pin_prefix(((1, -1),))
    # A live sequence takes 8 of the 10 blocks: a 3-block prefix does not fit, a 2-block one does.
    policy.admit(0, ((7, 32),), 32, output_content_id=500)
    with pytest.raises(OutOfKVMemory) as oom:
        policy.pin_prefix(ids(1, 12))
    assert str(oom.value) == "pinning a prefix needs 3 free blocks, 2 available"
    assert policy.pin_prefix(ids(1, 8)) == 8
    # The pool is now full. Pinning the same prefix again takes nothing (its blocks are pinned and
    # idle, not in the free queue), and pins nothing new.
    assert policy.pin_prefix(ids(1, 8)) == 0
    # Pinning a prefix a live sequence holds takes nothing either: its 8 blocks are shared.
    assert policy.pin_prefix(((7, 32),)) == 32
    assert policy.breakdown() == MemoryBreakdown(32, 0, 0, 0, 8, 0)


def test_pinning_cached_blocks_counts_those_in_the_free_queue():
    # 10 blocks of 4. A sequence's prompt ids(11..18) (2 blocks) is freed: 2 evictable cached blocks
    # in the free queue. A live sequence then takes 7 blocks: 3 left in the queue, 2 of them cached.
    policy = prefix_pool(num_blocks=10, block_size=4)
    policy.admit(0, ids(11, 18), 8, output_content_id=500)
    policy.free(0)
    policy.admit(1, ((7, 28),), 28, output_content_id=501)
    assert policy.breakdown() == MemoryBreakdown(28, 0, 0, 0, 8, 4)
    # ids(11..30): 20 tokens = 5 full blocks, 2 of them hits (both in the queue) and 3 new: it needs
    # 5 - 2 + 2 = 5 queue blocks > 3: no room.
    with pytest.raises(OutOfKVMemory, match="^pinning a prefix needs 5 free blocks, 3 available$"):
        policy.pin_prefix(ids(11, 30))
    # 12 tokens = 3 blocks: 2 hits + 1 new block = all 3 queue blocks: fits exactly.
    assert policy.pin_prefix(ids(11, 22)) == 12
    assert policy.breakdown() == MemoryBreakdown(28, 0, 0, 0, 12, 0)


def test_pins_are_per_namespace_and_a_live_hit_on_a_pinned_block_is_not_cached():
    policy = prefix_pool(num_blocks=10, block_size=4)
    policy.admit(0, ids(1, 8), 8, output_content_id=500, namespace=0)
    policy.free(0)  # 2 evictable blocks in namespace 0
    # The same tokens pinned in namespace 1 hit nothing there: 2 new blocks.
    assert policy.pin_prefix(ids(1, 8), namespace=1) == 8
    assert policy.breakdown().cached == 16
    # A sequence of namespace 1 hits the 2 pinned blocks: while it lives they are used, not cached.
    assert policy.admit(1, ids(1, 9), 9, output_content_id=501, namespace=1) == 8
    assert policy.breakdown() == MemoryBreakdown(9, 0, 3, 0, 8, 20)
    policy.free(1)
    # Back to 16 cached: its third block held 1 token (a partial block is never cached): freed.
    assert policy.breakdown() == MemoryBreakdown(0, 0, 0, 0, 16, 24)


def test_output_grown_token_by_token_is_hit_by_the_next_turn():
    # Turn 1: prompt ids(1..4) (1 block), 8 output tokens of stream 500 grown one at a time.
    # Turn 2's prompt is turn 1's prompt + those 8 output tokens + 2 new tokens (14 tokens): its
    # first 3 blocks (12 tokens; the hit is capped below the prompt length) come from the cache.
    policy = prefix_pool(num_blocks=10, block_size=4)
    policy.admit(0, ids(1, 4), 12, output_content_id=500)
    for _ in range(8):
        policy.grow(0, 1)
    policy.free(0)
    assert policy.admit(1, ids(1, 4) + ((500, 8),) + ids(50, 51), 16, output_content_id=501) == 12
    # Only the output tokens that were really generated are reused: a prompt that names 9 of them
    # (stream 500's 9th token never existed in the cache) still hits 12.
    policy.free(1)
    assert policy.admit(2, ids(1, 4) + ((500, 9),) + ids(60, 61), 16, output_content_id=502) == 12


def test_paged_messages_and_failure_counters():
    policy = make_policy("paged", PoolSpec(8, 4, 16))
    policy.admit(1, ids(1, 6), 8, output_content_id=501)  # 2 blocks: the pool is full
    with pytest.raises(OutOfKVMemory) as error:
        policy.admit(2, ids(7, 7), 2, output_content_id=502)
    assert str(error.value) == "admitting sequence 2 needs 1 free blocks, 0 available"
    assert (error.value.needed_slots, error.value.free_slots) == (4, 0)
    with pytest.raises(OutOfKVMemory, match="^forking sequence 1 needs 2 free blocks, 0 available$"):
        policy.fork(1, [ChildSpec(3, 8, 503)])
    policy.grow(1, 2)
    assert policy.stats.allocation_failures == 2
    with pytest.raises(
        PolicyInputError, match="^sequence 1: growing 8 by 1 tokens passes its final length 8$"
    ):
        policy.grow(1, 1)
    other = make_policy("paged", PoolSpec(8, 4, 16))
    other.admit(1, ids(1, 4), 8, output_content_id=501)
    with pytest.raises(
        PolicyInputError, match="^sequence 1: content holds a different number of tokens than 1$"
    ):
        other.grow(1, 1, ids(5, 6))
    with pytest.raises(PolicyInputError, match="^fork of 1: child 2 final_len=1 must be between"):
        other.fork(1, [ChildSpec(2, 1, 502)])


def test_a_reused_partial_block_forgets_its_previous_owner():
    # One block of 4. A: prompt 2, final 4 (block target 4). Freed; B: prompt 2, final 3 takes the same
    # block: used 2, reserved 1 (token 3), internal 1 (the 4th slot B never fills).
    policy = make_policy("paged", PoolSpec(4, 4, 4))
    policy.admit(1, ids(1, 2), 4, output_content_id=501)
    policy.free(1)
    policy.admit(2, ids(5, 6), 3, output_content_id=502)
    assert policy.breakdown() == MemoryBreakdown(2, 1, 1, 0, 0, 0)


def test_can_admit_counts_pinned_hits_and_hits_count_as_logical_blocks():
    # 4 blocks of 4: ids(1..8) pinned (2 blocks), a live sequence holds 1 block, 1 block free.
    policy = prefix_pool(num_blocks=4, block_size=4)
    policy.pin_prefix(ids(1, 8))
    policy.admit(0, ((9, 4),), 4, output_content_id=500)
    # ids(1..12): the 2 pinned blocks are hits, 1 new block: fits; ids(21..32) needs 3: does not.
    assert policy.can_admit(ids(1, 12), 12)
    assert not policy.can_admit(ids(21, 32), 12)
    assert policy.admit(1, ids(1, 12), 12, output_content_id=501) == 8
    policy.free(0)
    assert policy.admit(2, ids(1, 8) + ids(40, 43), 12, output_content_id=502) == 8
    # Sequences 1 and 2 hold 3 blocks each (6 logical); the 2 prefix blocks are shared: 4 physical.
    assert policy.sharing_slots() == (4 * 4, 6 * 4)


def test_explicit_growth_content_and_a_forked_sample_are_hit_later():
    policy = prefix_pool(num_blocks=12, block_size=4)
    # Growth with explicit content: the block holds ids(5..8), and a prompt naming them hits it.
    policy.admit(0, ids(1, 4), 8, output_content_id=500)
    policy.grow(0, 4, ids(5, 8))
    policy.free(0)
    assert policy.admit(1, ids(1, 9), 9, output_content_id=501) == 8
    policy.free(1)
    # A sample forked in namespace 3 writes its own stream 700; the next turn of that sample, in the
    # same namespace, hits the prompt block and the sample's output block.
    policy.admit(2, ids(20, 23), 8, output_content_id=600, namespace=3)
    policy.fork(2, [ChildSpec(3, 8, 700)])
    policy.grow(3, 4)
    policy.free(2)
    policy.free(3)
    assert (
        policy.admit(4, ids(20, 23) + ((700, 4),) + ids(90, 90), 9, output_content_id=800, namespace=3) == 8
    )
    assert (
        policy.admit(5, ids(20, 23) + ((700, 4),) + ids(91, 91), 9, output_content_id=801, namespace=0) == 0
    )


def test_content_validation_and_registry_messages():
    from policies.base import policy_class
    from token_content import ContentError, validate_content

    validate_content(((1, 0), (2, 3)), "x")  # an empty segment is allowed
    with pytest.raises(ContentError) as error:
        validate_content(((1, 2), (3, -1)), "x")
    assert str(error.value) == "x: segment 1 is (3, -1); expected (content_id, length >= 0)"
    assert not isinstance(error.value, PolicyInputError)  # outside a policy, not a policy's error
    policy = make_policy("paged", PoolSpec(16, 4, 16))
    with pytest.raises(PolicyInputError) as error:
        policy.admit(5, ((1, 2), (3, -1)), 4, output_content_id=500)
    assert (
        str(error.value) == "prompt of sequence 5: segment 1 is (3, -1); expected (content_id, length >= 0)"
    )
    with pytest.raises(PolicyInputError) as error:
        policy_class("pagd")
    assert str(error.value) == "unknown policy 'pagd'; known policies: contiguous, paged, prefix, radix"


def test_growth_out_of_memory_message():
    policy = make_policy("paged", PoolSpec(12, 4, 16))
    policy.admit(1, ids(1, 4), 16, output_content_id=501)  # 1 block of 3
    with pytest.raises(OutOfKVMemory) as error:
        policy.grow(1, 9)  # 13 tokens: 3 more blocks, 2 free
    assert str(error.value) == "growing sequence 1 needs 3 free blocks, 2 available"
    assert (error.value.needed_slots, error.value.free_slots) == (12, 8)


def test_pinning_a_prefix_cut_inside_a_segment_and_sharing_with_a_live_sequence():
    # 5 + 8 = 13 tokens pin 3 full blocks (12 tokens: all of stream 1's 5, the first 7 of stream 2).
    policy = prefix_pool(num_blocks=10, block_size=4)
    assert policy.pin_prefix(((1, 5), (2, 8))) == 12
    assert policy.admit(0, ((1, 5), (2, 8), (3, 1)), 14, output_content_id=500) == 12
    # The live sequence holds 4 blocks (3 shared with the pins); pinning its prefix again changes
    # neither the pinned set nor what the live sequences hold.
    assert policy.pin_prefix(((1, 5), (2, 7))) == 0
    assert policy.sharing_slots() == (16, 16)


def test_a_prefix_fork_needs_no_free_block():
    # A full pool (2 blocks of 4 held by one sequence): forking shares every block.
    policy = prefix_pool(num_blocks=2, block_size=4)
    policy.admit(0, ids(1, 8), 8, output_content_id=500)
    policy.fork(0, [ChildSpec(1, 8, 501)])
    assert policy.sharing_slots() == (8, 16)


@pytest.mark.parametrize("name", ["paged", "prefix"])
def test_grow_each_refuses_repeated_or_unknown_ids_and_changes_nothing(name):
    policy = make_policy(name, PoolSpec(64, 4, 32))
    policy.admit(1, ((100, 5),), 20, output_content_id=-1)
    policy.admit(2, ((200, 3),), 20, output_content_id=-2)
    with pytest.raises(PolicyInputError, match="distinct sequence ids"):
        policy.grow_each([1, 2, 1], [1, 1, 1])
    with pytest.raises(PolicyInputError, match="unknown sequence id 7"):
        policy.grow_each([1, 7], [1, 1])
    assert (policy.seq_len(1), policy.seq_len(2)) == (5, 3)
    assert policy.grow_each([2, 1], [2, 3]) == [3, 0]  # rooms: 5 of 8 slots held, 8 of 8
