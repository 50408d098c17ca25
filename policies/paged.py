"""Paged allocation (PagedAttention): a pool of fixed-size blocks, a block table per sequence, blocks
taken on demand as tokens arrive.

This module also holds the block bookkeeping the prefix-caching policy builds on (``prefix.py``):
reference counts, the free-block queue and the per-block accounting. Plain paging never shares a
block, so every reference count here is 0 or 1 and a fork copies the parent's tokens.

Accounting is kept per physical block so that a block shared by several sequences counts once:
a live block holds ``filled`` token states and will hold ``target`` (``filled <= target <= block_size``)
by the time its owners finish. Summed over live blocks: used = Σ filled, reserved = Σ (target − filled),
internal fragmentation = Σ (block_size − target). Only a sequence's last block can be partly filled,
so only those blocks need tracking beyond "full".
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from policies.base import (
    ChildSpec,
    KVCachePolicy,
    OutOfKVMemory,
    PolicyInputError,
    PoolSpec,
    Segment,
    TokenContent,
    register,
)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class FreeBlockQueue:
    """Free block ids in eviction order (head = next to be handed out).

    An ordered dict gives O(1) pop from the head, append at either end and removal from the middle
    (a cached block that gets a prefix hit leaves the queue), like vLLM's intrusive linked list."""

    def __init__(self, block_ids: Iterable[int]):
        self._queue: OrderedDict[int, None] = OrderedDict.fromkeys(block_ids)

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._queue

    def popleft(self) -> int:
        return self._queue.popitem(last=False)[0]

    def append(self, block_id: int) -> None:
        self._queue[block_id] = None

    def appendleft(self, block_id: int) -> None:
        self._queue[block_id] = None
        self._queue.move_to_end(block_id, last=False)

    def remove(self, block_id: int) -> None:
        del self._queue[block_id]

    def order(self) -> list[int]:
        return list(self._queue)


@dataclass(slots=True, eq=False)
class SequenceState:
    seq_id: int
    num_tokens: int
    final_len: int
    output_content_id: int
    block_table: list[int] = field(default_factory=list)
    # Token content and block hashes are only kept by policies that share blocks.
    segments: list[Segment] = field(default_factory=list)
    segment_ends: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    namespace: int = 0


@register("paged")
class PagedPolicy(KVCachePolicy):
    """PagedAttention block tables without sharing: O(1) allocation and free per block."""

    def __init__(self, pool: PoolSpec):
        super().__init__(pool)
        self.block_size = pool.block_size
        self.num_blocks = pool.kv_pool_blocks
        self.free_queue = FreeBlockQueue(range(self.num_blocks))
        self.ref_count = [0] * self.num_blocks
        self._filled = [0] * self.num_blocks
        self._target = [0] * self.num_blocks
        # Owners of every live, partly filled block; the block's target is the most any owner will fill.
        self._partial_owners: dict[int, list[SequenceState]] = {}
        self._live_blocks = 0
        self._logical_blocks = 0  # Σ block-table lengths: what the live sequences would hold unshared
        self._filled_sum = 0
        self._target_sum = 0
        self.sequences: dict[int, SequenceState] = {}

    # ---------------------------------------------------------------------------------------- queries
    def _has_sequence(self, seq_id: int) -> bool:
        return seq_id in self.sequences

    def _get(self, seq_id: int) -> SequenceState:
        try:
            return self.sequences[seq_id]
        except KeyError:
            raise PolicyInputError(
                f"unknown sequence id {seq_id!r} (never admitted, or already freed)"
            ) from None

    def seq_len(self, seq_id: int) -> int:
        return self._get(seq_id).num_tokens

    def block_table(self, seq_id: int) -> list[int]:
        return list(self._get(seq_id).block_table)

    def live_sequences(self) -> Iterable[int]:
        return self.sequences.keys()

    def available_slots(self) -> int:
        return len(self.free_queue) * self.block_size

    def can_admit(self, prompt: TokenContent, final_len: int) -> bool:
        return self._blocks_needed_to_admit(prompt, namespace=0)[0] <= len(self.free_queue)

    def slots_needed_to_grow(self, seq_id: int, num_tokens: int) -> int:
        return self._blocks_needed_to_grow(self._get(seq_id), num_tokens) * self.block_size

    def growth_room(self, seq_id: int) -> int:
        seq = self._get(seq_id)
        if seq.num_tokens % self.block_size and self.ref_count[seq.block_table[-1]] > 1:
            return 0  # the next write copies the shared tail first
        return min(len(seq.block_table) * self.block_size, seq.final_len) - seq.num_tokens

    def breakdown_values(self) -> tuple[int, int, int, int, int, int]:
        block_size = self.block_size
        cached_blocks = self._cached_blocks()
        return (
            self._filled_sum,
            self._target_sum - self._filled_sum,
            self._live_blocks * block_size - self._target_sum,
            # Slots past the last whole block can never hold a block: they are split-off memory.
            self.pool.kv_pool_tokens - self.num_blocks * block_size,
            cached_blocks * block_size,
            (self.num_blocks - self._live_blocks - cached_blocks) * block_size,
        )

    def _cached_blocks(self) -> int:
        return 0

    def sharing_slots(self) -> tuple[int, int]:
        return self._live_blocks * self.block_size, self._logical_blocks * self.block_size

    # ------------------------------------------------------------------------------------- operations
    def admit(
        self, seq_id: int, prompt: TokenContent, final_len: int, output_content_id: int, namespace: int = 0
    ) -> int:
        prompt_len = self._check_new_sequence(seq_id, prompt, final_len)
        blocks_needed, hit_blocks = self._blocks_needed_to_admit(prompt, namespace)
        self._ensure_free_blocks(blocks_needed, f"admitting sequence {seq_id}")
        seq = SequenceState(seq_id, 0, final_len, output_content_id, namespace=namespace)
        self._remember_content(seq, prompt)
        for block_id in hit_blocks:
            self._share_block(block_id)
            seq.block_table.append(block_id)
        self._logical_blocks += len(hit_blocks)
        cached_tokens = len(hit_blocks) * self.block_size
        seq.num_tokens = cached_tokens
        self.sequences[seq_id] = seq
        self._record_prefix_query(prompt_len, cached_tokens)
        self._extend(seq, prompt_len - cached_tokens)
        return cached_tokens

    def grow(self, seq_id: int, num_tokens: int, content: TokenContent | None = None) -> None:
        seq = self._get(seq_id)
        self._check_growth(seq_id, num_tokens, seq.num_tokens, seq.final_len)
        if content is not None and sum(length for _, length in content) != num_tokens:
            raise PolicyInputError(
                f"sequence {seq_id}: content holds a different number of tokens than {num_tokens}"
            )
        self._ensure_free_blocks(self._blocks_needed_to_grow(seq, num_tokens), f"growing sequence {seq_id}")
        self._copy_shared_tail_before_write(seq)
        self._append_content(seq, num_tokens, content)
        self._extend(seq, num_tokens)

    def fork(self, parent_id: int, children: Sequence[ChildSpec]) -> None:
        parent = self._get(parent_id)
        self._check_children(parent_id, parent.num_tokens, children)
        self._ensure_free_blocks(
            self._blocks_needed_to_fork(parent, len(children)), f"forking sequence {parent_id}"
        )
        for child in children:
            state = SequenceState(
                child.seq_id,
                parent.num_tokens,
                child.final_len,
                child.output_content_id,
                segments=list(parent.segments),
                segment_ends=list(parent.segment_ends),
                block_hashes=list(parent.block_hashes),
                namespace=parent.namespace,
            )
            self.sequences[child.seq_id] = state
            self._give_child_blocks(parent, state)

    def free(self, seq_id: int) -> None:
        seq = self._get(seq_id)
        # Reverse order: with prefix caching the tail (longest prefix, least reusable) is evicted first.
        table = seq.block_table
        if table and table[-1] in self._partial_owners:
            self._drop_reference(seq, table[-1])
            table = table[:-1]
        ref_count, filled, target = self.ref_count, self._filled, self._target
        for index in range(len(table) - 1, -1, -1):
            block_id = table[index]
            ref_count[block_id] -= 1
            if ref_count[block_id] == 0:
                # A full block nobody else holds (shared or partly filled blocks take the general path).
                self._live_blocks -= 1
                self._filled_sum -= filled[block_id]
                self._target_sum -= target[block_id]
                filled[block_id] = target[block_id] = 0
                self._return_free_block(block_id)
        self._logical_blocks -= len(seq.block_table)
        del self.sequences[seq_id]

    # ------------------------------------------------------------------- hooks the prefix policy overrides
    def _blocks_needed_to_admit(self, prompt: TokenContent, namespace: int) -> tuple[int, list[int]]:
        """Free-queue blocks an admission consumes, and the cached blocks it would reuse."""
        return ceil_div(sum(length for _, length in prompt), self.block_size), []

    def _blocks_needed_to_grow(self, seq: SequenceState, num_tokens: int) -> int:
        return ceil_div(seq.num_tokens + num_tokens, self.block_size) - len(seq.block_table)

    def _blocks_needed_to_fork(self, parent: SequenceState, num_children: int) -> int:
        return len(parent.block_table) * num_children

    def _give_child_blocks(self, parent: SequenceState, child: SequenceState) -> None:
        # Without sharing, a child is a physical copy of its parent.
        self.stats.fork_copied_tokens += parent.num_tokens
        child.num_tokens = 0
        self._extend(child, parent.num_tokens)

    def _share_block(self, block_id: int) -> None:
        raise AssertionError("plain paging never shares blocks")

    def _copy_shared_tail_before_write(self, seq: SequenceState) -> None:
        """Plain paging owns every block alone: nothing to copy."""

    def _remember_content(self, seq: SequenceState, content: TokenContent) -> None:
        """Plain paging does not need token content."""

    def _append_content(self, seq: SequenceState, num_tokens: int, content: TokenContent | None) -> None:
        """Plain paging does not need token content."""

    def _on_blocks_filled(self, seq: SequenceState) -> None:
        """Called after a sequence's tokens grew; the prefix policy caches newly full blocks."""

    def _record_prefix_query(self, prompt_len: int, cached_tokens: int) -> None:
        """Plain paging has no prefix cache to query."""

    def _take_free_block(self) -> int:
        return self.free_queue.popleft()

    def _return_free_block(self, block_id: int) -> None:
        # Head of the queue: reused first (vLLM puts hash-less freed blocks at the head too).
        self.free_queue.appendleft(block_id)

    # ------------------------------------------------------------------------------ block accounting
    def _ensure_free_blocks(self, blocks_needed: int, action: str) -> None:
        if blocks_needed > len(self.free_queue):
            self.stats.allocation_failures += 1
            raise OutOfKVMemory(
                f"{action} needs {blocks_needed} free blocks, {len(self.free_queue)} available",
                needed_slots=blocks_needed * self.block_size,
                free_slots=len(self.free_queue) * self.block_size,
            )

    def _extend(self, seq: SequenceState, num_tokens: int) -> None:
        """Append ``num_tokens`` token states, taking blocks as they are needed."""
        block_size = self.block_size
        table = seq.block_table
        remaining = num_tokens
        if table and seq.num_tokens % block_size:
            tail = table[-1]
            room = block_size - seq.num_tokens % block_size
            step = min(room, remaining)
            seq.num_tokens += step
            remaining -= step
            self._refresh_tail(tail, seq)
        if remaining > 0:
            self._append_blocks(seq, remaining)
        self._on_blocks_filled(seq)

    def _append_blocks(self, seq: SequenceState, num_tokens: int) -> None:
        """Fresh blocks for ``num_tokens`` tokens: full ones, then a partly filled tail."""
        block_size = self.block_size
        full, tail_tokens = divmod(num_tokens, block_size)
        new_blocks = [self._take_free_block() for _ in range(full + (tail_tokens > 0))]
        ref_count, filled, target = self.ref_count, self._filled, self._target
        for block_id in new_blocks:
            ref_count[block_id] = 1
            filled[block_id] = target[block_id] = block_size
        self._filled_sum += full * block_size
        self._target_sum += full * block_size
        self._live_blocks += len(new_blocks)
        self._logical_blocks += len(new_blocks)
        seq.block_table.extend(new_blocks)
        seq.num_tokens += num_tokens
        if tail_tokens:
            tail = new_blocks[-1]
            filled[tail] = target[tail] = 0
            self._partial_owners[tail] = [seq]
            self._set_fill(tail, tail_tokens, self._owner_target(seq, len(seq.block_table) - 1))

    def _owner_target(self, seq: SequenceState, block_index: int) -> int:
        return min(self.block_size, max(0, seq.final_len - block_index * self.block_size))

    def _refresh_tail(self, block_id: int, seq: SequenceState) -> None:
        """The tail block took more tokens; its owners (and so its target) are unchanged."""
        filled = seq.num_tokens - (len(seq.block_table) - 1) * self.block_size
        if filled >= self.block_size:
            self._partial_owners.pop(block_id, None)
            self._set_fill(block_id, self.block_size, self.block_size)
        else:
            self._filled_sum += filled - self._filled[block_id]
            self._filled[block_id] = filled

    def _retarget_tail(self, block_id: int, seq: SequenceState) -> None:
        """The tail block's owners changed (fork, copy-on-write): recompute its fill and target."""
        filled = seq.num_tokens - (len(seq.block_table) - 1) * self.block_size
        self._set_fill(block_id, filled, self._shared_target(block_id, len(seq.block_table) - 1))

    def _shared_target(self, block_id: int, block_index: int) -> int:
        return max(self._owner_target(owner, block_index) for owner in self._partial_owners[block_id])

    def _set_fill(self, block_id: int, filled: int, target: int) -> None:
        self._filled_sum += filled - self._filled[block_id]
        self._target_sum += target - self._target[block_id]
        self._filled[block_id] = filled
        self._target[block_id] = target

    def _drop_reference(self, seq: SequenceState, block_id: int) -> None:
        """``seq`` stops referencing ``block_id``; the block is freed when nobody else does."""
        owners = self._partial_owners.get(block_id)
        if owners is not None:
            owners.remove(seq)
        self.ref_count[block_id] -= 1
        if self.ref_count[block_id] > 0:
            if owners:
                self._set_fill(
                    block_id, self._filled[block_id], self._shared_target(block_id, self._index_of(seq))
                )
            return
        self._partial_owners.pop(block_id, None)
        self._live_blocks -= 1
        self._set_fill(block_id, 0, 0)
        self._return_free_block(block_id)

    def _index_of(self, seq: SequenceState) -> int:
        """Index of the sequence's last block: the only one that can be partly filled."""
        return len(seq.block_table) - 1
