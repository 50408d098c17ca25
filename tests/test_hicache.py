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
    with pytest.raises(PolicyInputError, match="unknown write_policy 'write_sometimes'"):
        hicache(16, "write_sometimes")


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
