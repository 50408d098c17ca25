"""The KV coordinator (sim/kv/coordinator.py): the engine's one door to KV memory over the model's KV
groups. One group hands every call to its policy (the golden summaries hold the results bit for
bit); several groups follow the rules worked out by hand here: the hit is the shortest group's, an
operation happens in every group or in none, each group's breakdown sums to its own pool."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import PoolSpec, make_policy
from policies.base import ChildSpec, OutOfKVMemory, PolicyInputError
from sim.engine.core import Engine, EngineKnobs
from sim.kv.coordinator import KVGroup, MultiGroupCoordinator, SingleGroupCoordinator, make_coordinator
from tests.engine_helpers import RoundCostModel, request

BLOCK = 16
PROMPT = ((7, 48),)  # 48 tokens of content 7: three full blocks


def two_groups(a_tokens: int = 128, b_tokens: int = 64, policy: str = "prefix") -> MultiGroupCoordinator:
    """Group "a" (8 blocks of 16) and group "b" (4 blocks of 16), each its own pool."""
    groups = [
        KVGroup("a", make_policy(policy, PoolSpec(a_tokens, BLOCK, 256)), slot_bytes=10),
        KVGroup("b", make_policy(policy, PoolSpec(b_tokens, BLOCK, 256)), slot_bytes=3),
    ]
    coordinator = make_coordinator(groups)
    assert isinstance(coordinator, MultiGroupCoordinator)
    return coordinator


def group(coordinator, name):
    return next(g.policy for g in coordinator.groups if g.name == name)


def states(coordinator):
    """Everything a failed operation must leave as it was."""
    return [
        (g.policy.breakdown_values(), sorted(g.policy.live_sequences()), g.policy.free_queue.order())
        for g in coordinator.groups
    ]


def held(coordinator):
    """What each group holds, whatever the order of its free list."""
    return [(g.policy.breakdown_values(), sorted(g.policy.live_sequences())) for g in coordinator.groups]


def test_one_group_is_the_policy_itself_behind_one_call():
    policy = make_policy("paged", PoolSpec(64, BLOCK, 64))
    coordinator = make_coordinator(policy)
    assert isinstance(coordinator, SingleGroupCoordinator)
    assert coordinator.policy is policy and coordinator.stats is policy.stats
    assert coordinator.admit(1, ((5, 20),), 40, 99) == 0
    # 20 tokens in 2 blocks of 16 (paging allocates as it grows): used 20, reserved 32 - 20 = 12 it
    # will fill, 2 of the 4 blocks free.
    assert coordinator.breakdown_values() == policy.breakdown_values() == (20, 12, 0, 0, 0, 32)
    engine = Engine(policy, RoundCostModel(), EngineKnobs(max_model_len=64), iter([]), block_size=BLOCK)
    assert engine.kv.policy is policy and engine.policy is policy


def test_the_hit_is_the_longest_prefix_every_group_holds():
    """Both groups cache PROMPT's three blocks (seq 1, then freed). Group b then admits 48 other
    tokens: it has 4 blocks, one never used and three cached, freed tail first, so LRU evicts the
    blocks of tokens 32-48 and 16-32 and keeps 0-16. Group a holds the hit the len - 1 rule allows,
    (48 - 1) // 16 = 2 blocks = 32 tokens; group b 1 block = 16. The common hit is 16 tokens."""
    kv = two_groups()
    kv.admit(1, PROMPT, 48, 101)
    kv.free(1)
    a, b = group(kv, "a"), group(kv, "b")
    a_cached_blocks = a.free_queue.order()[-3:]  # seq 1's three blocks, cached at the queue's tail
    b.admit(99, ((8, 48),), 48, 199)
    b.free(99)
    assert a.lookup(PROMPT).cached_tokens == 32 and b.lookup(PROMPT).cached_tokens == 16
    assert kv.lookup(PROMPT).cached_tokens == 16

    a_cached_before = a.breakdown().cached
    assert kv.admit(2, PROMPT, 48, 102) == 16
    # Group a reused one cached block (not the two it holds) and took two fresh ones: its cache
    # loses the reused block only (48 - 16 slots of the three cached stay cached).
    assert a.breakdown().cached == a_cached_before - 16
    assert a.seq_len(2) == b.seq_len(2) == 48
    assert a.stats.prefix_cache_hits == b.stats.prefix_cache_hits == kv.stats.prefix_cache_hits == 16
    assert kv.stats.prefix_cache_queries == 96  # two admissions of 48 prompt tokens, counted once
    table = a.block_table(2)
    assert table[0] in a_cached_blocks and not set(table[1:]) & set(a_cached_blocks)


def test_an_admission_that_one_group_cannot_hold_changes_no_group():
    """Group b (4 blocks) holds a 64-token sequence; a 16-token prompt needs a block in each group:
    group a has 8 free, group b none. The admission raises, and group a is exactly as before."""
    kv = two_groups()
    kv.admit(1, ((3, 64),), 64, 101)
    before = states(kv)
    assert not kv.can_admit(((4, 16),), 16)
    with pytest.raises(OutOfKVMemory):
        kv.admit(2, ((4, 16),), 16, 102)
    assert states(kv) == before


def test_room_is_the_scarcest_groups_and_growth_is_all_or_nothing():
    """Seq 1 holds 40 of its final 64 tokens: 3 blocks in each group (8 slots of room). Group b has
    one free block, group a five: available = min(16, 80) = 16 slots. Growing by 8 fills the held
    blocks; a second sequence of 16 tokens then takes b's last block, so seq 1's next token fails
    in b (a still has 4 free blocks) without changing a."""
    kv = two_groups()
    kv.admit(1, ((3, 40),), 64, 101)
    assert kv.available_slots() == 16 and kv.growth_room(1) == 8
    kv.grow(1, 8)
    assert kv.growth_room(1) == 0 and kv.fits_growth([1], 16)
    kv.admit(2, ((4, 16),), 32, 102)  # b's last free block
    assert kv.available_slots() == 0 and not kv.fits_growth([1], 1)
    before = states(kv)
    with pytest.raises(OutOfKVMemory, match="KV group 'b'"):
        kv.grow(1, 1)
    with pytest.raises(OutOfKVMemory):
        kv.grow_each([1, 2], [1, 1])
    assert states(kv) == before


def test_a_fork_that_fails_in_one_group_is_undone_in_the_others():
    """Plain paging copies every parent block for each child: a 48-token parent (3 blocks) forking
    two children needs 6 blocks. Group a (12 blocks, 9 free) forks; group b (4 blocks, 1 free)
    cannot, so a frees its children again: both groups hold what they held. (Group a's free list
    has its blocks back in another order: plain paging has no cache, so block ids are mere labels;
    a prefix-caching group's fork shares blocks and takes none from the pool.)"""
    kv = two_groups(a_tokens=192, b_tokens=64, policy="paged")
    kv.admit(1, PROMPT, 64, 101)
    held_before = held(kv)
    with pytest.raises(OutOfKVMemory):
        kv.fork(1, [ChildSpec(2, 64, -1), ChildSpec(3, 64, -2)])
    assert held(kv) == held_before


def test_accounting_per_group_and_in_total():
    """Seq 1: 40 tokens of final 64 in 3 blocks in each group: used 40, reserved 48 - 40 = 8 (held
    slots it will fill), no fragmentation. Group a: 8 blocks = 128 slots, 80 free; group b: 4 blocks
    = 64 slots, 16 free. Bytes: group a's slots are 10 B, group b's 3 B."""
    kv = two_groups(policy="paged")
    kv.admit(1, ((3, 40),), 64, 101)
    per_group = kv.group_breakdowns()
    assert per_group["a"].as_dict() == {
        "used": 40,
        "reserved": 8,
        "internal_fragmentation": 0,
        "external_fragmentation": 0,
        "cached": 0,
        "free": 80,
    }
    assert per_group["a"].total == 128 and per_group["b"].total == 64 and kv.pool_slots == 192
    assert kv.breakdown_values() == (80, 16, 0, 0, 0, 80 + 16)
    assert kv.breakdown_bytes()["used"] == 40 * 10 + 40 * 3
    assert sum(kv.breakdown_bytes().values()) == 128 * 10 + 64 * 3


def test_groups_must_be_distinct_and_share_a_block_size():
    policy = make_policy("paged", PoolSpec(64, BLOCK, 64))
    with pytest.raises(ValueError, match="distinct names"):
        make_coordinator([KVGroup("a", policy), KVGroup("a", make_policy("paged", PoolSpec(64, BLOCK, 64)))])
    with pytest.raises(ValueError, match="share a policy object"):
        make_coordinator([KVGroup("a", policy), KVGroup("b", policy)])
    with pytest.raises(ValueError, match="one block size"):
        make_coordinator([KVGroup("a", policy), KVGroup("b", make_policy("paged", PoolSpec(64, 8, 64)))])
    with pytest.raises(PolicyInputError, match="at least one KV group"):
        make_coordinator([])


def test_a_policy_that_cannot_shorten_its_hit_refuses_instead_of_skipping_tokens():
    """The radix tree (token granular) holds 47 tokens of PROMPT after it finished; capped at 16 by
    another group it refuses, changing nothing (a hybrid radix cache is the issue of its own)."""
    radix = make_policy("radix", PoolSpec(128, 1, 256))
    radix.admit(1, PROMPT, 48, 101)
    radix.free(1)
    assert radix.lookup(PROMPT).cached_tokens == 47
    assert not radix.can_admit_capped(PROMPT, 48, 0, 16)
    with pytest.raises(PolicyInputError, match="cannot serve a prefix hit shorter than its own"):
        radix.admit_capped(2, PROMPT, 48, 102, 0, 16)
    assert radix.admit_capped(2, PROMPT, 48, 102, 0, 47) == 47


def _run(groups: int, policy: str):
    requests = [
        request(i, 0.5 * i, 20 + 7 * i, 30 + 5 * (i % 4), prompt=((1, 16), (100 + i, 4 + 7 * i)))
        for i in range(12)
    ]
    policies = [make_policy(policy, PoolSpec(160, BLOCK, 256)) for _ in range(groups)]
    kv = make_coordinator(
        policies[0] if groups == 1 else [KVGroup(str(i), p) for i, p in enumerate(policies)]
    )
    engine = Engine(
        kv,
        RoundCostModel(per_context_token_s=0.001),
        EngineKnobs(max_model_len=256),
        iter(requests),
        block_size=BLOCK,
    )
    engine.run()
    records = [
        (r.request_id, r.admitted_s, r.first_token_s, r.finish_s, r.preemptions) for r in engine.records
    ]
    areas = engine.recorder.areas(engine.env.now)
    return records, engine.sink.timeseries(), engine.counters.preemptions, areas


@pytest.mark.parametrize("policy", ["paged", "prefix"])
def test_two_identical_groups_run_exactly_as_one(policy):
    """An independent check of the multi-group path end to end: two groups with the same pool see
    the same operations, so every request's times equal the one-group run's, in a pool tight enough
    to preempt, and every memory column is exactly twice the one-group value at every sample."""
    one, one_series, preemptions, one_areas = _run(1, policy)
    two, two_series, _, two_areas = _run(2, policy)
    assert preemptions > 0
    assert two == one
    # and the time integrals the summary averages (the tokens decoded inside jumps fill a slot in
    # each group: used and reserved double too)
    assert two_areas[:6] == pytest.approx([2 * area for area in one_areas[:6]], rel=1e-12)
    for column in (
        "used_tokens",
        "reserved_tokens",
        "internal_fragmentation_tokens",
        "cached_tokens",
        "free_tokens",
    ):
        assert (two_series[column] == 2 * one_series[column]).all(), column


OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "grow", "free", "fork"]),
        st.integers(0, 7),
        st.integers(1, 40),
        st.integers(0, 2),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(OPERATIONS, st.sampled_from(["paged", "prefix"]))
def test_every_group_stays_whole_and_in_step(operations, policy):
    """Under any sequence of operations: each group's breakdown sums to its own pool, every live
    sequence lives in every group with the same length, and an operation that raises changes nothing."""
    kv = two_groups(a_tokens=160, b_tokens=96, policy=policy)
    live: dict[int, int] = {}  # seq id -> final length
    next_id = 100
    for operation, pick, size, content in operations:
        before = states(kv)
        try:
            if operation == "admit":
                seq_id = next_id
                next_id += 1
                kv.admit(seq_id, ((content, size),), size + 24, 1000 + seq_id)
                live[seq_id] = size + 24
            elif live:
                seq_id = sorted(live)[pick % len(live)]
                if operation == "grow":
                    kv.grow(seq_id, min(size, live[seq_id] - kv.seq_len(seq_id)) or 1)
                elif operation == "free":
                    kv.free(seq_id)
                    del live[seq_id]
                else:
                    child = next_id
                    next_id += 1
                    kv.fork(seq_id, [ChildSpec(child, live[seq_id], -child)])
                    live[child] = live[seq_id]
        except (OutOfKVMemory, PolicyInputError):
            assert (held(kv) if operation == "fork" else states(kv)) == (
                [entry[:2] for entry in before] if operation == "fork" else before
            )
        for g in kv.groups:
            assert g.policy.breakdown().total == g.policy.pool_slots
            assert sorted(g.policy.live_sequences()) == sorted(live)
        for seq_id in live:
            assert group(kv, "a").seq_len(seq_id) == group(kv, "b").seq_len(seq_id)


def test_the_summed_statistics_leave_no_counter_out():
    """Each group's counters set to distinct values: every field but the prefix cache's is the sum;
    those two are the first group's (every group records the same query and the common hit)."""
    from dataclasses import fields

    kv = two_groups()
    for offset, g in enumerate(kv.groups):
        for index, counter in enumerate(fields(g.policy.stats)):
            setattr(g.policy.stats, counter.name, (index + 1) * 10 + offset)
    summed = kv.stats
    a, b = (g.policy.stats for g in kv.groups)
    for counter in fields(summed):
        expected = getattr(a, counter.name)
        if not counter.name.startswith("prefix_cache_"):
            expected += getattr(b, counter.name)
        assert getattr(summed, counter.name) == expected, counter.name
