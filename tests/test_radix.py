"""The ``radix`` policy (SGLang's RadixCache): a hand-worked example with exact numbers, pages, and
random operations checked against an independent recount from the tree."""

from __future__ import annotations

import copy
from collections import Counter
from itertools import islice
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import ChildSpec, OutOfKVMemory, PolicyInputError, PoolSpec, make_policy
from policies._radix_tree import Key, RadixNode, RadixTree, key_length
from policies.base import NO_HIT, PrefixHit
from policies.radix import RadixPolicy
from sim.cli import main
from sim.results import load_results
from tests.engine_helpers import request as engine_request
from tests.test_engine import run, times
from workloads import build_workload
from workloads.stats import trace_stats

SYSTEM = (7, 10)  # a 10-token system prompt (stream 7)


def radix_pool(slots: int, page_size: int = 1, max_model_len: int = 32) -> RadixPolicy:
    policy = make_policy("radix", PoolSpec(slots, 4, max_model_len), page_size=page_size)
    assert isinstance(policy, RadixPolicy)
    return policy


def breakdown(policy) -> tuple[int, ...]:
    """(used, reserved, internal, external, cached, free)"""
    return tuple(policy.breakdown().as_dict().values())


def test_hand_worked_example_token_granular():
    """Pool of 32 slots, page 1. Ticks count tree walks (admission: a match then an insertion;
    freeing: an insertion when there is something new to insert)."""
    policy = radix_pool(32)
    # 1. A = system + 4 tokens of stream 100 (14 tokens), will reach 16. Empty tree: no hit; 14 new
    #    slots; inserted at admission as one leaf N1 (14 tokens, tick 2), locked by A.
    assert policy.admit(0, (SYSTEM, (100, 4)), 16, output_content_id=500) == 0
    assert breakdown(policy) == (14, 0, 0, 0, 0, 18)
    policy.grow(0, 2)  # A's own decode tokens: 2 slots, not in the tree yet
    assert breakdown(policy) == (16, 0, 0, 0, 0, 16)

    # 2. B = system + 5 tokens of stream 101. Match of the first 14 tokens: 10 (stream 100 vs 101
    #    differ after the system prompt), inside N1, so N1 is split: U = system (10, id 2) above
    #    N1 = stream 100's 4 tokens. B needs 15 - 10 = 5 slots; its 5 tokens become leaf N2 under U.
    #    (The prefix policy with 4-token blocks would hit only 8.)
    assert policy.lookup((SYSTEM, (101, 5))) == PrefixHit(10)
    assert policy.admit(1, (SYSTEM, (101, 5)), 15, output_content_id=501) == 10
    assert policy.tree.total_tokens == policy.tree.locked_tokens == 19
    assert breakdown(policy) == (21, 0, 0, 0, 0, 11)

    # 3. A finishes: its 2 output tokens become leaf N3 under N1; N1 and N3 are unlocked (cached),
    #    U stays locked by B.
    policy.free(0)
    assert breakdown(policy) == (15, 0, 0, 0, 6, 11)

    # 4. C = A's next turn: system, stream 100 (4), A's output (2), 3 new tokens (19 tokens).
    #    Match of 18 tokens: U + N1 + N3 = 16, which C locks (6 cached tokens become used); 3 new
    #    slots, inserted as leaf N4 under N3.
    assert policy.admit(2, (SYSTEM, (100, 4), (500, 2), (102, 3)), 20, output_content_id=502) == 16
    assert breakdown(policy) == (24, 0, 0, 0, 0, 8)

    # 5. D = 20 fresh tokens: 8 free, nothing evictable -> out of memory, nothing changes.
    with pytest.raises(OutOfKVMemory) as error:
        policy.admit(3, ((103, 20),), 20, output_content_id=503)
    assert (error.value.needed_slots, error.value.free_slots, error.value.prefix_hit) == (20, 8, NO_HIT)
    assert breakdown(policy) == (24, 0, 0, 0, 0, 8)

    # 6. B and C finish (nothing new to insert). Everything is cached: U 10, N1 4, N2 5, N3 2, N4 3.
    policy.free(1)
    policy.free(2)
    assert breakdown(policy) == (0, 0, 0, 0, 24, 8)

    # 7. D again: 20 slots needed, 8 free: evict the 12-token shortfall, least recently used unlocked
    #    leaves first. N2 was last touched when B inserted it (tick 4); N4 at tick 7 (C's insertion,
    #    which also touched U, N1, N3). N2 (5) goes; then N4 (3); N3 becomes a leaf (tick 7) and goes
    #    (2); then N1 (4): 14 >= 12. The shared system prompt U survives.
    assert policy.admit(3, ((103, 20),), 20, output_content_id=503) == 0
    assert policy.stats.evictions == 14
    assert breakdown(policy) == (20, 0, 0, 0, 10, 2)
    assert policy.lookup((SYSTEM, (104, 5))) == PrefixHit(10)
    assert policy.lookup((SYSTEM, (100, 4), (500, 2), (102, 3))) == PrefixHit(10)

    assert (policy.stats.prefix_cache_queries, policy.stats.prefix_cache_hits) == (
        14 + 15 + 19 + 20,
        0 + 10 + 16 + 0,
    )
    assert policy.stats.allocation_failures == 1
    check_against_recount(policy)


def test_pages_hold_whole_pages_and_copy_a_partial_page_on_fork():
    """Pool of 32 slots in pages of 4."""
    policy = radix_pool(32, page_size=4)
    # A = the 10-token system prompt, will reach 13. 10 tokens take 3 pages (12 slots); the 8 tokens
    # of whole pages enter the tree; A keeps 2 own tokens in one page: 2 of its slots will be filled
    # (reserved), 13 - 8 = 5 >= 4 so none is wasted yet.
    assert policy.admit(0, (SYSTEM,), 13, output_content_id=500) == 0
    assert breakdown(policy) == (10, 2, 0, 0, 0, 20)
    policy.grow(0, 3)  # 5 own tokens: 2 pages; 8 slots, 5 filled, final: 3 never filled
    assert breakdown(policy) == (13, 0, 3, 0, 0, 16)
    # B = the same prompt, final 10: match of 9 tokens, floored to pages: 8. B's 2 own tokens take a
    # page of which 2 slots will never be filled.
    assert policy.lookup((SYSTEM,)) == PrefixHit(8)
    assert policy.admit(1, (SYSTEM,), 10, output_content_id=501) == 8
    assert breakdown(policy) == (15, 0, 5, 0, 0, 12)
    # Two samples of B (final 12): they share the tree's 8 tokens; each copies B's 2-token page.
    policy.fork(1, [ChildSpec(2, 12, 502), ChildSpec(3, 12, 503)])
    assert policy.stats.fork_copied_tokens == 4
    assert breakdown(policy) == (19, 4, 5, 0, 0, 4)
    assert policy.sharing_slots() == (8 + 8 + 4 + 4 + 4, 4 * 8 + 8 + 4 + 4 + 4)
    for seq_id in (0, 1, 2, 3):
        policy.free(seq_id)
    # Freeing inserts whole pages: A's tokens 9-12 (2 prompt, 2 output) join the 8 shared ones; A's
    # 13th token and the 2-token partial pages of B and the samples are freed.
    assert breakdown(policy) == (0, 0, 0, 0, 12, 20)
    check_against_recount(policy)


def test_forks_share_generated_tokens_without_copies_at_token_granularity():
    policy = radix_pool(64)
    policy.admit(0, ((1, 5),), 20, output_content_id=500)
    policy.grow(0, 3)  # 3 own tokens
    policy.fork(0, [ChildSpec(1, 20, 501), ChildSpec(2, 20, 502)])
    # The parent's 8 tokens are now one tree path locked by 3 sequences; nothing was copied.
    assert policy.stats.fork_copied_tokens == 0
    assert breakdown(policy) == (8, 0, 0, 0, 0, 56)
    assert policy.sharing_slots() == (8, 24)
    for seq_id in (0, 1, 2):
        policy.grow(seq_id, 2)
    assert breakdown(policy) == (14, 0, 0, 0, 0, 50)
    check_against_recount(policy)


def test_namespaces_never_share_nodes():
    policy = radix_pool(64)
    policy.admit(0, (SYSTEM, (100, 3)), 13, output_content_id=500, namespace=1)
    assert policy.lookup((SYSTEM, (101, 3)), namespace=2) == NO_HIT
    assert policy.can_admit((SYSTEM, (101, 3)), 13, namespace=2)
    assert policy.admit(1, (SYSTEM, (101, 3)), 13, output_content_id=501, namespace=2) == 0
    assert policy.admit(2, (SYSTEM, (102, 3)), 13, output_content_id=502, namespace=1) == 10
    check_against_recount(policy)


def test_last_prompt_token_is_always_computed_and_deduplicated():
    """A prompt fully in the tree hits len - 1 tokens; its recomputed last token is a duplicate of a
    tree token, freed when the prompt is inserted (SGLang deduplicates; vLLM does not)."""
    policy = radix_pool(32)
    policy.admit(0, ((1, 8),), 8, output_content_id=500)
    policy.free(0)
    assert policy.admit(1, ((1, 8),), 8, output_content_id=501) == 7
    assert policy.tree.total_tokens == 8
    assert breakdown(policy) == (8, 0, 0, 0, 0, 24)


@pytest.mark.parametrize("page_size", [0, -1, True, "4"])
def test_bad_page_size_is_refused(page_size):
    with pytest.raises(PolicyInputError, match="page_size"):
        make_policy("radix", PoolSpec(64, 4, 32), page_size=page_size)


def test_pinning_is_refused():
    with pytest.raises(PolicyInputError, match="no pinning"):
        radix_pool(64).pin_prefix((SYSTEM,))


def test_pool_is_sized_in_whole_pages():
    assert RadixPolicy.pool_slots_from_memory(15_728, 256, {}) == 15_728
    assert RadixPolicy.pool_slots_from_memory(15_728, 16, {"page_size": 64}) == 15_680


def test_admission_counts_the_cache_it_locks_by_matching():
    """Pool of 20. A's 10 tokens are cached (unlocked); B holds 8 fresh tokens: 2 slots free. A
    prompt extending A's tokens locks them by matching, so they cannot also be evicted for it: 3 new
    tokens do not fit (2 free + 10 cached - 10 locked by the match), 2 do."""
    policy = radix_pool(20)
    policy.admit(0, ((1, 10),), 10, output_content_id=500)
    policy.free(0)
    policy.admit(1, ((2, 8),), 8, output_content_id=501)
    assert breakdown(policy) == (8, 0, 0, 0, 10, 2)
    assert not policy.can_admit(((1, 10), (3, 3)), 13)
    with pytest.raises(OutOfKVMemory) as error:
        policy.admit(2, ((1, 10), (3, 3)), 13, output_content_id=502)
    assert error.value.prefix_hit == PrefixHit(10)
    assert policy.can_admit(((1, 10), (3, 2)), 12)
    # SGLang's scheduler checks its budget the same way (``add_one_req`` locks the match first).
    assert policy.available_slots() == 12
    assert policy.available_slots_with_hit_locked(((1, 10), (3, 3))) == 2
    assert policy.available_slots_with_hit_locked(((1, 4), (3, 3))) == 8
    assert policy.available_slots_with_hit_locked(((4, 6),)) == 12
    assert policy.admit(2, ((1, 10), (3, 2)), 12, output_content_id=502) == 10
    assert breakdown(policy) == (20, 0, 0, 0, 0, 0)


def test_fork_counts_the_pages_its_insertion_deduplicates():
    """Pool of 24 slots in pages of 4. P = 8 prompt tokens (a tree node) + 6 own output tokens
    (2 pages). Q's prompt holds P's first 4 output tokens explicitly, so they are in the tree (a node
    Q locks) and Q keeps 1 own token (1 page): nothing is free. Forking P inserts its 12 whole-page
    tokens: the last 4 are already cached, so P's own page holding them is freed, and that page is
    exactly what the child needs for its copy of P's partial page (2 tokens)."""
    policy = radix_pool(24, page_size=4)
    policy.admit(0, ((1, 8),), 16, output_content_id=500)
    policy.grow(0, 6)
    assert policy.admit(1, ((1, 8), (500, 4), (9, 1)), 13, output_content_id=501) == 8
    assert policy.available_slots() == 0
    policy.fork(0, [ChildSpec(2, 16, 502)])
    # Tree 12 (locked by all three); own: P 2 tokens, Q 1, child 2, one page each. P and the child
    # will fill 2 more slots each (final 16 = 12 + 4); Q never fills 3 of its page (final 13).
    assert breakdown(policy) == (17, 4, 3, 0, 0, 0)
    assert policy.stats.fork_copied_tokens == 2
    check_against_recount(policy)


def test_eviction_takes_the_least_recently_touched_leaf():
    """Three cached leaves X, Y, Z inserted in that order; a match touches X. Evicting 6 tokens
    takes whole leaves, least recently used first: Y, then Z (10 tokens); X survives."""
    tree = RadixTree(page_size=1)
    x, y, z = ((1, 0, 5),), ((2, 0, 5),), ((3, 0, 5),)
    for key in (x, y, z):
        tree.insert(key, namespace=0)
    tree.match_prefix(x, namespace=0)
    assert tree.evict(6) == 10
    assert [tree.longest_match(key, 0).length for key in (x, y, z)] == [5, 0, 0]


def test_locked_nodes_are_never_evicted_and_parents_follow_their_last_child():
    tree = RadixTree(page_size=1)
    shared = ((1, 0, 4),)
    a_end, _ = tree.insert((*shared, (2, 0, 3)), namespace=0)
    tree.insert((*shared, (3, 0, 2)), namespace=0)  # splits: shared (4) above two leaves (3, 2)
    tree.lock(a_end)
    assert (tree.total_tokens, tree.locked_tokens) == (9, 7)
    assert tree.evict(100) == 2  # only the unlocked leaf; its parent is still locked
    tree.unlock(a_end)
    assert tree.evict(100) == 7  # the leaf, then its parent once it became a childless leaf
    assert tree.total_tokens == 0


# --------------------------------------------------------------------------------------------------
# Where SGLang's RadixCache and its allocator touch the tree (issue 25): each example below gives a
# different cache on the code before these rules were followed
# --------------------------------------------------------------------------------------------------


def two_cached_leaves(slots: int = 16) -> RadixPolicy:
    """Pool of ``slots``, page 1. X = 4 tokens of stream 10 cached first (older), Y = 4 tokens of
    stream 11 cached second."""
    policy = radix_pool(slots)
    for seq_id, stream in ((0, 10), (1, 11)):
        policy.admit(seq_id, ((stream, 4),), 4, output_content_id=500 + seq_id)
        policy.free(seq_id)
    assert breakdown(policy) == (0, 0, 0, 0, 8, 8)
    return policy


def evict_one_leaf_and_look(policy: RadixPolicy) -> tuple[int, int]:
    """Admit 12 fresh tokens (8 free: the 4-token shortfall evicts the least recently used leaf),
    then the hits left for X's and Y's prompts."""
    policy.admit(9, ((13, 12),), 12, output_content_id=509)
    assert policy.stats.evictions == 4
    return policy.lookup(((10, 4), (60, 1))).cached_tokens, policy.lookup(((11, 4), (60, 1))).cached_tokens


def test_a_preempted_sequence_is_freed_without_inserting_its_tokens():
    """A 4-token prompt (inserted at admission) plus 3 decoded tokens, then preempted: SGLang's
    ``release_kv_cache(..., is_insert=False)`` frees the 3 own slots and inserts nothing; finished,
    the same sequence leaves all 7 tokens cached."""
    for finished, cached in ((False, 4), (True, 7)):
        policy = radix_pool(32)
        policy.admit(0, ((100, 4),), 8, output_content_id=500)
        policy.grow(0, 3)
        policy.free(0, finished=finished)
        assert breakdown(policy) == (0, 0, 0, 0, cached, 32 - cached)
        assert policy.lookup(((100, 4), (500, 3), (101, 1))) == PrefixHit(cached)
        check_against_recount(policy)


def test_the_schedulers_match_refreshes_the_path_and_lookup_does_not():
    """C = X's first 3 tokens + 10 new ones. ``lookup`` leaves X the least recently used leaf, so
    the next eviction takes X; ``match`` (the scheduler's) splits X after 3 tokens and refreshes it,
    so the eviction takes Y instead."""
    prompt_c = ((10, 3), (12, 10))
    policy = two_cached_leaves()
    assert policy.lookup(prompt_c) == PrefixHit(3)
    assert evict_one_leaf_and_look(policy) == (0, 4)

    policy = two_cached_leaves()
    nodes_before = len(list(policy.tree.nodes()))
    assert policy.match(prompt_c) == PrefixHit(3)
    assert len(list(policy.tree.nodes())) == nodes_before + 1  # X split into 3 + 1
    assert breakdown(policy) == (0, 0, 0, 0, 8, 8)  # a match moves no slot
    assert policy.stats.prefix_cache_queries == 8  # and counts no query
    assert evict_one_leaf_and_look(policy) == (4, 0)  # Y's leaf went (4 tokens, the shortfall)
    check_against_recount(policy)


def test_an_admission_that_does_not_fit_keeps_its_match():
    """C = X's first 3 tokens + 14 new ones needs 14 slots; 8 free + 8 cached - 3 it would lock = 13:
    refused. The scheduler matched it first, so X was split and refreshed all the same, and the
    next eviction takes Y."""
    policy = two_cached_leaves()
    with pytest.raises(OutOfKVMemory) as error:
        policy.admit(2, ((10, 3), (12, 14)), 17, output_content_id=502)
    failure = error.value
    assert (failure.needed_slots, failure.free_slots, failure.prefix_hit) == (14, 13, PrefixHit(3))
    assert breakdown(policy) == (0, 0, 0, 0, 8, 8)
    assert evict_one_leaf_and_look(policy) == (4, 0)


def test_a_paged_admission_evicts_for_a_spare_page():
    """Pages of 4, pool of 24: three one-page leaves X, Y, Z cached in that order, 12 slots free.
    A fresh 13-token prompt takes 4 pages (16 slots); ``alloc_paged_token_slots_extend`` evicts for
    13 + one spare page = 17, a shortfall of 5: X, then Y. Only Z stays cached."""
    policy = radix_pool(24, page_size=4)
    for seq_id, stream in enumerate((20, 21, 22)):
        policy.admit(seq_id, ((stream, 4),), 4, output_content_id=500 + seq_id)
        policy.free(seq_id)
    policy.admit(3, ((23, 13),), 13, output_content_id=503)
    assert policy.stats.evictions == 2
    # C: 12 tokens in the tree (locked) + 1 own token in a page of 4 it will never fill.
    assert breakdown(policy) == (13, 0, 3, 0, 4, 4)
    assert [policy.lookup(((stream, 4), (60, 1))).cached_tokens for stream in (20, 21, 22)] == [0, 0, 4]
    check_against_recount(policy)


def test_a_paged_decode_step_keeps_a_page_per_sequence_free():
    """Pages of 4, pool of 12. A (5-token prompt: a page in the tree, 1 token in its own page) and X
    (a cached page) fill the pool. A's next token fits its own page, but
    ``alloc_paged_token_slots_decode`` first makes a page per decoding request free: X is evicted."""
    policy = radix_pool(12, page_size=4)
    policy.admit(0, ((31, 5),), 8, output_content_id=500)
    policy.admit(1, ((30, 4),), 4, output_content_id=501)
    policy.free(1)
    assert breakdown(policy) == (5, 3, 0, 0, 4, 0)
    policy.prepare_decode_step(1)
    policy.grow(0, 1)
    assert breakdown(policy) == (6, 2, 0, 0, 0, 4)
    assert policy.lookup(((30, 4), (60, 1))) == NO_HIT
    check_against_recount(policy)


def test_finishing_refreshes_the_path_even_with_nothing_new_to_insert():
    """Pages of 4, pool of 20. Cached in this order: X, then A's prompt page (A still running), then
    Y. A decodes 2 tokens (no new whole page) and finishes: ``cache_finished_req`` walks its path all
    the same, so A's page is now the most recently used. B then needs 12 slots with 4 free: the
    8-token shortfall evicts X and Y; A's page survives."""
    policy = radix_pool(20, page_size=4)
    policy.admit(0, ((40, 4),), 4, output_content_id=500)
    policy.free(0)  # X
    policy.admit(1, ((41, 4),), 6, output_content_id=501)  # A
    policy.admit(2, ((42, 4),), 4, output_content_id=502)
    policy.free(2)  # Y
    policy.admit(3, ((43, 4),), 16, output_content_id=503)  # B
    policy.grow(1, 2)
    policy.free(1)
    assert breakdown(policy) == (4, 0, 0, 0, 12, 4)
    policy.grow(3, 12)
    assert policy.stats.evictions == 2
    assert [policy.lookup(((stream, 4), (60, 1))).cached_tokens for stream in (40, 41, 42)] == [0, 4, 0]
    check_against_recount(policy)


# --------------------------------------------------------------------------------------------------
# Independent recount
# --------------------------------------------------------------------------------------------------


def canonical(pieces: list) -> Key:
    """Merge pieces that continue each other (a node boundary can cut a stream's run)."""
    merged: list = []
    for stream, start, end in pieces:
        if merged and merged[-1][0] == stream and merged[-1][2] == start:
            merged[-1] = (stream, merged[-1][1], end)
        else:
            merged.append((stream, start, end))
    return tuple(merged)


def path_to(policy: RadixPolicy, node: RadixNode) -> list[RadixNode]:
    path = []
    while node is not policy.tree.root:
        path.append(node)
        assert node.parent is not None, "a sequence holds an evicted node"
        node = node.parent
    return path[::-1]


def check_against_recount(policy: RadixPolicy) -> None:
    """Recompute everything from the tree and the sequences alone and compare."""
    tree, page = policy.tree, policy.page_size
    nodes = list(tree.nodes())
    locks: Counter[int] = Counter()
    own_tokens = own_slots = own_target = held = 0
    for seq in policy.sequences.values():
        path = path_to(policy, seq.last_node)
        for node in path:
            locks[node.node_id] += 1
        # The tree path holds exactly the sequence's first tree_len tokens (content, not placement).
        assert sum(node.length for node in path) == seq.tree_len
        assert canonical([piece for node in path for piece in node.key]) == seq.key(seq.tree_len)
        assert seq.tree_len % page == 0 and seq.num_tokens >= seq.tree_len
        own = seq.num_tokens - seq.tree_len
        slots = -(-own // page) * page
        own_tokens, own_slots, held = own_tokens + own, own_slots + slots, held + seq.tree_len
        own_target += min(slots, seq.final_len - seq.tree_len)
    for node in nodes:
        assert node.lock_ref == locks[node.node_id]
        assert node.length == key_length(node.key) > 0 and node.length % page == 0
        assert (
            node.parent is not None and node.parent.children[tree.child_key(node.namespace, node.key)] is node
        )
        if node.lock_ref == 0:
            assert all(child.lock_ref == 0 for child in node.children.values())
    # With HiCache some nodes are held in host memory only: the device counts leave them out.
    device = [node for node in nodes if node.on_device]
    total = sum(node.length for node in device)
    locked = sum(node.length for node in device if node.lock_ref)
    assert all(node.on_device for node in nodes if node.lock_ref)
    assert (tree.total_tokens, tree.locked_tokens) == (total, locked)
    shared = sum(node.length for node in device if node.lock_ref >= 2)  # two or more requests read it
    assert (tree.shared_tokens, policy.shared_slots()) == (shared, shared)
    assert tree.evictable_leaves() == {
        node
        for node in device
        if node.lock_ref == 0 and not any(child.on_device for child in node.children.values())
    }
    host = tree.host
    if host is None:
        assert len(device) == len(nodes)
    else:
        for node in nodes:
            assert node.on_device or node.backed_up  # a node is held somewhere
            if node.on_device:
                assert node.parent is tree.root or node.parent.on_device  # device nodes: a rooted subtree
        backed = sum(node.length for node in nodes if node.backed_up)
        assert host.used_tokens == backed <= host.capacity_tokens
        assert host.leaves == {node for node in nodes if not node.on_device and not node.children}
        cached, free = policy.host_breakdown_values()
        assert (cached, cached + free) == (backed, host.capacity_blocks * policy.pool.block_size)
    page_slots = policy.pool.kv_pool_tokens // page * page
    assert policy.breakdown().as_dict() == {
        "used": locked + own_tokens,
        "reserved": own_target - own_tokens,
        "internal_fragmentation": own_slots - own_target,
        "external_fragmentation": policy.pool.kv_pool_tokens - page_slots,
        "cached": total - locked,
        "free": page_slots - total - own_slots,
    }
    assert policy.breakdown().total == policy.pool_slots
    assert min(policy.breakdown().as_dict().values()) >= 0
    assert policy.sharing_slots() == (locked + own_slots, held + own_slots)
    for seq_id, seq in policy.sequences.items():
        room = policy.growth_room(seq_id)
        assert room == min(
            seq.tree_len + -(-(seq.num_tokens - seq.tree_len) // page) * page, seq.final_len
        ) - (seq.num_tokens)


def assert_really_does_not_fit(
    policy: RadixPolicy, kind: str, live: list[int], choice: int, namespace: int, needed: int
) -> None:
    """Oracle for an out-of-memory answer: on a copy, do what the operation does before it allocates
    (admission: match and lock the prefix; fork: insert the parent's whole pages), evict every
    unlocked node, and check that the free slots still fall short."""
    trial = copy.deepcopy(policy)
    if kind == "admit":
        prompt = PROMPTS[choice]
        prompt_len = sum(length for _, length in prompt)
        node, _ = trial.tree.match_prefix(trial._prompt_key(prompt, prompt_len), namespace)
        trial.tree.lock(node)
    elif kind == "fork":
        trial._insert_into_tree(trial.sequences[live[choice % len(live)]])
    trial.tree.evict(trial.pool.kv_pool_tokens)
    assert trial._free_slots() < needed


# Prompts sharing leading segments at various token counts, so partial matches split nodes.
PROMPTS = [
    ((1, 9),),
    ((1, 9), (2, 5)),
    ((1, 4), (3, 7)),
    ((1, 12), (4, 1)),
    ((5, 3),),
    ((1, 9), (2, 5), (6, 8)),
    ((1, 9), (2, 3)),
]
MAX_LEN = 40

operation = st.one_of(
    st.tuples(st.just("admit"), st.integers(0, len(PROMPTS) - 1), st.integers(0, 12), st.integers(0, 1)),
    st.tuples(st.just("grow"), st.integers(0, 50), st.integers(1, 9), st.booleans()),
    st.tuples(st.just("fork"), st.integers(0, 50), st.integers(1, 3), st.just(0)),
    st.tuples(st.just("free"), st.integers(0, 50), st.just(0), st.just(0)),
)


@pytest.mark.python_sources  # its oracle deep-copies the policy
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    page_size=st.sampled_from([1, 3, 4]),
    pool_slots=st.integers(40, 90),
    operations=st.lists(operation, max_size=60),
)
def test_random_operations_match_an_independent_recount(page_size, pool_slots, operations):
    policy = radix_pool(pool_slots, page_size=page_size, max_model_len=MAX_LEN)
    live: list[int] = []
    for next_id, (kind, choice, amount, flag) in enumerate(operations, start=1):
        before = policy.breakdown()
        try:
            if kind == "admit":
                prompt = PROMPTS[choice]
                prompt_len = sum(length for _, length in prompt)
                hit = policy.lookup(prompt, namespace=flag)
                fits = policy.can_admit(prompt, prompt_len + amount, namespace=flag)
                assert policy.breakdown() == before, "lookup/can_admit changed the pool"
                try:
                    cached = policy.admit(
                        next_id, prompt, prompt_len + amount, 1000 + next_id, namespace=flag
                    )
                except OutOfKVMemory as error:
                    assert not fits and error.prefix_hit == hit
                    raise
                assert fits and cached == hit.cached_tokens < prompt_len and cached % page_size == 0
                live.append(next_id)
            elif live and kind == "grow":
                seq_id = live[choice % len(live)]
                room = policy.sequences[seq_id].final_len - policy.seq_len(seq_id)
                if room:
                    grown = min(amount, room)
                    content = ((2, grown),) if flag else None  # explicit content that others also hold
                    policy.grow(seq_id, grown, content)
            elif live and kind == "fork":
                parent = live[choice % len(live)]
                length = policy.seq_len(parent)
                # (Children's ids apart from the admitted ones, which count operations, at most 60:
                # next_id * 10 + i once collided with a later admission's id.)
                children = [
                    ChildSpec(1000 * next_id + i, min(MAX_LEN, length + 5), 5000 + i) for i in range(amount)
                ]
                policy.fork(parent, children)
                live.extend(child.seq_id for child in children)
            elif live and kind == "free":
                policy.free(live.pop(choice % len(live)))
        except OutOfKVMemory as error:
            assert policy.breakdown() == before, "a failed operation changed the pool"
            assert_really_does_not_fit(policy, kind, live, choice, flag, error.needed_slots)
        check_against_recount(policy)

    for seq_id in live:
        policy.free(seq_id)
    check_against_recount(policy)
    final = policy.breakdown()
    assert final.used == final.reserved == final.internal_fragmentation == 0
    # Fresh content as large as the pool allows evicts the whole cache.
    fresh = policy.pool.kv_pool_tokens // page_size * page_size
    policy.admit(-1, ((999_999, min(fresh, MAX_LEN)),), min(fresh, MAX_LEN), output_content_id=1)
    policy.free(-1)
    check_against_recount(policy)


# --------------------------------------------------------------------------------------------------
# Real trace, unlimited cache: the radix policy's hits equal an independent token-exact bound
# --------------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "traces" / "mooncake" / "conversation_trace.jsonl"


@pytest.mark.parametrize(("page_size", "max_requests"), [(1, 500), (16, 500)])
def test_unlimited_cache_hits_equal_the_trace_bound(page_size, max_requests):
    """``workloads.stats`` computes, with a trie over prompt segments, the longest prefix each prompt
    shares with an earlier one, capped at ``len - 1`` (and floored to ``B`` tokens for block size
    ``B``). Radix with a pool large enough never to evict must hit exactly that."""
    stats = trace_stats(MOONCAKE, max_requests=max_requests, block_sizes=(page_size,))["prefix_reuse"]
    expected = (
        stats["cached_prompt_tokens_frac_last_token_recomputed"]
        if page_size == 1
        else stats["cached_prompt_tokens_frac_by_block_size"][str(page_size)]
    )
    workload = build_workload({"source": {"kind": "mooncake", "path": str(MOONCAKE)}}, seed=0, base_dir=ROOT)
    requests = list(islice(workload.requests(), max_requests))
    pool = sum(request.final_len + page_size for request in requests)
    policy = radix_pool(pool, page_size=page_size, max_model_len=max(r.final_len for r in requests))
    for request in requests:
        policy.admit(request.request_id, request.prompt, request.final_len, request.output_content_id)
        policy.free(request.request_id)
    assert policy.stats.evictions == 0
    assert policy.stats.prefix_cache_hits / policy.stats.prefix_cache_queries == pytest.approx(
        expected, abs=1e-12
    )


def test_comparison_configs_run_and_page_aligned_radix_hits_what_prefix_hits(tmp_path):
    """The README's comparison, small: with a roomy pool (no eviction, no preemption) radix in pages
    of 16 hits exactly the tokens prefix hits in 16-token blocks, and token-granular radix hits more
    (system prompts and turns end anywhere inside a block)."""
    out = tmp_path / "chat"
    config = ROOT / "configs" / "chat-radix-vs-prefix.yaml"
    assert main(["run", str(config), "-q", "-o", str(out), "--set", "workload.num_requests=60"]) == 0
    summaries = {
        name: load_results(out).variant_summary(name) for name in ("prefix", "radix", "radix-page16")
    }
    assert all(summary["preemptions"] == summary["evictions"] == 0 for summary in summaries.values())
    hits = {name: summary["prefix_cache_hits"] for name, summary in summaries.items()}
    assert hits["radix-page16"] == hits["prefix"] < hits["radix"]
    mooncake = ROOT / "configs" / "traces" / "mooncake-radix-vs-prefix.yaml"
    args = ["run", str(mooncake), "-q", "-o", str(tmp_path / "mooncake"), "--set", "workload.window.end_s=40"]
    assert main(args) == 0


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_the_engine_frees_a_page_per_decoding_request_before_each_decode_step(step_mode):
    """The engine asks the policy before every decode step (``prepare_decode_step``), as SGLang's
    scheduler does. Pages of 4, pool of 12; decode step 1 s, prefill 0.01 s a token.
    X (prompt 4, output 1) runs alone and finishes at 1.04: its page goes into the tree (4 cached),
    its 5th token's page is freed (8 free). A (prompt 4, output 3) arrives at 2: its admission wants
    its 4 new tokens plus a spare page free (8: no eviction) and takes a page. Its first token (the
    5th) comes at 3.04 and takes the last free page; before the decode step X's page is evicted to
    keep a page free, though A's 6th and 7th tokens fit its page. A finishes at 5.04; its one whole
    page goes into the tree: 4 tokens, 1 page evicted (without the step's eviction: X's 4 + A's 4)."""
    requests = [
        engine_request(0, 0.0, 4, 1, prompt=((30, 4),)),
        engine_request(1, 2.0, 4, 3, prompt=((31, 4),)),
    ]
    engine = run("radix", PoolSpec(12, 4, 12), requests, step_mode, options={"page_size": 4})
    assert times(engine)[1] == pytest.approx((2.0, 3.04, 5.04, "finished"))
    assert engine.policy.stats.evictions == 1
    assert engine.policy.tree.total_tokens == 4


def test_a_page_as_large_as_the_pool_is_allowed_and_a_larger_one_refused():
    assert make_policy("radix", PoolSpec(16, 1, 64), page_size=16).available_slots() == 16
    with pytest.raises(PolicyInputError, match=r"^radix: page_size=32 exceeds the pool \(16 slots\)$"):
        make_policy("radix", PoolSpec(16, 1, 64), page_size=32)


def test_an_admission_that_does_not_fit_says_how_many_slots_it_needs_and_finds():
    """Pool 16 slots: the first prompt holds 10 (its request will grow to 12); the second's 10 find 6
    free and nothing evictable (the first is running). Its cache lookup found nothing: no hit."""
    from policies.base import NO_HIT

    policy = make_policy("radix", PoolSpec(16, 1, 64))
    policy.admit(1, ((5, 10),), 12, 99)
    with pytest.raises(OutOfKVMemory) as refused:
        policy.admit(2, ((6, 10),), 12, 98)
    error = refused.value
    assert error.message == "admitting sequence 2 needs 10 slots, 6 available (free + evictable)"
    assert (error.needed_slots, error.free_slots, error.prefix_hit) == (10, 6, NO_HIT)


@pytest.mark.parametrize(
    ("length", "host", "slots"),
    [
        (8, 0, 12),  # 12 new tokens: 3 pages of 4
        (13, 5, 12),  # a host hit under the threshold (10) is recomputed with the 7 new: 12 tokens, 3 pages
        (18, 13, 4 + 13),  # 2 new tokens take a page; the 13 loaded back take their own slots
        (18, 10, 4 + 10),  # exactly at the threshold: loaded back
    ],
)
def test_the_device_slots_an_admission_takes_with_a_host_hit(length, host, slots):
    """A 20-token prompt, pages of 4, matched ``length`` tokens of which the last ``host`` are in host
    memory only (HiCache): SGLang loads a host hit back only from load_back_threshold (10) tokens."""
    from policies._radix_tree import PrefixMatch

    policy = make_policy("radix", PoolSpec(64, 4, 64), page_size=4)
    assert policy._admission_slots(20, PrefixMatch(length, 0, host)) == slots
