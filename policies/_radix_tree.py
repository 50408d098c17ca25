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

Token counts are kept incrementally: ``total_tokens`` (every node on the device) and
``locked_tokens`` (nodes with a lock); unlocked device nodes are exactly the evictable cache, since a
lock also locks every ancestor.

**HiCache** (:meth:`RadixTree.enable_hicache`): SGLang's ``HiRadixCache``
(``mem_cache/hiradix_cache.py``), its host pool (``mem_cache/memory_pool_host.py``) and
``managers/cache_controller.py`` (``HiCacheController.write`` / ``load``), read for behaviour. A node
may hold its KV on the device, in host memory (*backed up*), or both:

- a device node is backed up when its hit count reaches the write policy's threshold
  (``inc_hit_count``: 1 for ``write_through``, 2 for ``write_through_selective``; an insertion counts
  a hit on every node it walks through on the device and on the node it creates), or, under
  ``write_back``, only when it is evicted (``evict`` calls ``write_backup(x, write_back=True)``);
- device eviction picks the least recently used unlocked node with no device child
  (``_collect_leaves_device``): a backed-up one keeps its tree node and its host copy, only its
  device slots are freed (``_evict_backuped``); one not backed up is deleted (``_evict_regular``),
  and with it any host-only nodes below it (SGLang cannot reach them either, once their parent has
  gone);
- the host pool has its own capacity and its own LRU: when a backup does not fit, the least recently
  used host-only leaves are deleted (``evict_host``) until it does; if it still does not fit, the
  node is not backed up (``write_backup`` fails);
- a match walks through host-only nodes too (``match_prefix`` reports ``host_hit_length`` past
  ``last_device_node``); :meth:`RadixTree.load_back` brings them back to the device (``load_back``;
  their host copies stay); an insertion that walks through a host-only node adopts the inserting
  sequence's own copy of those tokens as its device copy (``_insert_helper`` on an evicted node).

Device nodes form a subtree at the root (an evicted node's ancestors stay on the device until its
device children are gone), and host-only nodes hang below it.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

from mypy_extensions import mypyc_attr

from policies._host_tier import HostPool

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


@dataclass(eq=False, slots=True, init=False)
class RadixNode:
    """(Its constructor is written out: compiled, it runs natively, once per node.)"""

    node_id: int
    key: Key
    length: int
    namespace: int
    parent: RadixNode | None
    children: dict[Hashable, RadixNode]
    lock_ref: int
    last_access: int
    on_device: bool  # SGLang's ``not evicted``
    backed_up: bool  # a host copy exists (SGLang's ``backuped``)
    hit_count: int

    def __init__(
        self,
        node_id: int,
        key: Key,
        length: int,
        namespace: int,
        parent: RadixNode | None,
        children: dict[Hashable, RadixNode] | None = None,
        lock_ref: int = 0,
        last_access: int = 0,
        on_device: bool = True,
        backed_up: bool = False,
        hit_count: int = 0,
    ) -> None:
        self.node_id = node_id
        self.key = key
        self.length = length
        self.namespace = namespace
        self.parent = parent
        self.children = {} if children is None else children
        self.lock_ref = lock_ref
        self.last_access = last_access
        self.on_device = on_device
        self.backed_up = backed_up
        self.hit_count = hit_count


@dataclass(frozen=True, init=False)
class PrefixMatch:
    """What a side-effect-free walk found: matched tokens, how many of them sit in unlocked device
    nodes (they stop being evictable once a sequence locks the match), and how many of them (the
    match's tail) are held in host memory only. (Its constructor is written out: compiled, it runs
    natively, once per walk.)"""

    length: int
    unlocked_tokens: int
    host_tokens: int

    def __init__(self, length: int, unlocked_tokens: int, host_tokens: int = 0) -> None:
        setattr_ = object.__setattr__  # (frozen: as the dataclass's own constructor sets them)
        setattr_(self, "length", length)
        setattr_(self, "unlocked_tokens", unlocked_tokens)
        setattr_(self, "host_tokens", host_tokens)


WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")


class HiCachePool(HostPool):
    """The host pool of a HiCache tree: ``capacity_tokens`` slots (``capacity_blocks`` engine blocks
    of ``block_size``, in whole pages), and which nodes' copies it holds."""

    def __init__(self, capacity_blocks: int, block_size: int, page_size: int, write_policy: str):
        super().__init__(capacity_blocks)
        if write_policy not in WRITE_POLICIES:
            raise ValueError(
                f"unknown write_policy {write_policy!r}; SGLang's --hicache-write-policy is one of "
                + ", ".join(WRITE_POLICIES)
            )
        self.block_size = block_size
        self.capacity_tokens = capacity_blocks * block_size // page_size * page_size
        self.write_policy = write_policy
        # ``write_through_threshold``: 1 for write_through, else 2 (write_back never counts hits).
        self.threshold = 1 if write_policy == "write_through" else 2
        self.used_tokens = 0
        self.leaves: set[RadixNode] = set()  # host-only nodes without children: what evict_host frees
        self.heap: list[tuple[int, int, RadixNode]] = []  # lazy LRU heap over ``leaves``

    @property
    def cached_blocks(self) -> int:
        return self.used_tokens // self.block_size

    def host_slots(self, block_size: int) -> tuple[int, int]:
        return self.used_tokens, self.capacity_blocks * block_size - self.used_tokens


@mypyc_attr(
    allow_interpreted_subclasses=True
)  # (the SWA and Mamba trees, policies/_two_pool_radix_tree.py, are not compiled)
class RadixKeys:
    """What every radix tree over token content does with its keys, whatever its nodes hold (this
    module's :class:`RadixTree`; SGLang's SWA tree, :mod:`policies._swa_radix_tree`): children are
    keyed by their first token or page and the namespace, and a match is floored to whole pages."""

    def __init__(self, page_size: int):
        self.page_size = page_size

    def child_key(self, namespace: int, key: Key) -> Hashable:
        if self.page_size == 1:
            stream, start, _ = key[0]
            return (namespace, stream, start)
        return (namespace, split_key(key, self.page_size)[0])

    def matched_length(self, node_key: Key, rest: Key) -> int:
        """Tokens of ``rest`` a node holding ``node_key`` matches, in whole pages."""
        return self._page_floor(common_prefix_length(node_key, rest))

    def _page_floor(self, tokens: int) -> int:
        return tokens - tokens % self.page_size


class RadixTree(RadixKeys):
    """See the module docstring. Keys passed in must be whole pages long."""

    def __init__(self, page_size: int):
        super().__init__(page_size)
        self.root = RadixNode(0, (), 0, 0, None, lock_ref=1)
        self.total_tokens = 0
        self.locked_tokens = 0
        self.shared_tokens = 0  # tokens of nodes two or more locks hold (the running requests share)
        self._next_node_id = 1
        self._clock = 0
        self._evictable_leaves: set[RadixNode] = set()
        # Lazy LRU heap of (last access, node id, node): an entry is stale once its node is no longer
        # an evictable leaf or was touched again since; stale entries are skipped when popped.
        self._lru_heap: list[tuple[int, int, RadixNode]] = []
        self.host: HiCachePool | None = None

    def enable_hicache(self, pool: HiCachePool) -> None:
        self.host = pool

    # ------------------------------------------------------------------------------------- queries
    def longest_match(self, key: Key, namespace: int) -> PrefixMatch:
        """The longest cached prefix of ``key``, changing nothing (no split, no touch)."""
        node, rest = self.root, key
        matched = unlocked = host = 0
        while rest:
            child = node.children.get(self.child_key(namespace, rest))
            if child is None:
                break
            length = self.matched_length(child.key, rest)
            matched += length
            if not child.on_device:
                host += length
            elif child.lock_ref == 0:
                unlocked += length
            if length < child.length:
                break
            node, rest = child, split_key(rest, length)[1]
        return PrefixMatch(matched, unlocked, host)

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
        tokens that were already cached (the caller frees its own copies of those). With HiCache,
        host-only nodes on the path take the caller's copies as their device copies, and every
        device node of the path counts a hit (see the module docstring)."""
        node, matched, rest = self._walk(key, namespace)
        if rest:
            node = self._add_leaf(node, rest, namespace)
        if self.host is not None:
            self._insert_hicache(node)
        return node, matched

    def device_end(self, node: RadixNode) -> tuple[RadixNode, int]:
        """The last device node on the path to ``node`` and the host-only tokens below it
        (SGLang's ``last_device_node`` and ``host_hit_length``)."""
        host_tokens = 0
        while not node.on_device:
            host_tokens += node.length
            assert node.parent is not None
            node = node.parent
        return node, host_tokens

    def load_back(self, node: RadixNode) -> int:
        """Bring the host-only nodes on the path to ``node`` back to the device (``load_back``); their
        host copies stay. Returns the tokens loaded; the caller must make room for them on the device
        (they count as device tokens at once)."""
        host = self.host
        loaded: list[RadixNode] = []
        while not node.on_device:
            loaded.append(node)
            assert node.parent is not None
            node = node.parent
        if host is None or not loaded:
            return 0
        tokens = 0
        for item in reversed(loaded):
            item.on_device = True
            tokens += item.length
            host.leaves.discard(item)
        self.total_tokens += tokens
        for item in loaded:
            self._refresh_leaf_status(item)
        self._refresh_leaf_status(node)
        stats = host.stats
        stats.host_cache_hits += tokens
        stats.host_loaded_tokens += tokens
        stats.host_loaded_blocks = stats.host_loaded_tokens // host.block_size
        return tokens

    def lock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.locked_tokens += node.length
                self._evictable_leaves.discard(node)
            elif node.lock_ref == 1:
                self.shared_tokens += node.length
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.locked_tokens -= node.length
                self._refresh_leaf_status(node)
            elif node.lock_ref == 1:
                self.shared_tokens -= node.length
            assert node.parent is not None
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` device tokens of unlocked leaves, least recently used first (or
        every unlocked node, if that is less). Returns the tokens freed. With HiCache a backed-up
        leaf (or, under write_back, one that can be backed up now) moves to host memory instead."""
        freed = 0
        host = self.host
        while freed < num_tokens:
            leaf = self._pop_least_recent_leaf()
            if leaf is None:
                break
            freed += leaf.length
            if host is not None:
                if not leaf.backed_up and host.write_policy == "write_back":
                    self._backup(leaf, host)
                if leaf.backed_up:
                    self._evict_to_host(leaf, host)
                    continue
            self._delete_leaf(leaf)
        return freed

    # ------------------------------------------------------------------------------------- HiCache
    def _insert_hicache(self, node: RadixNode) -> None:
        """After an insertion ending at ``node``: adopt host-only nodes of the path, count hits."""
        host = self.host
        assert host is not None
        path: list[RadixNode] = []
        while node is not self.root:
            path.append(node)
            assert node.parent is not None
            node = node.parent
        adopted = False
        for item in reversed(path):  # root side first, as ``_insert_helper`` walks
            if not item.on_device:
                item.on_device = True
                self.total_tokens += item.length
                host.leaves.discard(item)
                adopted = True
            elif host.write_policy != "write_back" and not item.backed_up:
                item.hit_count += 1
                if item.hit_count >= host.threshold:
                    self._backup(item, host)
        if adopted:
            for item in path:
                self._refresh_leaf_status(item)
            self._refresh_leaf_status(node)

    def _backup(self, node: RadixNode, host: HiCachePool) -> bool:
        """``write_backup``: copy ``node`` to host memory, making room there (``evict_host``) first."""
        shortfall = node.length - (host.capacity_tokens - host.used_tokens)
        if shortfall > 0:
            self._evict_host(shortfall, host)
            if node.length > host.capacity_tokens - host.used_tokens:
                return False
        node.backed_up = True
        host.used_tokens += node.length
        stats = host.stats
        stats.host_offloaded_tokens += node.length
        stats.host_offloaded_blocks = stats.host_offloaded_tokens // host.block_size
        return True

    def _evict_to_host(self, leaf: RadixNode, host: HiCachePool) -> None:
        """``_evict_backuped``: free the device copy, keep the node and its host copy."""
        leaf.on_device = False
        self.total_tokens -= leaf.length
        self._evictable_leaves.discard(leaf)
        assert leaf.parent is not None
        self._refresh_leaf_status(leaf.parent)
        self._refresh_host_leaf(leaf, host)

    def _evict_host(self, num_tokens: int, host: HiCachePool) -> None:
        """``evict_host``: delete host-only leaves, least recently used first, until ``num_tokens``
        host slots are freed or none is left."""
        freed = 0
        while freed < num_tokens and host.heap:
            last_access, _, node = heapq.heappop(host.heap)
            if node not in host.leaves or node.last_access != last_access:
                continue  # stale
            freed += node.length
            self._delete_leaf(node)

    def _refresh_host_leaf(self, node: RadixNode, host: HiCachePool) -> None:
        if node is self.root or node.on_device or node.children or not node.backed_up:
            host.leaves.discard(node)
        elif node not in host.leaves:
            host.leaves.add(node)
            heapq.heappush(host.heap, (node.last_access, node.node_id, node))
            if len(host.heap) > 4 * len(host.leaves) + 1024:
                host.heap = [(leaf.last_access, leaf.node_id, leaf) for leaf in host.leaves]
                heapq.heapify(host.heap)

    # ------------------------------------------------------------------------------------ internals
    def extend(self, node: RadixNode, rest: Key, namespace: int) -> RadixNode:
        """:meth:`insert` of a key made of the path to ``node`` (a live sequence's locked path end)
        and then ``rest``: the same touches (every node of the path, at one tick of the clock), splits
        and new leaf, without matching the path again. Returns the node ending it."""
        self._clock += 1
        above = node
        while above is not self.root:
            self._touch(above)
            assert above.parent is not None
            above = above.parent
        node, _, rest = self._walk_from(node, rest, namespace)
        if rest:
            node = self._add_leaf(node, rest, namespace)
        if self.host is not None:
            self._insert_hicache(node)
        return node

    def _walk(self, key: Key, namespace: int) -> tuple[RadixNode, int, Key]:
        """Follow ``key`` from the root, touching each node and splitting the last one if the match
        ends inside it. Returns the last node matched, the tokens matched and the unmatched rest."""
        self._clock += 1
        return self._walk_from(self.root, key, namespace)

    def _walk_from(self, node: RadixNode, key: Key, namespace: int) -> tuple[RadixNode, int, Key]:
        """:meth:`_walk` from ``node`` on, in the clock's current tick."""
        rest, matched = key, 0
        while rest:
            child = node.children.get(self.child_key(namespace, rest))
            if child is None:
                break
            self._touch(child)
            length = self.matched_length(child.key, rest)
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
            on_device=node.on_device, backed_up=node.backed_up, hit_count=node.hit_count,
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
        if self.host is not None:
            self.host.leaves.discard(parent)
        return leaf

    def _delete_leaf(self, leaf: RadixNode) -> None:
        """Delete a device leaf (one with no device child) or, with HiCache, a host-only leaf."""
        parent = leaf.parent
        assert parent is not None
        del parent.children[self.child_key(leaf.namespace, leaf.key)]
        leaf.parent = None
        host = self.host
        if host is None:
            self.total_tokens -= leaf.length
            self._evictable_leaves.discard(leaf)
            self._refresh_leaf_status(parent)
            return
        # A deleted device leaf never has host-only children: a node is backed up no later than its
        # children (write-through at its first insertion or at as many hits as theirs, write-back
        # when it is evicted, before it is deleted), and a backup cannot fail while the node is on
        # the device, since the host pool is larger than the device pool (SGLang's hicache_ratio > 1)
        # and every host-only node can be evicted from it.
        assert not leaf.children, "a deleted radix node has children"
        if leaf.on_device:
            self.total_tokens -= leaf.length
            self._evictable_leaves.discard(leaf)
        host.leaves.discard(leaf)
        if leaf.backed_up:
            host.used_tokens -= leaf.length
            if not leaf.on_device:
                host.stats.host_evictions += leaf.length // self.page_size
        self._refresh_leaf_status(parent)
        self._refresh_host_leaf(parent, host)

    def _touch(self, node: RadixNode) -> None:
        node.last_access = self._clock
        if node in self._evictable_leaves:
            self._push(node)
        elif self.host is not None and node in self.host.leaves:
            heapq.heappush(self.host.heap, (node.last_access, node.node_id, node))

    def _refresh_leaf_status(self, node: RadixNode) -> None:
        """SGLang's ``_update_leaf_status``: an unlocked node without children may be evicted (with
        HiCache: an unlocked device node without device children)."""
        if (
            node is self.root
            or node.lock_ref > 0
            or not node.on_device
            or (node.children and (self.host is None or self._has_device_child(node)))
        ):
            self._evictable_leaves.discard(node)
        elif node not in self._evictable_leaves:
            self._evictable_leaves.add(node)
            self._push(node)

    @staticmethod
    def _has_device_child(node: RadixNode) -> bool:
        return any(child.on_device for child in node.children.values())

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
