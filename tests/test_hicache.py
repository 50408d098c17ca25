"""SGLang HiCache on the radix policy (``policies/radix.py``, ``policies/_radix_tree.py``), by hand.

A 32-token device pool (pages of 1), engine blocks of 4 tokens; prompts are single streams whose
sequences finish at their prompt length, so each leaves one tree node of its prompt."""

from __future__ import annotations

import pytest

from policies import PoolSpec, make_policy
from policies.base import PolicyInputError, PrefixHit
from sim.engine.core import Engine, EngineKnobs
from tests.engine_helpers import RoundCostModel
from tests.test_radix import check_against_recount
from workloads.request import Request


def hicache(host_blocks: int, write_policy: str | None = None):
    policy = make_policy("radix", PoolSpec(kv_pool_tokens=32, block_size=4, max_model_len=64))
    policy.enable_host_tier(host_blocks, write_policy)
    return policy


def run(policy, seq_id: int, stream: int, tokens: int) -> int:
    served = policy.admit(seq_id, ((stream, tokens),), tokens, 900 + seq_id)
    check_against_recount(policy)
    policy.free(seq_id)
    check_against_recount(policy)
    return served


def test_evicted_node_goes_to_host_and_a_hit_loads_it_back():
    policy = hicache(16)  # 64 host tokens, write_through
    stats = policy.host_tier.stats
    assert run(policy, 1, 1, 20) == 0
    assert (stats.host_offloaded_tokens, policy.host_breakdown_values()) == (20, (20, 44))  # at insertion
    assert run(policy, 2, 2, 24) == 0  # 12 free: A (20) leaves the device, its host copy stays
    assert policy.breakdown().cached == 24 and policy.host_breakdown_values() == (44, 20)
    hit = policy.lookup(((1, 20),))
    assert hit == PrefixHit(0, (), 19)  # the last prompt token is computed
    assert policy.host_breakdown_values() == (44, 20)  # lookup changed nothing
    served = policy.admit(3, ((1, 20),), 20, 903)
    check_against_recount(policy)
    assert served == 19
    assert (stats.host_cache_hits, stats.host_loaded_tokens, stats.host_loaded_blocks) == (19, 19, 4)
    assert (policy.stats.prefix_cache_hits, policy.stats.prefix_cache_queries) == (0, 64)
    # 19 loaded + 1 computed on the device; B (24) was evicted to make room (8 free then).
    assert policy.breakdown().used == 20 and policy.breakdown().cached == 0


def test_a_short_host_hit_is_recomputed():
    policy = hicache(16)
    run(policy, 1, 1, 8)
    run(policy, 2, 2, 30)  # evicts A to host
    assert policy.lookup(((1, 8),)) == PrefixHit(0)  # 7 < load_back_threshold (10)
    assert policy.admit(3, ((1, 8),), 8, 903) == 0
    check_against_recount(policy)
    assert policy.host_tier.stats.host_loaded_tokens == 0


@pytest.mark.parametrize(("prompt", "loaded"), [(11, 10), (10, 0)])
def test_a_host_hit_of_exactly_the_threshold_is_loaded_back(prompt, loaded):
    # SGLang's load_back_threshold (10): a host hit of 10 tokens or more is loaded back, a shorter one
    # recomputed. A prompt of 11 matches 10 tokens (never its last), one of 10 matches 9.
    policy = hicache(16)
    run(policy, 1, 1, prompt)
    run(policy, 2, 2, 30)  # evicts A to host
    assert policy.lookup(((1, prompt),)) == (PrefixHit(0, (), loaded) if loaded else PrefixHit(0))
    assert policy.admit(3, ((1, prompt),), prompt, 903) == loaded
    check_against_recount(policy)
    assert policy.host_tier.stats.host_loaded_tokens == loaded


def test_write_policies_copy_at_different_times():
    copied = {}
    for write_policy in ("write_through", "write_through_selective", "write_back"):
        policy = hicache(16, write_policy)
        stats = policy.host_tier.stats
        policy.admit(1, ((1, 20),), 20, 901)  # inserted at admission: a first hit
        at_admission = stats.host_offloaded_tokens
        policy.free(1)  # inserted again when it finishes: a second hit
        at_finish = stats.host_offloaded_tokens
        run(policy, 2, 2, 24)  # evicts A from the device
        copied[write_policy] = (at_admission, at_finish, stats.host_offloaded_tokens)
        assert policy.lookup(((1, 20),)).host_tokens == 19  # all three keep A on host
    assert copied == {
        "write_through": (20, 20, 44),
        "write_through_selective": (0, 20, 44),  # B too at its second insertion (it finishes)
        "write_back": (0, 0, 20),  # A copied when evicted
    }


def test_a_full_host_pool_drops_its_least_recently_used_node():
    policy = hicache(10, "write_back")  # 40 host tokens
    for seq_id, stream in enumerate((1, 2, 3, 4), start=1):
        run(policy, seq_id, stream, 20)  # each evicts the one before it to host
    # A, B then C went to host; C did not fit next to A and B: A, the least recent, was dropped.
    assert policy.host_breakdown_values() == (40, 0)
    assert policy.host_tier.stats.host_evictions == 20
    assert policy.lookup(((1, 20),)) == PrefixHit(0)
    assert policy.lookup(((2, 20),)).host_tokens == 19
    assert policy.lookup(((3, 20),)).host_tokens == 19


def test_impossible_host_tiers_are_refused():
    with pytest.raises(PolicyInputError, match="must be larger than the device pool"):
        hicache(8)  # 32 host tokens, not more than the 32-token device pool
    with pytest.raises(PolicyInputError) as refused:
        hicache(16, "write_sometimes")
    assert str(refused.value) == (
        "radix: unknown write_policy 'write_sometimes'; SGLang's --hicache-write-policy is one of "
        "write_through, write_through_selective, write_back"
    )


def test_engine_charges_the_load_back_transfer():
    """RoundCostModel: a prefill iteration takes 1 s + 0.01 s per token computed; a block (4 tokens)
    over the host link 0.5 s. A: 1.20 s; B: 1.24 s; A again: 19 tokens loaded (4.75 blocks,
    2.375 s), 1 computed: 1 + 0.01 + 2.375 = 3.385 s."""
    prompts = [((1, 20),), ((2, 24),), ((1, 20),)]
    requests = [Request(i, 10.0 * i, p, 1, output_content_id=100 + i) for i, p in enumerate(prompts)]
    policy = hicache(16)
    engine = Engine(policy, RoundCostModel(), EngineKnobs(max_model_len=64), iter(requests), block_size=4)
    engine.run()
    ttft = [round(record.first_token_s - record.arrival_s, 9) for record in engine.records]
    assert ttft == [1.2, 1.24, 3.385]
    assert engine.counters.host_load_s == pytest.approx(2.375)
    assert policy.host_tier.stats.host_cache_hits == 19


def test_a_node_not_yet_backed_up_is_deleted_when_evicted():
    """write_through_selective backs a node up at its second hit. A's 20 tokens are inserted once
    (admitted, then preempted: not inserted again): one hit, no host copy. B (24, finished: two hits,
    backed up) needs 24 slots with 12 free: A is evicted and, with no host copy, deleted."""
    policy = hicache(16, "write_through_selective")
    stats = policy.host_tier.stats
    policy.admit(1, ((1, 20),), 20, 901)
    policy.free(1, finished=False)
    assert (stats.host_offloaded_tokens, policy.breakdown().cached) == (0, 20)
    assert run(policy, 2, 2, 24) == 0
    assert policy.stats.evictions == 20
    assert policy.lookup(((1, 20),)) == PrefixHit(0)  # neither on the device nor on host
    assert (stats.host_offloaded_tokens, stats.host_evictions) == (24, 0)
    assert policy.host_breakdown_values() == (24, 64 - 24)
    assert policy.breakdown().as_dict() == {
        "used": 0,
        "reserved": 0,
        "internal_fragmentation": 0,
        "external_fragmentation": 0,
        "cached": 24,
        "free": 8,
    }


def test_a_backup_one_token_short_of_room_drops_the_oldest_host_node():
    """write_back, 9 host blocks of 4 = 36 host tokens. A (20) is cached, then B (17) evicts it: A
    is copied to host (20 of 36). C (32) evicts B: B's 17 tokens find 16 host slots free, one short,
    so A, the least recently used host leaf, is dropped (20 host evictions) and B copied."""
    policy = hicache(9, "write_back")
    stats = policy.host_tier.stats
    run(policy, 1, 1, 20)
    run(policy, 2, 2, 17)
    assert policy.host_breakdown_values() == (20, 16)
    run(policy, 3, 3, 32)
    assert (stats.host_evictions, stats.host_offloaded_tokens) == (20, 37)
    assert stats.host_offloaded_blocks == 9  # 37 tokens: 9 whole blocks of 4
    assert policy.host_breakdown_values() == (17, 19)
    assert policy.lookup(((1, 20),)) == PrefixHit(0)
    assert policy.lookup(((2, 17),)) == PrefixHit(0, (), 16)


def test_the_host_pool_drops_its_least_recently_matched_node():
    """write_back, 36 host tokens; prompts of 16 tokens fill half the 32-slot device. A (20) goes to
    host when B runs, B when D runs (C and B filled the device): host full (20 + 16). The scheduler's
    match of A's prompt refreshes A. E then evicts C, whose copy needs 16 host slots: B, not A, is
    dropped. F evicts D: C, older than A's match, is dropped next."""
    policy = hicache(9, "write_back")
    stats = policy.host_tier.stats
    run(policy, 1, 1, 20)
    run(policy, 2, 2, 16)  # A to host
    run(policy, 3, 3, 16)  # fits beside B
    run(policy, 4, 4, 16)  # B to host
    assert policy.host_breakdown_values() == (36, 0)
    assert policy.match(((1, 20),)) == PrefixHit(0, (), 19)
    run(policy, 5, 5, 16)  # C to host, B dropped
    assert stats.host_evictions == 16
    assert [policy.lookup(((stream, 16),)) for stream in (2, 3)] == [PrefixHit(0), PrefixHit(0, (), 15)]
    run(policy, 6, 6, 16)  # D to host, C dropped
    assert stats.host_evictions == 16 + 16
    assert type(stats.host_evictions) is int  # pages (of 1 token), an integer count
    assert [policy.lookup(((stream, 16),)).host_tokens for stream in (3, 4)] == [0, 15]
    assert policy.lookup(((1, 20),)) == PrefixHit(0, (), 19)
    assert policy.host_breakdown_values() == (36, 0)


def test_a_deleted_device_leaf_leaves_its_parent_on_the_device():
    """write_through_selective. A's 8 tokens: two insertions, copied to host. B = A's 8 + 8 more,
    preempted: its 8 are inserted once, not copied. C (24 fresh, 16 free) evicts B's 8 (the only
    evictable leaf): deleted; A stays on the device, the node it was, now a cached leaf."""
    policy = hicache(16, "write_through_selective")
    run(policy, 1, 1, 8)
    policy.admit(2, ((1, 8), (2, 8)), 16, 902)
    policy.free(2, finished=False)
    check_against_recount(policy)
    assert policy.host_breakdown_values() == (8, 64 - 8)
    run(policy, 3, 3, 24)
    assert policy.stats.evictions == 8
    assert policy.lookup(((1, 8), (2, 8))) == PrefixHit(8)
    assert policy.host_breakdown_values() == (8 + 24, 64 - 32)
