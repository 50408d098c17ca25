"""What SGLang's two radix caches over a full-attention pool and a second pool share: the SWA radix
cache (:mod:`policies._swa_radix_tree`, the second pool the sliding-window layers' slots) and the
Mamba radix cache (:mod:`policies._mamba_radix_tree`, the second pool the Mamba states). In both a
node always holds full-pool slots but may have lost its second-pool content (a *tombstone*), each pool
has its own LRU list, and evicting from the full pool deletes a leaf and then every tombstone
ancestor it leaves an unlocked leaf (``_iteratively_delete_tombstone_leaf`` in both of SGLang's
classes, ``python/sglang/srt/mem_cache/swa_radix_cache.py`` and ``mamba_radix_cache.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, Protocol, TypeVar

from policies._radix_tree import Key, RadixKeys


class TreeNode(Protocol):
    """What :class:`LRUList` needs of a node: its parent (None at the root)."""

    @property
    def parent(self) -> Any: ...


NodeT = TypeVar("NodeT", bound=TreeNode)


class LRUList(Generic[NodeT]):
    """SGLang's ``LRUList``: nodes from the most recently used (after :attr:`head`) to the least (before
    :attr:`tail`), scanned from the tail for the first node a test accepts. ``head`` and ``tail``: two
    sentinel nodes of the tree's kind (shared with the Mamba radix tree, :mod:`policies._mamba_radix_tree`)."""

    def __init__(self, head: NodeT, tail: NodeT) -> None:
        self.head = head
        self.tail = tail
        self._older: dict[NodeT, NodeT] = {self.head: self.tail}
        self._newer: dict[NodeT, NodeT] = {self.tail: self.head}

    def __contains__(self, node: NodeT) -> bool:
        return node in self._newer and node is not self.tail

    def __len__(self) -> int:
        return len(self._newer) - 1

    def insert_mru(self, node: NodeT) -> None:
        self._link_after(self.head, node)

    def reset_mru(self, node: NodeT) -> None:
        self.remove(node)
        self._link_after(self.head, node)

    def reset_path_mru(self, node: NodeT, root: NodeT, skip: Callable[[NodeT], bool]) -> None:
        """``node`` first, then each ancestor (but those ``skip`` names) just after its child."""
        anchor = self.head
        while node is not root:
            if not skip(node):
                self.remove(node)
                self._link_after(anchor, node)
                anchor = node
            assert node.parent is not None
            node = node.parent

    def remove(self, node: NodeT) -> None:
        newer, older = self._newer.pop(node), self._older.pop(node)
        self._older[newer] = older
        self._newer[older] = newer

    def least_recent(self, accept: Callable[[NodeT], bool]) -> NodeT | None:
        return self.next_newer(self.tail, accept)

    def next_newer(self, node: NodeT, accept: Callable[[NodeT], bool]) -> NodeT | None:
        """The first node more recently used than ``node`` that ``accept`` takes."""
        candidate = self._newer[node]
        while candidate is not self.head and not accept(candidate):
            candidate = self._newer[candidate]
        return None if candidate is self.head else candidate

    def _link_after(self, anchor: NodeT, node: NodeT) -> None:
        older = self._older[anchor]
        self._older[anchor], self._newer[node] = node, anchor
        self._older[node], self._newer[older] = older, node


class TwoPoolNode(Protocol):
    """What :class:`TwoPoolRadixTree` reads of a node."""

    key: Key
    length: int
    namespace: int
    children: dict[Hashable, Any]
    full_lock_ref: int

    @property
    def parent(self) -> Any: ...


TwoPoolNodeT = TypeVar("TwoPoolNodeT", bound=TwoPoolNode)


def full_evictable_leaf(node: TwoPoolNode) -> bool:
    return node.full_lock_ref == 0 and not node.children


class TwoPoolRadixTree(RadixKeys, Generic[TwoPoolNodeT]):
    """Full-pool eviction for a tree whose nodes may be tombstones. A subclass sets ``root``,
    ``full_lru`` and ``full_tokens`` and says what a node holds in the second pool."""

    root: TwoPoolNodeT
    full_lru: LRUList[TwoPoolNodeT]
    full_tokens: int
    full_locked: int  # full slots of nodes a lock holds
    full_shared: int  # full slots of nodes two or more locks hold (running requests share them)

    def _lock_full(self, node: TwoPoolNodeT) -> None:
        """One more lock on ``node``'s full slots (a split keeps both counts: its halves keep the locks)."""
        locks = node.full_lock_ref
        if locks == 0:
            self.full_locked += node.length
        elif locks == 1:
            self.full_shared += node.length
        node.full_lock_ref = locks + 1

    def _unlock_full(self, node: TwoPoolNodeT) -> None:
        locks = node.full_lock_ref - 1
        node.full_lock_ref = locks
        if locks == 0:
            self.full_locked -= node.length
        elif locks == 1:
            self.full_shared -= node.length

    def _is_tombstone(self, node: TwoPoolNodeT) -> bool:
        raise NotImplementedError

    def _second_pool_freed(self, leaf: TwoPoolNodeT) -> int:
        """What deleting ``leaf`` frees in the second pool, in the unit its ``evict`` counts."""
        raise NotImplementedError

    def _release_second_pool(self, node: TwoPoolNodeT) -> None:
        """Give back what a node being deleted holds in the second pool (nothing for a tombstone)."""
        raise NotImplementedError

    def _evict_full(self, wanted: int) -> tuple[int, int]:
        """``evict`` (full): unlocked leaves, least recently used first, until ``wanted`` full slots
        are freed. Returns the full slots and the second pool's units freed."""
        full_freed = second_freed = 0
        leaf = self.full_lru.least_recent(full_evictable_leaf) if wanted > 0 else None
        while leaf is not None and full_freed < wanted:
            following = self.full_lru.next_newer(leaf, full_evictable_leaf)
            second_freed += self._second_pool_freed(leaf)
            parent, freed = self._delete_leaf(leaf)
            full_freed += freed
            if not parent.children:  # a new leaf, maybe older than ``following``: scan again
                following = self.full_lru.least_recent(full_evictable_leaf)
            leaf = following
        return full_freed, second_freed

    def _delete_leaf(self, leaf: TwoPoolNodeT) -> tuple[TwoPoolNodeT, int]:
        """Delete an unlocked leaf, then every tombstone ancestor it leaves an unlocked leaf
        (``_iteratively_delete_tombstone_leaf``). Returns the first ancestor kept and the full
        slots freed."""
        assert leaf.full_lock_ref == 0 and not leaf.children
        freed = 0
        node = leaf
        while True:
            parent = node.parent
            assert parent is not None
            del parent.children[self.child_key(node.namespace, node.key)]
            self.full_lru.remove(node)
            self.full_tokens -= node.length
            freed += node.length
            self._release_second_pool(node)
            if (
                parent is self.root
                or parent.children
                or not self._is_tombstone(parent)
                or parent.full_lock_ref
            ):
                return parent, freed
            node = parent
