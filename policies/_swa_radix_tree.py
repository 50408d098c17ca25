"""SGLang's ``SWARadixCache`` tree: a radix tree over token content whose nodes hold a slot per token in
the full-attention pool and, unless *tombstoned*, one in the sliding-window (SWA) pool.

Read at sgl-project/sglang commit 019cfc0f9617007e17cbb0bcff2545ce3e0aea45,
``python/sglang/srt/mem_cache/swa_radix_cache.py`` (``TreeNode``, ``LRUList``, ``match_prefix`` /
``_match_prefix_helper``, ``_split_node``, ``insert`` / ``_insert_helper``, ``evict``,
``inc_lock_ref`` / ``dec_lock_ref``, ``_iteratively_delete_tombstone_leaf``); no code is copied. The
keys are the ``radix`` policy's (:class:`~policies._radix_tree.RadixKeys`: canonical pieces of token
content, children keyed by first token or page and namespace, matches floored to pages). What the
SWA tree adds, as SGLang runs it:

- **Tombstones.** A node's SWA slots may be freed while its full slots stay (``swa_tombstone``): the
  full-attention layers still hold those tokens, the sliding-window layers do not. A leaf is never a
  tombstone (one left without children is deleted).
- **The match** (``_match_prefix_helper``) is the longest prefix whose last ``window`` tokens all
  have SWA slots, or whose path from the root has no tombstone: walking down, a tombstone ends the
  run counted since the last one, and the match may end only where that run is ``window`` tokens or
  more (or where no tombstone was passed). A match inside a node splits it.
- **Two LRU lists**, every node in the full one, every node that is no tombstone in the SWA one;
  the most recently used first. An insertion refreshes each node it walks, root side first (the
  leaf ends most recent); a match refreshes the matched node and its ancestors, each ancestor just
  older than its child (``reset_node_and_parents_mru``), so eviction reaches nodes nearer the root
  first; a split puts both halves first, the lower one most recent.
- **Locks** (``inc_lock_ref``): locking a node locks every ancestor's full slots, and the SWA slots
  of the nodes from it upward until ``window`` tokens are covered; the node where that happens gets
  an id (``swa_uuid``), handed back with the lock so that unlocking (``dec_lock_ref``) stops there.
  A split gives the id to the upper half. The root is always locked.
- **Insertion** (``_insert_helper``) of a sequence whose first ``prev_prefix_len`` tokens are its
  locked path and whose SWA slots before ``swa_evicted`` it has freed: a tombstone on the path past
  ``prev_prefix_len`` takes the sequence's SWA slots back where it still holds them (whole, or its
  part from ``swa_evicted`` on, split there); new tokens become a tombstone up to ``swa_evicted``
  and a leaf after. Tokens the tree already held are the sequence's duplicates, which it frees
  (the caller's accounting: this tree counts only its own slots).
- **Eviction** (``evict(full, swa)``): for the full pool, unlocked leaves, least recently used first,
  each freeing its slots in both pools, and then any tombstone parent left a leaf; then, if the SWA
  pool still needs more, the SWA list's least recently used nodes without an SWA lock: an internal
  node (or a leaf still locked in full) is tombstoned (its SWA slots freed, its full slots kept), a
  leaf is deleted.

Counted as SGLang counts them (``full_evictable_size`` / ``swa_evictable_size``, ``*_protected_size``):
``full_tokens`` / ``swa_tokens`` the tree's slots in each pool, ``full_locked`` / ``swa_locked`` those
a lock holds; the rest is evictable. Left out: HiCache (host copies), EAGLE's bigram keys, the
compaction of single-child chains and the leaf split on insertion (both off by default there), the
early release of a decoding request's SWA lock (``dec_swa_lock_only``), KV events and metrics.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from policies._radix_tree import Key, key_length, split_key
from policies._two_pool_radix_tree import LRUList, TwoPoolRadixTree

NO_UUID = 0  # (SGLang's ``swa_uuid = None``)


@dataclass(eq=False, slots=True, init=False)
class SWANode:
    node_id: int
    key: Key
    length: int
    namespace: int
    parent: SWANode | None
    children: dict[Hashable, SWANode]
    full_lock_ref: int
    swa_lock_ref: int
    swa_tombstone: bool
    swa_uuid: int

    # (The constructor is written out: compiled, it runs natively, where a dataclass's generated one
    # stays interpreted; a node is built per insertion and split.)
    def __init__(
        self,
        node_id: int,
        key: Key,
        length: int,
        namespace: int,
        parent: SWANode | None,
        full_lock_ref: int = 0,
        swa_lock_ref: int = 0,
        swa_tombstone: bool = False,
        swa_uuid: int = NO_UUID,
    ) -> None:
        self.node_id = node_id
        self.key = key
        self.length = length
        self.namespace = namespace
        self.parent = parent
        self.children = {}
        self.full_lock_ref = full_lock_ref
        self.swa_lock_ref = swa_lock_ref
        self.swa_tombstone = swa_tombstone
        self.swa_uuid = swa_uuid


@dataclass(frozen=True, init=False)
class SWAMatch:
    """What a side-effect-free match found: the tokens served, and what locking its node would take
    out of each pool's evictable cache (its path's full slots and its window's SWA slots no lock
    holds yet). (Its constructor is written out, as :class:`SWANode`'s: one is built per match.)"""

    length: int
    full_unlocked: int
    swa_unlocked: int

    def __init__(self, length: int, full_unlocked: int = 0, swa_unlocked: int = 0) -> None:
        setattr_ = object.__setattr__
        setattr_(self, "length", length)
        setattr_(self, "full_unlocked", full_unlocked)
        setattr_(self, "swa_unlocked", swa_unlocked)


def _swa_unlocked(node: SWANode) -> bool:
    return node.swa_lock_ref == 0


def _is_tombstone(node: SWANode) -> bool:
    return node.swa_tombstone


class SWARadixTree(TwoPoolRadixTree[SWANode]):
    """See the module docstring. ``window``: the sliding window, in tokens. Keys passed in must be whole
    pages long."""

    def __init__(self, page_size: int, window: int):
        super().__init__(page_size)
        self.window = window
        self.root = SWANode(0, (), 0, 0, None, full_lock_ref=1, swa_lock_ref=1)
        self.full_lru: LRUList[SWANode] = LRUList(SWANode(-1, (), 0, 0, None), SWANode(-2, (), 0, 0, None))
        self.swa_lru: LRUList[SWANode] = LRUList(SWANode(-1, (), 0, 0, None), SWANode(-2, (), 0, 0, None))
        self.full_tokens = 0
        self.swa_tokens = 0
        self.full_locked = 0
        self.full_shared = 0
        self.swa_locked = 0
        self._next_node_id = 1
        self._next_uuid = NO_UUID + 1

    @property
    def full_evictable(self) -> int:
        return self.full_tokens - self.full_locked

    @property
    def swa_evictable(self) -> int:
        return self.swa_tokens - self.swa_locked

    # ------------------------------------------------------------------------------------- matching
    def longest_match(self, key: Key, namespace: int) -> SWAMatch:
        """The match :meth:`match_prefix` would find, changing nothing."""
        path, served = self._match_path(key, namespace, split=False)
        held = path[:served]
        full_unlocked = sum(tokens for node, tokens in held if node.full_lock_ref == 0)
        swa_unlocked = covered = 0
        for node, tokens in reversed(held):  # (the window's nodes, as a lock walks them)
            if covered >= self.window:
                break
            if node.swa_lock_ref == 0:
                swa_unlocked += tokens
            covered += tokens
        return SWAMatch(sum(tokens for _, tokens in held), full_unlocked, swa_unlocked)

    def match_prefix(self, key: Key, namespace: int) -> tuple[SWANode, int]:
        """SGLang's ``match_prefix``: the node ending the longest prefix served (a node the match ends
        inside is split) and its length; refreshes that node and its ancestors in both lists."""
        path, served = self._match_path(key, namespace, split=True)
        node = path[served - 1][0] if served else self.root
        self.full_lru.reset_path_mru(node, self.root, lambda _: False)
        self.swa_lru.reset_path_mru(node, self.root, _is_tombstone)
        return node, sum(tokens for _, tokens in path[:served])

    def _match_path(self, key: Key, namespace: int, split: bool) -> tuple[list[tuple[SWANode, int]], int]:
        """The nodes ``key`` walks through with the tokens it matches in each, and how many of them
        the match keeps (the window rule). Splits the last node if ``split`` and the match ends in it."""
        path: list[tuple[SWANode, int]] = []
        node, rest = self.root, key
        passed_tombstone = False  # (none passed: any length serves, SGLang's run of ``inf``)
        run = served = 0  # tokens with SWA slots since the last tombstone; path entries served
        while rest:
            child = node.children.get(self.child_key(namespace, rest))
            if child is None:
                break
            if child.swa_tombstone:
                if not passed_tombstone or run >= self.window:
                    served = len(path)
                passed_tombstone, run = True, 0
            length = self.matched_length(child.key, rest)
            partial = length < child.length
            if partial and split:
                child = self._split(child, length)
            path.append((child, length))
            if not child.swa_tombstone:
                run += length
            if partial:
                break
            node, rest = child, split_key(rest, length)[1]
        if not passed_tombstone or run >= self.window:
            served = len(path)
        return path, served

    def unlocked_by_lock(self, node: SWANode) -> tuple[int, int]:
        """What locking ``node`` would take out of each pool's evictable cache: its path's full slots
        and its window's SWA slots that no lock holds yet."""
        full = swa = covered = 0
        while node is not self.root:
            if node.full_lock_ref == 0:
                full += node.length
            if covered < self.window:
                if node.swa_lock_ref == 0:
                    swa += node.length
                covered += node.length
            assert node.parent is not None
            node = node.parent
        return full, swa

    # ------------------------------------------------------------------------------------- locking
    def lock(self, node: SWANode) -> tuple[int, int]:
        """``inc_lock_ref``: returns the SWA lock's id (:data:`NO_UUID` when it reaches the root) and
        the SWA tokens it covers."""
        covered, uuid = 0, NO_UUID
        while node is not self.root:
            self._lock_full(node)
            if covered < self.window:
                assert not node.swa_tombstone, "a lock's window reaches a tombstone"
                if node.swa_lock_ref == 0:
                    self.swa_locked += node.length
                node.swa_lock_ref += 1
                covered += node.length
                if covered >= self.window:
                    if node.swa_uuid == NO_UUID:
                        node.swa_uuid = self._next_uuid
                        self._next_uuid += 1
                    uuid = node.swa_uuid
            assert node.parent is not None
            node = node.parent
        return uuid, covered

    def unlock(self, node: SWANode, uuid: int) -> None:
        """``dec_lock_ref``: the full lock up to the root, the SWA lock up to the node ``uuid`` names."""
        in_window = True
        while node is not self.root:
            self._unlock_full(node)
            if in_window:
                node.swa_lock_ref -= 1
                if node.swa_lock_ref == 0:
                    self.swa_locked -= node.length
                if uuid != NO_UUID and node.swa_uuid == uuid:
                    in_window = False
            assert node.parent is not None
            node = node.parent

    # ------------------------------------------------------------------------------------ insertion
    def insert(self, key: Key, namespace: int, prev_prefix_len: int, swa_evicted: int) -> SWANode:
        """``_insert_helper`` (see the module docstring). Returns the node ending ``key``'s path."""
        node, rest, walked = self.root, key, 0
        while rest:
            child = node.children.get(self.child_key(namespace, rest))
            if child is None:
                break
            self._refresh(child)
            length = self.matched_length(child.key, rest)
            node = self._split(child, length) if length < child.length else child
            if prev_prefix_len < walked + length and node.swa_tombstone:
                node = self._recover(node, walked, swa_evicted)
            walked += length
            rest = split_key(rest, length)[1]
        if not rest:
            return node
        if swa_evicted >= walked + key_length(rest):
            return node  # (the sequence freed every new token's SWA slots: nothing new is cached)
        if swa_evicted > walked:
            head, rest = split_key(rest, swa_evicted - walked)
            node = self._add_node(node, head, namespace, tombstone=True)
        return self._add_node(node, rest, namespace, tombstone=False)

    def _recover(self, node: SWANode, start: int, swa_evicted: int) -> SWANode:
        """A tombstone at tokens ``[start, start + length)`` of an inserted sequence takes back the SWA
        slots the sequence still holds (from ``swa_evicted`` on): all of it, or its part from there,
        split off (``_insert_helper``'s branches 1 and 2). Returns the node continuing the path."""
        end = start + node.length
        if swa_evicted >= end:
            return node  # (branch 3: the sequence freed them all too)
        if swa_evicted > start:
            self._split(node, swa_evicted - start)  # the upper part stays a tombstone
        assert node.swa_lock_ref == 0, "a tombstone is never SWA-locked"
        node.swa_tombstone = False
        self.swa_lru.insert_mru(node)
        self.swa_tokens += node.length
        return node

    # ------------------------------------------------------------------------------------- eviction
    def evict(self, full_tokens: int, swa_tokens: int) -> tuple[int, int]:
        """``evict``: free at least ``full_tokens`` full slots, then at least ``swa_tokens`` SWA slots
        (counting those the full eviction freed), or all that can be. Returns the slots freed in each."""
        full_freed, swa_freed = self._evict_full(full_tokens)
        if swa_freed < swa_tokens:
            more_full, more_swa = self._evict_swa(swa_tokens - swa_freed)
            full_freed, swa_freed = full_freed + more_full, swa_freed + more_swa
        return full_freed, swa_freed

    def _evict_swa(self, wanted: int) -> tuple[int, int]:
        full_freed = swa_freed = 0
        node = self.swa_lru.least_recent(_swa_unlocked)
        while node is not None and swa_freed < wanted:
            following = self.swa_lru.next_newer(node, _swa_unlocked)
            swa_freed += node.length
            if node.children or node.full_lock_ref > 0:
                self._tombstone(node)
            else:
                full_freed += self._delete_leaf(node)[1]
            node = following
        return full_freed, swa_freed

    def _tombstone(self, node: SWANode) -> None:
        self.swa_lru.remove(node)
        node.swa_tombstone = True
        self.swa_tokens -= node.length

    def _is_tombstone(self, node: SWANode) -> bool:
        return node.swa_tombstone

    def _second_pool_freed(self, leaf: SWANode) -> int:
        return 0 if leaf.swa_tombstone else leaf.length

    def _release_second_pool(self, node: SWANode) -> None:
        if not node.swa_tombstone:
            self.swa_lru.remove(node)
            self.swa_tokens -= node.length

    # ------------------------------------------------------------------------------------ structure
    def _refresh(self, node: SWANode) -> None:
        self.full_lru.reset_mru(node)
        if not node.swa_tombstone:
            self.swa_lru.reset_mru(node)

    def _split(self, node: SWANode, length: int) -> SWANode:
        """``_split_node``: a new upper node takes ``node``'s first ``length`` tokens, its locks, its
        tombstone and its SWA lock id; both go first in the lists, the lower one most recent."""
        parent = node.parent
        assert parent is not None and 0 < length < node.length
        head, tail = split_key(node.key, length)
        upper = SWANode(
            self._next_node_id, head, length, node.namespace, parent,
            full_lock_ref=node.full_lock_ref, swa_lock_ref=node.swa_lock_ref,
            swa_tombstone=node.swa_tombstone, swa_uuid=node.swa_uuid,
        )  # fmt: skip
        self._next_node_id += 1
        node.swa_uuid = NO_UUID
        self.full_lru.remove(node)
        if not node.swa_tombstone:
            self.swa_lru.remove(node)
        parent.children[self.child_key(node.namespace, head)] = upper
        node.key, node.length, node.parent = tail, node.length - length, upper
        upper.children[self.child_key(node.namespace, tail)] = node
        for lru in (self.full_lru, self.swa_lru) if not node.swa_tombstone else (self.full_lru,):
            lru.insert_mru(upper)
            lru.insert_mru(node)
        return upper

    def _add_node(self, parent: SWANode, key: Key, namespace: int, tombstone: bool) -> SWANode:
        node = SWANode(self._next_node_id, key, key_length(key), namespace, parent, swa_tombstone=tombstone)
        self._next_node_id += 1
        parent.children[self.child_key(namespace, key)] = node
        self.full_lru.insert_mru(node)
        self.full_tokens += node.length
        if not tombstone:
            self.swa_lru.insert_mru(node)
            self.swa_tokens += node.length
        return node
