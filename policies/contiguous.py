"""Contiguous per-sequence reservations: the systems before PagedAttention (the vLLM paper's Orca
baselines, and the seeds' "static preallocation").

Each sequence reserves ONE contiguous region of a linear KV address space of ``kv_pool_tokens``
slots, sized once, at admission, by a *reservation* rule:

* ``max``: ``max_model_len`` slots (Orca-Max, static preallocation);
* ``pow2``: the prompt plus the next power of two >= the true output length, capped at
  ``max_model_len`` (Orca-Pow2: a true output of 25 tokens reserves 32 output slots). An output of
  0 reserves just the prompt; 1 reserves 1 slot;
* ``oracle``: exactly ``final_len`` (Orca-Oracle).

*Placement* picks the region: ``first_fit`` (lowest-address hole that fits), ``best_fit`` (smallest
hole that fits, lowest address on ties) or ``buddy`` (the region is rounded up to a power-of-two
chunk; chunks split and merge with their buddies). Freed regions coalesce with free neighbours.
Growth always stays inside the reservation (``final_len <= reservation``), so it never fails, and a
fork physically copies the parent's tokens into each child's own new region.

Memory breakdown (slots; sums to the pool):

* ``used``: tokens the live sequences hold now;
* ``reserved``: ``final_len - current length`` per sequence: slots that will be filled later;
* ``internal_fragmentation``: ``region size - final_len`` per sequence: reservation beyond the
  final length, plus the buddy's rounding up to a power of two;
* ``external_fragmentation``: free slots stranded by a request that cannot be placed: when the
  *reference reservation* fits in no hole (buddy: no free chunk) although it would fit in the empty
  pool, every free slot counts, since every piece (a hole between regions, the pool's tail, a buddy
  chunk) is too small for it; otherwise none does. So an empty pool, a pool where the reference fits
  somewhere, and a reference larger than the empty pool could ever place (a request that is rejected,
  not blocked) all report 0. This is the vLLM paper's "holes too small for the next reservation", and
  it counts the tail too small for a whole reservation as paged policies count the pool's tail past
  the last whole block. The reference is the region size of the most recent reservation this policy
  was asked about: by ``can_admit`` (whether it fits or not: the scheduler asks before admitting, so a
  request waiting for memory is the one measured; the engine's report of what holds the queue's head
  back asks ``can_admit_quietly``, which notes nothing: single steps would ask more often than
  skipped ones), or by a *successful* ``admit`` or ``fork`` (the last
  child), which stands for "the next request of this size". A failed ``admit``/``fork`` changes
  nothing, the reference included, as every error must (see :class:`policies.base.KVCachePolicy`).
  For ``buddy`` the reference is the power-of-two chunk the request needs. Before any request it is
  ``max_model_len`` under ``max`` and 1 otherwise. Free slots in holes smaller than the reference
  while it still fits elsewhere are ``free``: nothing is blocked by them yet (:meth:`free_pieces` lists
  the holes for a finer look);
* ``cached`` is always 0 (no prefix cache); ``free`` is the rest.

Costs: ``first_fit``/``best_fit`` are O(log holes) per admit/free/fork child (treaps, see
:mod:`policies._free_space`), ``buddy`` O(log pool); ``grow`` is O(1); ``breakdown`` is O(log holes)
(one fit query), O(log pool) for buddy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies._free_space import BuddySpace, FreeSpace, HoleSpace, ceil_pow2
from policies.base import (
    ChildSpec,
    KVCachePolicy,
    OutOfKVMemory,
    PolicyInputError,
    PoolSpec,
    register,
)
from token_content import TokenContent, content_length, validate_content

RESERVATIONS = ("max", "pow2", "oracle")
PLACEMENTS = ("first_fit", "best_fit", "buddy")


@dataclass(slots=True, init=False)
class _Sequence:
    """(Its constructor is written out: compiled, it runs natively, once per sequence.)"""

    start: int
    size: int  # slots of the region (>= final_len)
    prompt_len: int  # the original prompt: forks size their children's reservations from it
    final_len: int
    length: int

    def __init__(self, start: int, size: int, prompt_len: int, final_len: int, length: int) -> None:
        self.start = start
        self.size = size
        self.prompt_len = prompt_len
        self.final_len = final_len
        self.length = length


class ContiguousPolicy(KVCachePolicy):
    """One contiguous region per sequence; see the module docstring."""

    OPTION_VALUES: ClassVar = {"reservation": RESERVATIONS, "placement": PLACEMENTS}  # for `kvsim policies`
    uses_blocks: ClassVar[bool] = False

    @classmethod
    def pool_slots_from_memory(cls, memory_slots: int, block_size: int, options: Mapping[str, object]) -> int:
        """Every slot the KV memory holds: a linear address space has no blocks, so ``block_size``
        must not shrink it (OPT-13B with 12 GiB: 15,728 slots at any block size)."""
        return memory_slots

    # The options are typed ``object``: they come from YAML, and a compiled build would refuse a
    # value of another type with a bare TypeError before this could name the option.
    def __init__(self, pool: PoolSpec, reservation: object = "max", placement: object = "first_fit"):
        super().__init__(pool)
        self.reservation = _choice("reservation", reservation, RESERVATIONS)
        self.placement = _choice("placement", placement, PLACEMENTS)
        self._space: FreeSpace = (
            BuddySpace(pool.kv_pool_tokens)
            if placement == "buddy"
            else HoleSpace(pool.kv_pool_tokens, best_fit=placement == "best_fit")
        )
        self._sequences: dict[int, _Sequence] = {}
        # Running sums over live sequences, so breakdown() never walks them.
        self._used = 0  # sum of lengths
        self._final_total = 0  # sum of final_len
        self._region_total = 0  # sum of region sizes
        self._reference = self._space.region_size(pool.max_model_len if reservation == "max" else 1)

    # Speculative decoding's slots fit inside the reservation: the engine admits a sequence with a
    # final length that counts them, and the longest reservation grows by them.
    HOLDS_LOOKAHEAD = True

    def hold_lookahead(self, slots: int) -> None:
        super().hold_lookahead(slots)
        if self.reservation == "max":
            self._reference = self._space.region_size(self.pool.max_model_len + slots)

    # -- read-only helpers (tests, engine diagnostics) ---------------------------------------------
    def reservation_size(self, prompt_len: int, final_len: int) -> int:
        """Slots the reservation rule asks for (before buddy rounding)."""
        longest = self.pool.max_model_len + self.lookahead_slots
        if self.reservation == "max":
            return longest
        if self.reservation == "oracle":
            return final_len
        output = final_len - prompt_len
        return min(prompt_len + (ceil_pow2(output) if output > 0 else 0), longest)

    def region_size(self, reservation: int) -> int:
        """Slots a reservation really takes: buddy placement rounds up to a power of two."""
        return self._space.region_size(reservation)

    def region(self, seq_id: int) -> tuple[int, int]:
        """``(start, size)`` of the sequence's region (size includes buddy rounding)."""
        sequence = self._get(seq_id)
        return sequence.start, sequence.size

    def free_pieces(self) -> list[tuple[int, int]]:
        """Free holes (buddy: free chunks) as ``(start, size)`` in address order. O(holes)."""
        return self._space.pieces()

    @property
    def reference_size(self) -> int:
        """Region size below which a free hole counts as external fragmentation."""
        return self._reference

    # -- sequences ---------------------------------------------------------------------------------
    def _region_size(self, prompt_len: int, final_len: int) -> int:
        return self._space.region_size(self.reservation_size(prompt_len, final_len))

    def _get(self, seq_id: int) -> _Sequence:
        try:
            return self._sequences[seq_id]
        except KeyError:
            raise PolicyInputError(f"unknown sequence {seq_id} (never admitted, or already freed)") from None

    def _has_sequence(self, seq_id: int) -> bool:
        return seq_id in self._sequences

    def _out_of_memory(self, what: str, size: int) -> OutOfKVMemory:
        free = self._space.free_slots
        return self._allocation_failure(
            f"{what}: no free contiguous region of {size} slots ({free} slots free in total)", size, free
        )

    def _add(self, seq_id: int, start: int, size: int, prompt_len: int, final_len: int, length: int) -> None:
        self._sequences[seq_id] = _Sequence(start, size, prompt_len, final_len, length)
        self._used += length
        self._final_total += final_len
        self._region_total += size

    def can_admit(self, prompt: TokenContent, final_len: int, namespace: int = 0) -> bool:
        # The only side effect: this request becomes the external-fragmentation reference.
        self._reference = self._region_size(content_length(prompt), final_len)
        return self._space.find(self._reference) is not None

    def can_admit_quietly(self, prompt: TokenContent, final_len: int, namespace: int = 0) -> bool:
        return self._space.find(self._region_size(content_length(prompt), final_len)) is not None

    def admit(
        self, seq_id: int, prompt: TokenContent, final_len: int, output_content_id: int, namespace: int = 0
    ) -> int:
        # output_content_id and namespace only matter to policies that share cached content.
        prompt_len = self._check_new_sequence(seq_id, prompt, final_len)
        size = self._region_size(prompt_len, final_len)
        start = self._space.allocate(size)
        if start is None:
            raise self._out_of_memory(f"admit sequence {seq_id}", size)
        self._add(seq_id, start, size, prompt_len, final_len, prompt_len)
        self._reference = size
        return 0  # no prefix cache

    def grow(self, seq_id: int, num_tokens: int, content: TokenContent | None = None) -> None:
        sequence = self._get(seq_id)
        self._check_growth(seq_id, num_tokens, sequence.length, sequence.final_len)
        if content is not None:
            validate_content(content, f"growth of sequence {seq_id}", PolicyInputError)
            if content_length(content) != num_tokens:
                raise PolicyInputError(
                    f"sequence {seq_id}: growth content holds {content_length(content)} tokens, "
                    f"not num_tokens={num_tokens}"
                )
        # final_len <= region size, so growth always fits in the reservation: no allocation.
        sequence.length += num_tokens
        self._used += num_tokens

    def fork(self, parent_id: int, children: Sequence[ChildSpec]) -> None:
        parent = self._get(parent_id)
        self._check_children(parent_id, parent.length, children)
        placed: list[tuple[ChildSpec, int, int]] = []
        for child in children:
            size = self._region_size(parent.prompt_len, child.final_len)
            start = self._space.allocate(size)
            if start is None:
                # All or nothing. Releasing in reverse restores the exact free structure: holes
                # are always maximal and buddy chunks always fully merged, so it is canonical.
                for _, placed_start, placed_size in reversed(placed):
                    self._space.release(placed_start, placed_size)
                raise self._out_of_memory(f"fork of {parent_id}: child {child.seq_id}", size)
            placed.append((child, start, size))
        for child, start, size in placed:
            self._add(child.seq_id, start, size, parent.prompt_len, child.final_len, parent.length)
        if placed:
            self._reference = placed[-1][2]
        # Contiguous regions cannot share: every child gets a physical copy of the parent's tokens.
        self.stats.fork_copied_tokens += parent.length * len(placed)

    def free(self, seq_id: int, finished: bool = True) -> None:
        # (No cache: why the sequence leaves plays no part.)
        sequence = self._get(seq_id)
        self._space.release(sequence.start, sequence.size)
        del self._sequences[seq_id]
        self._used -= sequence.length
        self._final_total -= sequence.final_len
        self._region_total -= sequence.size

    # -- capacity and accounting -------------------------------------------------------------------
    def largest_region(self) -> int:
        """The largest region an empty pool can place (buddy: its largest top-level chunk)."""
        if isinstance(self._space, BuddySpace):
            return max(size for _, size in self._space.top_level)
        return self.pool.kv_pool_tokens

    def _external_fragmentation(self) -> int:
        if self._reference > self.largest_region() or self._space.find(self._reference) is not None:
            return 0  # nothing is blocked: the reference fits now, or never will (it is rejected)
        return self._space.free_slots  # no piece fits the reference: every free piece is smaller

    def sharing_slots(self) -> tuple[int, int]:
        # used + reserved + internal fragmentation: the regions, without computing the breakdown.
        return self._region_total, self._region_total

    def breakdown_values(self) -> tuple[int, int, int, int, int, int]:
        external = self._external_fragmentation()
        return (
            self._used,
            self._final_total - self._used,
            self._region_total - self._final_total,
            external,
            0,
            self._space.free_slots - external,
        )

    def slots_needed_to_grow(self, seq_id: int, num_tokens: int) -> int:
        self._get(seq_id)
        return 0  # growth stays inside the reservation

    def growth_room(self, seq_id: int) -> int:
        sequence = self._get(seq_id)
        return sequence.final_len - sequence.length  # growth stays inside the reservation

    def available_slots(self) -> int:
        return self._space.free_slots

    def seq_len(self, seq_id: int) -> int:
        return self._get(seq_id).length

    def final_len(self, seq_id: int) -> int:
        """The length the sequence will reach (given at admission or fork)."""
        return self._get(seq_id).final_len

    def live_sequences(self) -> Iterable[int]:
        return list(self._sequences)


def _choice(option: str, value: object, valid: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in valid:
        raise PolicyInputError(f"contiguous: unknown {option} {value!r}; valid values: {', '.join(valid)}")
    return value


register("contiguous", ContiguousPolicy)
