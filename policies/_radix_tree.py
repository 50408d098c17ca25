"""The radix tree behind the ``radix`` policy: SGLang's ``RadixCache`` over token content.

Checked against sgl-project/sglang ``python/sglang/srt/mem_cache/radix_cache.py`` (``TreeNode``,
``match_prefix`` / ``_match_prefix_helper``, ``_split_node``, ``insert`` / ``_insert_helper``,
``inc_lock_ref`` / ``dec_lock_ref``, ``evict``, ``_update_leaf_status``) and mini-sglang's
``python/minisgl/kvcache/radix_manager.py``; no code is copied.

A node's *key* is a run of tokens written as canonical pieces ``(stream id, first offset, end
offset)`` (token content is carried as segments, never one object per token): two runs hold the
same tokens exactly when their pieces are equal, and adjacent pieces of one key never continue each
other. The rules kept from SGLang:

- children are keyed by their first token (``page_size`` 1) or their first page, plus the
  namespace (SGLang's ``extra_key``), so namespaces never share a node;
- matching is token-granular, or page-granular: a match inside a node is floored to whole pages;
- a match or an insertion that ends inside a node *splits* it: the upper part becomes a new node
  with the same lock count; the original node keeps the lower part, its children and its lockers;
- every node a match or an insertion walks through is *touched* (its last access time refreshed);
  the simulator's clock is a counter, one tick per walk, so ties are broken by node id (older first);
- ``lock`` / ``unlock`` walk from a node to the root, counting locks (``lock_ref``); the root is
  always locked;
- eviction frees the least recently used *leaf* with no lock, then, when its parent becomes an
  unlocked leaf, considers the parent too, until enough tokens are freed. Whole nodes are evicted.

Token counts are kept incrementally: ``total_tokens`` (every node) and ``locked_tokens`` (nodes
with a lock); unlocked nodes are exactly the evictable cache, since a lock also locks every ancestor.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field

Piece = tuple[int, int, int]  # (stream id, first offset, end offset): tokens [first, end) of a stream
Key = tuple[Piece, ...]


def key_length(key: Key) -> int:
    return sum(end - start for _, start, end in key)


def split_key(key: Key, position: int) -> tuple[Key, Key]:
    """``key``'s first ``position`` tokens, and the rest."""
    if position <= 0:
        return (), key
    head: list[Piece] = []
    for index, (stream, start, end) in enumerate(key):
        length = end - start
        if position < length:
            head.append((stream, start, start + position))
            return tuple(head), ((stream, start + position, end), *key[index + 1 :])
        head.append((stream, start, end))
        position -= length
        if position == 0:
            return tuple(head), key[index + 1 :]
    return tuple(head), ()


def common_prefix_length(a: Key, b: Key) -> int:
    """Tokens two canonical keys share from their start."""
    shared = 0
    for (stream_a, start_a, end_a), (stream_b, start_b, end_b) in zip(a, b, strict=False):
        if stream_a != stream_b or start_a != start_b:
            break
        shared += min(end_a, end_b) - start_a
        if end_a != end_b:
            break  # the longer piece continues its stream; the shorter key's next piece cannot
    return shared


@dataclass(eq=False, slots=True)
class RadixNode:
    node_id: int
    key: Key
    length: int
    namespace: int
    parent: RadixNode | None
    children: dict[Hashable, RadixNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0


@dataclass(frozen=True)
class PrefixMatch:
    """What a side-effect-free walk found: matched tokens, and how many of them sit in unlocked
    nodes (they stop being evictable once a sequence locks the match)."""

    length: int
    unlocked_tokens: int


class RadixTree:
    """See the module docstring. Keys passed in must be whole pages long."""

    def __init__(self, page_size: int):
        self.page_size = page_size
        self.root = RadixNode(0, (), 0, 0, None, lock_ref=1)
        self.total_tokens = 0
        self.locked_tokens = 0
        self._next_node_id = 1
        self._clock = 0
        self._evictable_leaves: set[RadixNode] = set()
        # Lazy LRU heap of (last access, node id, node): an entry is stale once its node is no longer
        # an evictable leaf or was touched again since; stale entries are skipped when popped.
        self._lru_heap: list[tuple[int, int, RadixNode]] = []

    # ------------------------------------------------------------------------------------- queries
    def child_key(self, namespace: int, key: Key) -> Hashable:
        if self.page_size == 1:
            stream, start, _ = key[0]
            return (namespace, stream, start)
        return (namespace, split_key(key, self.page_size)[0])

    def longest_match(self, key: Key, namespace: int) -> PrefixMatch:
        """The longest cached prefix of ``key``, changing nothing (no split, no touch)."""
        node, rest = self.root, key
        matched = unlocked = 0
        while rest:
            child = node.children.get(self.child_key(namespace, rest))
            if child is None:
                break
            length = self._page_floor(common_prefix_length(child.key, rest))
            matched += length
            unlocked += length if child.lock_ref == 0 else 0
            if length < child.length:
                break
            node, rest = child, split_key(rest, length)[1]
        return PrefixMatch(matched, unlocked)

    def unlocked_tokens_above(self, node: RadixNode) -> int:
        """Tokens of the unlocked nodes on the path from the root to ``node``: what locking ``node``
        takes out of the evictable cache. (A lock locks every ancestor, so they are the path's lower
        end.)"""
        unlocked = 0
        while node is not self.root and node.lock_ref == 0:
            unlocked += node.length
            assert node.parent is not None
            node = node.parent
        return unlocked

    def nodes(self) -> Iterator[RadixNode]:
        """Every node but the root."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def evictable_leaves(self) -> set[RadixNode]:
        return set(self._evictable_leaves)

    # ---------------------------------------------------------------------------------- operations
    def match_prefix(self, key: Key, namespace: int) -> tuple[RadixNode, int]:
        """SGLang's ``match_prefix``: the node ending the longest cached prefix of ``key`` (split
        there if the match ends inside a node) and its length; touches the path."""
        node, matched, _ = self._walk(key, namespace)
        return node, matched

    def insert(self, key: Key, namespace: int) -> tuple[RadixNode, int]:
        """SGLang's ``insert``: make ``key`` a path of the tree. Returns the node ending it and the
        tokens that were already cached (the caller frees its own copies of those)."""
        node, matched, rest = self._walk(key, namespace)
        if rest:
            node = self._add_leaf(node, rest, namespace)
        return node, matched

    def lock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.locked_tokens += node.length
                self._evictable_leaves.discard(node)
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.locked_tokens -= node.length
                self._refresh_leaf_status(node)
            assert node.parent is not None
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` tokens of unlocked leaves, least recently used first (or
        every unlocked node, if that is less). Returns the tokens freed."""
        freed = 0
        while freed < num_tokens:
            leaf = self._pop_least_recent_leaf()
            if leaf is None:
                break
            freed += leaf.length
            self._delete_leaf(leaf)
        return freed

    # ------------------------------------------------------------------------------------ internals
    def _page_floor(self, tokens: int) -> int:
        return tokens - tokens % self.page_size

    def _walk(self, key: Key, namespace: int) -> tuple[RadixNode, int, Key]:
        """Follow ``key`` from the root, touching each node and splitting the last one if the match
        ends inside it. Returns the last node matched, the tokens matched and the unmatched rest."""
        self._clock += 1
        node, rest, matched = self.root, key, 0
        while rest:
            child = node.children.get(self.child_key(namespace, rest))
            if child is None:
                break
            self._touch(child)
            length = self._page_floor(common_prefix_length(child.key, rest))
            rest = split_key(rest, length)[1]
            matched += length
            if length < child.length:
                return self._split(child, length), matched, rest
            node = child
        return node, matched, rest

    def _split(self, node: RadixNode, length: int) -> RadixNode:
        """Cut ``node`` after ``length`` tokens: a new upper node takes the head, ``node`` keeps the
        tail (with its children and lockers). Returns the upper node."""
        parent = node.parent
        assert parent is not None and 0 < length < node.length
        head, tail = split_key(node.key, length)
        upper = RadixNode(
            self._next_node_id, head, length, node.namespace, parent,
            lock_ref=node.lock_ref, last_access=node.last_access,
        )  # fmt: skip
        self._next_node_id += 1
        parent.children[self.child_key(node.namespace, head)] = upper
        node.key, node.length, node.parent = tail, node.length - length, upper
        upper.children[self.child_key(node.namespace, tail)] = node
        return upper

    def _add_leaf(self, parent: RadixNode, key: Key, namespace: int) -> RadixNode:
        leaf = RadixNode(self._next_node_id, key, key_length(key), namespace, parent, last_access=self._clock)
        self._next_node_id += 1
        parent.children[self.child_key(namespace, key)] = leaf
        self.total_tokens += leaf.length
        self._refresh_leaf_status(parent)
        self._refresh_leaf_status(leaf)
        return leaf

    def _delete_leaf(self, leaf: RadixNode) -> None:
        parent = leaf.parent
        assert parent is not None
        del parent.children[self.child_key(leaf.namespace, leaf.key)]
        leaf.parent = None
        self.total_tokens -= leaf.length
        self._evictable_leaves.discard(leaf)
        self._refresh_leaf_status(parent)

    def _touch(self, node: RadixNode) -> None:
        node.last_access = self._clock
        if node in self._evictable_leaves:
            self._push(node)

    def _refresh_leaf_status(self, node: RadixNode) -> None:
        """SGLang's ``_update_leaf_status``: an unlocked node without children may be evicted."""
        if node is self.root or node.lock_ref > 0 or node.children:
            self._evictable_leaves.discard(node)
        elif node not in self._evictable_leaves:
            self._evictable_leaves.add(node)
            self._push(node)

    def _push(self, node: RadixNode) -> None:
        heapq.heappush(self._lru_heap, (node.last_access, node.node_id, node))
        if len(self._lru_heap) > 4 * len(self._evictable_leaves) + 1024:
            # Drop stale entries so the heap stays proportional to the evictable leaves.
            self._lru_heap = [(leaf.last_access, leaf.node_id, leaf) for leaf in self._evictable_leaves]
            heapq.heapify(self._lru_heap)

    def _pop_least_recent_leaf(self) -> RadixNode | None:
        while self._lru_heap:
            last_access, _, node = heapq.heappop(self._lru_heap)
            if node in self._evictable_leaves and node.last_access == last_access:
                return node
        return None
