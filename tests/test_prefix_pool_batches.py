"""The shared prefix-caching pool's batch operations (policies/hybrid/prefix_pool.py) against the
one-block operations they stand for: ``release_each`` against ``release`` of each block in turn,
``mark_lazy_each`` against ``mark_lazy``, a lazy run's mark positions, and the evictions of a take."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import PolicyStats
from policies.hybrid.prefix_pool import LAZY, NO_BLOCK, LazyRun, PrefixCachingBlockPool
from policies.paged import SequenceState

BLOCKS = 12


def _key(pool: PrefixCachingBlockPool, group: int, block: int) -> None:
    """``block`` (held) cached in ``group`` under a chain of its own (the sequence's hold kept)."""
    pool.cache_block(group, block, pool.chains.acquire((None, 100 + block, 0, 4, 0)))


def _pool(holders: list[int], keyed: list[bool]) -> PrefixCachingBlockPool:
    """Blocks 0.. taken (every one, in id order), then held ``holders[b]`` times; block ``b`` keeps an
    identity (cached in group ``b % 2``) when ``keyed[b]``."""
    pool = PrefixCachingBlockPool(BLOCKS, 4)
    for _ in range(2):
        pool.add_group(PolicyStats())
    taken = pool.take_blocks(BLOCKS, "the test")
    assert taken == list(range(BLOCKS))
    for block in taken:
        for _ in range(holders[block] - 1):
            pool.touch(block)
        if keyed[block]:
            _key(pool, block % 2, block)
    return pool


def _state(pool: PrefixCachingBlockPool) -> tuple:
    return (
        pool.queue.order(),
        pool.queue.blank,
        list(pool.ref_count),
        pool.free_blocks,
        pool.cached_blocks,
        [pool.cached_in(group) for group in range(2)],
    )


@settings(max_examples=200, deadline=None)
@given(
    holders=st.lists(st.integers(1, 3), min_size=BLOCKS, max_size=BLOCKS),
    keyed=st.lists(st.booleans(), min_size=BLOCKS, max_size=BLOCKS),
    order=st.permutations(list(range(BLOCKS))),
    count=st.integers(0, BLOCKS),
)
def test_release_each_is_release_of_each_block_in_turn(holders, keyed, order, count):
    released = order[:count]
    batch, one_by_one = _pool(holders, keyed), _pool(holders, keyed)
    held = batch.release_each(list(released))
    expected_held = [one_by_one.release(block) for block in released]
    assert held == any(expected_held)
    assert _state(batch) == _state(one_by_one)


def test_release_each_sends_blank_blocks_to_the_head_and_cached_ones_to_the_tail_in_turn():
    # Blocks 0-5 each held once; 1, 3 and 4 keep an identity. Released 5, 4, 3, 2, 1, 0 (a sequence's
    # blocks, the last first): the blank ones 5, 2, 0 go to the head in turn (the last one given back
    # is the first taken), the cached 4, 3, 1 to the tail in turn; blocks 6-11 are still held.
    holders = [1] * BLOCKS
    keyed = [block in (1, 3, 4) for block in range(BLOCKS)]
    pool = _pool(holders, keyed)
    assert pool.release_each([5, 4, 3, 2, 1, 0]) is False
    assert pool.queue.order() == [0, 2, 5, 4, 3, 1]
    assert pool.queue.blank == 3
    assert (pool.free_blocks, pool.cached_blocks) == (6, 3)
    assert [pool.cached_in(group) for group in range(2)] == [1, 2]  # group 0: block 4; group 1: 1, 3


def _run(pool: PrefixCachingBlockPool, first: int) -> LazyRun:
    content = SequenceState(1, 64, 64, 2, segments=[(7, 64)], segment_ends=[64])
    return LazyRun(pool, (None, 7, 0, 4, 0), None, first, 0, content, [])


@settings(max_examples=200, deadline=None)
@given(
    blocks=st.permutations(list(range(8))),
    holes=st.lists(st.booleans(), min_size=1, max_size=8),
    start=st.integers(0, 8),
)
def test_mark_lazy_each_is_mark_lazy_of_each_blank_held_block_in_turn(blocks, holes, start):
    # A table holds each block once at most; a hole is a position that holds none.
    table = [NO_BLOCK if hole else block for block, hole in zip(blocks, holes, strict=False)]
    start = min(start, len(table))
    batch, one_by_one = (PrefixCachingBlockPool(8, 4, lazy_keys=True) for _ in range(2))
    for pool in (batch, one_by_one):
        pool.add_group(PolicyStats())
        pool.take_blocks(8, "the test")
        _key(pool, 0, 3)  # block 3 has an identity already: neither marks it
    run_batch, run_one = _run(batch, start), _run(one_by_one, start)
    batch.mark_lazy_each(table, start, len(table), run_batch)
    for position in range(start, len(table)):
        block = table[position]
        if block != NO_BLOCK and not one_by_one.has_identity(block):
            one_by_one.mark_lazy(block, run_one, position)
    assert run_batch.marked == run_one.marked
    assert run_batch.mark_positions() == run_one.mark_positions()
    assert run_batch.identified == run_one.identified
    assert batch.block_chain == one_by_one.block_chain and batch.block_group == one_by_one.block_group
    expected_positions = [
        position for position in range(start, len(table)) if table[position] not in (NO_BLOCK, 3)
    ]
    assert run_batch.mark_positions() == expected_positions


def test_a_runs_mark_positions_are_kept_as_stretches():
    # Marks at positions 4, 5, 6, then 9, 10 (7 and 8 held nothing new), then 2 (a block marked again
    # at another position): three stretches, and the positions read back in mark order.
    pool = PrefixCachingBlockPool(8, 4, lazy_keys=True)
    pool.add_group(PolicyStats())
    pool.take_blocks(8, "the test")
    run = _run(pool, 2)
    for block, position in ((0, 4), (1, 5), (2, 6), (3, 9), (4, 10), (5, 2)):
        pool.mark_lazy(block, run, position)
    assert run.marked == [0, 1, 2, 3, 4, 5]
    assert run.stretches == [0, 4, 3, 9, 5, 2]
    assert run.mark_positions() == [4, 5, 6, 9, 10, 2]
    assert run.identified == 6
    assert all(pool.block_chain[block] == LAZY for block in range(6))


def _two_group_pool() -> tuple[PrefixCachingBlockPool, list[PolicyStats]]:
    """8 blocks of 4 slots, two groups (their stats), every block taken, in id order."""
    stats = [PolicyStats(), PolicyStats()]
    pool = PrefixCachingBlockPool(8, 4, lazy_keys=True)
    for group_stats in stats:
        pool.add_group(group_stats)
    pool.take_blocks(8, "the test")
    return pool, stats


def test_a_take_evicts_lazy_and_keyed_blocks_alike():
    # Blocks 0-3 marked by one run (group 0) and 4-5 keyed (group 1), all released to the tail in that
    # order, then 2 blank ones taken and 6 more: the six cached blocks are evicted, each counted in
    # its group, and the run, freed and wholly evicted, is forgotten.
    pool, stats = _two_group_pool()
    run = pool.file_run(_run(pool, 0))
    pool.mark_lazy_each([0, 1, 2, 3], 0, 4, run)
    _key(pool, 1, 4)
    _key(pool, 1, 5)
    run.live = False
    assert pool.release_each([0, 1, 2, 3, 4, 5, 6, 7]) is False
    assert (pool.cached_blocks, pool.cached_in(0), pool.cached_in(1)) == (6, 4, 2)
    assert pool.take_blocks(2, "the test") == [7, 6]
    assert pool.take_blocks(6, "the test") == [0, 1, 2, 3, 4, 5]
    assert (pool.cached_blocks, pool.cached_in(0), pool.cached_in(1)) == (0, 0, 0)
    assert (stats[0].evictions, stats[1].evictions) == (4, 2)
    assert run.identified == 0 and pool.lazy_runs == {}
    assert pool.block_chain == [NO_BLOCK] * 8 and pool.block_run == [None] * 8


def test_a_take_counts_each_stretch_of_lazy_runs_off_its_own_run_and_group():
    # Run A (group 0) marks blocks 0, 1 and 5, run B (group 1) marks 3 and 4, block 2 is keyed in
    # group 1. Released in the order 0-7 and all taken again, the evictions come off the queue as
    # A A keyed B B A: A is counted off in two stretches, and each run is forgotten when its last
    # mark goes (both are freed).
    pool, stats = _two_group_pool()
    run_a = pool.file_run(_run(pool, 0))
    run_b = pool.file_run(LazyRun(pool, (None, 8, 0, 4, 0), None, 0, 1, run_a.content, []))
    pool.mark_lazy_each([0, 1, NO_BLOCK, NO_BLOCK, NO_BLOCK, 5], 0, 6, run_a)
    pool.mark_lazy_each([3, 4], 0, 2, run_b)
    _key(pool, 1, 2)
    run_a.live = run_b.live = False
    assert [pool.group_of(block) for block in range(8)] == [0, 0, 1, 1, 1, 0, NO_BLOCK, NO_BLOCK]
    assert pool.release_each([0, 1, 2, 3, 4, 5, 6, 7]) is False
    assert (pool.cached_blocks, pool.cached_in(0), pool.cached_in(1)) == (6, 3, 3)
    assert pool.take_blocks(2, "the test") == [7, 6]
    assert pool.take_blocks(4, "the test") == [0, 1, 2, 3]
    # A keeps its mark of block 5, B of block 4: neither is forgotten yet.
    assert (run_a.identified, run_b.identified) == (1, 1)
    assert set(pool.lazy_runs) == {run_a.key, run_b.key}
    assert (stats[0].evictions, stats[1].evictions) == (2, 2)
    assert pool.take_blocks(2, "the test") == [4, 5]
    assert (run_a.identified, run_b.identified) == (0, 0) and pool.lazy_runs == {}
    assert (stats[0].evictions, stats[1].evictions) == (3, 3)
    assert (pool.cached_blocks, pool.cached_in(0), pool.cached_in(1)) == (0, 0, 0)
    assert pool.ref_count == [1] * 8
