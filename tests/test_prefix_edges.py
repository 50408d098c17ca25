"""Edges of the prefix-caching policy (``policies/prefix.py``) worked out by hand: the free-queue count
of an admission that touches idle hits, growth needs after a fork, duplicate holders, lazy runs that
another sequence's fill (not a lookup) reaches, content chains released with the last holder, keys
made eagerly (host tier) across segment boundaries, host hits of prompts with empty and one-token
segments, statistics, and input errors.

Block size 4 throughout. The rules (``tests/test_prefix_lookup.py``, ``tests/test_host_tier.py``):
the free queue starts in block-id order, a new block is taken from its head (a blank block first,
then cached blocks oldest first: each one evicted); a freed sequence's full blocks go to the tail,
last block first; a lookup reuses at most ``(len - 1) // 4`` blocks, each block's key being its
parent's content chain, what it holds, and the namespace; without a host tier a sequence's first
new key starts a lazy run (its blocks keyed when a lookup or another sequence reaches that key).
"""

from __future__ import annotations

import pytest

from policies import ChildSpec, OutOfKVMemory, PolicyInputError, PoolSpec, make_policy
from policies.prefix import ContentChains, PrefixCachingPolicy


def pool(num_blocks: int, host_blocks: int = 0) -> PrefixCachingPolicy:
    policy = make_policy("prefix", PoolSpec(num_blocks * 4, 4, 64))
    assert isinstance(policy, PrefixCachingPolicy)
    if host_blocks:
        policy.enable_host_tier(host_blocks)
    return policy


def hit(policy: PrefixCachingPolicy, prompt) -> tuple:
    found = policy.lookup(prompt)
    return found.cached_tokens, found.block_ids, found.host_tokens


# ------------------------------------------------------------------------------------ content chains
def test_a_held_chain_is_forgotten_only_when_every_hold_is_released():
    chains = ContentChains()
    key = (None, 1, 0, 4, 0)
    chain = chains.acquire(key)  # one holder
    chains.hold(chain)  # two
    chains.release(chain)
    assert chains.find(key) == chain and len(chains) == 1
    chains.release(chain)  # none left: forgotten
    assert chains.find(key) is None and len(chains) == 0


# ------------------------------------------------------------------------ admission's block count
@pytest.mark.parametrize("pin_elsewhere", [False, True])
def test_idle_hits_count_against_the_free_queue(pin_elsewhere):
    """Pool of 3 blocks (4 with a pinned block 0 that no prompt here shares). A = 8 tokens of stream 1
    takes two blocks and frees them: cached, idle, still in the queue of 3. A 16-token prompt of
    stream 1 needs ceil(16 / 4) = 4 blocks, 2 of them hits (at most (16 - 1) // 4 = 3): 2 new blocks,
    and touching the 2 idle hits takes them out of the queue too: 4 > 3, refused. A 12-token prompt
    needs 3 - 2 = 1 new block + 2 idle hits = 3 <= 3: admitted with 8 cached tokens."""
    policy = pool(4 if pin_elsewhere else 3)
    if pin_elsewhere:
        assert policy.pin_prefix(((9, 4),)) == 4
    policy.admit(0, ((1, 8),), 8, output_content_id=100)
    policy.free(0)
    assert len(policy.free_queue) == 3
    assert not policy.can_admit(((1, 16),), 16)
    with pytest.raises(OutOfKVMemory) as error:
        policy.admit(1, ((1, 16),), 16, output_content_id=101)
    assert (error.value.needed_slots, error.value.free_slots) == (16, 12)
    assert error.value.prefix_hit.cached_tokens == 8
    assert policy.can_admit(((1, 12),), 12)
    assert policy.admit(2, ((1, 12),), 12, output_content_id=102) == 8


# --------------------------------------------------------------------------------- growth needs
def test_growing_a_fork_that_shares_a_partly_filled_tail_copies_it_first():
    """A holds 6 tokens (blocks 0 full, 1 with 2 tokens); its fork shares both. Growing the fork by 6
    tokens: ceil((6 + 6) / 4) - 2 = 1 new block, plus 1 copy of the shared tail = 2 blocks, 8 slots.
    By 2 tokens: ceil(8 / 4) - 2 = 0, plus the copy: 4 slots."""
    policy = pool(8)
    policy.admit(0, ((1, 6),), 20, output_content_id=100)
    policy.fork(0, [ChildSpec(1, 20, 101)])
    assert policy.slots_needed_to_grow(1, 6) == 8
    assert policy.slots_needed_to_grow(1, 2) == 4


def test_growing_a_fork_that_shares_a_full_last_block_copies_nothing():
    """A holds 8 tokens (2 full blocks); its fork shares both, none partly filled. Growing the fork by
    one token takes ceil(9 / 4) - 2 = 1 new block: 4 slots, no copy."""
    policy = pool(8)
    policy.admit(0, ((1, 8),), 20, output_content_id=100)
    policy.fork(0, [ChildSpec(1, 20, 101)])
    assert policy.slots_needed_to_grow(1, 1) == 4


def test_growth_needs_count_the_lookahead_slots():
    """2 lookahead slots. A holds 5 tokens in 2 blocks (an admission takes no lookahead). Growing by 2
    needs room for 5 + 2 + 2 = 9 slots: ceil(9 / 4) - 2 = 1 block, 4 slots."""
    policy = pool(8)
    policy.hold_lookahead(2)
    policy.admit(0, ((1, 5),), 20, output_content_id=100)
    assert policy.block_table(0) == [0, 1]
    assert policy.slots_needed_to_grow(0, 2) == 4


# ------------------------------------------------------------------------------ duplicate holders
def test_evicting_a_later_holder_keeps_the_first_one_hittable():
    """Pool of 4. A = 8 tokens of stream 1 (blocks 0, 1) stays live. B = the same 8 tokens reuses at
    most (8 - 1) // 4 = 1 block: block 0, and computes its second block in block 2, a second holder of
    A's block 1's key. B is freed: block 2 goes to the queue [3, 2]. C = 8 new tokens takes block 3
    (blank) and block 2, evicting the later holder: block 1 still stands for the key, and a 12-token
    lookup of stream 1 hits blocks 0 and 1."""
    policy = pool(4)
    policy.admit(0, ((1, 8),), 8, output_content_id=100)
    assert policy.admit(1, ((1, 8),), 8, output_content_id=101) == 4
    assert policy.block_table(1) == [0, 2]
    policy.free(1)
    assert policy.free_queue_order() == [3, 2]
    policy.admit(2, ((5, 8),), 8, output_content_id=102)
    assert policy.block_table(2) == [3, 2] and policy.stats.evictions == 1
    assert hit(policy, ((1, 12),)) == (8, (0, 1), 0)


# ------------------------------------------------------------------------------------- lazy runs
def test_a_fill_that_reaches_a_lazy_run_keys_it_first():
    """Pool of 6. A = 8 tokens of stream 1 (blocks 0, 1): a lazy run from block 0. B = 12 tokens of
    stream 1 admitted with no cached tokens allowed (a KV coordinator's cap of 0) takes blocks 2, 3,
    4; its fill reaches A's first key: A's run is keyed first (blocks 0, 1 cached before B's), B's
    blocks 2, 3 are second holders, and B's block 4 (tokens 8-11, new) starts a lazy run. A lookup
    of 16 tokens of stream 1 (at most 3 blocks) gets the earliest holders: 0, 1, then B's 4."""
    policy = pool(6)
    policy.admit(0, ((1, 8),), 8, output_content_id=100)
    assert policy.admit_capped(1, ((1, 12),), 12, 101, 0, 0) == 0
    assert policy.block_table(1) == [2, 3, 4]
    assert hit(policy, ((1, 16),)) == (12, (0, 1, 4), 0)


def test_a_lazy_run_keyed_by_a_lookup_and_a_later_one_are_forgotten_when_evicted():
    """Pool of 4. A = 8 tokens of stream 1 (final 12): a lazy run from block 0, which a lookup keys.
    A then generates 4 tokens: block 2 holds a key nothing holds, a second lazy run (of 1 block). A
    is freed (queue [3, 2, 1, 0]) and D = 16 new tokens evicts A's three (block 3 was blank). D is
    freed (its blocks [3, 2, 1, 0] return last first: queue [0, 1, 2, 3]) and E = 8 tokens of stream
    1 takes blocks 0, 1, caching the first two keys again; a 16-token lookup of stream 1 then A's
    output hits E's two blocks and stops: A's block 2 is gone with its run."""
    policy = pool(4)
    policy.admit(0, ((1, 8),), 12, output_content_id=100)
    assert hit(policy, ((1, 8), (7, 4))) == (8, (0, 1), 0)
    policy.grow(0, 4)
    policy.free(0)
    assert policy.free_queue_order() == [3, 2, 1, 0]
    policy.admit(1, ((50, 16),), 16, output_content_id=101)
    assert policy.stats.evictions == 3
    policy.free(1)
    policy.admit(2, ((1, 8),), 8, output_content_id=102)
    assert policy.block_table(2) == [0, 1]
    assert hit(policy, ((1, 8), (100, 4), (7, 4))) == (8, (0, 1), 0)


def test_a_lazy_run_past_a_hit_leaves_the_hit_blocks_keyed():
    """Pool of 4. A = 8 tokens of stream 1 (blocks 0, 1); B = those 8 then 8 of stream 2 hits A's two
    blocks (keying A's run) and starts a lazy run at its block 2 (blocks 2, 3). Both are freed (queue
    [3, 2, 1, 0]); C = 16 new tokens evicts all four: nothing of stream 1 is cached any more."""
    policy = pool(4)
    policy.admit(0, ((1, 8),), 8, output_content_id=100)
    assert policy.admit(1, ((1, 8), (2, 8)), 16, output_content_id=101) == 8
    policy.free(1)
    policy.free(0)
    assert policy.free_queue_order() == [3, 2, 1, 0]
    policy.admit(2, ((50, 16),), 16, output_content_id=102)
    assert policy.stats.evictions == 4
    assert hit(policy, ((1, 12),)) == (0, (), 0)


@pytest.mark.parametrize("looked_up", [False, True])
def test_an_evicted_cache_holds_no_content_chain(looked_up):
    """Pool of 4. A = 8 tokens of stream 1; B = those 8 then 8 of stream 2: a lazy run at block 2 whose
    first key names the chain of A's block 1 (the run holds it). The run is keyed by a lookup, or
    not. Both are freed and C = 16 new tokens evicts all four blocks, and its own run holds no chain:
    no content chain is left (none leaks with an unreleased hold)."""
    policy = pool(4)
    policy.admit(0, ((1, 8),), 8, output_content_id=100)
    policy.admit(1, ((1, 8), (2, 8)), 16, output_content_id=101)
    if looked_up:
        assert hit(policy, ((1, 8), (2, 8), (3, 4)))[0] == 16
    policy.free(1)
    policy.free(0)
    policy.admit(2, ((50, 16),), 16, output_content_id=102)
    assert policy.stats.evictions == 4
    assert len(policy._chains) == 0


# ------------------------------------------------------------------------------------- layout
def test_an_empty_segment_does_not_change_a_blocks_content():
    """A = 1 token of stream 1, an empty segment, 7 of stream 2. Its first block holds stream 1's token
    then stream 2's first 3 whatever the empty segment: a 12-token lookup without it hits A's two
    blocks."""
    policy = pool(4)
    policy.admit(0, ((1, 1), (7, 0), (2, 7)), 8, output_content_id=100)
    assert hit(policy, ((1, 1), (2, 7), (3, 4))) == (8, (0, 1), 0)


# --------------------------------------------------------------------------- eager keys (host tier)
# P: 4 tokens of stream 1 (block 0, the segment ends on the block boundary), 6 of stream 2 (block 1,
# then 2 tokens in block 2), 11 of stream 3 (2 tokens in block 2, blocks 3 and 4 at offsets 2 and 6,
# 1 token in block 5): 21 tokens, 5 full blocks, one of them (block 2) across two segments.
P = ((1, 4), (2, 6), (3, 11))


def test_eager_keys_across_segment_boundaries_match_the_lookup():
    """With a host tier every full block is keyed as it fills. P's 5 full blocks are keyed at
    admission; 3 generated tokens then fill block 5 (1 token of stream 3, 3 of stream 100). A lookup of
    P, those 3 tokens and 1 more (25 tokens, at most 6 blocks) hits all six: 24 tokens."""
    policy = pool(8, host_blocks=4)
    policy.admit(0, P, 28, output_content_id=100)
    assert policy.block_table(0) == [0, 1, 2, 3, 4, 5]
    assert hit(policy, P) == (20, (0, 1, 2, 3, 4), 0)
    policy.grow(0, 3)
    assert hit(policy, (*P, (100, 3), (9, 1))) == (24, (0, 1, 2, 3, 4, 5), 0)


def test_a_lookup_keys_a_block_starting_on_a_segment_boundary_as_one_piece():
    """Without a host tier: A = P's first 12 tokens is a lazy run from block 0. A lookup of P (at most
    5 blocks, A has 3) keys the run and hits blocks 0-2: block 1 starts where stream 1 ends."""
    policy = pool(8)
    policy.admit(0, ((1, 4), (2, 6), (3, 2)), 12, output_content_id=100)
    assert hit(policy, P) == (12, (0, 1, 2), 0)


# --------------------------------------------------------------------------------------- host tier
def test_blocks_loaded_from_the_host_keep_the_host_chains():
    """GPU pool of 4, host tier of 16. A = 2 tokens of stream 1, 10 of stream 2 (block 0 across the two
    streams, blocks 1, 2 inside stream 2) is freed; F = 16 new tokens evicts A's blocks 2, 1, 0 to the
    host (3 blocks, 12 tokens moved). B = A's 12 tokens + 4 of stream 3: no GPU hit, a host hit of 3
    blocks (12 tokens loaded), into fresh blocks, which evict F's 4 (4 stores). Reloaded, B's first
    three blocks get the same content chains as their host copies, so B's fourth block's key follows
    the host's chain. B is freed and G = 16 new tokens evicts B: only its fourth block is stored
    (8 stores in all); the host then continues a 17-token lookup of B's content for 4 blocks."""
    policy = pool(4, host_blocks=16)
    tier = policy.host_tier
    assert tier is not None
    a = ((1, 2), (2, 10))
    b = (*a, (3, 4))
    policy.admit(0, a, 12, output_content_id=100)
    policy.free(0)
    policy.admit(1, ((50, 16),), 16, output_content_id=101)
    assert (tier.stats.host_offloaded_blocks, tier.stats.host_offloaded_tokens) == (3, 12)
    policy.free(1)
    assert policy.admit(2, b, 16, output_content_id=102) == 12
    assert tier.stats.host_offloaded_blocks == 7
    policy.free(2)
    policy.admit(3, ((60, 16),), 16, output_content_id=103)
    assert (tier.stats.host_offloaded_blocks, tier.stats.host_offloaded_tokens) == (8, 32)
    assert hit(policy, (*b, (9, 1))) == (0, (), 16)


def test_host_hits_skip_empty_segments_and_keep_one_token_ones():
    """GPU pool of 4, host tier of 4. A = 1 token of stream 1, 7 of stream 2 is freed and evicted to
    the host by F (16 new tokens). A lookup of A's content with an empty segment inside its first
    block, then 4 more tokens (at most (12 - 1) // 4 = 2 blocks), finds both blocks in the host."""
    policy = pool(4, host_blocks=4)
    policy.admit(0, ((1, 1), (2, 7)), 8, output_content_id=100)
    policy.free(0)
    policy.admit(1, ((50, 16),), 16, output_content_id=101)
    assert hit(policy, ((1, 1), (7, 0), (2, 7), (3, 4))) == (0, (), 8)


def test_a_host_tier_enabled_later_keys_the_pending_lazy_runs():
    """A = 8 tokens of stream 1 is a lazy run when the host tier is enabled: its blocks are keyed then,
    so a 12-token lookup hits both, and once F (16 new tokens, pool of 4) evicts them they are in the
    host: the same lookup finds them there."""
    policy = pool(4)
    policy.admit(0, ((1, 8),), 8, output_content_id=100)
    policy.enable_host_tier(4, "write_back")
    assert hit(policy, ((1, 12),)) == (8, (0, 1), 0)
    policy.free(0)
    policy.admit(1, ((50, 16),), 16, output_content_id=101)
    assert hit(policy, ((1, 12),)) == (0, (), 8)


def test_host_tier_errors():
    policy = pool(4)
    with pytest.raises(PolicyInputError) as error:
        policy.enable_host_tier(4, "write_through")
    assert str(error.value) == (
        "write_policy 'write_through': the 'prefix' policy's host tier writes a block back when the "
        "GPU evicts it (write_back) only; write_through policies are the 'radix' policy's "
        "(SGLang HiCache)"
    )
    policy.enable_host_tier(4)
    with pytest.raises(PolicyInputError) as error:
        policy.enable_host_tier(4)
    assert str(error.value) == "this policy already has a host tier"


# ------------------------------------------------------------------------------ statistics, errors
def test_prefix_statistics_add_up_over_admissions():
    """A = 8 tokens (no hit), then B and C = 12 tokens of the same stream, 8 cached each: 32 tokens
    queried, 16 served from cache."""
    policy = pool(8)
    policy.admit(0, ((1, 8),), 8, output_content_id=100)
    policy.admit(1, ((1, 12),), 12, output_content_id=101)
    policy.admit(2, ((1, 12),), 12, output_content_id=102)
    assert (policy.stats.prefix_cache_queries, policy.stats.prefix_cache_hits) == (32, 16)


def test_freed_full_blocks_count_as_cached():
    """Pool of 8. Without pins: A and B (8 tokens each) freed: 4 cached blocks, 16 slots. With block 0
    pinned (idle, cached too): A freed adds 2: 3 cached blocks, 12 slots."""
    policy = pool(8)
    policy.admit(0, ((1, 8),), 8, output_content_id=100)
    policy.free(0)
    policy.admit(1, ((2, 8),), 8, output_content_id=101)
    policy.free(1)
    assert policy.breakdown().cached == 16
    pinned = pool(8)
    pinned.pin_prefix(((9, 4),))
    pinned.admit(0, ((1, 8),), 8, output_content_id=100)
    assert pinned.breakdown().cached == 4
    pinned.free(0)
    assert pinned.breakdown().cached == 12


def test_bad_content_is_named_in_the_error():
    policy = pool(4)
    with pytest.raises(PolicyInputError) as error:
        policy.lookup(((1, -1),))
    assert str(error.value) == "looked-up prompt: segment 0 is (1, -1); expected (content_id, length >= 0)"
    policy.admit(7, ((1, 4),), 8, output_content_id=100)
    with pytest.raises(PolicyInputError) as error:
        policy.grow(7, 2, content=((5, -1), (6, 3)))
    assert str(error.value) == (
        "content of sequence 7: segment 0 is (5, -1); expected (content_id, length >= 0)"
    )
