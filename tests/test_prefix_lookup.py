"""Prefix-cache lookup: content verification (not placement), vLLM's choice among duplicate blocks,
the side-effect-free ``lookup``, the hit carried by a failed admission, and namespaces.

Block ids are worked out by hand against vLLM V1's rules (``vllm/v1/core/block_pool.py``,
``kv_cache_manager.py``), in kvsim's numbering: vLLM's pool reserves one extra block (the
``null_block``, taken from the queue at start-up), so a vLLM block id is kvsim's plus one.

The rules used:
  R1 the free queue starts in block-id order; a new block is taken from its head, and a block taken
     there that still holds a hash is evicted (its hash leaves the map);
  R2 a hit block with no owner is "touched": taken out of the queue wherever it is;
  R3 a freed sequence's blocks are released tail first; a block with a hash goes to the queue's
     tail, one without a hash to its head (#42656);
  R4 every block that becomes full is cached under its hash, even when an identical block is
     already cached (no deduplication): a duplicate;
  R5 a lookup walks the prompt's full blocks, at most ``(len - 1) // block_size`` of them, and for
     each hash takes ``BlockHashToBlockMap.get_one_block``: the earliest-cached block still cached
     under it. A block's hash depends only on its parent's hash and its own tokens.
"""

from __future__ import annotations

import pytest

from policies import OutOfKVMemory, PoolSpec, make_policy
from policies.base import NO_HIT, PrefixHit
from policies.prefix import ContentChains, PrefixCachingPolicy
from token_content import token_ids


def ids(first: int, last: int):
    return token_ids(range(first, last + 1))


def prefix_pool(num_blocks: int) -> PrefixCachingPolicy:
    policy = make_policy("prefix", PoolSpec(num_blocks * 4, 4, 64))
    assert isinstance(policy, PrefixCachingPolicy)
    return policy


OUTPUT_B = 900  # request B's generated stream
PROMPT_A = ids(1, 8)  # two full blocks
# The next turn of B's conversation: B's prompt, B's 4 generated tokens, 3 new tokens (15 tokens).
PROMPT_C = ids(1, 8) + ((OUTPUT_B, 4),) + ids(101, 103)


def drive_to_duplicate(policy: PrefixCachingPolicy) -> None:
    """Steps 1-2 of issue 11 §1: a fully cached prompt is recomputed and cached a second time."""
    # Step 1. A = tokens 1..8. No hit (empty cache); R1: blocks 0, 1; R4: both cached
    # (h1 = H(None, 1..4) -> {0}; h2 = H(h1, 5..8) -> {1}). Queue [2, 3, 4].
    assert policy.admit(0, PROMPT_A, 8, output_content_id=800) == 0
    assert policy.block_table(0) == [0, 1]
    # R3: 1 then 0 appended. Queue [2, 3, 4, 1, 0].
    policy.free(0)
    assert policy.free_queue_order() == [2, 3, 4, 1, 0]

    # Step 2. B = the same 8 tokens. R5: at most (8 - 1) // 4 = 1 block -> hit [0]; R2: queue
    # [2, 3, 4, 1]. Tokens 5..8 go to a new block, R1: block 2, which fills: R4 caches it under
    # h2 next to block 1 -> h2: {1, 2}, the duplicate. Queue [3, 4, 1].
    assert policy.admit(1, PROMPT_A, 12, output_content_id=OUTPUT_B) == 4
    assert policy.block_table(1) == [0, 2]
    # B generates 4 tokens: a new block, R1: block 3; full, so R4 caches it under
    # h3 = H(h2, B's 4 tokens) -> {3}. Its physical parent is the duplicate, block 2. Queue [4, 1].
    policy.grow(1, 4)
    assert policy.block_table(1) == [0, 2, 3]
    # R3: 3, 2, 0 appended. Queue [4, 1, 3, 2, 0].
    policy.free(1)
    assert policy.free_queue_order() == [4, 1, 3, 2, 0]


def test_next_turn_hits_the_child_of_a_duplicate_as_vllm_does():
    """Issue 11 §1, step 3: C extends B's conversation. R5: at most (15 - 1) // 4 = 3 blocks.
    h1 -> {0}: block 0. h2 -> {1, 2}: get_one_block gives the earliest, block 1. h3 -> {3}: block 3,
    although its physical parent is 2, not 1 (vLLM's hash depends on content only). Hits [0, 1, 3],
    12 tokens; R2 leaves queue [4, 2]; the 3 remaining tokens take one block, R1: block 4 (no hash,
    nothing evicted). Queue [2].

    Verifying the physical parent (kvsim before this fix) stopped at block 3: hits [0, 1], then two
    new blocks 4 and 3 from queue [4, 3, 2], evicting block 3, the very block vLLM hits."""
    policy = prefix_pool(5)
    drive_to_duplicate(policy)
    assert policy.lookup(PROMPT_C) == PrefixHit(12, (0, 1, 3))
    assert policy.admit(2, PROMPT_C, 15, output_content_id=902) == 12
    assert policy.block_table(2) == [0, 1, 3, 4]
    assert policy.free_queue_order() == [2]
    assert policy.stats.evictions == 0
    assert (policy.stats.prefix_cache_queries, policy.stats.prefix_cache_hits) == (8 + 8 + 15, 0 + 4 + 12)
    # C: 15 tokens in 4 blocks, final length 15 -> block 4 holds 3 and will never hold a 4th;
    # block 2 (the duplicate, owner-less, hashed) is the cache.
    assert policy.breakdown().as_dict() == {
        "used": 15,
        "reserved": 0,
        "internal_fragmentation": 1,
        "external_fragmentation": 0,
        "cached": 4,
        "free": 0,
    }


def test_when_the_first_duplicate_is_evicted_the_other_copy_serves():
    """After step 2 (queue [4, 1, 3, 2, 0]), D = 8 new tokens takes blocks 4 and 1 (R1), evicting
    block 1: h2 -> {2}. D is freed (R3: 1, 4 appended; both full and hashed): queue [3, 2, 0, 1, 4].
    C: h1 -> 0, h2 -> 2 (the only copy left), h3 -> 3. R2 leaves queue [1, 4]; one new block, R1:
    block 1, evicting D's second block."""
    policy = prefix_pool(5)
    drive_to_duplicate(policy)
    assert policy.admit(3, ids(50, 57), 8, output_content_id=803) == 0
    assert policy.block_table(3) == [4, 1]
    assert policy.stats.evictions == 1
    policy.free(3)
    assert policy.free_queue_order() == [3, 2, 0, 1, 4]
    assert policy.admit(4, PROMPT_C, 15, output_content_id=904) == 12
    assert policy.block_table(4) == [0, 2, 3, 1]
    assert policy.stats.evictions == 2


def test_lookup_changes_nothing_and_caps_at_len_minus_one():
    policy = prefix_pool(10)
    policy.admit(0, ids(1, 8), 8, output_content_id=500)
    policy.free(0)
    queue, stats, breakdown = policy.free_queue_order(), policy.stats.as_dict(), policy.breakdown()
    # The whole prompt is cached, but its last token must be computed: (8 - 1) // 4 = 1 block.
    assert policy.lookup(ids(1, 8)) == PrefixHit(4, (0,))
    assert policy.lookup(ids(1, 9)) == PrefixHit(8, (0, 1))
    assert policy.lookup(ids(1, 9), namespace=3) == NO_HIT
    assert policy.lookup(ids(2, 9)) == NO_HIT
    assert policy.free_queue_order() == queue
    assert policy.stats.as_dict() == stats
    assert policy.breakdown() == breakdown


def test_empty_segments_hold_no_tokens_and_change_no_lookup():
    """A segment of length 0 (content that contributes nothing) must not change a block's content:
    the 9-token prompt 1:2 + 3:6 + 4:1 caches block 0 (1:0-2 and 3:0-2) and block 1 (3:2-6); the same
    tokens with empty segments of content 2 before, between and after them hit both blocks."""
    policy = prefix_pool(10)
    policy.admit(0, ((1, 2), (3, 6), (4, 1)), 9, output_content_id=500)
    policy.free(0)
    for prompt in (
        ((1, 2), (2, 0), (3, 6), (4, 1)),
        ((2, 0), (1, 2), (3, 6), (4, 1)),
        ((1, 2), (3, 6), (2, 0), (4, 1), (2, 0)),
    ):
        assert policy.lookup(prompt) == PrefixHit(8, (0, 1)), prompt
    assert policy.lookup(((1, 2), (2, 1), (3, 5), (4, 1))) == NO_HIT  # content 2 is a token here


@pytest.mark.parametrize(("name", "options"), [("paged", {}), ("contiguous", {"reservation": "oracle"})])
def test_policies_without_a_cache_never_hit(name, options):
    policy = make_policy(name, PoolSpec(64, 4, 64), **options)
    policy.admit(0, ids(1, 9), 9, output_content_id=500)
    policy.free(0)
    assert policy.lookup(ids(1, 9)) == NO_HIT


def live_namespaced_prompt() -> PrefixCachingPolicy:
    """Pool of 5 blocks; a live request in namespace 7 holds tokens 1..9 in blocks 0, 1, 2.
    Free queue [3, 4]."""
    policy = prefix_pool(5)
    policy.admit(0, ids(1, 9), 9, output_content_id=500, namespace=7)
    assert policy.free_queue_order() == [3, 4]
    return policy


def test_can_admit_looks_up_the_prompt_in_its_own_namespace():
    """12 tokens sharing 1..8 with the live request: in namespace 7 the hit is blocks 0 and 1 (held
    live, so they cost nothing) and one new block is needed: it fits in the 2 free blocks. In
    namespace 8 nothing hits: 3 new blocks do not fit. (can_admit used to look up namespace 0.)"""
    policy = live_namespaced_prompt()
    prompt = ids(1, 8) + ids(201, 204)
    assert policy.can_admit(prompt, 12, namespace=7)
    assert not policy.can_admit(prompt, 12, namespace=8)
    assert policy.admit(1, prompt, 12, output_content_id=501, namespace=7) == 8
    assert policy.block_table(1) == [0, 1, 3]


def test_failed_admission_carries_its_hit_and_counts_no_query():
    """20 tokens sharing 1..8: hit blocks 0, 1 (8 tokens), then 3 new blocks, 2 free: OOM. vLLM
    (since #48860) records prefix-cache stats only once allocation succeeded, so nothing is counted;
    the error still tells the engine what the lookup found."""
    policy = live_namespaced_prompt()
    stats = policy.stats.as_dict()
    with pytest.raises(OutOfKVMemory) as error:
        policy.admit(1, ids(1, 8) + ids(301, 312), 20, output_content_id=501, namespace=7)
    assert error.value.prefix_hit == PrefixHit(8, (0, 1))
    assert (error.value.needed_slots, error.value.free_slots) == (12, 8)
    stats["allocation_failures"] += 1
    assert policy.stats.as_dict() == stats
    # The same admission on a pool without a hit fails with no hit.
    with pytest.raises(OutOfKVMemory) as error:
        policy.admit(2, ids(401, 420), 20, output_content_id=502)
    assert error.value.prefix_hit == NO_HIT


def test_content_chains_outlive_their_blocks_while_a_child_names_them():
    """A cached child keeps its parent's chain id alive, so when the parent's content is cached
    again (recomputed) the child verifies again, as a vLLM content hash would."""
    chains = ContentChains()
    parent_key = (None, ((1, 0, 4),), 0)
    parent = chains.acquire(parent_key)
    child = chains.acquire((parent, ((2, 0, 4),), 0))
    chains.release(parent)  # the parent block is evicted; the child block stays cached
    assert chains.find(parent_key) == parent
    assert chains.acquire(parent_key) == parent  # recomputed: same identity, the child chains to it
    chains.release(parent)
    chains.release(child)  # last holders gone: both forgotten
    assert len(chains) == 0
    assert chains.acquire(parent_key) != parent  # ids are never reused
