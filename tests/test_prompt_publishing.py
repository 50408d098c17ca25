"""A prompt's blocks become hittable as its chunks are scheduled, not at admission (vLLM's
``allocate_slots`` caches a chunk's full blocks when it schedules the chunk): worked by hand on the
prefix policy and end to end through the engine, where a request preempted mid-prefill leaves
cached only what it had scheduled."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import ChildSpec, OutOfKVMemory, PoolSpec, make_policy
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


def test_radix_inserts_a_prompt_as_its_chunks_are_scheduled_and_deduplicates_then():
    """Pages of 4, 10 pages. A and B are admitted with the same 14-token prompt before either has a
    chunk scheduled: nothing to hit, each holds 4 pages of its own (14 used, 2 reserved each).
    A's first 8 tokens enter the tree (2 pages, locked by A): nothing moves. B's first 8 find them
    there: B adopts the tree's pages and its own 2 go back (SGLang's insert frees the request's
    copies of cached tokens), so 8 used slots become free."""
    policy = make_policy("radix", PoolSpec(10 * 4, 4, 64), page_size=4)
    assert policy.defer_prompt_keys()
    prompt = ids(1, 14)
    assert policy.admit(0, prompt, 20, output_content_id=1000) == 0
    assert policy.admit(1, prompt, 20, output_content_id=1001) == 0
    assert policy.lookup(prompt).cached_tokens == 0
    before = policy.breakdown().as_dict()
    assert before == {
        "used": 28,
        "reserved": 4,
        "internal_fragmentation": 0,
        "external_fragmentation": 0,
        "cached": 0,
        "free": 8,
    }
    policy.prompt_scheduled(0, 9)  # two whole pages
    assert policy.lookup(prompt).cached_tokens == 8
    assert policy.breakdown().as_dict() == before
    policy.prompt_scheduled(1, 8)
    assert policy.breakdown().as_dict() == before | {"used": 20, "free": 16}
    policy.prompt_scheduled(0, 14)  # the whole prompt: its whole pages, 12 tokens
    assert policy.lookup(prompt).cached_tokens == 12
    # B preempted: its own pages go, what it shares stays; A still holds the 12 tokens.
    policy.free(1, finished=False)
    assert policy.lookup(prompt).cached_tokens == 12
    assert policy.breakdown().as_dict() == {
        "used": 14,
        "reserved": 2,
        "internal_fragmentation": 0,
        "external_fragmentation": 0,
        "cached": 0,
        "free": 24,
    }


def test_radix_inserts_a_finished_sequence_whole_whatever_was_reported():
    """Finished means computed: its whole pages enter the tree (SGLang's ``cache_finished_req``),
    here the prompt's 12 tokens and the 4 output tokens after them, though no chunk was reported."""
    policy = make_policy("radix", PoolSpec(10 * 4, 4, 64), page_size=4)
    assert policy.defer_prompt_keys()
    prompt = ids(1, 14)
    policy.admit(0, prompt, 18, output_content_id=1000)
    policy.grow(0, 4)
    policy.free(0, finished=True)
    assert policy.lookup(prompt).cached_tokens == 12
    assert policy.breakdown().cached == 16  # 18 tokens: 4 whole pages


def test_a_refused_fork_leaves_what_was_scheduled_as_it_was():
    """4 pages of 4, all held by A's 14 tokens: a child's copy of the partial last page does not fit,
    and the refused fork changes nothing; A's first 8 tokens then enter the tree as reported."""
    policy = make_policy("radix", PoolSpec(4 * 4, 4, 64), page_size=4)
    assert policy.defer_prompt_keys()
    prompt = ids(1, 14)
    policy.admit(0, prompt, 20, output_content_id=1000)
    with pytest.raises(OutOfKVMemory):
        policy.fork(0, [ChildSpec(1, 20, 1001)])
    policy.prompt_scheduled(0, 8)
    assert policy.lookup(prompt).cached_tokens == 8


@pytest.mark.parametrize("policy, options", [("prefix", {}), ("radix", {}), ("radix", {"page_size": 4})])
@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_a_request_preempted_mid_prefill_hits_only_what_it_scheduled(step_mode, policy, options):
    """8 blocks (or pages, or 32 slots) of 4 tokens, 1 s an iteration, a budget of 9 tokens. R0 (4
    prompt tokens, 7 output) decodes from 1.0 (its prompt fills 4 slots, its first four output
    tokens 4 more); R1 (24 tokens) is admitted at 3.0 with the 24 free slots and schedules a first
    chunk of 8 tokens. At 4.0 R0 needs a ninth slot and none is free: R1, the newest, is preempted.
    It does not fit beside R0 until R0 finishes at 7.0; it then hits the 8 tokens it had scheduled
    and computes 16: 9 then 7 tokens, its first token at 9.0, its second at 10.0.

    Keyed at admission, ``prefix`` gave it a hit of 20 (its never-computed blocks, cached at its
    preemption), and ``radix`` one of 0 (its whole prompt, one leaf, was evicted for R0's token)."""
    pool = PoolSpec(8 * 4, 4, 64)
    engine = run(
        policy,
        pool,
        [request(0, 0.0, 4, 7), request(1, 2.5, 24, 2)],
        step_mode=step_mode,
        costs=ConstantCost(1.0),
        max_num_batched_tokens=9,
        options=options,
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


@pytest.mark.parametrize("step_mode", ["single", "skip"])
@pytest.mark.parametrize(("scheduler", "hits"), [("vllm", [0, 15, 15]), ("sglang", [0, 0, 15])])
def test_sglang_caches_a_chunk_once_its_batch_ran(step_mode, scheduler, hits):
    """Three requests with one 16-token prompt on ``radix`` (pages of 1), 1 s an iteration: R0 and R1
    arrive at 0.0 and are admitted in one round, R2 at 2.5. SGLang inserts a prompt into its tree
    after the batch that computed it ran (``cache_unfinished_req``): R1 cannot hit R0's prompt, R2
    hits 15 tokens (a hit stops one short of the prompt). vLLM's scheduler caches a chunk as it
    schedules it: R1 hits R0's 15 in the same round."""
    shared = ((7, 16),)
    engine = run(
        "radix",
        PoolSpec(64, 1, 64),
        [request(index, arrival, 16, 3, prompt=shared) for index, arrival in enumerate((0.0, 0.0, 2.5))],
        step_mode=step_mode,
        costs=ConstantCost(1.0),
        scheduler=scheduler,
        max_num_batched_tokens=64,
    )
    records = sorted(engine.records, key=lambda record: record.request_id)
    assert [record.cached_prompt_tokens for record in records] == hits
    assert [(record.admitted_s, record.first_token_s) for record in records] == [
        (0.0, 1.0),
        (0.0, 1.0),
        (3.0, 4.0),
    ]
