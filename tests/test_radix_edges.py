"""Edges of the ``radix`` policy (``policies/radix.py``) worked out by hand: exact error messages,
admissions and forks that fit or fail by one page, counters summed over several evictions, prompts
with one-token and empty segments, and the scheduler's match with a HiCache host tier."""

from __future__ import annotations

import pytest

from policies import ChildSpec, OutOfKVMemory, PolicyInputError, PoolSpec, make_policy
from policies._radix_tree import HiCachePool, PrefixMatch, RadixTree
from policies.base import NO_HIT, PrefixHit
from policies.radix import RadixPolicy
from tests.test_hicache import hicache
from tests.test_radix import breakdown, check_against_recount, radix_pool

# --------------------------------------------------------------------------------------------------
# Messages of refused inputs
# --------------------------------------------------------------------------------------------------


def test_refused_operations_name_the_sequence():
    policy = radix_pool(32)
    policy.admit(1, ((1, 4),), 8, output_content_id=501)
    with pytest.raises(PolicyInputError, match=r"^sequence 1 is already allocated$"):
        policy.admit(1, ((2, 4),), 8, output_content_id=502)
    with pytest.raises(PolicyInputError, match=r"^sequence 1: cannot grow by 0 tokens$"):
        policy.grow(1, 0)
    with pytest.raises(
        PolicyInputError,
        match=r"^content of sequence 1: segment 0 is \(5, -1\); expected \(content_id, length >= 0\)$",
    ):
        policy.grow(1, 1, ((5, -1),))
    with pytest.raises(
        PolicyInputError, match=r"^sequence 1: content holds a different number of tokens than 2$"
    ):
        policy.grow(1, 2, ((5, 1),))
    with pytest.raises(PolicyInputError, match=r"^fork of 1: child id 1 is already in use$"):
        policy.fork(1, [ChildSpec(1, 8, 503)])
    # Nothing changed: 4 prompt tokens in the tree, locked; 4 slots the sequence will fill.
    assert breakdown(policy) == (4, 0, 0, 0, 0, 28)
    check_against_recount(policy)


def test_bad_prompts_are_refused_by_lookup_and_match_with_their_names():
    policy = radix_pool(32)
    expected = r": segment 0 is \(1, -1\); expected \(content_id, length >= 0\)$"
    with pytest.raises(PolicyInputError, match=r"^looked-up prompt" + expected):
        policy.lookup(((1, -1),))
    with pytest.raises(PolicyInputError, match=r"^matched prompt" + expected):
        policy.match(((1, -1),))


def test_pinning_is_refused_with_the_reason():
    message = (
        r"^policy 'radix' cannot pin prefixes: SGLang's radix cache has no pinning "
        r"\(only eviction priorities\)$"
    )
    with pytest.raises(PolicyInputError, match=message):
        radix_pool(64).pin_prefix(((7, 10),))


def test_a_host_tier_is_refused_twice_after_caching_or_when_too_small():
    policy = hicache(16)
    with pytest.raises(PolicyInputError, match=r"^this policy already has a host tier$"):
        policy.enable_host_tier(16)
    # Something cached but no sequence left: still too late.
    policy = make_policy("radix", PoolSpec(kv_pool_tokens=32, block_size=4, max_model_len=64))
    policy.admit(1, ((1, 4),), 4, 901)
    policy.free(1)
    assert breakdown(policy) == (0, 0, 0, 0, 4, 28)
    with pytest.raises(
        PolicyInputError, match=r"^radix: a host tier must be enabled before anything is cached$"
    ):
        policy.enable_host_tier(16)
    with pytest.raises(PolicyInputError) as refused:
        hicache(8)  # 8 blocks of 4 = 32 host tokens, not more than the 32 device slots
    assert str(refused.value) == (
        "radix: the host pool (32 tokens) must be larger than the device pool (32 tokens): SGLang's "
        "HiCache host pool asserts it (memory_pool_host.py; --hicache-ratio > 1)"
    )


def test_pool_of_an_odd_number_of_slots_in_pages_of_one():
    # No page_size option: pages of 1, so every slot counts (15_727 is odd).
    assert RadixPolicy.pool_slots_from_memory(15_727, 256, {}) == 15_727


# --------------------------------------------------------------------------------------------------
# grow_each: one pass while nothing is evicted, one grow at a time when something must be
# --------------------------------------------------------------------------------------------------


def test_grow_each_in_pages_of_three_by_hand():
    """Pool of 30, pages of 3. A: 4 prompt tokens (3 in the tree, 1 own in a page), will reach 9.
    B: 2 prompt tokens (none in the tree: no whole page), will reach 4. Free: 30 - 3 - 3 - 3 = 21.
    grow_each: A by 4 (own 1 -> 5 tokens, pages 3 -> 6 slots; room: min(3 + 6, 9) - 8 = 1),
    B by 2 (own 2 -> 4, pages 3 -> 6, of which only 4 will be filled: room min(0 + 6, 4) - 4 = 0).
    Own tokens 9, own slots 12, slots they will fill 6 + 4 = 10: used 3 + 9, reserved 1, internal 2,
    free 30 - 3 - 12 = 15."""
    policies = [radix_pool(30, page_size=3), radix_pool(30, page_size=3)]
    for policy in policies:
        policy.admit(1, ((1, 4),), 9, output_content_id=501)
        policy.admit(2, ((2, 2),), 4, output_content_id=502)
        assert breakdown(policy) == (6, 3, 0, 0, 0, 21)
    one_pass, one_at_a_time = policies
    assert one_pass.grow_each([1, 2], [4, 2]) == [1, 0]
    assert breakdown(one_pass) == (12, 1, 2, 0, 0, 15)
    one_at_a_time.grow(1, 4)
    one_at_a_time.grow(2, 2)
    assert breakdown(one_at_a_time) == breakdown(one_pass)
    assert one_pass.sequences[1].segments == [(1, 4), (501, 4)]
    assert one_pass.sequences[2].segments == [(2, 2), (502, 2)]
    assert one_pass.sharing_slots() == one_at_a_time.sharing_slots() == (3 + 12, 3 + 12)
    check_against_recount(one_pass)
    # A's output stream grows in place: one more token joins its last segment.
    assert one_pass.grow_each([1], [1]) == [0]
    assert one_pass.sequences[1].segments == [(1, 4), (501, 5)]
    check_against_recount(one_pass)


def test_grow_each_that_needs_an_eviction_grows_one_at_a_time():
    """Pool of 10, pages of 1. A (6 tokens) finishes: a 6-token leaf, cached. B: 2 prompt tokens,
    both in the tree. Free 2, cached 6. B grows by 3: one slot short, so the cached leaf is evicted
    whole (6 evictions of a one-token page) and B's 3 tokens are its own: used 2 + 3, free 5."""
    policy = radix_pool(10)
    policy.admit(1, ((1, 6),), 6, output_content_id=501)
    policy.free(1)
    policy.admit(2, ((2, 2),), 10, output_content_id=502)
    assert breakdown(policy) == (2, 0, 0, 0, 6, 2)
    assert policy.grow_each([2], [3]) == [0]
    assert breakdown(policy) == (5, 0, 0, 0, 0, 5)
    assert policy.stats.evictions == 6
    check_against_recount(policy)


def test_grow_each_refuses_unknown_sequences_and_overgrowth_and_changes_nothing():
    policy = radix_pool(32)
    policy.admit(1, ((1, 4),), 8, output_content_id=501)
    before = breakdown(policy)
    with pytest.raises(
        PolicyInputError, match=r"^unknown sequence id 9 \(never admitted, or already freed\)$"
    ):
        policy.grow_each([1, 9], [1, 1])
    with pytest.raises(
        PolicyInputError, match=r"^sequence 1: growing 4 by 5 tokens passes its final length 8$"
    ):
        policy.grow_each([1], [5])
    with pytest.raises(PolicyInputError, match=r"^grow_each needs distinct sequence ids"):
        policy.grow_each([1, 1], [1, 1])
    assert breakdown(policy) == before
    policy.admit(2, ((2, 4),), 32, output_content_id=502)
    with pytest.raises(OutOfKVMemory, match=r"^growing sequences \[2\] needs 25 slots, 24 available$"):
        policy.grow_each([2], [25])
    assert breakdown(policy) == (8, 0, 0, 0, 0, 24)


# --------------------------------------------------------------------------------------------------
# Out of memory: what the refusal reports
# --------------------------------------------------------------------------------------------------


def test_a_growth_that_does_not_fit_reports_no_prefix_hit():
    """Pool of 8: A and B hold 4 prompt tokens each (both running): nothing is free or evictable."""
    policy = radix_pool(8)
    policy.admit(0, ((1, 4),), 8, output_content_id=500)
    policy.admit(1, ((2, 4),), 8, output_content_id=501)
    with pytest.raises(OutOfKVMemory) as refused:
        policy.grow(0, 1)
    error = refused.value
    assert error.message == "growing sequence 0 needs 1 slots, 0 available (free + evictable)"
    assert (error.needed_slots, error.free_slots, error.prefix_hit) == (1, 0, NO_HIT)


def test_an_admission_with_a_host_hit_that_does_not_fit():
    """HiCache, 32 device slots, 128 host tokens (write_through). A (20) and B (24) run and finish;
    C (26 tokens, running) evicts B to host, and B had already evicted A: A is host-only, 6 slots
    free, nothing evictable. A again: a 19-token host hit (>= 10: loaded back) plus 1 new token needs
    19 + 1 = 20 slots, 6 available: refused, reporting no device hit and the 19 host tokens."""
    policy = hicache(32)
    for seq_id, stream, tokens in ((1, 1, 20), (2, 2, 24)):
        policy.admit(seq_id, ((stream, tokens),), tokens, 900 + seq_id)
        policy.free(seq_id)
    policy.admit(3, ((3, 26),), 26, 903)
    assert breakdown(policy) == (26, 0, 0, 0, 0, 6)
    assert policy.lookup(((1, 20),)) == PrefixHit(0, (), 19)
    with pytest.raises(OutOfKVMemory) as refused:
        policy.admit(4, ((1, 20),), 20, 904)
    error = refused.value
    assert (error.needed_slots, error.free_slots, error.prefix_hit) == (20, 6, PrefixHit(0, (), 19))
    assert breakdown(policy) == (26, 0, 0, 0, 0, 6)
    check_against_recount(policy)


# --------------------------------------------------------------------------------------------------
# Admission
# --------------------------------------------------------------------------------------------------


def test_can_admit_counts_a_hit_that_a_running_sequence_holds():
    """Pool of 16, page 1. A (10 tokens of stream 1) runs: 6 free, nothing evictable. B = A's 10
    tokens + 4 new: matched 10 (locked already), 4 new slots <= 6: fits. In another namespace (or
    without the hit) B would need 14 slots."""
    policy = radix_pool(16)
    policy.admit(0, ((1, 10),), 12, output_content_id=500)
    prompt = ((1, 10), (3, 4))
    assert policy.can_admit(prompt, 14)
    assert not policy.can_admit(prompt, 14, namespace=1)
    assert policy.admit(1, prompt, 14, output_content_id=501) == 10
    # Tree: A's 10 (locked by both) + B's 4 (locked): 14 used; no sequence has own slots; 2 free.
    assert breakdown(policy) == (14, 0, 0, 0, 0, 2)
    check_against_recount(policy)


def test_an_admission_with_a_hit_evicts_only_for_its_new_tokens():
    """Pool of 16, page 1. X = 6 tokens of stream 1 cached, then Y = 4 of stream 2: 6 free. C = X's 6
    tokens + 4 new: matched 6, 4 new slots, 6 free: no eviction; Y stays cached."""
    policy = radix_pool(16)
    for seq_id, stream, tokens in ((0, 1, 6), (1, 2, 4)):
        policy.admit(seq_id, ((stream, tokens),), tokens, output_content_id=500 + seq_id)
        policy.free(seq_id)
    assert policy.admit(2, ((1, 6), (3, 4)), 10, output_content_id=502) == 6
    assert policy.stats.evictions == 0
    assert breakdown(policy) == (10, 0, 0, 0, 4, 2)
    assert policy.lookup(((2, 4), (9, 1))) == PrefixHit(4)
    check_against_recount(policy)


def test_one_token_and_empty_segments_of_a_prompt_are_matched_as_written():
    """A's prompt: 4 tokens of stream 1, 1 of stream 2, 4 of stream 3 (9 tokens), cached whole. The
    same tokens followed by one more hit all 9; with an empty segment of stream 8 inside, still 9 (it
    holds no token); without the one token of stream 2 the prompts part after 4."""
    policy = radix_pool(32)
    policy.admit(0, ((1, 4), (2, 1), (3, 4)), 9, output_content_id=500)
    policy.free(0)
    assert policy.lookup(((1, 4), (2, 1), (3, 4), (9, 1))) == PrefixHit(9)
    assert policy.lookup(((1, 4), (8, 0), (2, 1), (3, 4), (9, 1))) == PrefixHit(9)
    assert policy.lookup(((1, 4), (3, 5))) == PrefixHit(4)


def test_a_growth_with_explicit_content_caches_that_content():
    """A (4 tokens of stream 1) grows by 3 tokens given as stream 2 (not its output stream) and
    finishes: its 7 tokens are cached, so a prompt of stream 1 then stream 2 hits all 7."""
    policy = radix_pool(32)
    policy.admit(0, ((1, 4),), 10, output_content_id=500)
    policy.grow(0, 3, ((2, 3),))
    policy.free(0)
    assert policy.lookup(((1, 4), (2, 3), (9, 1))) == PrefixHit(7)
    assert policy.lookup(((1, 4), (500, 3), (9, 1))) == PrefixHit(4)
    check_against_recount(policy)


# --------------------------------------------------------------------------------------------------
# The scheduler's match with a host tier
# --------------------------------------------------------------------------------------------------


def test_the_schedulers_match_reports_the_device_hit_and_the_host_hit_loaded_back():
    """HiCache, 32 device slots (page 1). X = 20 tokens of stream 1, cached. D = X's first 8 tokens
    + 4 of stream 5, running: X splits into U (8, locked by D) and T (12, cached). E = 10 fresh
    tokens, running: 8 free, the 2-token shortfall evicts T (backed up at insertion) to host.
    X's prompt matches 19 tokens: U's 8 on the device, 11 of T in host memory (>= 10: loaded back);
    16 tokens match 8 + 7 (< 10: recomputed, no host hit)."""
    policy = hicache(32)  # 128 host tokens: nothing is dropped there
    policy.admit(1, ((1, 20),), 20, 901)
    policy.free(1)
    assert policy.admit(2, ((1, 8), (5, 4)), 12, 902) == 8
    policy.admit(3, ((3, 10),), 10, 903)
    assert policy.stats.evictions == 12
    assert breakdown(policy) == (22, 0, 0, 0, 0, 10)
    assert policy.lookup(((1, 20),)) == PrefixHit(8, (), 11)
    assert policy.match(((1, 20),)) == PrefixHit(8, (), 11)
    assert policy.match(((1, 16),)) == PrefixHit(8)
    # T is now three host-only nodes (7, 4, 1): X's prompt still finds 7 + 4 of them.
    assert policy.match(((1, 20),)) == PrefixHit(8, (), 11)
    assert breakdown(policy) == (22, 0, 0, 0, 0, 10)  # a match moves no slot
    check_against_recount(policy)
    # D and E finish; 32 fresh tokens evict everything: E's 10, D's 4, then U (its only device child
    # gone), which goes to host above T's host-only parts: a host node with children, not a leaf.
    policy.free(2)
    policy.free(3)
    policy.admit(4, ((4, 32),), 32, 904)
    assert policy.lookup(((1, 20),)) == PrefixHit(0, (), 19)
    check_against_recount(policy)


# --------------------------------------------------------------------------------------------------
# Forks that fit exactly or miss by a page
# --------------------------------------------------------------------------------------------------


def parent_with_cached_continuation(host: bool) -> RadixPolicy:
    """Pool of 24 in pages of 4 (HiCache: host pool of 32 tokens, write_through). P = 8 prompt
    tokens (tree, locked), grown by 4 tokens of stream 2 and 2 output tokens: 6 own tokens, 2 pages.
    Q = P's prompt + the 4 tokens of stream 2 + 1: Q puts that page into the tree and finishes, so
    it is cached while P still holds its own copy. With ``host``, R (4 fresh tokens) then evicts
    Q's page to host (8 free, an admission evicts for its 4 tokens + a spare page) and finishes."""
    policy = make_policy("radix", PoolSpec(24, 4, 64), page_size=4)
    if host:
        policy.enable_host_tier(8)
    policy.admit(0, ((1, 8),), 20, output_content_id=500)
    policy.grow(0, 4, ((2, 4),))
    policy.grow(0, 2)
    assert policy.admit(1, ((1, 8), (2, 4), (9, 1)), 13, output_content_id=501) == 8
    policy.free(1)
    if host:
        policy.admit(2, ((7, 4),), 4, output_content_id=502)
        policy.free(2)
        # Q's page is in host memory only: 4 host tokens, under the threshold, are recomputed.
        assert policy.lookup(((1, 8), (2, 4), (9, 1))) == PrefixHit(8)
        assert policy.host_breakdown_values() == (8 + 4 + 4, 32 - 16)  # P's, Q's and R's pages
    # Tree: P's 8 (locked) + 4 cached; P's own 6 tokens in 2 pages, 2 of them it will fill; 4 free.
    assert breakdown(policy) == (14, 2, 0, 0, 4, 4)
    check_against_recount(policy)
    return policy


@pytest.mark.parametrize("host", [False, True])
def test_a_fork_counts_what_inserting_the_parent_frees_and_locks(host):
    """Forking P inserts its 12 whole-page tokens: the last page is Q's (cached, or host-only), so
    P's own copy of it is freed (4 slots) and Q's node is locked (no longer evictable) or, host-only,
    takes P's copy as its device copy (nothing freed). Either way 4 free + 4 evictable = 8 slots for
    the children's copies of P's 2-token partial page, a page each: 2 children fit, 3 do not."""
    policy = parent_with_cached_continuation(host)
    with pytest.raises(OutOfKVMemory) as refused:
        policy.fork(0, [ChildSpec(10 + i, 20, 510 + i) for i in range(3)])
    error = refused.value
    assert error.message == "forking sequence 0 needs 12 slots, 8 available (free + evictable)"
    assert (error.needed_slots, error.free_slots, error.prefix_hit) == (12, 8, NO_HIT)
    assert breakdown(policy) == (14, 2, 0, 0, 4, 4)

    policy.fork(0, [ChildSpec(10, 20, 510), ChildSpec(11, 20, 511)])
    # Tree 12 (locked by all three); each holds 2 own tokens in a page it will fill (final 20).
    assert breakdown(policy) == (12 + 3 * 2, 3 * 2, 0, 0, 0, 0)
    assert policy.stats.fork_copied_tokens == 2 * 2
    # Without a host tier nothing was evicted; with one, R's page (cached) went for the children's
    # pages (4 free after the insertion), after Q's page went for R: 2 evictions at 2 times.
    assert policy.stats.evictions == (2 if host else 0)
    assert type(policy.stats.evictions) is int  # a count of pages, written as an integer
    check_against_recount(policy)
    # A child's decode tokens are its own output stream: they fill its page, which is cached.
    policy.grow(10, 2)
    policy.free(10)
    assert policy.lookup(((1, 8), (2, 4), (500, 2), (510, 2), (9, 1))) == PrefixHit(16)
    check_against_recount(policy)


def test_a_paged_decode_step_frees_a_page_for_each_decoding_sequence():
    """Pages of 4, pool of 24. A and B (5-token prompts: a page in the tree, 1 token in an own page)
    run; X (a page) is cached: 4 free. A decode step of 2 sequences makes 2 pages (8 slots) free
    first: X is evicted, though both next tokens fit the sequences' own pages."""
    policy = radix_pool(24, page_size=4)
    policy.admit(0, ((31, 5),), 8, output_content_id=500)
    policy.admit(1, ((32, 5),), 8, output_content_id=501)
    policy.admit(2, ((30, 4),), 4, output_content_id=502)
    policy.free(2)
    # used 8 tree + 2 own; each will fill 3 more of its page; X cached; 24 - 12 - 8 = 4 free.
    assert breakdown(policy) == (10, 6, 0, 0, 4, 4)
    policy.prepare_decode_step(2)
    assert policy.stats.evictions == 1
    assert breakdown(policy) == (10, 6, 0, 0, 0, 8)
    check_against_recount(policy)


# --------------------------------------------------------------------------------------------------
# The tree: what a split node's upper part inherits
# --------------------------------------------------------------------------------------------------


def test_the_upper_part_of_a_split_node_keeps_the_access_time_of_the_match():
    """Y (5 tokens) inserted at tick 1, X (10) at tick 2; a match of X's first 4 tokens at tick 3
    splits X into an upper part (4) and a lower part (6), both touched at tick 3. With Y locked the
    lower part is the only evictable leaf; once it has gone and Y is unlocked, Y (tick 1) is older
    than X's upper part (tick 3) and goes first."""
    tree = RadixTree(page_size=1)
    y_end, _ = tree.insert(((2, 0, 5),), namespace=0)
    tree.insert(((1, 0, 10),), namespace=0)
    upper, matched = tree.match_prefix(((1, 0, 4), (3, 0, 2)), namespace=0)
    assert (upper.length, matched) == (4, 4)
    tree.lock(y_end)
    assert tree.evict(1) == 6
    tree.unlock(y_end)
    assert tree.evict(1) == 5
    assert tree.longest_match(((1, 0, 4), (3, 0, 2)), 0).length == 4
    assert tree.longest_match(((2, 0, 5),), 0).length == 0


def test_a_split_node_keeps_its_hits_toward_a_selective_backup():
    """write_through_selective backs a node up at its second hit. A's 20 tokens are inserted once
    (then preempted): one hit. The scheduler's match of A's first 8 tokens + 4 others splits A
    (both parts keep the hit); A's prompt again matches 19 tokens (a second split, 11 + 1) and its
    insertion walks all three parts: a second hit each, so all 20 tokens are copied to host."""
    policy = hicache(16, "write_through_selective")
    stats = policy.host_tier.stats
    policy.admit(1, ((1, 20),), 20, 901)
    policy.free(1, finished=False)
    assert policy.match(((1, 8), (5, 4))) == PrefixHit(8)
    assert stats.host_offloaded_tokens == 0
    assert policy.admit(2, ((1, 20),), 20, 902) == 19
    assert stats.host_offloaded_tokens == 8 + 11 + 1
    check_against_recount(policy)


def test_a_new_leaf_is_as_recent_as_the_insertion_that_made_it():
    """X inserted at tick 1 and matched at tick 2; Y inserted at tick 3: X is the older leaf."""
    tree = RadixTree(page_size=1)
    x, y = ((1, 0, 5),), ((2, 0, 3),)
    tree.insert(x, namespace=0)
    tree.match_prefix(x, namespace=0)
    tree.insert(y, namespace=0)
    assert tree.evict(1) == 5
    assert [tree.longest_match(key, 0).length for key in (x, y)] == [0, 3]


def test_pages_of_two_keep_keys_with_the_same_first_token_apart():
    """Pages of 2: children are keyed by their first page, so (1: 0, 1) and (1: 0; 5: 0) are two
    children, though they start with the same token."""
    tree = RadixTree(page_size=2)
    a, b = ((1, 0, 2),), ((1, 0, 1), (5, 0, 1))
    tree.insert(a, namespace=0)
    end, matched = tree.insert(b, namespace=0)
    assert (matched, end.length, tree.total_tokens) == (0, 2, 4)
    assert len(tree.root.children) == 2
    assert [tree.longest_match(key, 0).length for key in (a, b)] == [2, 2]


def test_an_insertion_that_adopts_a_host_only_leaf_makes_it_evictable_again():
    """write_through: X (5 tokens) is copied to host at its insertion and evicted to host; inserted
    again, it takes the inserting sequence's copy as its device copy: a device leaf, evictable."""
    tree = RadixTree(page_size=1)
    tree.enable_hicache(HiCachePool(4, 4, 1, "write_through"))  # 16 host tokens
    x = ((1, 0, 5),)
    node, _ = tree.insert(x, namespace=0)
    assert tree.evict(5) == 5
    assert (tree.total_tokens, node.on_device) == (0, False)
    assert tree.insert(x, namespace=0) == (node, 5)
    assert (tree.total_tokens, tree.evictable_leaves()) == (5, {node})
    assert tree.evict(5) == 5


def test_the_lazy_lru_heaps_stay_in_order_when_they_are_compacted():
    """write_through, 12 host tokens. X and Y (5 tokens each) are cached and copied to host. X is
    matched 1100 times (each a heap entry: the device heap is rebuilt past 1024 stale ones), so Y
    is the older leaf and goes to host first; Y is then matched 1100 times in host memory, and X
    goes to host too (the host heap is rebuilt). Z's copy (5) finds 2 host slots free: X, matched
    before all of Y's matches, is the host node dropped."""
    tree = RadixTree(page_size=1)
    tree.enable_hicache(HiCachePool(3, 4, 1, "write_through"))
    x, y, z = ((1, 0, 5),), ((2, 0, 5),), ((3, 0, 5),)
    tree.insert(x, namespace=0)
    tree.insert(y, namespace=0)
    for _ in range(1100):
        tree.match_prefix(x, namespace=0)
    assert tree.evict(1) == 5
    assert tree.longest_match(y, 0).host_tokens == 5
    for _ in range(1100):
        tree.match_prefix(y, namespace=0)
    assert tree.evict(1) == 5
    tree.insert(z, namespace=0)
    assert (tree.longest_match(x, 0).length, tree.longest_match(y, 0).host_tokens) == (0, 5)
    assert tree.host is not None and tree.host.used_tokens == 10


def test_load_backs_of_several_host_nodes():
    """As above: U (8, locked by D) on the device, X's other 12 tokens in host memory as three nodes
    (7, 4, 1) after the scheduler's matches, E's 10 tokens cached once E finishes: 10 free.
    X's prompt: 19 matched, 11 of them (7 + 4) loaded back; with its last token that is 12 slots and
    the allocation evicts E (to host). The insertion walks on into the 1-token node, host-only: the
    sequence's own copy becomes its device copy. Later all of it goes to host under 32 fresh tokens,
    and X's 20 tokens + 1 load back 20 (U, 7, 4 and the 1-token leaf)."""
    policy = hicache(32)
    stats = policy.host_tier.stats
    policy.admit(1, ((1, 20),), 20, 901)
    policy.free(1)
    policy.admit(2, ((1, 8), (5, 4)), 12, 902)
    policy.admit(3, ((3, 10),), 10, 903)
    policy.match(((1, 20),))
    policy.match(((1, 16),))
    policy.free(3)
    assert breakdown(policy) == (12, 0, 0, 0, 10, 10)
    assert policy.admit(5, ((1, 20),), 20, 905) == 19
    assert (stats.host_loaded_tokens, stats.host_cache_hits) == (11, 11)
    assert breakdown(policy) == (8 + 4 + 7 + 4 + 1, 0, 0, 0, 0, 8)
    check_against_recount(policy)
    policy.free(2)
    policy.free(5)
    run_fresh = policy.admit(6, ((4, 32),), 32, 906)
    policy.free(6)
    assert run_fresh == 0 and breakdown(policy) == (0, 0, 0, 0, 32, 0)
    assert policy.admit(7, ((1, 20), (9, 1)), 21, 907) == 20
    assert (stats.host_loaded_tokens, stats.host_cache_hits) == (11 + 20, 11 + 20)
    assert breakdown(policy) == (21, 0, 0, 0, 0, 11)
    check_against_recount(policy)


def test_a_split_can_cut_a_node_after_its_first_token():
    tree = RadixTree(page_size=1)
    tree.insert(((1, 0, 5),), namespace=0)
    upper, matched = tree.match_prefix(((1, 0, 1), (3, 0, 1)), namespace=0)
    assert (upper.length, matched, len(upper.children)) == (1, 1, 1)
    assert tree.total_tokens == 5


def test_unlocked_tokens_are_summed_over_the_nodes_of_a_path():
    """X (10 tokens) split after 4 by a match: both parts unlocked, 10 tokens either way."""
    tree = RadixTree(page_size=1)
    lower, _ = tree.insert(((1, 0, 10),), namespace=0)
    tree.match_prefix(((1, 0, 4), (3, 0, 1)), namespace=0)
    assert tree.longest_match(((1, 0, 10),), 0) == PrefixMatch(10, 10, 0)
    assert (lower.length, tree.unlocked_tokens_above(lower)) == (6, 10)


def test_a_leaf_given_a_child_is_no_longer_evictable():
    tree = RadixTree(page_size=1)
    x, _ = tree.insert(((1, 0, 4),), namespace=0)
    child, _ = tree.insert(((1, 0, 4), (2, 0, 3)), namespace=0)
    assert tree.evictable_leaves() == {child}
    assert tree.evict(1) == 3
    assert tree.evictable_leaves() == {x}


def test_host_leaves_are_dropped_least_recently_used_first_until_a_backup_fits():
    """write_through, 16 host tokens. A (5), B (3), C (4) are copied to host at insertion, then
    evicted there (12 of 16 used); A is matched again. D (11) needs 7 more host slots: B and C, the
    least recently used, are dropped (7); A stays. E (5) then finds the host full but for A
    (D's copy is on the device too): A is dropped."""
    tree = RadixTree(page_size=1)
    tree.enable_hicache(HiCachePool(4, 4, 1, "write_through"))
    host = tree.host
    assert host is not None
    a, b, c = ((1, 0, 5),), ((2, 0, 3),), ((3, 0, 4),)
    for key in (a, b, c):
        tree.insert(key, namespace=0)
    assert tree.evict(12) == 12
    tree.match_prefix(a, namespace=0)
    d_node, _ = tree.insert(((4, 0, 11),), namespace=0)
    assert d_node.backed_up and host.used_tokens == 16
    assert [tree.longest_match(key, 0).host_tokens for key in (a, b, c)] == [5, 0, 0]
    e_node, _ = tree.insert(((5, 0, 5),), namespace=0)
    assert e_node.backed_up and host.used_tokens == 16
    assert tree.longest_match(a, 0).length == 0
    assert host.stats.host_evictions == 3 + 4 + 5


def test_a_host_leaf_loaded_back_is_no_longer_a_host_leaf():
    """write_through: X (5) is copied to host and evicted there; loaded back, it is a device leaf
    (evictable) and no longer one of the host-only leaves the host pool may drop."""
    tree = RadixTree(page_size=1)
    tree.enable_hicache(HiCachePool(4, 4, 1, "write_through"))
    host = tree.host
    assert host is not None
    node, _ = tree.insert(((1, 0, 5),), namespace=0)
    tree.evict(5)
    assert host.leaves == {node}
    assert tree.match_prefix(((1, 0, 5),), namespace=0) == (node, 5)
    assert tree.load_back(node) == 5
    assert (host.leaves, tree.evictable_leaves(), tree.total_tokens) == (set(), {node}, 5)


def test_a_backup_that_cannot_fit_is_not_made():
    """A tree alone (the policy refuses a host pool not larger than the device's): 8 host tokens,
    write_through. X (5) is copied; Y (5) finds 3 host slots free and no host-only node to drop:
    its copy is not made (SGLang's write_backup fails), and the host pool stays within its size."""
    tree = RadixTree(page_size=1)
    tree.enable_hicache(HiCachePool(2, 4, 1, "write_through"))
    host = tree.host
    assert host is not None
    x, _ = tree.insert(((1, 0, 5),), namespace=0)
    y, _ = tree.insert(((2, 0, 5),), namespace=0)
    assert (x.backed_up, y.backed_up, host.used_tokens) == (True, False, 5)
    assert host.stats.host_offloaded_tokens == 5
