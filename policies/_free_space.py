"""Free-space managers for :mod:`policies.contiguous` (private).

Two managers share one small interface (:class:`FreeSpace`):

* :class:`HoleSpace`: a linear address space of free *holes* (maximal free intervals), with
  first-fit or best-fit placement and coalescing of neighbours on release;
* :class:`BuddySpace`: a binary buddy allocator (power-of-two chunks, splitting and merging).

Both answer ``free_below(threshold)``: the free slots lying in pieces (holes, or free chunks) too
small for a request of ``threshold`` slots. The contiguous policy reports that as external
fragmentation.
"""

from __future__ import annotations

import heapq
import random
from abc import ABC, abstractmethod

# --------------------------------------------------------------------------------------------------
# An augmented treap (randomised balanced binary search tree)
# --------------------------------------------------------------------------------------------------


class _Node:
    __slots__ = ("key", "value", "priority", "left", "right", "max_value", "sum_value")

    def __init__(self, key: int, value: int, priority: float):
        self.key = key
        self.value = value
        self.priority = priority
        self.left: _Node | None = None
        self.right: _Node | None = None
        # Subtree aggregates: they let one root-to-leaf walk answer "leftmost hole of at least k
        # slots" (first fit) and "slots in holes smaller than k" (external fragmentation).
        self.max_value = value
        self.sum_value = value


def _pull(node: _Node) -> None:
    """Recompute ``node``'s aggregates from its children (which must already be correct)."""
    # (Comparisons, not max(): this runs at every level of every insert and remove.)
    max_value = sum_value = node.value
    left, right = node.left, node.right
    if left is not None:
        if left.max_value > max_value:
            max_value = left.max_value
        sum_value += left.sum_value
    if right is not None:
        if right.max_value > max_value:
            max_value = right.max_value
        sum_value += right.sum_value
    node.max_value = max_value
    node.sum_value = sum_value


def _split(node: _Node | None, key: int) -> tuple[_Node | None, _Node | None]:
    """Split into (keys < key, keys >= key)."""
    if node is None:
        return None, None
    if node.key < key:
        below, above = _split(node.right, key)
        node.right = below
        _pull(node)
        return node, above
    below, above = _split(node.left, key)
    node.left = above
    _pull(node)
    return below, node


def _merge(low: _Node | None, high: _Node | None) -> _Node | None:
    """Join two treaps where every key of ``low`` is below every key of ``high``."""
    if low is None:
        return high
    if high is None:
        return low
    if low.priority > high.priority:
        low.right = _merge(low.right, high)
        _pull(low)
        return low
    high.left = _merge(low, high.left)
    _pull(high)
    return high


def _insert(node: _Node | None, new: _Node) -> _Node:
    if node is None:
        return new
    if new.priority > node.priority:
        new.left, new.right = _split(node, new.key)
        _pull(new)
        return new
    if new.key < node.key:
        node.left = _insert(node.left, new)
    else:
        node.right = _insert(node.right, new)
    _pull(node)
    return node


def _remove(node: _Node | None, key: int) -> _Node | None:
    if node is None:
        raise KeyError(key)
    if key == node.key:
        return _merge(node.left, node.right)
    if key < node.key:
        node.left = _remove(node.left, key)
    else:
        node.right = _remove(node.right, key)
    _pull(node)
    return node


class Treap:
    """Ordered map ``int key -> int value`` with O(log n) expected insert, remove and the three
    aggregate queries the allocators need. Keys are unique."""

    def __init__(self, seed: int = 0):
        # A private, seeded generator: the tree's shape never changes results, but a fixed seed
        # keeps runs bit-for-bit reproducible, including their timing profile.
        self._random = random.Random(seed)
        self._root: _Node | None = None
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def insert(self, key: int, value: int) -> None:
        self._root = _insert(self._root, _Node(key, value, self._random.random()))
        self._len += 1

    def remove(self, key: int) -> None:
        self._root = _remove(self._root, key)
        self._len -= 1

    def leftmost_with_value_at_least(self, threshold: int) -> tuple[int, int] | None:
        """The smallest key whose value is >= ``threshold`` (first fit, when value = hole size)."""
        node = self._root
        if node is None or node.max_value < threshold:
            return None
        while True:
            left = node.left
            if left is not None and left.max_value >= threshold:
                node = left
            elif node.value >= threshold:
                return node.key, node.value
            else:
                # The root check guarantees the right subtree holds a large enough value.
                assert node.right is not None
                node = node.right

    def ceiling(self, key: int) -> tuple[int, int] | None:
        """The entry with the smallest key >= ``key``."""
        node, best = self._root, None
        while node is not None:
            if node.key >= key:
                best = node
                node = node.left
            else:
                node = node.right
        return None if best is None else (best.key, best.value)

    def sum_values_below(self, key: int) -> int:
        """Sum of the values of every entry with a key < ``key``."""
        node, total = self._root, 0
        while node is not None:
            if node.key < key:
                total += node.value
                if node.left is not None:
                    total += node.left.sum_value
                node = node.right
            else:
                node = node.left
        return total

    def items(self) -> list[tuple[int, int]]:
        """Every entry in key order (O(n); for tests and debugging)."""
        out: list[tuple[int, int]] = []
        stack: list[_Node] = []
        node = self._root
        while stack or node is not None:
            while node is not None:
                stack.append(node)
                node = node.left
            node = stack.pop()
            out.append((node.key, node.value))
            node = node.right
        return out


# --------------------------------------------------------------------------------------------------
# The managers
# --------------------------------------------------------------------------------------------------


class FreeSpace(ABC):
    """Free slots of an address space ``[0, capacity)``."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.free_slots = capacity

    @abstractmethod
    def region_size(self, request: int) -> int:
        """Slots a region holding ``request`` slots really occupies (the buddy rounds up)."""

    @abstractmethod
    def find(self, size: int) -> int | None:
        """Start of the region :meth:`allocate` would return for ``size`` slots; no side effects.
        ``size`` must be a :meth:`region_size` result."""

    @abstractmethod
    def allocate(self, size: int) -> int | None:
        """Carve a region of ``size`` slots; its start, or ``None`` (nothing changed) if no piece
        fits. ``size`` must be a :meth:`region_size` result."""

    @abstractmethod
    def release(self, start: int, size: int) -> None:
        """Give back a region returned by :meth:`allocate`, merging it with free neighbours."""

    @abstractmethod
    def free_below(self, threshold: int) -> int:
        """Free slots in pieces (holes, chunks) of fewer than ``threshold`` slots."""

    @abstractmethod
    def pieces(self) -> list[tuple[int, int]]:
        """Free pieces as ``(start, size)`` in address order (O(n); for tests and debugging)."""


class HoleSpace(FreeSpace):
    """Holes in a linear address space; first-fit or best-fit; O(log holes) per operation.

    * ``_start_of_end`` / ``_size_of_start``: dicts that find the holes touching a released region
      in O(1), so coalescing needs no search;
    * ``_by_size``: treap keyed by (size, start), packed into one int ``size * stride + start``
      (``stride`` > every start, so int order is (size, start) order). Its ceiling is best fit
      (smallest hole, lowest address on ties) and its prefix sum is :meth:`free_below`;
    * ``_by_address``: treap keyed by start, augmented with the subtree's largest hole, whose
      leftmost-fitting walk is first fit. Only kept for first fit.

    A region is always carved from the low end of its hole.
    """

    def __init__(self, capacity: int, best_fit: bool):
        super().__init__(capacity)
        self.best_fit = best_fit
        self._stride = capacity + 1
        self._size_of_start: dict[int, int] = {}
        self._start_of_end: dict[int, int] = {}
        self._by_size = Treap(seed=1)
        self._by_address: Treap | None = None if best_fit else Treap(seed=2)
        self._add_hole(0, capacity)

    def _add_hole(self, start: int, size: int) -> None:
        self._size_of_start[start] = size
        self._start_of_end[start + size] = start
        self._by_size.insert(size * self._stride + start, size)
        if self._by_address is not None:
            self._by_address.insert(start, size)

    def _remove_hole(self, start: int) -> int:
        size = self._size_of_start.pop(start)
        del self._start_of_end[start + size]
        self._by_size.remove(size * self._stride + start)
        if self._by_address is not None:
            self._by_address.remove(start)
        return size

    def region_size(self, request: int) -> int:
        return request

    def find(self, size: int) -> int | None:
        if self._by_address is not None:
            hit = self._by_address.leftmost_with_value_at_least(size)
            return None if hit is None else hit[0]
        hit = self._by_size.ceiling(size * self._stride)
        return None if hit is None else hit[0] % self._stride

    def allocate(self, size: int) -> int | None:
        start = self.find(size)
        if start is None:
            return None
        hole = self._remove_hole(start)
        if hole > size:
            self._add_hole(start + size, hole - size)
        self.free_slots -= size
        return start

    def release(self, start: int, size: int) -> None:
        end = start + size
        # Coalesce: holes are kept maximal, so at most one hole ends where the region starts and
        # at most one starts where it ends.
        before = self._start_of_end.get(start)
        if before is not None:
            self._remove_hole(before)
            start = before
        if end in self._size_of_start:
            end += self._remove_hole(end)
        self._add_hole(start, end - start)
        self.free_slots += size

    def free_below(self, threshold: int) -> int:
        return self._by_size.sum_values_below(threshold * self._stride)

    def pieces(self) -> list[tuple[int, int]]:
        return sorted(self._size_of_start.items())


def ceil_pow2(n: int) -> int:
    """Smallest power of two >= ``n`` (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


class BuddySpace(FreeSpace):
    """Binary buddy allocator over ``[0, capacity)``.

    A pool that is not a power of two is covered by maximal aligned power-of-two *top-level*
    chunks (100 slots: 64 @0, 32 @64, 4 @96). A chunk of ``2**k`` slots at ``a`` has its buddy at
    ``a ^ 2**k``; the two merge into the ``2**(k+1)`` chunk at ``a & ~(2**(k+1) - 1)`` when that
    chunk lies inside the pool: with the top-level cover above, an aligned chunk lies inside the
    pool exactly when it lies inside one top-level chunk, so merging never crosses top-level
    boundaries.

    Per order ``k``: a set of free chunk starts (membership for merging, counts for
    :meth:`free_below`) and a min-heap of starts with lazy deletion (lowest-address chunk for
    allocation). Allocation takes the lowest-address free chunk of the smallest sufficient order
    and splits it, keeping the low halves. Every operation is O(log capacity) amortised.
    """

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.max_order = capacity.bit_length() - 1
        self._free: list[set[int]] = [set() for _ in range(self.max_order + 1)]
        self._heaps: list[list[int]] = [[] for _ in range(self.max_order + 1)]
        self.top_level: list[tuple[int, int]] = []
        start = 0
        while start < capacity:
            order = (capacity - start).bit_length() - 1
            # Alignment: a chunk of 2**order must start at a multiple of 2**order.
            while start % (1 << order):
                order -= 1
            self.top_level.append((start, 1 << order))
            self._push(start, order)
            start += 1 << order

    def _push(self, start: int, order: int) -> None:
        self._free[order].add(start)
        heap = self._heaps[order]
        heapq.heappush(heap, start)
        # Stale entries (chunks merged away) are skipped on pop; rebuild before they pile up.
        if len(heap) > 2 * len(self._free[order]) + 16:
            self._heaps[order] = sorted(self._free[order])

    def _lowest(self, order: int) -> int:
        """Lowest free chunk start of ``order`` (which must have one); drops stale heap tops."""
        heap, free = self._heaps[order], self._free[order]
        while heap[0] not in free:
            heapq.heappop(heap)
        return heap[0]

    def region_size(self, request: int) -> int:
        return ceil_pow2(request)

    def _first_order(self, size: int) -> int | None:
        for order in range(size.bit_length() - 1, self.max_order + 1):
            if self._free[order]:
                return order
        return None

    def find(self, size: int) -> int | None:
        order = self._first_order(size)
        return None if order is None else self._lowest(order)

    def allocate(self, size: int) -> int | None:
        order = self._first_order(size)
        if order is None:
            return None
        start = self._lowest(order)
        self._free[order].remove(start)
        # Split down to the wanted size, freeing each upper half.
        while (1 << order) > size:
            order -= 1
            self._push(start + (1 << order), order)
        self.free_slots -= size
        return start

    def release(self, start: int, size: int) -> None:
        self.free_slots += size
        order = size.bit_length() - 1
        while order < self.max_order:
            parent = start & ~((2 << order) - 1)
            buddy = start ^ (1 << order)
            if parent + (2 << order) > self.capacity or buddy not in self._free[order]:
                break
            self._free[order].remove(buddy)
            start, order = parent, order + 1
        self._push(start, order)

    def free_below(self, threshold: int) -> int:
        if threshold <= 1:
            return 0
        # 2**order < threshold  <=>  order < bit_length(threshold - 1)
        top = min(self.max_order + 1, (threshold - 1).bit_length())
        free = self._free
        return sum(len(free[order]) << order for order in range(top))

    def pieces(self) -> list[tuple[int, int]]:
        return sorted((start, 1 << order) for order, starts in enumerate(self._free) for start in starts)
