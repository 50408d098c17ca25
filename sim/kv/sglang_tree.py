"""What SGLang's two hybrid radix caches share in kvsim: a coordinator over two pools of their own, one
tree holding slots in both, and sequences that lock a tree path and hold their own tokens after it
(``sim/kv/sglang_swa_radix.py``: full attention and sliding window; ``sim/kv/sglang_mamba_radix.py``:
full attention and Mamba states). Each pool's breakdown sums to that pool; the totals are their sums.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from policies._radix_tree import Key
from policies.base import (
    ALL_PUBLISHED,
    NO_HIT,
    MemoryBreakdown,
    PolicyInputError,
    PolicyStats,
    PrefixHit,
    grow_each_arguments_error,
    scheduled_mark,
    unknown_sequence,
)
from policies.prefix import block_pieces
from sim.kv.coordinator import Breakdown, KVCoordinator
from token_content import Segment, TokenContent, content_length, validate_content

__all__ = ["OwnSlots", "SGLangTreeCoordinator", "content_key", "prompt_key"]


@dataclass
class OwnSlots:
    """Sums over the live sequences of one pool's own slots: tokens, slots (whole pages), and the
    slots of those they will fill."""

    tokens: int = 0
    slots: int = 0
    target: int = 0

    def add(self, sign: int, num_tokens: int, start: int, end: int, filled: int) -> None:
        """Add (+1) or remove (-1) a sequence of ``num_tokens`` tokens whose own slots of this pool
        run from ``start`` to ``end`` (``filled``: to its final length or ``end``, the lesser)."""
        self.tokens += sign * (num_tokens - start)
        self.slots += sign * (end - start)
        self.target += sign * (filled - start)


def content_key(segments: Sequence[Segment], num_tokens: int) -> Key:
    """The first ``num_tokens`` tokens of ``segments`` (empty ones skipped) as a tree key."""
    kept = [segment for segment in segments if segment[1] > 0]
    ends, total = [], 0
    for _, length in kept:
        total += length
        ends.append(total)
    return block_pieces(kept, ends, 0, num_tokens)


def prompt_key(prompt: TokenContent, prompt_len: int, page_size: int) -> Key:
    """What admission matches: the prompt without its last token, in whole pages."""
    return content_key(prompt, (prompt_len - 1) // page_size * page_size)


class TreeSequence(Protocol):
    """What the shared code reads of a sequence."""

    seq_id: int
    final_len: int
    output_content_id: int
    base: tuple[Segment, ...]
    base_len: int
    num_tokens: int
    scheduled: int  # tokens of its prompt reported scheduled (ALL_PUBLISHED: all of them)


class _Tree(Protocol):
    full_locked: int
    full_shared: int

    def longest_match(self, key: Key, namespace: int) -> Any: ...

    def match_prefix(self, key: Key, namespace: int) -> tuple[Any, int]: ...


TreeT = TypeVar("TreeT", bound=_Tree)


def sequence_segments(seq: TreeSequence) -> tuple[Segment, ...]:
    """A sequence's content: its base, then the tokens it generated itself."""
    generated = seq.num_tokens - seq.base_len
    own = ((seq.output_content_id, generated),) if generated > 0 else ()
    return (*[segment for segment in seq.base if segment[1] > 0], *own)


def check_growth_lists(seq_ids: Sequence[int], num_tokens: Sequence[int]) -> None:
    """A growth of several sequences names each once, with its tokens."""
    if len(seq_ids) != len(num_tokens) or (len(seq_ids) > 1 and len(set(seq_ids)) != len(seq_ids)):
        raise grow_each_arguments_error(seq_ids, num_tokens)


def check_growth(seq_id: int, held_tokens: int, tokens: int, final_len: int) -> None:
    """A sequence of ``held_tokens`` grows by ``tokens``, within its final length."""
    if tokens <= 0 or held_tokens + tokens > final_len:
        raise PolicyInputError(
            f"sequence {seq_id}: cannot grow {held_tokens} by {tokens} tokens (final length {final_len})"
        )


class SGLangTreeCoordinator(KVCoordinator, Generic[TreeT]):
    """The shared part (see the module docstring); a subclass sets :attr:`tree`, :attr:`pool_tokens`,
    :attr:`page_slots`, builds its groups and gives :meth:`pool_breakdown`."""

    tree: TreeT  # (a type parameter: compiled, a subclass may not narrow an attribute's type)
    page_size: int
    max_model_len: int
    pool_tokens: tuple[int, int]
    page_slots: list[int]  # by pool index
    sequences: dict[int, Any]
    _stats: PolicyStats
    _tree_held: int  # tree tokens the sequences hold (their locked paths), counted once per sequence
    # With the engine driving, prompts enter the tree as their chunks are reported (defer_prompt_keys).
    _inserts_deferred: bool = False
    # Unbacked decode growth (defer_unbacked): what reads the decoded tokens no slot holds yet.
    _pending_tokens: Callable[[], int] | None = None

    def _part(self, index: int) -> Callable[[], Breakdown]:
        return lambda: self.pool_breakdown(index)

    def _pages(self, tokens: int) -> int:
        """Slots of the whole pages holding ``tokens`` tokens."""
        return -(-tokens // self.page_size) * self.page_size

    def _take_unbacked(self, ahead_tokens: int = 0) -> None:
        """Unbacked growth: evict what the pending tokens, and ``ahead_tokens`` more, need beyond the
        free slots. Every query and operation that reads the tree takes them first, so the tree is
        the one token-by-token growth would have left. (A coordinator that never defers: nothing.)"""

    # -- what a decode step reads once ---------------------------------------------------------------
    def may_share(self) -> bool:
        return True

    def token_sharing(self) -> tuple[int, int]:
        """The full-attention pool's (a sliding window or a Mamba state is a sequence's own): paths of
        the tree that several running sequences lock are read once. A sequence's own tokens past its
        path are its alone."""
        return self._tree_held - self.tree.full_locked, self.tree.full_shared

    # -- prefix hits ------------------------------------------------------------------------------
    def lookup(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        validate_content(prompt, "looked-up prompt", PolicyInputError)
        self._take_unbacked()
        prompt_len = content_length(prompt)
        if prompt_len <= 0:
            return NO_HIT
        matched = self.tree.longest_match(prompt_key(prompt, prompt_len, self.page_size), namespace).length
        return PrefixHit(matched) if matched else NO_HIT

    def match(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        """The scheduler's ``match_prefix``: splits and refreshes the tree."""
        validate_content(prompt, "matched prompt", PolicyInputError)
        self._take_unbacked()
        prompt_len = content_length(prompt)
        if prompt_len <= 0:
            return NO_HIT
        _, matched = self.tree.match_prefix(prompt_key(prompt, prompt_len, self.page_size), namespace)
        return PrefixHit(matched) if matched else NO_HIT

    # -- prompts entering the tree chunk by chunk -----------------------------------------------------
    def defer_prompt_keys(self) -> bool:
        self._inserts_deferred = True
        return True

    def prompt_scheduled(self, seq_id: int, tokens: int) -> None:
        """SGLang's ``cache_unfinished_req`` after a prefill chunk: the prompt so far enters the tree
        (:meth:`_cache_chunk`). A request admitted later can hit it; a request preempted mid-prefill
        leaves only its reported chunks there (the engine reports a chunk once its batch ran:
        sim/engine/chunk_reports.py)."""
        seq = self._get(seq_id)
        scheduled = scheduled_mark(seq.scheduled, tokens, seq.num_tokens)
        if scheduled == seq.scheduled:
            return  # (already reported that far)
        if seq.num_tokens > seq.base_len:
            # Decoding: its prompt was computed, and SGLang inserts nothing more until it finishes
            # (a decode step may have freed own slots of a window, which a lock must not reach).
            seq.scheduled = ALL_PUBLISHED
            return
        self._take_unbacked()
        start = seq.scheduled
        seq.scheduled = scheduled
        self._cache_chunk(seq, start, tokens if tokens < seq.num_tokens else seq.num_tokens)

    def _cache_chunk(self, seq: Any, start: int, end: int) -> None:
        """The prefill chunk of tokens ``[start, end)`` of ``seq``'s prompt ran: what of it enters the
        tree, as the cache's ``cache_unfinished_req`` inserts it."""
        raise NotImplementedError

    def scheduled_chunks_move_slots(self) -> bool:
        """A chunk entering the tree moves slots (a window's out of its lock to cached, a Mamba
        state's slot taken)."""
        return self._inserts_deferred

    # -- sequences --------------------------------------------------------------------------------
    def _check_new(self, seq_id: int, prompt: TokenContent, final_len: int) -> int:
        if seq_id in self.sequences:
            raise PolicyInputError(f"sequence {seq_id} is already allocated")
        validate_content(prompt, f"prompt of sequence {seq_id}", PolicyInputError)
        prompt_len = content_length(prompt)
        if prompt_len <= 0 or not prompt_len <= final_len <= self.max_model_len:
            raise PolicyInputError(
                f"sequence {seq_id}: needs 0 < prompt ({prompt_len}) <= final_len ({final_len}) <= "
                f"max_model_len ({self.max_model_len})"
            )
        return prompt_len

    def _fork_parent(self, parent_id: int, children: Sequence[Any]) -> Any:
        """The parent of a fork, its children checked: ids not in use, lengths from the parent's to
        ``max_model_len``."""
        parent = self._get(parent_id)
        for child in children:
            if (
                child.seq_id in self.sequences
                or not parent.num_tokens <= child.final_len <= self.max_model_len
            ):
                raise PolicyInputError(
                    f"fork of {parent_id}: child {child.seq_id} is in use or its length is out of range"
                )
        return parent

    def _get(self, seq_id: int) -> Any:
        try:
            return self.sequences[seq_id]
        except KeyError:
            raise unknown_sequence(seq_id) from None

    def _growths(self, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> Iterator[tuple[Any, int]]:
        """Each growth's sequence and tokens, checked (distinct ids, within its final length)."""
        check_growth_lists(seq_ids, num_tokens)
        # (Indexes, lengths checked above: compiled, zip(strict=True) is a call with keywords.)
        for index in range(len(seq_ids)):
            seq_id, tokens = seq_ids[index], num_tokens[index]
            seq = self._get(seq_id)
            check_growth(seq_id, seq.num_tokens, tokens, seq.final_len)
            yield seq, tokens

    def grow(self, seq_id: int, num_tokens: int) -> None:
        self.grow_each([seq_id], [num_tokens])

    def seq_len(self, seq_id: int) -> int:
        return self._get(seq_id).num_tokens

    # -- accounting -------------------------------------------------------------------------------
    def pool_breakdown(self, index: int) -> Breakdown:
        raise NotImplementedError

    def group_breakdown_values(self) -> list[int]:
        return [*self.pool_breakdown(0), *self.pool_breakdown(1)]

    def breakdown_values(self) -> Breakdown:
        first, second = self.pool_breakdown(0), self.pool_breakdown(1)
        used, reserved, internal, external, cached, free = (a + b for a, b in zip(first, second, strict=True))
        return used, reserved, internal, external, cached, free

    def breakdown_bytes(self) -> dict[str, int]:
        """Each pool's slots at its own group's ``slot_bytes``."""
        totals = dict.fromkeys(MemoryBreakdown.CATEGORIES, 0)
        for index, group in enumerate(self.groups):
            for name, value in zip(MemoryBreakdown.CATEGORIES, self.pool_breakdown(index), strict=True):
                totals[name] += value * group.slot_bytes
        return totals

    def host_breakdown_values(self) -> tuple[int, int]:
        return 0, 0

    @property
    def stats(self) -> PolicyStats:
        return self._stats

    def evictions(self) -> int:
        return self._stats.evictions

    def cow_copies(self) -> int:
        return 0  # (a fork copies its parent's own tokens; nothing is copied on write)

    @property
    def host_tier(self) -> None:
        return None
