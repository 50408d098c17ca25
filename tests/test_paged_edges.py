"""Edges of the paged policy (policies/paged.py), worked by hand: the free block queue against a
plain list model (with its stale entries, head and compaction), the all-or-nothing checks of
``grow_each``, capped admission, growth rooms and lookahead blocks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import ChildSpec, OutOfKVMemory, PolicyInputError, PoolSpec, make_policy
from policies.paged import FreeBlockQueue
from token_content import token_ids

# ------------------------------------------------------------------------------- free block queue


class ListModel:
    """The queue as one list, head first: ``blank`` blank blocks, then the cached ones, oldest first."""

    def __init__(self, blocks: int) -> None:
        self.order = list(range(blocks))
        self.blank = blocks

    def take(self, count: int) -> list[int]:
        taken, self.order = self.order[:count], self.order[count:]
        self.blank -= min(count, self.blank)
        return taken


def apply(queue: FreeBlockQueue, model: ListModel, held: list[int], kind: str, pick: int) -> None:
    """One operation as the paged and prefix policies call it, on the queue and on the model; then
    every read-only view of the queue must match the model."""
    cached = model.order[model.blank :]
    if kind == "take":  # a sequence takes blocks (0 to all of them)
        count = pick % (len(model.order) + 1)
        taken = queue.take(count)
        assert taken == model.take(count)
        held += taken
    elif kind == "take1" and model.order:  # a decoding sequence's next block
        taken = queue.take(1)
        assert taken == model.take(1)
        held += taken
    elif kind == "hit" and cached:  # a prefix hit takes a cached block out of the middle
        block = cached[pick % len(cached)]
        queue.remove_cached(block)
        model.order.remove(block)
        held.append(block)
    elif kind == "oldest" and cached:  # Marconi's eviction peeks at the oldest cached block
        assert queue.oldest_cached() == cached[0]
    elif kind == "append" and held:  # a full block with a cache key freed back, to the tail
        block = held.pop(pick % len(held))
        queue.append(block)
        model.order.append(block)
    elif kind == "extend" and held:  # a sequence's full blocks freed back, to the tail in turn
        count = 1 + pick % len(held)
        blocks, held[:] = held[:count], held[count:]
        queue.extend(blocks)
        model.order += blocks
    elif kind == "appendleft" and held:  # a partly filled tail freed: it holds nothing reusable
        block = held.pop(pick % len(held))
        queue.appendleft(block)
        model.order.insert(0, block)
        model.blank += 1
    elif kind == "extendleft" and held:  # blocks without keys freed: the last one ends at the head
        count = 1 + pick % len(held)
        blocks, held[:] = held[:count], held[count:]
        queue.extendleft(blocks)
        model.order[:0] = blocks[::-1]
        model.blank += count
    assert queue.order() == model.order
    assert len(queue) == len(model.order)
    assert queue.blank == model.blank


OPERATION = st.sampled_from(
    ["take", "take1", "hit", "oldest", "append", "extend", "appendleft", "extendleft"]
)


@pytest.mark.parametrize("compact_after", [2, 1024])  # 2: the cached part is rebuilt all the time
@settings(max_examples=200, deadline=None)
@given(operations=st.lists(st.tuples(OPERATION, st.integers(0, 10**6)), max_size=60))
def test_free_block_queue_matches_a_list_model(compact_after, operations):
    queue, model, held = FreeBlockQueue(range(10), compact_after), ListModel(10), []
    for kind, pick in operations:
        apply(queue, model, held, kind, pick)


def run_script(queue: FreeBlockQueue, model: ListModel, script: list[tuple]) -> None:
    """``apply`` with the blocks named: ("take", count), ("take1",), ("oldest",), ("hit", block),
    ("append", block), ("extend", count) (the first ``count`` held blocks)."""
    held: list[int] = []
    for kind, *arg in script:
        pick = 0
        if kind == "take":
            pick = arg[0]
        elif kind == "hit":
            pick = model.order[model.blank :].index(arg[0])
        elif kind == "append":
            pick = held.index(arg[0])
        elif kind == "extend":
            pick = arg[0] - 1
        apply(queue, model, held, kind, pick)


ALL_CACHED = [("take", 8), ("extend", 8)]  # blocks 0-7 all cached, 0 the oldest
SCRIPTS = {
    # A take past a stale entry (1) leaves one (5) a later take must skip too.
    "two stale, skipped by a take of 2": ALL_CACHED
    + [("hit", 1), ("hit", 5), ("take", 2), ("append", 1), ("take", 3), ("take", 2)],
    "two stale, skipped by a take of 1": ALL_CACHED
    + [("hit", 1), ("hit", 5), ("take1",), ("take1",), ("append", 1), ("take", 3), ("take", 2)],
    "two stale, skipped by oldest_cached": ALL_CACHED
    + [("hit", 1), ("hit", 5), ("take1",), ("oldest",), ("append", 1), ("take", 4), ("take", 2)],
    # Three stale entries: after one is skipped two are left, after two one.
    "three stale, take of 1 then take of 1": ALL_CACHED
    + [("hit", 1), ("hit", 3), ("hit", 5), ("take1",), ("take1",), ("take1",), ("take", 2)],
    "three stale, oldest_cached then take of 1": ALL_CACHED
    + [("hit", 1), ("hit", 3), ("hit", 5), ("take1",), ("oldest",), ("take1",), ("take1",), ("take", 2)],
    "three stale, take of 1 then oldest_cached": ALL_CACHED
    + [("hit", 1), ("hit", 3), ("hit", 5), ("take1",), ("take1",), ("oldest",), ("take", 3)],
    # Four: a take of 2 skips 1 (three left), a take of 1 skips 4 (two left: 7 and 8).
    "four stale, take of 2 then take of 1": [("take", 10), ("extend", 10)]
    + [("hit", 1), ("hit", 4), ("hit", 7), ("hit", 8), ("take1",), ("take", 2), ("take1",)]
    + [("append", 1), ("take", 3)],
    # Nothing taken yet: a take of 0 hands out nothing.
    "take of 0 from the blank part": [("take", 0), ("take", 3), ("take", 0), ("append", 0), ("take", 0)],
}


@pytest.mark.parametrize("script", SCRIPTS.values(), ids=SCRIPTS.keys())
def test_free_block_queue_skips_exactly_the_stale_entries(script):
    blocks = 10 if script[0] == ("take", 10) else 8
    run_script(FreeBlockQueue(range(blocks)), ListModel(blocks), script)


def test_free_block_queue_compaction_keeps_the_order():
    """compact_after=2. Hits on 0, 1, 2 of the cached 0-3: the third leaves 3 stale entries for 1
    live one (3 > max(2, 1)), so the cached part is rebuilt as [3]; 0 comes back behind it, and a
    hit on 0 after the rebuild is counted again. Then, 6 blocks cached and taken one by one: the
    fourth take moves the head to 4 > 2 and past the 2 live entries, dropping the taken ones."""
    queue, model = FreeBlockQueue(range(4), compact_after=2), ListModel(4)
    run_script(queue, model, [("take", 4), ("extend", 4), ("hit", 0), ("hit", 1), ("hit", 2)])
    assert queue.entries() == 1  # rebuilt: [3]
    run_script(queue, model, [("take", 1), ("extend", 1)])  # (held by the script: 3 again)
    queue.append(0)
    model.order.append(0)
    queue.remove_cached(3)
    model.order.remove(3)
    assert queue.order() == model.order == [0] and len(queue) == 1
    assert queue.take(1) == [0]

    queue, model = FreeBlockQueue(range(6), compact_after=2), ListModel(6)
    run_script(queue, model, [("take", 6), ("extend", 6)] + [("take1",)] * 4)
    assert queue.entries() == 2  # [4, 5]: the 4 taken entries dropped
    run_script(queue, model, [("take1",), ("take1",)])


def test_an_empty_free_block_queue():
    queue = FreeBlockQueue([])
    assert (len(queue), queue.order(), queue.blank, queue.take(0)) == (0, [], 0, [])


def test_taking_more_blocks_than_the_queue_holds_names_both_counts():
    queue = FreeBlockQueue(range(4))
    queue.extend(queue.take(1))  # 3 blank blocks, 1 cached
    with pytest.raises(IndexError, match=r"^take\(5\) from a queue of 4 blocks$"):
        queue.take(5)


# ------------------------------------------------------------------------------------- grow_each


def ids(first: int, last: int):
    return token_ids(range(first, last + 1))


def paged_with_one_free_block():
    """Block size 4, 3 blocks: sequences 1 and 2 hold a full block each (4 tokens, final length 20)."""
    policy = make_policy("paged", PoolSpec(12, 4, 64))
    policy.admit(1, ((1, 4),), 20, output_content_id=91)
    policy.admit(2, ((2, 4),), 20, output_content_id=92)
    return policy


@pytest.mark.parametrize(
    ("seq_ids", "tokens", "message"),
    [
        (
            [1, 1],
            [1, 1],
            r"^grow_each needs distinct sequence ids, one token count each: \[1, 1\], \[1, 1\]$",
        ),
        ([1], [0], r"^sequence 1: cannot grow by 0 tokens$"),
        ([2], [17], r"^sequence 2: growing 4 by 17 tokens passes its final length 20$"),  # 21 > 20
    ],
)
def test_grow_each_refuses_bad_arguments_with_their_message(seq_ids, tokens, message):
    policy = paged_with_one_free_block()
    with pytest.raises(PolicyInputError, match=message):
        policy.grow_each(seq_ids, tokens)
    assert (policy.seq_len(1), policy.seq_len(2), len(policy.free_queue)) == (4, 4, 1)


@pytest.mark.parametrize(
    ("seq_ids", "tokens", "message", "needed"),
    [
        # Two sequences at a block boundary, one token each: a new block each, 2 > 1 free.
        ([1, 2], [1, 1], r"^growing sequences needs 2 free blocks, 1 available$", 2),
        # One sequence, 4 + 5 = 9 tokens: ceil(9 / 4) - 1 = 2 new blocks; the message names it.
        ([1], [5], r"^growing sequences 1 needs 2 free blocks, 1 available$", 2),
    ],
)
def test_grow_each_one_block_short_is_refused_whole(seq_ids, tokens, message, needed):
    policy = paged_with_one_free_block()
    with pytest.raises(OutOfKVMemory, match=message) as error:
        policy.grow_each(seq_ids, tokens)
    assert (error.value.needed_slots, error.value.free_slots) == (needed * 4, 4)
    assert (policy.seq_len(1), policy.seq_len(2), len(policy.free_queue)) == (4, 4, 1)
    assert policy.stats.allocation_failures == 1


def test_grow_each_that_needs_exactly_the_free_blocks_grows():
    # 4 + 4 = 8 tokens: exactly the 1 free block (block 2); room 8 - 8 = 0.
    policy = paged_with_one_free_block()
    assert policy.grow_each([1], [4]) == [0]
    assert policy.block_table(1) == [0, 2] and len(policy.free_queue) == 0
    # 4 blocks, 2 free: one token each takes the 2 (blocks 2 and 3); rooms 8 - 5 = 3.
    policy = make_policy("paged", PoolSpec(16, 4, 64))
    policy.admit(1, ((1, 4),), 20, output_content_id=91)
    policy.admit(2, ((2, 4),), 20, output_content_id=92)
    assert policy.grow_each([1, 2], [1, 1]) == [3, 3]
    assert (policy.block_table(1), policy.block_table(2)) == ([0, 2], [1, 3])


def test_lookahead_blocks_rooms_and_their_release():
    """Block size 4, 2 lookahead slots. Sequence 1: 5 tokens, final length 10 (its last token + 2);
    grown by 2 to 7 it holds 7 + 2 = 9 slots, 3 blocks (0, 1, then 3: 2 is sequence 2's), 12 slots
    past its final length: room 10 - 2 - 7 = 1. Freed, the lookahead block 3 goes to the head first,
    then its tail 1, then its full block 0; nothing it held keeps a reference."""
    policy = make_policy("paged", PoolSpec(40, 4, 64))
    policy.hold_lookahead(2)
    policy.admit(1, ((1, 5),), 10, output_content_id=91)
    policy.admit(2, ((2, 4),), 8, output_content_id=92)
    assert policy.grow_each([1], [2]) == [1]
    assert policy.growth_room(1) == 1 and policy.block_table(1) == [0, 1, 3]
    assert policy.sharing_slots() == (16, 16)  # 4 blocks
    policy.free(1)
    assert policy.free_queue.order() == [0, 1, 3, 4, 5, 6, 7, 8, 9]
    assert policy.ref_count == [0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    assert policy.sharing_slots() == (4, 4)  # sequence 2's one block
    assert policy.breakdown_values() == (4, 0, 0, 0, 0, 36)


def test_a_shared_tail_leaves_no_room_and_grow_each_copies_it():
    """Prefix caching, block size 4. A fork shares sequence 0's blocks [0, 1]; block 1 holds 2
    tokens: the next write copies it, so neither owner has room (else 8 - 6 = 2)."""
    policy = make_policy("prefix", PoolSpec(40, 4, 64))
    policy.admit(0, ids(1, 6), 20, output_content_id=500)
    policy.fork(0, [ChildSpec(1, 16, 501)])
    assert (policy.growth_room(0), policy.growth_room(1)) == (0, 0)
    # With 2 lookahead slots, one token each: sequence 0 copies block 1 into 2 and takes 3 for
    # 7 + 2 = 9 slots; sequence 1 then owns block 1 alone and takes 4. Rooms 12 - 2 - 7 = 3.
    policy = make_policy("prefix", PoolSpec(40, 4, 64))
    policy.hold_lookahead(2)
    policy.admit(0, ids(1, 6), 20, output_content_id=500)
    policy.fork(0, [ChildSpec(1, 16, 501)])
    assert policy.grow_each([0, 1], [1, 1]) == [3, 3]
    assert (policy.block_table(0), policy.block_table(1), policy.stats.cow_copies) == (
        [0, 2, 3],
        [0, 1, 4],
        1,
    )


def test_a_shared_full_tail_holds_no_lookahead_room():
    """8 tokens in 2 full blocks, shared with a fork: no copy is due (the tail is full), but no
    lookahead block is held yet: room 8 - 2 - 8 = -2 for each."""
    policy = make_policy("prefix", PoolSpec(40, 4, 64))
    policy.hold_lookahead(2)
    policy.admit(0, ids(1, 8), 20, output_content_id=500)
    policy.fork(0, [ChildSpec(1, 16, 501)])
    assert (policy.growth_room(0), policy.growth_room(1)) == (-2, -2)


# ------------------------------------------------------------------------------- capped admission


def test_capped_admission_reuses_whole_blocks_within_the_cap():
    """12 tokens cached in blocks of 4: a 12-token prompt may hit (12 - 1) // 4 = 2 blocks; a cap
    of 5 tokens allows 5 // 4 = 1 block (4 tokens), a cap of 3 none."""
    policy = make_policy("prefix", PoolSpec(40, 4, 64))
    policy.admit(1, ids(1, 12), 12, output_content_id=500)
    policy.free(1)
    assert policy.admit_capped(2, ids(1, 12), 16, 501, 0, 5) == 4
    assert policy.admit_capped(3, ids(1, 12), 16, 502, 0, 3) == 0
    assert policy.admit(4, ids(1, 12), 16, output_content_id=503) == 8


def test_capped_admission_check_counts_only_the_capped_hit():
    """4 blocks, sequence 1 holds 3 (12 tokens): 1 free. A 16-token prompt extending it hits 3
    blocks ((16 - 1) // 4) and needs 1 new one: it fits; capped at 8 tokens it hits 2, needs 2."""
    policy = make_policy("prefix", PoolSpec(16, 4, 64))
    policy.admit(1, ids(1, 12), 12, output_content_id=500)
    assert policy.can_admit(ids(1, 16), 16) and policy.can_admit_capped(ids(1, 16), 16, 0, 12)
    assert not policy.can_admit_capped(ids(1, 16), 16, 0, 8)


def test_lookahead_growth_needs_and_counts_by_hand():
    """Block size 4, 2 lookahead slots, 5 tokens in 2 blocks, final length 6. One more token wants
    6 + 2 = 8 slots: the 8 held, no new block (0 slots needed); the target stays the final length
    6 of the 8 slots: used 5 -> 6, reserved 1 -> 0, internal 2."""
    policy = make_policy("paged", PoolSpec(40, 4, 64))
    policy.hold_lookahead(2)
    policy.admit(1, ((1, 5),), 6, output_content_id=91)
    assert policy.slots_needed_to_grow(1, 1) == 0
    assert policy.breakdown_values() == (5, 1, 2, 0, 0, 32)
    policy.grow(1, 1)
    assert policy.block_table(1) == [0, 1] and policy.breakdown_values() == (6, 0, 2, 0, 0, 32)


def test_forks_add_up_their_copied_tokens_and_free_keeps_shared_blocks():
    policy = make_policy("paged", PoolSpec(40, 4, 64))
    policy.admit(0, ((1, 5),), 16, output_content_id=90)
    policy.fork(0, [ChildSpec(1, 16, 91)])
    policy.fork(0, [ChildSpec(2, 16, 92)])
    assert policy.stats.fork_copied_tokens == 5 + 5
    # Prefix caching: a fork shares block 0 (4 tokens, full), fills its own block 1, and ends:
    # block 1 goes back to the queue (9 of 10 free), block 0 stays with sequence 0.
    policy = make_policy("prefix", PoolSpec(40, 4, 64))
    policy.admit(0, ids(1, 4), 16, output_content_id=500)
    policy.fork(0, [ChildSpec(1, 16, 501)])
    policy.grow(1, 4)
    assert policy.block_table(1) == [0, 1]
    policy.free(1)
    assert len(policy.free_queue) == 9 and policy.ref_count[:2] == [1, 0]


def test_folding_output_extends_the_output_stream_or_starts_it():
    """A sequence's content is brought up to date with its pending output tokens: after the prompt
    (stream 6, 4 tokens, then stream 7, 5 tokens) 3 output tokens of stream 900 start a segment
    (ends 4, 9, 12); 2 more extend the last one in place (ends 4, 9, 14); with nothing pending,
    nothing changes."""
    from policies.paged import SequenceState

    seq = SequenceState(1, 9, 20, 900, segments=[(6, 4), (7, 5)], segment_ends=[4, 9])
    seq.fold_output()
    assert (seq.segments, seq.segment_ends) == ([(6, 4), (7, 5)], [4, 9])
    seq.output_pending = 3
    seq.fold_output()
    assert (seq.segments, seq.segment_ends, seq.output_pending) == ([(6, 4), (7, 5), (900, 3)], [4, 9, 12], 0)
    seq.output_pending = 2
    seq.fold_output()
    assert (seq.segments, seq.segment_ends, seq.output_pending) == ([(6, 4), (7, 5), (900, 5)], [4, 9, 14], 0)
    empty = SequenceState(2, 0, 4, 901)
    empty.output_pending = 4
    empty.fold_output()
    assert (empty.segments, empty.segment_ends) == ([(901, 4)], [4])
