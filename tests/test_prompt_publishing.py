"""A prompt's blocks become hittable as its chunks are scheduled, not at admission (vLLM's
``allocate_slots`` caches a chunk's full blocks when it schedules the chunk): worked by hand on the
prefix policy and end to end through the engine, where a request preempted mid-prefill leaves
cached only what it had scheduled."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import PoolSpec, make_policy
from policies.prefix import PrefixCachingPolicy
from tests.engine_helpers import ConstantCost, request
from tests.test_engine import run
from tests.test_policy_properties import Driver, check_block_invariants, operation
from token_content import token_ids


def ids(first: int, last: int):
    return token_ids(range(first, last + 1))


def deferring_pool() -> PrefixCachingPolicy:
    """10 blocks of 4 tokens (ids 0-9), prompts keyed as the engine schedules them."""
    policy = make_policy("prefix", PoolSpec(10 * 4, 4, 64))
    assert isinstance(policy, PrefixCachingPolicy)
    assert policy.defer_prompt_keys()
    return policy


def test_a_prompt_is_hittable_as_far_as_it_was_scheduled():
    policy = deferring_pool()
    prompt = ids(1, 14)  # blocks 0-2 full, block 3 holds tokens 13-14
    assert policy.admit(0, prompt, 20, output_content_id=1000) == 0
    assert policy.block_table(0) == [0, 1, 2, 3]
    assert policy.lookup(prompt).cached_tokens == 0  # nothing scheduled: nothing to hit
    policy.prompt_scheduled(0, 6)  # tokens 1-6: block 0 full, block 1 half
    assert policy.lookup(prompt).cached_tokens == 4
    policy.prompt_scheduled(0, 10)
    assert policy.lookup(prompt).cached_tokens == 8
    policy.prompt_scheduled(0, 5)  # (behind what was scheduled: nothing changes)
    assert policy.lookup(prompt).cached_tokens == 8
    check_block_invariants(policy)  # (among them: no block past what was scheduled holds a key)
    policy.prompt_scheduled(0, 14)
    # The whole prompt: a hit stops one token short of it, so at block 2 (12 tokens).
    assert policy.lookup(prompt).cached_tokens == 12
    # Admission keys nothing past the hit either way.
    assert policy.breakdown().cached == 0


def test_without_deferral_a_prompt_is_hittable_from_admission():
    policy = make_policy("prefix", PoolSpec(10 * 4, 4, 64))
    prompt = ids(1, 14)
    policy.admit(0, prompt, 20, output_content_id=1000)
    policy.prompt_scheduled(0, 1)  # (told nothing: keyed at admission)
    assert policy.lookup(prompt).cached_tokens == 12


def test_a_sequence_freed_mid_prefill_caches_only_its_scheduled_blocks():
    """Sequence 1 hits sequence 0's first block, schedules 9 of its 14 tokens (its blocks 0 and 4
    full) and is preempted: block 4 stays cached, block 5 (never computed) and its tail 6 go back
    blank. Sequence 0 (14 tokens of 20, 4 blocks) still runs."""
    policy = deferring_pool()
    policy.admit(0, ids(1, 14), 20, output_content_id=1000)
    policy.prompt_scheduled(0, 4)
    other = ids(1, 4) + ids(101, 110)
    assert policy.admit(1, other, 20, output_content_id=1001) == 4
    assert policy.block_table(1) == [0, 4, 5, 6]
    policy.prompt_scheduled(1, 9)
    policy.free(1, finished=False)
    assert policy.breakdown().as_dict() == {
        "used": 14,
        "reserved": 2,  # its 4 blocks hold 16 of its 20 tokens
        "internal_fragmentation": 0,
        "external_fragmentation": 0,
        "cached": 4,  # block 4 alone
        "free": 20,  # blocks 5 and 6, and 7-9
    }
    assert policy.lookup(other).cached_tokens == 8  # blocks 0 and 4
    # Blank blocks are handed out first, the cached one last.
    assert policy.free_queue_order()[-1] == 4


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_a_request_preempted_mid_prefill_hits_only_what_it_scheduled(step_mode):
    """8 blocks of 4 tokens, 1 s an iteration, a budget of 9 tokens. R0 (4 prompt tokens, 7 output)
    decodes from 1.0 (block 0 holds its prompt, its first four output tokens fill block 1); R1 (24
    tokens) is admitted at 3.0 with the 6 free blocks and schedules a first chunk of 8 tokens (2
    blocks). At 4.0 R0 needs its third block and none is free: R1, the newest, is preempted. Its 6
    blocks and its 2 cached ones do not fit beside R0's 3 until R0 finishes at 7.0; it then hits
    the 8 tokens it had scheduled (its other 4 blocks were never computed; keyed at admission they
    gave a hit of 20) and computes 16: 9 then 7 tokens, its first token at 9.0, its second at 10.0."""
    pool = PoolSpec(8 * 4, 4, 64)
    engine = run(
        "prefix",
        pool,
        [request(0, 0.0, 4, 7), request(1, 2.5, 24, 2)],
        step_mode=step_mode,
        costs=ConstantCost(1.0),
        max_num_batched_tokens=9,
    )
    r0, r1 = sorted(engine.records, key=lambda record: record.request_id)
    assert (r0.first_token_s, r0.finish_s, r0.preemptions) == (1.0, 7.0, 0)
    assert (r1.admitted_s, r1.first_token_s, r1.finish_s, r1.preemptions) == (3.0, 9.0, 10.0, 1)
    assert engine.kv.stats.prefix_cache_hits == 8


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=st.lists(operation, max_size=60))
def test_random_operations_with_prompts_keyed_as_scheduled_keep_every_invariant(operations):
    """The property test's driver on the deferring prefix policy alone (there it is one variant of
    many): chunks reported in any order, forks and growth before a prompt is whole, preemptions
    mid-prefill. Beyond the usual checks, blocks past what was scheduled hold no key."""
    driver = Driver("prefix", {"defer_keys": True})
    for kind, choice, amount in operations:
        driver.apply(kind, choice, amount)
    driver.drain()
