"""Property-based tests: random admit / grow / fork / free sequences against every policy."""

from __future__ import annotations

import copy
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import ChildSpec, OutOfKVMemory, PoolSpec, make_policy
from policies.paged import PagedPolicy
from policies.prefix import NO_PARENT, PrefixCachingPolicy, block_contents

BLOCK_SIZE = 4
POOL = PoolSpec(kv_pool_tokens=30 * BLOCK_SIZE + 2, block_size=BLOCK_SIZE, max_model_len=48)

# A few prompts that share leading segments, so prefix hits happen often. A block-aligned prompt
# repeated may hit only all but its last block, so two blocks come to hold the same cache key.
PROMPTS = [
    ((1, 8),),
    ((1, 9),),
    ((1, 9), (2, 5)),
    ((1, 4), (3, 7)),
    ((1, 12), (4, 1)),
    ((5, 3),),
    ((1, 9), (2, 5), (6, 8)),
]

VARIANTS = [
    ("paged", {}),
    ("prefix", {}),
    ("contiguous", {"reservation": "max", "placement": "first_fit"}),
    ("contiguous", {"reservation": "pow2", "placement": "best_fit"}),
    ("contiguous", {"reservation": "oracle", "placement": "buddy"}),
]

operation = st.one_of(
    st.tuples(st.just("admit"), st.integers(0, len(PROMPTS) - 1), st.integers(0, 20)),
    st.tuples(st.just("grow"), st.integers(0, 50), st.integers(1, 9)),
    st.tuples(st.just("grow_each"), st.integers(0, 50), st.integers(1, 9)),
    st.tuples(st.just("fork"), st.integers(0, 50), st.integers(1, 3)),
    st.tuples(st.just("free"), st.integers(0, 50), st.just(0)),
)


def expected_block_accounting(policy: PagedPolicy) -> dict[str, int]:
    """Recompute the breakdown from the block tables alone (independent of the incremental sums)."""
    block_size = policy.block_size
    filled: dict[int, int] = {}
    target: dict[int, int] = {}
    for seq_id in policy.live_sequences():
        state = policy.sequences[seq_id]
        for index, block_id in enumerate(state.block_table):
            fill = min(block_size, state.num_tokens - index * block_size)
            goal = min(block_size, max(0, state.final_len - index * block_size))
            filled[block_id] = fill
            target[block_id] = max(target.get(block_id, 0), goal)
    live = len(filled)
    cached = 0
    if isinstance(policy, PrefixCachingPolicy):
        cached = sum(
            1
            for block_id in range(policy.num_blocks)
            if policy.ref_count[block_id] == 0
            and (policy._block_key[block_id] is not None or block_id in policy._pinned)
        )
    return {
        "used": sum(filled.values()),
        "reserved": sum(target[b] - filled[b] for b in filled),
        "internal_fragmentation": live * block_size - sum(target.values()),
        "external_fragmentation": policy.pool.kv_pool_tokens - policy.num_blocks * block_size,
        "cached": cached * block_size,
        "free": (policy.num_blocks - live - cached) * block_size,
    }


def check_block_invariants(policy: PagedPolicy) -> None:
    references: Counter[int] = Counter()
    for seq_id in policy.live_sequences():
        table = policy.sequences[seq_id].block_table
        assert len(table) == len(set(table)), "a sequence holds the same block twice"
        assert len(table) == -(-policy.sequences[seq_id].num_tokens // policy.block_size)
        references.update(table)
    for block_id in range(policy.num_blocks):
        assert policy.ref_count[block_id] == references[block_id] >= 0
        in_queue = block_id in policy.free_queue
        pinned_idle = isinstance(policy, PrefixCachingPolicy) and block_id in policy._pinned
        assert in_queue == (references[block_id] == 0 and not pinned_idle)
    assert policy.breakdown().as_dict() == expected_block_accounting(policy)
    for seq_id in policy.live_sequences():
        state = policy.sequences[seq_id]
        room = policy.growth_room(seq_id)
        tail_shared = (
            bool(state.num_tokens % policy.block_size) and policy.ref_count[state.block_table[-1]] > 1
        )
        allocated = len(state.block_table) * policy.block_size
        assert room == (0 if tail_shared else min(allocated, state.final_len) - state.num_tokens)
        if room:
            assert policy.slots_needed_to_grow(seq_id, room) == 0
        if state.num_tokens < state.final_len and room < state.final_len - state.num_tokens:
            assert policy.slots_needed_to_grow(seq_id, room + 1) > 0
    if isinstance(policy, PrefixCachingPolicy):
        for seq_id in policy.live_sequences():
            _assert_keys_name_content_and_parent(policy, policy.sequences[seq_id])
    logical = sum(len(policy.sequences[s].block_table) for s in policy.live_sequences())
    assert policy.sharing_slots() == (len(references) * policy.block_size, logical * policy.block_size)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variant=st.sampled_from(VARIANTS), operations=st.lists(operation, max_size=60))
def test_random_operations_keep_every_invariant(variant, operations):
    name, options = variant
    policy = make_policy(name, POOL, **options)
    live: list[int] = []
    next_id = 0

    def fresh_id() -> int:
        nonlocal next_id
        next_id += 1
        return next_id

    for kind, choice, amount in operations:
        before = policy.breakdown()
        try:
            if kind == "admit":
                prompt = PROMPTS[choice]
                prompt_len = sum(length for _, length in prompt)
                seq_id = fresh_id()
                cached = policy.admit(seq_id, prompt, prompt_len + amount, output_content_id=1000 + seq_id)
                assert 0 <= cached < prompt_len and cached % BLOCK_SIZE == 0
                live.append(seq_id)
            elif live and kind == "grow":
                seq_id = live[choice % len(live)]
                state = getattr(policy, "sequences", {}).get(seq_id)
                room = _final_len(policy, seq_id) - policy.seq_len(seq_id)
                if room == 0:
                    continue
                policy.grow(seq_id, min(amount, room))
                if state is not None:
                    _assert_written_blocks_are_private(policy, state, min(amount, room))
            elif live and kind == "grow_each":
                _grow_each_as_one_at_a_time(policy, live, choice, amount)
            elif live and kind == "fork":
                parent = live[choice % len(live)]
                length = policy.seq_len(parent)
                children = [
                    ChildSpec(fresh_id(), min(POOL.max_model_len, length + 5), 5000 + i)
                    for i in range(amount)
                ]
                policy.fork(parent, children)
                live.extend(child.seq_id for child in children)
            elif live and kind == "free":
                policy.free(live.pop(choice % len(live)))
        except OutOfKVMemory:
            assert policy.breakdown() == before, "a failed operation changed the pool"
        assert policy.breakdown().total == POOL.kv_pool_tokens
        if isinstance(policy, PagedPolicy):
            check_block_invariants(policy)

    for seq_id in live:
        policy.free(seq_id)
    final = policy.breakdown()
    assert final.used == final.reserved == final.internal_fragmentation == 0
    assert final.cached + final.free + final.external_fragmentation == POOL.kv_pool_tokens
    if isinstance(policy, PagedPolicy):
        check_block_invariants(policy)
        # Evict everything: admitting enough fresh content drains the cache, and the pool is all free again.
        seq_id = fresh_id()
        policy.admit(seq_id, ((999_999, POOL.max_model_len),), POOL.max_model_len, output_content_id=1)
        policy.free(seq_id)
        assert policy.breakdown().used == 0


def _assert_keys_name_content_and_parent(policy: PrefixCachingPolicy, state) -> None:
    """Every full block of a live sequence is keyed by what it holds and by the block before it,
    exactly as a lookup of the same content computes the key."""
    full = state.num_tokens // policy.block_size
    contents = block_contents(state.segments, state.segment_ends, 0, full, policy.block_size)
    parent = NO_PARENT
    for block_id, content in zip(state.block_table[:full], contents, strict=True):
        assert policy._block_key[block_id] == content + (state.namespace, *parent)
        parent = (block_id, policy._epoch[block_id])


def _final_len(policy, seq_id: int) -> int:
    return policy.final_len(seq_id)


def _grow_each_as_one_at_a_time(policy, live: list[int], choice: int, amount: int) -> None:
    """grow_each of up to three live sequences (often a parent and its forks, sharing a tail) leaves
    the policy exactly as growing them one at a time would, and returns each one's growth room; when
    it fails, nothing changed."""
    start = choice % len(live)
    group = [
        seq_id for seq_id in live[start : start + 3] if policy.seq_len(seq_id) < _final_len(policy, seq_id)
    ]
    if not group:
        return
    tokens = [min(amount, _final_len(policy, seq_id) - policy.seq_len(seq_id)) for seq_id in group]
    reference = copy.deepcopy(policy)
    before = _snapshot(policy, live)
    failures = policy.stats.allocation_failures
    try:
        rooms = policy.grow_each(group, tokens)
    except OutOfKVMemory:
        # Nothing changed but the count of failed allocations.
        assert policy.stats.allocation_failures == failures + 1
        policy.stats.allocation_failures = failures
        assert _snapshot(policy, live) == before, "a failed grow_each changed the policy"
        raise
    for seq_id, count in zip(group, tokens, strict=True):
        reference.grow(seq_id, count)
    assert rooms == [reference.growth_room(seq_id) for seq_id in group]
    assert _snapshot(policy, live) == _snapshot(reference, live)


def _snapshot(policy, live: list[int]) -> tuple:
    sequences = [(policy.seq_len(s), policy.growth_room(s)) for s in live]
    tables = [policy.block_table(s) for s in live] if isinstance(policy, PagedPolicy) else []
    order = policy.free_queue.order() if isinstance(policy, PagedPolicy) else []
    return policy.breakdown(), policy.sharing_slots(), policy.stats.as_dict(), sequences, tables, order


def _assert_written_blocks_are_private(policy: PagedPolicy, state, grown: int) -> None:
    """Copy-on-write: every block a write touched belongs to the writer alone."""
    first_written = (state.num_tokens - grown) // policy.block_size
    for block_id in state.block_table[first_written:]:
        assert policy.ref_count[block_id] == 1
