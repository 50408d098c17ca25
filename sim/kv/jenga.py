"""``policy: jenga``: Jenga's two-level allocator (Zhang et al., SOSP 2025, arXiv 2503.18292) behind
the engine's coordinator interface.

One group per layer type (``sim/hardware/jenga_capacity.py``), each with the layer kind's rules for
which blocks a sequence holds (``policies/hybrid/``: full attention keeps every block, a sliding
window or an attention chunk releases what left it, a Mamba state is one page per request), and a
small-page allocator of its own over the large pages all types share
(``policies/hybrid/jenga_pages.py``). A kind's manager keeps the runs of block positions and their
accounting; this coordinator gives each held position a small page. (With prefix caching the pages
are the managers' own block ids, with identities: ``sim/kv/jenga_prefix.py``.)

What the coordinator decides (as :class:`~sim.kv.coordinator.MultiGroupCoordinator` does for vLLM's
groups): every operation happens in every group or in none, released blocks are freed before a step
takes new ones (vLLM's order), and a request fits when Jenga's quota rule finds it the large pages
(``jenga_pages.py``). Growing one sequence is checked exactly; growing several at once (an engine
flush) only when the free large pages alone would hold every new small page, or no block is
released and every type's free small pages hold its new ones; else it is refused whole, and the
engine grows those sequences one token at a time, each checked exactly.

Accounting, in slots of ``slot_bytes`` (one token of one attention layer): a group holds the large
pages it carved. Its small pages held by sequences are used, reserved and internal fragmentation as
in ``vllm-hybrid`` (scaled by the group's slots per token); its free small pages are **external
fragmentation**: free memory that only this type can take, lost to the other types until every
small page of its large page is free (the waste Jenga's LCM allocator bounds but does not remove).
The large pages no type holds are free. So per group used + reserved + internal + external = its
large pages, and with the free large pages the groups sum to the pool at every instant.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import NoReturn

from mypy_extensions import mypyc_attr

from policies.base import NO_HIT, ChildSpec, MemoryBreakdown, OutOfKVMemory, PolicyStats, PoolSpec, PrefixHit
from policies.hybrid.block_pool import SharedBlockPool
from policies.hybrid.group import GroupManager, GrowthStep, moves
from policies.hybrid.jenga_pages import (
    LargePagePool,
    NamedHoldings,
    SmallPageAllocator,
    TypeHoldings,
    TypePages,
    WholeHoldings,
    WholePages,
    quotas,
)
from sim.hardware.jenga_capacity import JengaCapacity
from sim.hardware.layers import FullAttention
from sim.kv.allocators import group_manager  # (each layer kind's rules, as vllm-hybrid builds them)
from sim.kv.coordinator import Breakdown, KVCoordinator, KVGroup
from sim.kv.interface import least_rooms, put_breakdown, zero_breakdowns
from token_content import TokenContent, content_length

__all__ = ["JengaCoordinator"]


@mypyc_attr(allow_interpreted_subclasses=True)
class JengaCoordinator(KVCoordinator):
    def __init__(self, capacity: JengaCapacity, names: Sequence[str], prefill_tokens: int):
        self.capacity = capacity
        block_size = capacity.block_size
        self.block_size = block_size
        self.large_pages = LargePagePool(capacity.num_blocks)
        self.large_slots = capacity.large_page_slots
        self.managers: list[GroupManager] = []
        self.allocators: list[TypePages] = []
        self.holdings: list[TypeHoldings] = []  # per group, its sequences' pages (not with prefix caching)
        self.page_slots: list[int] = []  # slots of one small page, per group
        self.holds: list[bool] = []
        groups = []
        for name, group in zip(names, capacity.groups, strict=True):
            slots = capacity.small_page_slots(group)
            most = capacity.num_blocks * group.ratio  # (what one type could ever hold)
            spec = PoolSpec(most * block_size, block_size, capacity.max_model_len, capacity.slot_bytes)
            allocator = self._type_pages(group.ratio)
            manager = group_manager(group.kind, spec, self._type_pool(allocator), prefill_tokens)
            self.managers.append(manager)
            self.allocators.append(allocator)
            self.page_slots.append(slots)
            self.holds.append(group.holds_tokens)
            groups.append(KVGroup(name, manager, capacity.slot_bytes))
        self.groups = tuple(groups)
        self.pool_slots = capacity.num_blocks * self.large_slots
        self.slots_per_token = sum(
            s // block_size for s, h in zip(self.page_slots, self.holds, strict=True) if h
        )
        self._token_groups = max(1, sum(self.holds))
        # (A token takes a small page's share in every full-attention type: what fills the pool.)
        full_slots = sum(
            slots // block_size
            for slots, group in zip(self.page_slots, capacity.groups, strict=True)
            if isinstance(group.kind, FullAttention)
        )
        self.context_tokens = self.pool_slots // (full_slots or max(1, self.slots_per_token))
        self._stats = PolicyStats()
        self._requests: dict[int, int] = {}  # sequence -> the allocators' request id
        self._next_request = 0
        # Every type's small page a whole large page (equal page sizes, as gpt-oss's two kinds):
        # Jenga's quota is then what each type needs, and growth needs no plans (_grow_whole_pages).
        whole = [holdings.whole for holdings in self.holdings if isinstance(holdings, WholeHoldings)]
        self._whole_pages: list[WholePages] = whole if len(whole) == len(self.holdings) else []

    def _type_pages(self, ratio: int) -> TypePages:
        """A type's small pages, and how its sequences hold them: by count when a small page is a whole
        large page (no id of it is ever read), else by id."""
        holdings: TypeHoldings
        if ratio == 1:
            # (Its sequences' counts are their runs, which this type's manager, made next, keeps.)
            runs = partial(self._runs_of, len(self.holdings))
            holdings = WholeHoldings(WholePages(self.large_pages), runs)
        else:
            holdings = NamedHoldings(SmallPageAllocator(self.large_pages, ratio))
        self.holdings.append(holdings)
        return holdings.pages

    def _runs_of(self, group: int, seq_id: int) -> tuple[int, int]:
        return self.managers[group].held_blocks(seq_id)

    def _type_pool(self, allocator: TypePages) -> SharedBlockPool:
        """The block pool a type's manager keeps its runs over: here only a count (this coordinator
        gives each held position a small page); with prefix caching, the pages themselves
        (``sim/kv/jenga_prefix.py``)."""
        return SharedBlockPool(allocator.large_pages.num_pages * allocator.ratio, self.block_size)

    def _free_large(self) -> int:
        """Large pages a quota may carve: the free ones (with prefix caching, the wholly cached too)."""
        return self.large_pages.free

    def _free_pages(self, group: int) -> int:
        """Small pages of ``group`` the quota rule counts as free (with prefix caching, evictable too)."""
        return self.allocators[group].free_small

    # -- prefix hits: none without prefix caching (``sim/kv/jenga_prefix.py`` has them) -------------
    def lookup(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        return NO_HIT

    def match(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        return NO_HIT

    # -- admission and forks ----------------------------------------------------------------------
    def _new_requests_fit(self, needs: list[list[int]]) -> bool:
        """Do new requests, each needing ``needs[i][g]`` small pages of group ``g``, fit one after the
        other? (A new request has no preferred pages: it takes its whole quota.)"""
        if self._whole_pages:  # (every quota is what its type needs: no type has free small pages)
            needed = 0
            for request in needs:
                for pages in request:
                    needed += pages
            return needed <= self.large_pages.free
        free_large = self._free_large()
        free_small = [self._free_pages(group) for group in range(len(self.allocators))]
        for request in needs:
            ratios = [allocator.ratio for allocator in self.allocators]
            quota = quotas(free_large, list(zip(request, ratios, free_small, strict=True)))
            if quota is None:
                return False
            free_large -= sum(quota)
            assert len(request) == len(ratios) == len(quota)
            for g, (needed, ratio, taken) in enumerate(zip(request, ratios, quota)):  # noqa: B905 (lengths checked above; compiled, strict=True costs a call with keywords)
                free_small[g] += taken * ratio - needed
        return True

    def _prompt_needs(self, prompt: TokenContent) -> list[int]:
        length = content_length(prompt)
        return [end - first for first, end in (m.prefill_run(length) for m in self.managers)]

    def can_admit(self, prompt: TokenContent, final_len: int) -> bool:
        return self._new_requests_fit([self._prompt_needs(prompt)])

    def admit(
        self, seq_id: int, prompt: TokenContent, final_len: int, output_content_id: int, namespace: int = 0
    ) -> int:
        needs = self._prompt_needs(prompt)
        if not self._new_requests_fit([needs]):
            self._refuse(f"admitting sequence {seq_id}", needs)
        for manager in self.managers:  # (the first checks the sequence: nothing changes if it is bad)
            manager.admit(seq_id, prompt, final_len, output_content_id, namespace)
        self._take_new(seq_id, needs)
        return 0

    def _take_new(self, seq_id: int, needs: list[int]) -> None:
        free_large = self.large_pages.free
        allocators = self.allocators
        quota = quotas(
            free_large, [(n, a.ratio, a.free_small) for n, a in zip(needs, allocators, strict=True)]
        )
        assert quota is not None, "a new request that was checked to fit"
        request = self._new_request(seq_id)
        assert len(self.holdings) == len(needs) == len(quota)
        for holdings, needed, taken in zip(self.holdings, needs, quota):  # noqa: B905 (lengths checked above; compiled, strict=True costs a call with keywords)
            holdings.hold(seq_id, request, needed, taken)

    def _new_request(self, seq_id: int) -> int:
        """The allocators' id of a new sequence. (An id never used before: a large page remembers the
        request that carved it after it is gone, and the engine may reuse a sequence's id.)"""
        request = self._next_request
        self._next_request += 1
        self._requests[seq_id] = request
        for allocator in self.allocators:
            allocator.add_request(request)
        return request

    def fork(self, parent_id: int, children: Sequence[ChildSpec]) -> None:
        """Each child gets its own copy of the parent's held blocks (no prefix cache to share through)."""
        held = [end - first for first, end in (m.held_blocks(parent_id) for m in self.managers)]
        if not self._new_requests_fit([held] * len(children)):
            self._refuse(f"forking sequence {parent_id}", [n * len(children) for n in held])
        for manager in self.managers:
            manager.fork(parent_id, children)
        for child in children:
            self._take_new(child.seq_id, held)

    def _refuse(self, what: str, needs: list[int], hit: PrefixHit = NO_HIT) -> NoReturn:
        self._stats.allocation_failures += 1
        needed = sum(n * s for n, s in zip(needs, self.page_slots, strict=True))
        free = self._free_large() * self.large_slots
        free += sum(self._free_pages(group) * s for group, s in enumerate(self.page_slots))
        raise OutOfKVMemory(
            f"{what} needs {needed} slots in small pages of Jenga's large pages, {free} free "
            f"({self._free_large()} large pages free)",
            needed_slots=needed,
            free_slots=free,
            prefix_hit=hit,
        )

    # -- growth -----------------------------------------------------------------------------------
    def _plans(self, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> list[list[GrowthStep]]:
        """Each group's plan (``GroupManager.plan_growth``): per sequence ``(seq, tokens, first, end)``."""
        first = self.managers[0]
        plans = [first.plan_growth(seq_ids, num_tokens)[1]]
        plans += [m.plan_checked_growth(seq_ids, num_tokens)[1] for m in self.managers[1:]]
        return plans

    def _one_fits(self, seq_id: int, plans: list[list[GrowthStep]], index: int) -> list[int] | None:
        """The quota of growing the ``index``-th planned sequence, its released blocks freed first,
        exactly as the allocators stand now; None when it does not fit."""
        return self._one_quota(seq_id, plans, index)[0]

    def _one_quota(
        self, seq_id: int, plans: list[list[GrowthStep]], index: int
    ) -> tuple[list[int] | None, list[tuple[int, int]]]:
        """:meth:`_one_fits`, and per type the ``(blocks released, blocks taken)`` of that growth."""
        free_large = self._free_large()
        moved: list[tuple[int, int]] = []
        needs: list[tuple[int, int, int]] = []
        for group, holdings in enumerate(self.holdings):
            seq, _, first, end = plans[group][index]
            released, taken = moves(seq, first, end)
            returned, free_small = holdings.after_release_oldest(seq_id, released)
            free_large += returned
            moved.append((released, taken))
            needs.append((taken, holdings.pages.ratio, free_small))
        return quotas(free_large, needs), moved

    def _many_fit(self, plans: list[list[GrowthStep]]) -> bool:
        """Will several sequences' growth fit, whatever each one's quota takes? (Module docstring.)"""
        new = [sum(moves(seq, first, end)[1] for seq, _, first, end in plan) for plan in plans]
        if self._free_large() >= sum(new):
            return True
        releases = any(moves(seq, first, end)[0] for plan in plans for seq, _, first, end in plan)
        return not releases and all(self._free_pages(group) >= n for group, n in enumerate(new))

    def _fits(self, seq_ids: Sequence[int], plans: list[list[GrowthStep]]) -> bool:
        if len(seq_ids) == 1:
            return self._one_fits(seq_ids[0], plans, 0) is not None
        return self._many_fit(plans)

    def fits_growth_each(self, seq_ids: list[int], num_tokens: list[int]) -> bool:
        return self._fits(seq_ids, self._plans(seq_ids, num_tokens))

    def grow(self, seq_id: int, num_tokens: int) -> None:
        self.grow_each([seq_id], [num_tokens])

    def grow_each(self, seq_ids: list[int], num_tokens: list[int]) -> list[int]:
        if self._whole_pages:
            return self._grow_whole_pages(seq_ids, num_tokens)
        plans = self._plans(seq_ids, num_tokens)
        if len(seq_ids) > 1 and not self._many_fit(plans):
            self._refuse_growth(seq_ids, plans)
        nets = [0] * len(self.managers)  # blocks each type's runs gain, net
        for index, seq_id in enumerate(seq_ids):
            # (One sequence, nearly always, from a flush: the quota that says it fits is the one it
            # takes. Several were checked together; each takes its quota as those before it left the
            # pages.)
            self._take_pages(seq_id, plans, index, nets)
        rooms: list[int] | None = None
        assert len(self.managers) == len(plans) == len(nets)
        for manager, plan, net in zip(self.managers, plans, nets):  # noqa: B905 (lengths checked above; compiled, strict=True costs a call with keywords)
            manager.shared_pool.adjust(net)
            more = manager.commit_growth(plan)
            rooms = least_rooms(rooms, more)
        assert rooms is not None
        return rooms

    def _grow_whole_pages(self, seq_ids: list[int], num_tokens: list[int]) -> list[int]:
        """:meth:`grow_each` when every type's small page is a whole large page: each type's quota is
        the pages it needs (no type has free small pages), so one sequence fits when the free large
        pages and those its growth gives back hold what it takes, and several (checked together, as
        :meth:`_many_fit` does) when the free ones alone hold every new page. Pages are counts, and a
        sequence's are its runs' lengths (``WholeHoldings``): each type gives back all it releases,
        then takes all it needs, without plans and without a step per sequence."""
        managers, pages = self.managers, self._whole_pages
        groups = len(managers)
        released: list[int] = []
        taken: list[int] = []
        all_released = all_taken = 0
        for group in range(groups):
            gives, takes = managers[group].growth_moves(seq_ids, num_tokens, group == 0)  # (the first checks)
            released.append(gives)
            taken.append(takes)
            all_released += gives
            all_taken += takes
        if self.large_pages.free + (all_released if len(seq_ids) == 1 else 0) < all_taken:
            self._refuse_growth(seq_ids, self._plans(seq_ids, num_tokens))
        for group in range(groups):  # (every type's releases before any takes, as vLLM frees first)
            pages[group].give_back(released[group])
        rooms: list[int] | None = None
        for group in range(groups):
            pages[group].take(taken[group])
            manager = managers[group]
            manager.shared_pool.adjust(taken[group] - released[group])
            rooms = manager.grow_checked(seq_ids, num_tokens, rooms)
        assert rooms is not None
        return rooms

    def _refuse_growth(self, seq_ids: Sequence[int], plans: list[list[GrowthStep]]) -> NoReturn:
        needs = [sum(moves(seq, first, end)[1] for seq, _, first, end in plan) for plan in plans]
        self._refuse(f"growing sequences {list(seq_ids)}", needs)

    def _take_pages(self, seq_id: int, plans: list[list[GrowthStep]], index: int, nets: list[int]) -> None:
        """The pages of the ``index``-th planned sequence's growth, within the quota Jenga's rule gives
        it as the pages stand (refused when there is none): every type's released pages go back
        before any type takes new ones (vLLM frees skipped blocks before allocating). Adds each type's
        net to ``nets``."""
        quota, moved = self._one_quota(seq_id, plans, index)
        if quota is None:
            self._refuse_growth([seq_id], [[plan[index]] for plan in plans])
        for group, (released, taken) in enumerate(moved):
            nets[group] += taken - released
        assert len(self.holdings) == len(moved)
        for holdings, (released, _) in zip(self.holdings, moved):  # noqa: B905 (lengths checked above; compiled, strict=True costs a call with keywords)
            if released:
                holdings.release_oldest(seq_id, released)
        assert len(self.holdings) == len(moved) == len(quota)
        for holdings, (_, taken), pages in zip(self.holdings, moved, quota):  # noqa: B905 (lengths checked above; compiled, strict=True costs a call with keywords)
            if taken:
                holdings.hold(seq_id, self._requests[seq_id], taken, pages)

    def free(self, seq_id: int, finished: bool = True) -> None:
        self.managers[0].held_blocks(seq_id)  # (checks the sequence before anything changes)
        request = self._requests.pop(seq_id)
        for holdings in self.holdings:  # (before the managers forget the runs whole pages count)
            holdings.release_all(seq_id)
            holdings.pages.remove_request(request)
        for manager in self.managers:
            manager.free(seq_id, finished)

    def growth_room(self, seq_id: int) -> int:
        return min(manager.growth_room(seq_id) for manager in self.managers)

    def available_slots(self) -> int:
        """Tokens every sequence together is sure to grow by: a small page per block in every type
        that holds tokens, each from a free large page (what any quota can take)."""
        return self._free_large() // self._token_groups * self.block_size

    def seq_len(self, seq_id: int) -> int:
        return self.managers[0].seq_len(seq_id)

    def prepare_decode_step(self, num_sequences: int) -> None:
        return None

    def releases_while_decoding(self) -> bool:
        # (Asked of the types, not of their count: one sliding-window type, as Mistral's, releases.)
        return any(manager.releases_while_decoding() for manager in self.managers)

    # -- accounting -------------------------------------------------------------------------------
    def group_entries(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """Every group, then the large pages no type holds; and the slots a token fills in each (its
        group's layers; none in a Mamba state or a free large page)."""
        weights = tuple(
            s // self.block_size if h else 0 for s, h in zip(self.page_slots, self.holds, strict=True)
        )
        # (Named as the figures and outputs name a pool the groups share: its free memory is no group's.)
        return tuple(g.name for g in self.groups) + ("shared pool (large pages)",), weights + (0,)

    def group_breakdown_values(self) -> list[int]:
        managers = self.managers
        values = zero_breakdowns(len(managers) + 1)
        allocators, page_slots, token_groups = self.allocators, self.page_slots, self.holds
        # (Indexes, not zip(strict=True): compiled, that is a call with keywords at every observation.)
        for group in range(len(managers)):
            manager = managers[group]
            allocator, slots, holds = allocators[group], page_slots[group], token_groups[group]
            used, reserved, internal, _, _, _ = manager.breakdown_values()
            if holds:  # (the manager counts one slot per token of its group)
                weight = slots // self.block_size
                used, reserved, internal = used * weight, reserved * weight, internal * weight
            else:  # a Mamba page is one request's state: used
                used, reserved, internal = (
                    (allocator.held_large * allocator.ratio - allocator.free_small) * slots,
                    0,
                    0,
                )
            put_breakdown(values, group, (used, reserved, internal, allocator.free_small * slots, 0, 0))
        put_breakdown(values, len(managers), (0, 0, 0, 0, 0, self.large_pages.free * self.large_slots))
        return values

    def group_breakdowns(self) -> dict[str, MemoryBreakdown]:
        names, _ = self.group_entries()
        values = self.group_breakdown_values()
        return {name: MemoryBreakdown(*values[6 * i : 6 * i + 6]) for i, name in enumerate(names)}

    def breakdown_values(self) -> Breakdown:
        values = self.group_breakdown_values()
        used, reserved, internal, external, cached, free = (sum(values[k::6]) for k in range(6))
        return used, reserved, internal, external, cached, free

    def breakdown_bytes(self) -> dict[str, int]:
        slot_bytes = self.capacity.slot_bytes
        return {
            name: value * slot_bytes
            for name, value in zip(MemoryBreakdown.CATEGORIES, self.breakdown_values(), strict=True)
        }

    def sharing_slots(self) -> tuple[int, int]:
        # Per type used + reserved + internal = its large pages less its free small pages (the
        # accounting identity), so no walk over the sequences' runs; nothing is shared.
        held = sum(
            a.held_large * self.large_slots - a.free_small * slots
            for a, slots in zip(self.allocators, self.page_slots, strict=True)
        )
        return held, held

    def sharing_slots_of(self, breakdown: Breakdown) -> tuple[int, int]:
        # (The identity again: what the types hold is the breakdown's used, reserved and internal.)
        allocated = breakdown[0] + breakdown[1] + breakdown[2]
        return allocated, allocated

    def host_breakdown_values(self) -> tuple[int, int]:
        return 0, 0

    @property
    def stats(self) -> PolicyStats:
        every = [manager.stats for manager in self.managers] + [self._stats]
        return PolicyStats(
            fork_copied_tokens=sum(s.fork_copied_tokens for s in every),
            allocation_failures=sum(s.allocation_failures for s in every),
        )

    def evictions(self) -> int:
        return 0  # (no prefix cache to evict from)

    def cow_copies(self) -> int:
        return 0  # (forks copy; nothing is shared to copy on write)

    @property
    def host_tier(self) -> None:
        return None
