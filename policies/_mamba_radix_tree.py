"""SGLang's ``MambaRadixCache`` tree: a radix tree over token content whose nodes hold a slot per token in
the full-attention pool and, unless *tombstoned*, one Mamba state (a slot of the Mamba pool): the
recurrent state after the node's last token.

Read at sgl-project/sglang commit 00df707e8de4ab0110fb5527bf3c9dffc535671a,
``python/sglang/srt/mem_cache/mamba_radix_cache.py`` (``TreeNode``, ``LRUList``,
``_match_prefix_helper`` / ``_match_post_processor``, ``_split_node``, ``_insert_helper``,
``evict_full`` / ``evict_mamba`` / ``_evict_leaf_node``, ``inc_lock_ref`` / ``dec_lock_ref``,
``_iteratively_delete_tombstone_leaf``), under its ``no_buffer`` strategy (pages of one token);
no code is copied. The keys are the ``radix`` policy's (:class:`~policies._radix_tree.RadixKeys`),
the two LRU lists the SWA tree's (:class:`~policies._two_pool_radix_tree.LRUList`). What the Mamba tree
does, as SGLang runs it:

- **States only where a sequence's insertion ended.** An insertion puts the inserted sequence's
  state on the node ending its key (a new leaf, a tombstone it revives, or a node that already has
  one, whose state it keeps: the caller frees its copy). A split's upper half has no state (a state
  cannot be cut).
- **The match** (``_match_prefix_helper``) walks the longest prefix (splitting a node it ends in)
  but serves only up to the deepest node on the way that has a state (a hit must end where the
  Mamba layers can resume), the root when none has. The served node and its ancestors are refreshed
  (``reset_node_and_parents_mru``: the node most recent, each ancestor just older than its child).
- **Two LRU lists**: every node in the full one, every node with a state in the Mamba one.
- **Locks** (``inc_lock_ref``): locking a node locks every ancestor's full slots and the node's own
  state, if it has one (the root is always locked and has none).
- **Eviction**, full (``evict_full``): unlocked leaves, least recently used first, each freeing its
  tokens and its state, then every tombstone ancestor it leaves an unlocked leaf (a leaf always has
  a state). Mamba (``evict_mamba``): the Mamba list's least recently used nodes whose state no lock
  holds: an internal node is tombstoned (its state freed, its tokens kept), a leaf deleted as above.

Counted as SGLang counts them (``full_evictable_size`` / ``mamba_evictable_size``,
``*_protected_size``): ``full_tokens`` / ``states`` the tree's slots in each pool, ``full_locked`` /
``states_locked`` those a lock holds. The extra-buffer strategies' tracking (ping-pong track buffers,
``mamba_branching_seqlen``) is the coordinator's (``sim/kv/sglang_mamba_radix.py``, which says which
states enter this tree). Left out: HiCache, KV events and metrics.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from policies._radix_tree import Key, key_length, split_key
from policies._two_pool_radix_tree import LRUList, TwoPoolRadixTree


@dataclass(eq=False, slots=True, init=False)
class MambaNode:
    node_id: int
    key: Key
    length: int
    namespace: int
    parent: MambaNode | None
    children: dict[Hashable, MambaNode]
    full_lock_ref: int
    mamba_lock_ref: int
    has_state: bool
    """False: a tombstone (SGLang's ``mamba_value is None``)."""

    # (The constructor is written out: compiled, it runs natively, where a dataclass's generated one
    # stays interpreted; a node is built per insertion and split.)
    def __init__(
        self,
        node_id: int,
        key: Key,
        length: int,
        namespace: int,
        parent: MambaNode | None,
        full_lock_ref: int = 0,
        mamba_lock_ref: int = 0,
        has_state: bool = False,
    ) -> None:
        self.node_id = node_id
        self.key = key
        self.length = length
        self.namespace = namespace
        self.parent = parent
        self.children = {}
        self.full_lock_ref = full_lock_ref
        self.mamba_lock_ref = mamba_lock_ref
        self.has_state = has_state


@dataclass(frozen=True, init=False)
class MambaMatch:
    """What a side-effect-free match found: the tokens served, and what locking its node would take
    out of each pool's evictable cache (its path's full slots, its state, that no lock holds yet).
    (Its constructor is written out, as :class:`MambaNode`'s: one is built per match.)"""

    length: int
    full_unlocked: int
    state_unlocked: int
    kv_length: int
    """The tokens the tree holds of the key, states or not (SGLang's full-KV match: past ``length``
    where the deepest state comes before the key leaves the tree)."""

    def __init__(
        self, length: int, full_unlocked: int = 0, state_unlocked: int = 0, kv_length: int = 0
    ) -> None:
        setattr_ = object.__setattr__
        setattr_(self, "length", length)
        setattr_(self, "full_unlocked", full_unlocked)
        setattr_(self, "state_unlocked", state_unlocked)
        setattr_(self, "kv_length", kv_length)


def _sentinel(node_id: int) -> MambaNode:
    return MambaNode(node_id, (), 0, 0, None)


def _state_unlocked(node: MambaNode) -> bool:
    return node.mamba_lock_ref == 0


def _no_state(node: MambaNode) -> bool:
    return not node.has_state


class MambaRadixTree(TwoPoolRadixTree[MambaNode]):
    """See the module docstring. Keys passed in must be whole pages long."""

    def __init__(self, page_size: int):
        super().__init__(page_size)
        self.root = MambaNode(0, (), 0, 0, None, full_lock_ref=1, mamba_lock_ref=1)
        self.full_lru: LRUList[MambaNode] = LRUList(_sentinel(-1), _sentinel(-2))
        self.mamba_lru: LRUList[MambaNode] = LRUList(_sentinel(-1), _sentinel(-2))
        self.full_tokens = 0
        self.states = 0
        self.full_locked = 0
        self.full_shared = 0
        self.states_locked = 0
        self._next_node_id = 1

    @property
    def full_evictable(self) -> int:
        return self.full_tokens - self.full_locked

    @property
    def states_evictable(self) -> int:
        return self.states - self.states_locked

    # ------------------------------------------------------------------------------------- matching
    def longest_match(self, key: Key, namespace: int) -> MambaMatch:
        """The match :meth:`match_prefix` would find, changing nothing."""
        node, rest = self.root, key
        path: list[MambaNode] = []
        best = 0  # path entries served
        walked = 0
        while rest:
            child = node.children.get(self.child_key(namespace, rest))
            if child is None:
                break
            length = self.matched_length(child.key, rest)
            walked += length
            if length < child.length:
                break  # (a split's upper half has no state: it cannot end the hit)
            path.append(child)
            if child.has_state:
                best = len(path)
            node, rest = child, split_key(rest, length)[1]
        served = path[:best]
        full_unlocked = sum(item.length for item in served if item.full_lock_ref == 0)
        state_unlocked = 1 if served and served[-1].mamba_lock_ref == 0 else 0
        return MambaMatch(sum(item.length for item in served), full_unlocked, state_unlocked, walked)

    def match_prefix(self, key: Key, namespace: int) -> tuple[MambaNode, int]:
        """SGLang's ``match_prefix``: the deepest node with a state on ``key``'s longest prefix (the root
        when none) and its length; splits a node the walk ends inside, refreshes the served node and
        its ancestors in both lists."""
        node, rest = self.root, key
        best, best_len, walked = self.root, 0, 0
        while rest:
            child = node.children.get(self.child_key(namespace, rest))
            if child is None:
                break
            length = self.matched_length(child.key, rest)
            if length < child.length:
                self._split(child, length)
                break
            node, rest, walked = child, split_key(rest, length)[1], walked + length
            if node.has_state:
                best, best_len = node, walked
        self.full_lru.reset_path_mru(best, self.root, lambda _: False)
        self.mamba_lru.reset_path_mru(best, self.root, _no_state)
        return best, best_len

    def unlocked_by_lock(self, node: MambaNode) -> tuple[int, int]:
        """What locking ``node`` would take out of each pool's evictable cache: its path's full slots
        and its state that no lock holds yet."""
        state = 1 if node.has_state and node.mamba_lock_ref == 0 else 0
        full = 0
        while node is not self.root:
            if node.full_lock_ref == 0:
                full += node.length
            assert node.parent is not None
            node = node.parent
        return full, state

    # ------------------------------------------------------------------------------------- locking
    def lock(self, node: MambaNode) -> None:
        """``inc_lock_ref``: the node's state, and the full slots of its path to the root."""
        assert node is self.root or node.has_state, "a lock is taken on a node with a state"
        if node is not self.root:
            if node.mamba_lock_ref == 0:
                self.states_locked += 1
            node.mamba_lock_ref += 1
        while node is not self.root:
            self._lock_full(node)
            assert node.parent is not None
            node = node.parent

    def unlock(self, node: MambaNode) -> None:
        """``dec_lock_ref``."""
        if node is not self.root:
            node.mamba_lock_ref -= 1
            if node.mamba_lock_ref == 0:
                self.states_locked -= 1
        while node is not self.root:
            self._unlock_full(node)
            assert node.parent is not None
            node = node.parent

    # ------------------------------------------------------------------------------------ insertion
    def insert(self, key: Key, namespace: int) -> tuple[MambaNode, bool]:
        """``_insert_helper`` with a state for ``key``'s end: returns the node ending ``key`` and whether
        it had a state already (the caller's copy is then freed; else the tree holds it). Tokens the
        tree already held are the inserting sequence's duplicates, which it frees (the caller's
        accounting: this tree counts only its own slots)."""
        node, rest = self.root, key
        while rest:
            child = node.children.get(self.child_key(namespace, rest))
            if child is None:
                break
            self._refresh(child)
            length = self.matched_length(child.key, rest)
            node = self._split(child, length) if length < child.length else child
            rest = split_key(rest, length)[1]
        if rest:
            leaf = MambaNode(self._next_node_id, rest, key_length(rest), namespace, node, has_state=True)
            self._next_node_id += 1
            node.children[self.child_key(namespace, rest)] = leaf
            self.full_lru.insert_mru(leaf)
            self.mamba_lru.insert_mru(leaf)
            self.full_tokens += leaf.length
            self.states += 1
            return leaf, False
        if node is self.root:
            return node, True  # (an empty key: nothing to cache, the copy is freed)
        if not node.has_state:  # a tombstone (or a split's upper half) takes the state
            node.has_state = True
            self.full_lru.reset_mru(node)
            self.mamba_lru.insert_mru(node)
            self.states += 1
            return node, False
        self._refresh(node)
        return node, True

    # ------------------------------------------------------------------------------------- eviction
    def evict(self, full_tokens: int, states: int) -> tuple[int, int]:
        """``evict``: at least ``full_tokens`` full slots, then at least ``states`` states, or all that
        can be (each count apart, as SGLang runs ``evict_full`` then ``evict_mamba``). Returns the
        full slots and states freed."""
        full_freed = states_freed = 0
        if full_tokens > 0:
            full_freed, states_freed = self._evict_full(full_tokens)
        if states > 0:
            more_full, more_states = self._evict_mamba(states)
            full_freed, states_freed = full_freed + more_full, states_freed + more_states
        return full_freed, states_freed

    def _evict_mamba(self, wanted: int) -> tuple[int, int]:
        """``evict_mamba``: ``states_freed`` counts the states, as SGLang's ``mamba_num_evicted``."""
        full_freed = states_freed = 0
        node = self.mamba_lru.least_recent(_state_unlocked)
        while node is not None and states_freed < wanted:
            following = self.mamba_lru.next_newer(node, _state_unlocked)
            states_freed += 1
            if node.children:
                self.mamba_lru.remove(node)
                node.has_state = False
                self.states -= 1
            else:
                full_freed += self._delete_leaf(node)[1]
            node = following
        return full_freed, states_freed

    def _is_tombstone(self, node: MambaNode) -> bool:
        return not node.has_state

    def _second_pool_freed(self, leaf: MambaNode) -> int:
        return 1  # (a leaf always holds a state: a tombstone leaf is deleted with the leaf below it)

    def _release_second_pool(self, node: MambaNode) -> None:
        if node.has_state:
            self.mamba_lru.remove(node)
            self.states -= 1

    # ------------------------------------------------------------------------------------ structure
    def _refresh(self, node: MambaNode) -> None:
        self.full_lru.reset_mru(node)
        if node.has_state:
            self.mamba_lru.reset_mru(node)

    def _split(self, node: MambaNode, length: int) -> MambaNode:
        """``_split_node``: a new upper node takes ``node``'s first ``length`` tokens and its full
        locks, but no state (nor a Mamba lock); both go first in the full list, the lower one most
        recent (and first in the Mamba list, if it has a state)."""
        parent = node.parent
        assert parent is not None and 0 < length < node.length
        head, tail = split_key(node.key, length)
        upper = MambaNode(
            self._next_node_id, head, length, node.namespace, parent, full_lock_ref=node.full_lock_ref
        )
        self._next_node_id += 1
        self.full_lru.remove(node)
        if node.has_state:
            self.mamba_lru.remove(node)
        parent.children[self.child_key(node.namespace, head)] = upper
        node.key, node.length, node.parent = tail, node.length - length, upper
        upper.children[self.child_key(node.namespace, tail)] = node
        self.full_lru.insert_mru(upper)
        self.full_lru.insert_mru(node)
        if node.has_state:
            self.mamba_lru.insert_mru(node)
        return upper
