"""The free block queue against a reference model: a list for the blank head, an ordered dict for
the cached tail (the structure it replaced), under random operations."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.paged import FreeBlockQueue

BLOCKS = 12

operation = st.tuples(
    st.sampled_from(["append", "extend", "appendleft", "hit", "take"]), st.integers(0, 10**6)
)


class Reference:
    def __init__(self) -> None:
        self.blank = list(range(BLOCKS))  # head first
        self.cached: OrderedDict[int, None] = OrderedDict()

    def order(self) -> list[int]:
        return self.blank + list(self.cached)

    def take(self, count: int) -> list[int]:
        taken = self.blank[:count]
        del self.blank[:count]
        while len(taken) < count:
            taken.append(self.cached.popitem(last=False)[0])
        return taken


@pytest.mark.parametrize("compact_after", [1, 3, 1024])
@settings(max_examples=150, deadline=None)
@given(operations=st.lists(operation, max_size=80))
def test_queue_matches_an_ordered_dict_reference(compact_after, operations):
    queue = FreeBlockQueue(
        range(BLOCKS), compact_after
    )  # small: the rebuild without stale entries runs often
    reference = Reference()
    held: list[int] = []  # taken blocks, not in the queue
    for kind, pick in operations:
        if kind == "take" and len(reference.order()):
            count = 1 + pick % len(reference.order())
            taken = queue.take(count)
            assert taken == reference.take(count)
            held += taken
        elif kind == "hit" and reference.cached:
            block = list(reference.cached)[pick % len(reference.cached)]
            queue.remove_cached(block)
            del reference.cached[block]
            held.append(block)
        elif kind in ("append", "appendleft") and held:
            block = held.pop(pick % len(held))
            if kind == "append":
                queue.append(block)
                reference.cached[block] = None
            else:
                queue.appendleft(block)
                reference.blank.insert(0, block)
        elif kind == "extend" and held:
            count = 1 + pick % len(held)
            blocks, held = held[:count], held[count:]
            queue.extend(blocks)
            reference.cached.update((block, None) for block in blocks)
        assert queue.order() == reference.order()
        assert len(queue) == len(reference.order())
        assert queue.blank == len(reference.blank)
        assert all(block in queue for block in reference.order())
        assert not any(block in queue for block in held)


def test_hits_without_evictions_do_not_grow_the_queue():
    """A block hit and freed again, over and over, with nothing ever evicted: stale entries are
    dropped once they outnumber the live ones, so memory stays bounded by the pool."""
    queue = FreeBlockQueue(range(4))
    queue.extend(queue.take(4))  # all four hold cached content
    for _ in range(10_000):
        queue.remove_cached(2)
        queue.append(2)
    assert queue.order() == [0, 1, 3, 2]
    assert queue.entries() <= 4 + max(FreeBlockQueue.COMPACT_AFTER, 4) + 1
