"""One object between the engine and KV memory, over the model's KV groups.

A *KV group* is a set of layers whose cache one allocation policy manages (vLLM's KV-cache groups:
``KVCacheCoordinator`` over one ``SingleTypeKVCacheManager`` per group). A model whose layers are all
full attention has one group; a hybrid model (sliding-window, chunked-local, Mamba layers) has one
per layer kind. Every sequence lives in every group, with the same tokens.

What the coordinator decides, so that the engine never has to know how many groups there are:

* **A prefix hit is the longest prefix every group can serve** (vLLM ``find_longest_cache_hit``
  over the groups): a request skips only tokens that every group holds, so each group is admitted
  with its hit capped at the shortest one (:meth:`~policies.base.KVCachePolicy.admit_capped`).
* **All or nothing.** An admission, a growth or a fork either happens in every group or in none: each
  group's need is checked against its own pool before any group changes, and a fork that fails in a
  later group is undone in the earlier ones.
* **Accounting per group.** Each group's breakdown sums to its own pool; the totals are their sums
  (in slots: one token of one group's layers each), so the identity holds per group and in total.
* **Room is the scarcest group's.** A token needs a slot in every group, so the slots available to
  growth are the minimum over the groups, and a sequence's growth room likewise.

:class:`SingleGroupCoordinator` is the one-group case (every model kvsim could express before
hybrid layers): it hands each call straight to its one policy, so the seam costs one call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from mypy_extensions import mypyc_attr

from policies._host_tier import HostPool
from policies.base import (
    ChildSpec,
    KVCachePolicy,
    MemoryBreakdown,
    PolicyStats,
    PrefixHit,
)
from token_content import TokenContent

__all__ = ["Breakdown", "KVCoordinator", "KVGroup", "least_rooms", "put_breakdown", "zero_breakdowns"]

Breakdown = tuple[int, int, int, int, int, int]


@dataclass(frozen=True)
class KVGroup:
    """Layers of one kind and the policy that manages their cache. ``slot_bytes`` is what one token's
    slot holds in this group (its layers' K and V), so a group's slots convert to bytes."""

    name: str
    policy: KVCachePolicy
    slot_bytes: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.slot_bytes, bool) or not isinstance(self.slot_bytes, int) or self.slot_bytes <= 0:
            raise ValueError(
                f"KV group {self.name!r}: slot_bytes must be a positive integer, got {self.slot_bytes!r}"
            )


@mypyc_attr(allow_interpreted_subclasses=True)
class KVCoordinator:
    """What the engine asks of KV memory (the methods of :class:`~policies.base.KVCachePolicy` it
    needs, with the same meaning, applied to every group). Build one with :func:`make_coordinator`."""

    groups: tuple[KVGroup, ...]
    pool_slots: int
    slots_per_token: int = 1
    """Slots one more token of a sequence fills: one in each group whose slots hold tokens (a Mamba
    group's state block holds none)."""
    context_tokens: int = 0
    """Tokens of context the pool holds, counting only the layers that keep every token (full
    attention): a window, a chunk or a state holds a bounded amount per sequence, so it is what
    arrivals fill (the steady-state probe's fill time, ``sim/planning/sweeps/steady.py``)."""
    lookahead_slots: int = 0
    """Slots every decoding sequence holds past its tokens (speculative decoding): counted into the
    final length each sequence is admitted with."""

    def hold_lookahead(self, slots: int) -> None:
        """Every decoding sequence holds ``slots`` slots past its tokens from now on."""
        raise NotImplementedError(f"{type(self).__name__} holds no lookahead slots (speculative decoding)")

    def lookup(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        raise NotImplementedError

    def match(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        raise NotImplementedError

    def can_admit(self, prompt: TokenContent, final_len: int) -> bool:
        raise NotImplementedError

    def can_admit_quietly(self, prompt: TokenContent, final_len: int) -> bool:
        """:meth:`can_admit` as a reading, leaving no note (``KVCachePolicy.can_admit_quietly``)."""
        return self.can_admit(prompt, final_len)

    def admit(
        self, seq_id: int, prompt: TokenContent, final_len: int, output_content_id: int, namespace: int = 0
    ) -> int:
        raise NotImplementedError

    def grow(self, seq_id: int, num_tokens: int) -> None:
        raise NotImplementedError

    def grow_each(self, seq_ids: list[int], num_tokens: list[int]) -> list[int]:
        raise NotImplementedError

    def fits_growth(self, seq_ids: list[int], num_tokens: int) -> bool:
        """Could every sequence of ``seq_ids`` take ``num_tokens`` more tokens now?"""
        return self.fits_growth_each(seq_ids, [num_tokens] * len(seq_ids))

    def fits_growth_each(self, seq_ids: list[int], num_tokens: list[int]) -> bool:
        """Would :meth:`grow_each` of these sequences and tokens succeed now? It depends only on the
        sequences whose growth moves blocks: one that stays inside its held slots changes nothing."""
        raise NotImplementedError

    def fork(self, parent_id: int, children: Sequence[ChildSpec]) -> None:
        raise NotImplementedError

    def free(self, seq_id: int, finished: bool = True) -> None:
        raise NotImplementedError

    def growth_room(self, seq_id: int) -> int:
        raise NotImplementedError

    def available_slots(self) -> int:
        raise NotImplementedError

    def available_slots_with_hit_locked(self, prompt: TokenContent) -> int:
        """:meth:`available_slots` once the cached prefix ``prompt`` would hit is locked: its tokens
        no running request holds are evictable now, and not once a request holds them (SGLang's
        ``add_one_req`` locks the matched node before it checks its budget). Default: a pool whose
        hits this does not apply to, or that caches nothing: :meth:`available_slots`."""
        return self.available_slots()

    def seq_len(self, seq_id: int) -> int:
        raise NotImplementedError

    def prepare_decode_step(self, num_sequences: int) -> None:
        raise NotImplementedError

    def follow_steps(self, steps: Callable[[], int]) -> None:
        """``steps()`` is the engine's scheduler step of the operation in progress, for a pool whose
        cache stamps pages with time (``jenga``'s). Default: nothing to stamp."""

    def releases_while_decoding(self) -> bool:
        """Can a decoding sequence give memory back (a sliding window's or a chunk's blocks leaving,
        a state released)? Then a flush may let a request in that did not fit before it. One group
        never does; a pool of several may (the coordinators that know better say so)."""
        return len(self.groups) > 1

    def defer_prompt_keys(self) -> bool:
        """Make prompts' blocks hittable as their chunks are scheduled (``KVCachePolicy.defer_prompt_keys``);
        returns whether the pool does. Default: it caches no prompt."""
        return False

    def prompt_scheduled(self, seq_id: int, tokens: int) -> None:
        """``seq_id``'s first ``tokens`` tokens are scheduled (``KVCachePolicy.prompt_scheduled``).
        A pool that keys prompts at admission has nothing to do."""

    def scheduled_chunks_move_slots(self) -> bool:
        """Can a reported chunk (:meth:`prompt_scheduled`) move slots between the categories of the
        breakdown? Then the engine steps the iterations that prefill, so that each move is observed
        at its own iteration. Default: no (a chunk only makes held blocks hittable)."""
        return False

    def can_defer_unbacked(self) -> bool:
        """Can decode growth go past the slots sequences hold (``KVCachePolicy.can_defer_unbacked``)?
        One group whose policy can: a pool of several groups tells each of every token."""
        return False

    def defer_unbacked(self, pending_tokens: Callable[[], int] | None) -> None:
        raise NotImplementedError

    def evict_for_unbacked(self, ahead_tokens: int) -> int:
        raise NotImplementedError

    def unbacked_draws(self) -> tuple[int, ...]:
        """Per entry of a split by group (``group_entries``), the free slots a pending token of
        unbacked growth takes there."""
        raise NotImplementedError

    def breakdown_values(self) -> Breakdown:
        raise NotImplementedError

    def sharing_slots(self) -> tuple[int, int]:
        raise NotImplementedError

    def sharing_slots_of(self, breakdown: Breakdown) -> tuple[int, int]:
        """:meth:`sharing_slots`, for a caller that has just read the pool's ``breakdown``: a
        coordinator whose groups never share a slot reads it from there."""
        return self.sharing_slots()

    def shared_slots(self) -> int:
        """Slots two or more live sequences hold, each counted once (0: not tracked)."""
        return 0

    def token_sharing(self) -> tuple[int, int]:
        """``(re-read, shared)``, in tokens of the full-attention layers: the slots sharing saves
        (logical - physical) and the slots two or more sequences hold, each once. A decode step reads
        the shared ones once (``sim/engine/shared_reads.py``). ``(0, 0)``: nothing tracked."""
        return 0, 0

    def may_share(self) -> bool:
        """Whether :meth:`token_sharing` can ever report anything (else nothing asks it)."""
        return False

    def host_breakdown_values(self) -> tuple[int, int]:
        raise NotImplementedError

    @property
    def stats(self) -> PolicyStats:
        raise NotImplementedError

    def evictions(self) -> int:
        """Cached blocks evicted so far, in every group: what the engine compares around an operation
        (cheaper than :attr:`stats`, which a coordinator of several groups builds afresh)."""
        return self.stats.evictions

    def cow_copies(self) -> int:
        """Blocks copied on write so far, in every group."""
        return self.stats.cow_copies

    @property
    def host_tier(self) -> HostPool | None:
        raise NotImplementedError

    def group_breakdowns(self) -> dict[str, MemoryBreakdown]:
        """Each entry's breakdown by its name (:meth:`group_entries`): together they sum to the pool."""
        names, _ = self.group_entries()
        values = self.group_breakdown_values()
        width = len(MemoryBreakdown.CATEGORIES)
        return {
            name: MemoryBreakdown(*values[index * width : (index + 1) * width])
            for index, name in enumerate(names)
        }

    def group_entries(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The entries of :meth:`group_breakdown_values` (each group; a hybrid allocator adds its
        shared pools' free blocks) and whether each entry's slots hold tokens (a bool, or how many
        slots a token fills there: ``jenga``'s groups, ``sim/kv/jenga.py``)."""
        return tuple(group.name for group in self.groups), tuple(True for _ in self.groups)

    def group_breakdown_values(self) -> list[int]:
        """Every entry's breakdown, flat, in :meth:`group_entries` order: a new list, the caller's to
        change (the engine moves its pending tokens into it and keeps it, at every observation)."""
        values: list[int] = []
        for group in self.groups:
            values.extend(group.policy.breakdown_values())
        return values

    def breakdown_bytes(self) -> dict[str, int]:
        """The breakdown in bytes over every group (each group's slots at its own ``slot_bytes``)."""
        totals = dict.fromkeys(MemoryBreakdown.CATEGORIES, 0)
        for group in self.groups:
            for name, slots in group.policy.breakdown().as_dict().items():
                totals[name] += slots * group.slot_bytes
        return totals


def least_rooms(rooms: list[int] | None, more: list[int]) -> list[int]:
    """Each sequence's growth room over a pool's groups so far: the least (``rooms``: the caller's own
    list, lowered in place; None before the first group)."""
    if rooms is None:
        return more
    assert len(rooms) == len(more)
    # (An index loop, not zip(strict=True): compiled, this runs at every flush of every group.)
    for index in range(len(rooms)):
        if more[index] < rooms[index]:
            rooms[index] = more[index]
    return rooms


_WIDTH: Final = len(MemoryBreakdown.CATEGORIES)  # used, reserved, internal, external, cached, free


def zero_breakdowns(entries: int) -> list[int]:
    """A flat list of ``entries`` breakdowns, every value zero (:func:`put_breakdown` fills it)."""
    return [0] * (_WIDTH * entries)


def put_breakdown(values: list[int], entry: int, breakdown: Breakdown) -> None:
    """``breakdown``'s six values as the ``entry``-th of ``values`` (:func:`zero_breakdowns`'s list).
    Only the values that are not zero are written, and one by one: compiled, a breakdown is then
    never made a tuple object, and most of a group split's values are zero by construction (a
    group's free slots, a pool's used ones). This runs for every group at every observation of a
    hybrid pool."""
    used, reserved, internal, external, cached, free = breakdown
    start = entry * _WIDTH
    if used:
        values[start] = used
    if reserved:
        values[start + 1] = reserved
    if internal:
        values[start + 2] = internal
    if external:
        values[start + 3] = external
    if cached:
        values[start + 4] = cached
    if free:
        values[start + 5] = free
