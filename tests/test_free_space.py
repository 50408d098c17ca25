"""The contiguous policy's free-space structures against brute-force references.

Each structure replays a fixed pseudo-random sequence of operations (a seeded ``random.Random``:
the same sequence every run) and is compared after every operation with a plain Python model that
computes the same answers by scanning everything: an ordered map for the treap, a sorted list of
holes for first and best fit, an occupancy map and the buddy rules for the buddy allocator.
"""

from __future__ import annotations

import random

import pytest

from policies._free_space import BuddySpace, HoleSpace, Treap, ceil_pow2

# ------------------------------------------------------------------------------------------- treap


def check_treap(treap: Treap, model: dict[int, int]) -> None:
    entries = sorted(model.items())
    assert treap.items() == entries
    assert len(treap) == len(model)
    values = sorted(set(model.values()))
    keys = sorted(model)
    for threshold in [0, 1, *values, *(v + 1 for v in values)]:
        fitting = [(k, v) for k, v in entries if v >= threshold]
        assert treap.leftmost_with_value_at_least(threshold) == (fitting[0] if fitting else None)
    for key in [-1, 0, *keys, *(k + 1 for k in keys), 10**6]:
        above = [(k, v) for k, v in entries if k >= key]
        assert treap.ceiling(key) == (above[0] if above else None)
        assert treap.sum_values_below(key) == sum(v for k, v in entries if k < key)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_treap_matches_an_ordered_map(seed):
    rng = random.Random(100 + seed)
    treap, model = Treap(seed=seed), {}
    check_treap(treap, model)
    for _ in range(300):
        if model and rng.random() < 0.4:
            key = rng.choice(sorted(model))
            treap.remove(key)
            del model[key]
        else:
            key = rng.randrange(1000)
            if key in model:
                continue
            value = rng.randrange(1, 50)
            treap.insert(key, value)
            model[key] = value
        check_treap(treap, model)
    with pytest.raises(KeyError) as error:
        treap.remove(5000)
    assert error.value.args == (5000,)


# ----------------------------------------------------------------------------------- first/best fit


class HoleModel:
    """Holes as a sorted list of (start, size); regions carved from the low end of a hole."""

    def __init__(self, capacity: int, best_fit: bool):
        self.holes = [(0, capacity)]
        self.best_fit = best_fit

    def find(self, size: int) -> int | None:
        fitting = [(s, n) for s, n in self.holes if n >= size]
        if not fitting:
            return None
        if self.best_fit:
            return min(fitting, key=lambda hole: (hole[1], hole[0]))[0]
        return fitting[0][0]

    def allocate(self, size: int) -> int | None:
        start = self.find(size)
        if start is None:
            return None
        hole = dict(self.holes)[start]
        self.holes.remove((start, hole))
        if hole > size:
            self.holes.append((start + size, hole - size))
        self.holes.sort()
        return start

    def release(self, start: int, size: int) -> None:
        self.holes.append((start, size))
        self.holes.sort()
        merged = [self.holes[0]]
        for s, n in self.holes[1:]:
            last_start, last_size = merged[-1]
            if last_start + last_size == s:
                merged[-1] = (last_start, last_size + n)
            else:
                merged.append((s, n))
        self.holes = merged


@pytest.mark.parametrize("best_fit", [False, True])
@pytest.mark.parametrize("capacity", [200, 211])
def test_holes_match_a_sorted_list(best_fit, capacity):
    rng = random.Random(capacity + best_fit)
    space, model = HoleSpace(capacity, best_fit), HoleModel(capacity, best_fit)
    regions: list[tuple[int, int]] = []
    for _ in range(400):
        if regions and rng.random() < 0.45:
            start, size = regions.pop(rng.randrange(len(regions)))
            space.release(start, size)
            model.release(start, size)
        else:
            size = rng.randrange(1, 30)
            assert space.find(size) == model.find(size)
            start = space.allocate(size)
            assert start == model.allocate(size)
            if start is not None:
                regions.append((start, size))
        assert space.pieces() == model.holes
        assert space.free_slots == capacity - sum(size for _, size in regions)
        for threshold in (1, 2, 5, 16, 17, 29, 30, capacity, capacity + 1):
            assert space.free_below(threshold) == sum(n for _, n in model.holes if n < threshold)


# ------------------------------------------------------------------------------------------- buddy


def test_ceil_pow2_by_hand():
    assert [ceil_pow2(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 100)] == [1, 1, 2, 4, 4, 8, 8, 16, 128]


@pytest.mark.parametrize(
    ("capacity", "top_level"),
    [
        (100, [(0, 64), (64, 32), (96, 4)]),
        (96, [(0, 64), (64, 32)]),
        (64, [(0, 64)]),
        (7, [(0, 4), (4, 2), (6, 1)]),
    ],
)
def test_buddy_top_level_chunks(capacity, top_level):
    space = BuddySpace(capacity)
    assert space.top_level == top_level
    assert space.pieces() == top_level
    assert space.free_below(10**6) == capacity


def check_buddy(space: BuddySpace, capacity: int, allocated: dict[int, int]) -> None:
    """The free chunks are aligned powers of two inside one top-level chunk, cover exactly the slots
    no region holds, and no two free buddies are left unmerged."""
    pieces = space.pieces()
    occupied = [False] * capacity
    for start, size in allocated.items():
        for slot in range(start, start + size):
            assert not occupied[slot]
            occupied[slot] = True
    free_slots = [slot for slot in range(capacity) if not occupied[slot]]
    covered = sorted(slot for start, size in pieces for slot in range(start, start + size))
    assert covered == free_slots
    assert space.free_slots == len(free_slots)
    tops = space.top_level
    free = set(pieces)
    for start, size in pieces:
        assert size & (size - 1) == 0 and start % size == 0
        assert any(t <= start and start + size <= t + n for t, n in tops)
        buddy, parent = start ^ size, start & ~(2 * size - 1)
        inside = any(t <= parent and parent + 2 * size <= t + n for t, n in tops)
        assert not (inside and (buddy, size) in free), f"free buddies {start} and {buddy} of {size}"
    for threshold in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64, 65, 10**6):
        assert space.free_below(threshold) == sum(size for _, size in pieces if size < threshold)


@pytest.mark.parametrize("capacity", [64, 100, 7])
def test_buddy_matches_the_buddy_rules(capacity):
    rng = random.Random(capacity)
    space = BuddySpace(capacity)
    allocated: dict[int, int] = {}
    for _ in range(400):
        if allocated and rng.random() < 0.45:
            start = rng.choice(sorted(allocated))
            space.release(start, allocated.pop(start))
        else:
            request = rng.randrange(1, max(2, capacity // 3))
            size = space.region_size(request)
            assert size == ceil_pow2(request)
            # Lowest-address free chunk of the smallest order that holds it; its low end is used.
            fitting = [(n, s) for s, n in space.pieces() if n >= size]
            expected = min(fitting)[1] if fitting else None
            assert space.find(size) == expected
            start = space.allocate(size)
            assert start == expected
            if start is not None:
                allocated[start] = size
        check_buddy(space, capacity, allocated)
