"""Several KV groups (a hybrid model's layer kinds): each with a pool of its own, or drawing on one
pool they share (vLLM's hybrid manager). The rules are the coordinator's (``sim/kv/interface.py``):
the longest prefix every group serves, all or nothing, accounting per group, the scarcest group's
room."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from policies._host_tier import HostPool
from policies.base import (
    NO_HIT,
    ChildSpec,
    KVCachePolicy,
    MemoryBreakdown,
    OutOfKVMemory,
    PolicyInputError,
    PolicyStats,
    PrefixHit,
)
from policies.hybrid.block_pool import SharedBlockPool
from policies.hybrid.group import GroupManager, GrowthStep
from sim.kv.interface import Breakdown, KVCoordinator, KVGroup, least_rooms, put_breakdown, zero_breakdowns
from token_content import TokenContent, content_length, validate_content

__all__ = ["MultiGroupCoordinator", "group_token_sharing", "longest_common_hit"]

GroupPlan = tuple[GroupManager, list[GrowthStep]]  # a group and its plan of one growth


class _SharedPool:
    """A shared block pool and the groups drawing from it (vLLM's hybrid manager: one pool, every
    group a layer kind)."""

    def __init__(self, pool: SharedBlockPool, managers: list[GroupManager], slot_bytes: int):
        self.pool = pool
        self.managers = managers
        self.slot_bytes = slot_bytes
        # Groups whose blocks hold tokens (a Mamba state does not): a token needs a slot in each.
        self.token_groups = sum(1 for manager in managers if manager.kind != "mamba")
        # What free slots are split over: every group that takes a block as a sequence grows (a
        # Mamba group caching prefixes writes a state block at each block boundary).
        self.growing = max(1, sum(1 for manager in managers if manager.takes_blocks_as_it_grows()))


class MultiGroupCoordinator(KVCoordinator):
    """Several groups: each with a pool of its own (a policy), or drawing on a pool they share
    (:class:`~policies.hybrid.group.GroupManager`). Every check of room is made per pool: the needs
    of the groups sharing one are added up."""

    def __init__(self, groups: Sequence[KVGroup]):
        names = [group.name for group in groups]
        if len(set(names)) != len(names):
            raise ValueError(f"KV groups need distinct names, got {names}")
        policies = [group.policy for group in groups]
        if len({id(policy) for policy in policies}) != len(policies):
            raise ValueError(f"KV groups {names} share a policy object: each group needs its own")
        tiered = [group.name for group in groups if group.policy.host_tier is not None]
        if tiered:
            raise ValueError(f"KV groups {tiered} have a host tier: offload is for one KV group only")
        # A hit capped at another group's length must end on a block boundary of every group, or a
        # group would serve less than the tokens the request skips.
        block_sizes = {group.name: group.policy.pool.block_size for group in groups}
        if len(set(block_sizes.values())) > 1:
            raise ValueError(f"KV groups need one block size (tokens per block), got {block_sizes}")
        self.groups = tuple(groups)
        self.policies = policies
        self._own = [group for group in groups if not isinstance(group.policy, GroupManager)]
        self._shared = self._shared_pools(groups)
        self.pool_slots = sum(group.policy.pool_slots for group in self._own) + sum(
            shared.pool.pool_slots for shared in self._shared
        )
        self.slots_per_token = len(self._own) + sum(shared.token_groups for shared in self._shared)
        self.context_tokens = self._context_tokens()
        # Prefix caching over a shared pool: its groups, full attention first (vLLM's order).
        self._caching: list[GroupManager] = self._caching_groups()
        # Every group on one pool that caches nothing: then no slot is ever shared.
        self._shares_nothing = (
            not self._own and len(self._shared) == 1 and not self._shared[0].pool.caches_prefixes
        )
        # What full-attention layers share (a group of a shared pool: pools of their own keep theirs).
        self._full_attention: GroupManager | None = next(
            (
                group.policy
                for group in groups
                if isinstance(group.policy, GroupManager) and group.policy.kind == "full"
            ),
            None,
        )

    def _context_tokens(self) -> int:
        """What fills first: a pool of its own holds every token; a shared pool its slots over its
        full-attention groups (each token takes a slot in every one). A deployment with no
        full-attention layer counts every group that holds tokens."""
        capacities = [group.policy.pool_slots for group in self._own]
        for shared in self._shared:
            full_groups = sum(1 for manager in shared.managers if manager.kind == "full")
            if full_groups:
                capacities.append(shared.pool.pool_slots // full_groups)
        return min(capacities) if capacities else self.pool_slots // max(1, self.slots_per_token)

    def _caching_groups(self) -> list[GroupManager]:
        caching = [shared for shared in self._shared if shared.pool.caches_prefixes]
        if not caching:
            return []
        if self._own or len(self._shared) > 1:
            raise ValueError(
                "prefix caching over a shared block pool needs every KV group in that one pool "
                f"(groups {[group.name for group in self.groups]})"
            )
        managers = caching[0].managers
        return [manager for manager in managers if manager.kind == "full"] + [
            manager for manager in managers if manager.kind != "full"
        ]

    @staticmethod
    def _shared_pools(groups: Sequence[KVGroup]) -> list[_SharedPool]:
        by_pool: dict[int, list[KVGroup]] = {}
        for group in groups:
            if isinstance(group.policy, GroupManager):
                by_pool.setdefault(id(group.policy.shared_pool), []).append(group)
        shared = []
        for members in by_pool.values():
            slot_bytes = {group.slot_bytes for group in members}
            if len(slot_bytes) > 1:
                raise ValueError(
                    f"KV groups {[group.name for group in members]} share a block pool, so one page size, "
                    f"but their slot_bytes differ: {sorted(slot_bytes)}"
                )
            managers = [group.policy for group in members if isinstance(group.policy, GroupManager)]
            shared.append(_SharedPool(managers[0].shared_pool, managers, slot_bytes.pop()))
        return shared

    # -- prefix hits ------------------------------------------------------------------------------
    def lookup(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        if self._caching:
            return self._common_hit(prompt, namespace)
        return self._shortest([policy.lookup(prompt, namespace) for policy in self.policies])

    def match(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        if self._caching:
            return self._common_hit(prompt, namespace)
        return self._shortest([policy.match(prompt, namespace) for policy in self.policies])

    def _common_hit(self, prompt: TokenContent, namespace: int) -> PrefixHit:
        """The longest prefix every group of a prefix-caching pool serves (:func:`longest_common_hit`)."""
        hit = longest_common_hit(self._caching, prompt, namespace)
        return PrefixHit(hit * self._caching[0].block_size) if hit else NO_HIT

    @staticmethod
    def _shortest(hits: list[PrefixHit]) -> PrefixHit:
        """The hit every group can serve (no group has a host tier). Block ids belong to one group's
        pool, so none are named."""
        cached = min(hit.cached_tokens for hit in hits)
        return PrefixHit(cached) if cached else NO_HIT

    # -- sequences --------------------------------------------------------------------------------
    def can_admit(self, prompt: TokenContent, final_len: int) -> bool:
        return self._admission_shortfall(prompt, final_len, 0, self.lookup(prompt).cached_tokens) is None

    def _admission_shortfall(
        self, prompt: TokenContent, final_len: int, namespace: int, cached: int
    ) -> tuple[str, int, int] | KVCachePolicy | None:
        """Why the prompt does not fit now: the first own-pool policy that cannot admit it (its own
        admission says by how much), or (shared pool, slots needed, slots free); None when it fits."""
        for group in self._own:
            if not group.policy.can_admit_capped(prompt, final_len, namespace, cached):
                return group.policy
        for shared in self._shared:
            if shared.pool.caches_prefixes:
                needed = sum(
                    manager.slots_needed_to_admit_cached(prompt, namespace, cached)
                    for manager in shared.managers
                )
            else:
                needed = sum(manager.slots_needed_to_admit(prompt) for manager in shared.managers)
            if needed > shared.pool.free_slots():
                return "the shared block pool", needed, shared.pool.free_slots()
        return None

    def admit(
        self, seq_id: int, prompt: TokenContent, final_len: int, output_content_id: int, namespace: int = 0
    ) -> int:
        cached = self.lookup(prompt, namespace).cached_tokens
        shortfall = self._admission_shortfall(prompt, final_len, namespace, cached)
        if isinstance(shortfall, KVCachePolicy):
            # Its own admission raises the OutOfKVMemory that says by how much, changing nothing.
            shortfall.admit_capped(seq_id, prompt, final_len, output_content_id, namespace, cached)
            raise AssertionError(f"policy {shortfall.name!r} admitted a sequence its can_admit refused")
        if shortfall is not None:
            self._refuse(f"admitting sequence {seq_id}", shortfall)
        if self._caching:
            # Every group holds its hit before any takes new blocks (vLLM ``allocate_slots``), so no
            # group's new block evicts a block another group's hit needs.
            managers = self._shared[0].managers  # (in the groups' order, as vLLM allocates)
            for manager in managers:
                manager.hold_cached_prefix(seq_id, prompt, final_len, output_content_id, namespace, cached)
            for manager in managers:
                manager.take_admission_blocks(seq_id)
            return cached
        for policy in self.policies:
            policy.admit_capped(seq_id, prompt, final_len, output_content_id, namespace, cached)
        return cached

    def defer_prompt_keys(self) -> bool:
        """A prefix-caching pool caches a prompt's held blocks as its chunks are scheduled, in every
        group (``GroupManager.defer_prompt_keys``)."""
        for manager in self._caching:
            manager.defer_prompt_keys()
        return bool(self._caching)

    def prompt_scheduled(self, seq_id: int, tokens: int) -> None:
        for manager in self._caching:
            manager.prompt_scheduled(seq_id, tokens)

    def scheduled_chunks_move_slots(self) -> bool:
        """A chunk that passes a block an earlier chunk computed (a window's, a Mamba group's state)
        takes it, caches it and gives it back: free slots become cached ones."""
        for manager in self._caching:
            tables = manager.tables
            if tables is not None and tables.pending_passes:
                return True
        return False

    def _refuse(self, what: str, shortfall: tuple[str, int, int]) -> None:
        where, needed, available = shortfall
        self.policies[0].stats.allocation_failures += 1
        raise OutOfKVMemory(
            f"{what} needs {needed} slots of {where}, {available} available",
            needed_slots=needed,
            free_slots=available,
        )

    def grow(self, seq_id: int, num_tokens: int) -> None:
        self.grow_each([seq_id], [num_tokens])

    def grow_each(self, seq_ids: list[int], num_tokens: list[int]) -> list[int]:
        """Every group or none: each own pool and each shared pool is checked before any group grows.
        A shared pool's groups are planned together and their net taken at once (vLLM frees every
        group's skipped blocks before it allocates)."""
        if self._shares_nothing:
            return self._grow_in_plain_pool(seq_ids, num_tokens)
        for group in self._own:
            needed = _slots_needed(group.policy, seq_ids, num_tokens)
            if needed > group.policy.available_slots():
                self._refuse(
                    f"growing sequences {seq_ids}",
                    (f"KV group {group.name!r}", needed, group.policy.available_slots()),
                )
        planned: list[tuple[_SharedPool, int, list[GroupPlan]]] = []
        for shared in self._shared:
            net_blocks, plans = self._plan(shared, seq_ids, num_tokens)
            if net_blocks > shared.pool.spare_blocks():
                self._refuse(
                    f"growing sequences {seq_ids}",
                    ("the shared block pool", net_blocks * shared.pool.block_size, shared.pool.free_slots()),
                )
            planned.append((shared, net_blocks, plans))
        rooms: list[int] | None = None
        for group in self._own:
            rooms = least_rooms(rooms, group.policy.grow_each(seq_ids, num_tokens))
        for shared, net_blocks, plans in planned:
            shared.pool.adjust(net_blocks)
            if shared.pool.caches_prefixes:
                if _fits_in_request_order(shared, plans, len(seq_ids)):
                    rooms = _commit_in_request_order(plans, len(seq_ids), rooms)
                    continue
                for manager, plan in plans:  # (every group's skipped blocks back before any takes)
                    manager.release_skipped(plan)
            for manager, plan in plans:
                rooms = least_rooms(rooms, manager.commit_growth(plan))
        assert rooms is not None
        return rooms

    def _grow_in_plain_pool(self, seq_ids: list[int], num_tokens: list[int]) -> list[int]:
        """:meth:`grow_each` when every group draws on one pool that caches nothing (``vllm-hybrid``
        without prefix caching): what it does, each group's growth made in one pass after the pool
        gave the net blocks (nothing is released before another group takes: there is no cache to
        release into)."""
        shared = self._shared[0]
        managers = shared.managers
        net_blocks = 0
        for index in range(len(managers)):  # (the first checks the growth for every group)
            released, taken = managers[index].growth_moves(seq_ids, num_tokens, index == 0)
            net_blocks += taken - released
        if net_blocks > shared.pool.spare_blocks():
            self._refuse(
                f"growing sequences {seq_ids}",
                ("the shared block pool", net_blocks * shared.pool.block_size, shared.pool.free_slots()),
            )
        shared.pool.adjust(net_blocks)
        rooms: list[int] | None = None
        for manager in managers:
            rooms = manager.grow_checked(seq_ids, num_tokens, rooms)
        assert rooms is not None
        return rooms

    @staticmethod
    def _plan(shared: _SharedPool, seq_ids: list[int], num_tokens: list[int]) -> tuple[int, list[GroupPlan]]:
        """The groups' plans of one growth and their net blocks. The first group checks the growth
        (every group holds the same sequences at the same lengths); the others only plan it."""
        first = shared.managers[0]
        net_blocks, plan = first.plan_growth(seq_ids, num_tokens)
        plans: list[GroupPlan] = [(first, plan)]
        for manager in shared.managers[1:]:
            blocks, plan = manager.plan_checked_growth(seq_ids, num_tokens)
            net_blocks += blocks
            plans.append((manager, plan))
        return net_blocks, plans

    def fits_growth_each(self, seq_ids: list[int], num_tokens: list[int]) -> bool:
        """Whether the growth fits as vLLM's scheduler allocates it, request by request (each frees its
        skipped blocks, then takes): what :meth:`grow_each` would do without refusing, and what telling
        the sequences one at a time would do without preempting any."""
        for group in self._own:
            if _slots_needed(group.policy, seq_ids, num_tokens) > group.policy.available_slots():
                return False
        for shared in self._shared:
            net_blocks, plans = self._plan(shared, seq_ids, num_tokens)
            in_order = _fits_in_request_order(shared, plans, len(seq_ids))
            if net_blocks > shared.pool.spare_blocks() or not in_order:
                return False
        return True

    def fork(self, parent_id: int, children: Sequence[ChildSpec]) -> None:
        for shared in self._shared:
            needed = sum(
                manager.slots_needed_to_fork(parent_id, len(children)) for manager in shared.managers
            )
            if needed > shared.pool.free_slots():
                self._refuse(
                    f"forking sequence {parent_id}",
                    ("the shared block pool", needed, shared.pool.free_slots()),
                )
        done: list[KVCachePolicy] = []
        try:
            for policy in self.policies:
                policy.fork(parent_id, children)
                done.append(policy)
        except OutOfKVMemory:
            for policy in done:
                for child in children:
                    policy.free(child.seq_id, finished=False)
            raise

    def free(self, seq_id: int, finished: bool = True) -> None:
        for policy in self.policies:
            policy.free(seq_id, finished)

    def growth_room(self, seq_id: int) -> int:
        return min(policy.growth_room(seq_id) for policy in self.policies)

    def available_slots(self) -> int:
        """Slots every growing group can still take: the scarcest own pool's, and a shared pool's free
        slots split over the groups that grow with each token."""
        rooms = [group.policy.available_slots() for group in self._own]
        rooms += [shared.pool.free_slots() // shared.growing for shared in self._shared]
        return min(rooms)

    def seq_len(self, seq_id: int) -> int:
        return self.policies[0].seq_len(seq_id)

    def prepare_decode_step(self, num_sequences: int) -> None:
        for policy in self.policies:
            policy.prepare_decode_step(num_sequences)

    def releases_while_decoding(self) -> bool:
        return any(
            isinstance(policy, GroupManager) and policy.releases_while_decoding() for policy in self.policies
        )

    def can_defer_unbacked(self) -> bool:
        """Every group a one-token-page group without a cache, on a pool of its own (SGLang's SWA and
        full-attention token pools without the radix cache): a pending token takes a free block of
        each pool, and nothing is evicted for it."""
        return (
            not self._own
            and not self.lookahead_slots
            and all(
                len(shared.managers) == 1
                and not shared.pool.caches_prefixes
                and shared.managers[0].can_defer_unbacked()
                for shared in self._shared
            )
        )

    def defer_unbacked(self, pending_tokens: Callable[[], int] | None) -> None:
        for shared in self._shared:
            shared.managers[0].defer_unbacked(pending_tokens)
            shared.pool.unbacked = pending_tokens

    def evict_for_unbacked(self, ahead_tokens: int) -> int:
        return self.available_slots()  # (nothing cached: nothing to evict)

    def unbacked_draws(self) -> tuple[int, ...]:
        """Per entry of :meth:`group_entries`, the free slots a pending token takes there: one in a
        pool per group of it whose slots hold tokens (the groups' own entries: none)."""
        return (0,) * len(self.groups) + tuple(shared.token_groups for shared in self._shared)

    # -- accounting -------------------------------------------------------------------------------
    def breakdown_values(self) -> Breakdown:
        used = reserved = internal = external = cached = free = 0
        parts = [policy.breakdown_values() for policy in self.policies]
        parts += [shared.pool.breakdown_values() for shared in self._shared]
        for part in parts:
            used += part[0]
            reserved += part[1]
            internal += part[2]
            external += part[3]
            cached += part[4]
            free += part[5]
        return used, reserved, internal, external, cached, free

    def group_entries(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The entries of :meth:`group_breakdown_values`: every group, then every shared pool's free
        blocks; and whether each entry's slots hold tokens (a Mamba group's state and a pool's free
        blocks do not), so that a token decoded but not yet told fills one of its slots."""
        names = [group.name for group in self.groups]
        holds = [
            not (isinstance(group.policy, GroupManager) and group.policy.kind == "mamba")
            for group in self.groups
        ]
        for shared in self._shared:
            members = ", ".join(
                group.name
                for group in self.groups
                if any(group.policy is manager for manager in shared.managers)
            )
            names.append("shared pool" if len(self._shared) == 1 else f"shared pool ({members})")
            holds.append(False)
        return tuple(names), tuple(holds)

    def group_breakdown_values(self) -> list[int]:
        """Every entry's breakdown, flat, in :meth:`group_entries` order (what the recorder keeps of a
        hybrid run, ``sim/outputs/group_series.py``): a new list, the caller's to change."""
        policies, shared_pools = self.policies, self._shared
        values = zero_breakdowns(len(policies) + len(shared_pools))
        for entry in range(len(policies)):
            put_breakdown(values, entry, policies[entry].breakdown_values())
        for index in range(len(shared_pools)):
            put_breakdown(values, len(policies) + index, shared_pools[index].pool.breakdown_values())
        return values

    def breakdown_bytes(self) -> dict[str, int]:
        totals = super().breakdown_bytes()
        for shared in self._shared:
            for name, slots in MemoryBreakdown(*shared.pool.breakdown_values()).as_dict().items():
                totals[name] += slots * shared.slot_bytes
        return totals

    def may_share(self) -> bool:
        return self._full_attention is not None and self._full_attention.tables is not None

    def token_sharing(self) -> tuple[int, int]:
        return group_token_sharing(self._full_attention)

    def sharing_slots(self) -> tuple[int, int]:
        physical = logical = 0
        for policy in self.policies:
            group_physical, group_logical = policy.sharing_slots()
            physical += group_physical
            logical += group_logical
        return physical, logical

    def sharing_slots_of(self, breakdown: Breakdown) -> tuple[int, int]:
        if not self._shares_nothing:
            return self.sharing_slots()
        # No group caches, so none shares: each holds what it allocated (the pool's part is free).
        allocated = breakdown[0] + breakdown[1] + breakdown[2]
        return allocated, allocated

    def host_breakdown_values(self) -> tuple[int, int]:
        return 0, 0

    @property
    def stats(self) -> PolicyStats:
        """The groups' counters summed, but for the prefix cache's: every group records the same query
        (the prompt) and the same common hit, so those are one group's. A new object: read it again
        after the operations to compare. (Written out field by field: the engine reads it after
        every iteration; tests/test_kv_coordinator.py checks that no field is left out.)"""
        every = [policy.stats for policy in self.policies]
        first = every[0]
        return PolicyStats(
            prefix_cache_queries=first.prefix_cache_queries,
            prefix_cache_hits=first.prefix_cache_hits,
            evictions=sum(stats.evictions for stats in every),
            cow_copies=sum(stats.cow_copies for stats in every),
            fork_copied_tokens=sum(stats.fork_copied_tokens for stats in every),
            allocation_failures=sum(stats.allocation_failures for stats in every),
        )

    def evictions(self) -> int:
        total = 0
        for policy in self.policies:
            total += policy.stats.evictions
        return total

    def cow_copies(self) -> int:
        total = 0
        for policy in self.policies:
            total += policy.stats.cow_copies
        return total

    @property
    def host_tier(self) -> HostPool | None:
        return None


def group_token_sharing(full: GroupManager | None) -> tuple[int, int]:
    """``KVCoordinator.token_sharing`` of a pool of KV groups: every full-attention group holds the
    same token positions of the same sequences, so the first one (``full``; None: the pool has none)
    says what they all share (the other kinds share windows or states, which a step does not read
    whole)."""
    if full is None:
        return 0, 0
    physical, logical = full.sharing_slots()
    return logical - physical, full.shared_slots()


def longest_common_hit(groups: Sequence[GroupManager], prompt: TokenContent, namespace: int) -> int:
    """The longest prefix every group of a prefix-caching pool serves (vLLM
    ``vllm/v1/core/kv_cache_coordinator.py``, ``HybridKVCacheCoordinator.find_longest_cache_hit``):
    full attention first, then each other group at the length so far, which it keeps or shortens;
    any shortening starts another round, until every group keeps the length. (Each group's hit is
    the longest it serves within the length it is given, so this ends at the longest length they
    all serve; vLLM looks groups of one spec up together, which comes to the same length.) Never
    the prompt's last token (``len - 1``). In blocks; ``groups`` full attention first, their blocks
    named by one set of content chains (vLLM's groups of one pool, Jenga's types:
    ``sim/kv/jenga_prefix.py``)."""
    validate_content(prompt, "looked-up prompt", PolicyInputError)
    block_size = groups[0].block_size
    hit = (content_length(prompt) - 1) // block_size
    tables = groups[0].tables
    assert tables is not None
    chains = tables.prompt_chains(prompt, namespace, hit)  # (one content chain for every group)
    while hit:
        length = hit
        for group in groups:
            length = group.longest_cache_hit(chains, length)
        if length == hit:
            break
        hit = length
    return hit


def _fits_in_request_order(shared: _SharedPool, plans: list[GroupPlan], sequences: int) -> bool:
    """Whether the pool holds each sequence's new blocks when it allocates, after the skipped blocks
    of those before it and its own went back (vLLM's order). Nothing to check when it holds every
    new block whatever is released; else the running net after each sequence. When it does not, the
    growth was checked on its net (every release first), and is committed in that order."""
    spare = shared.pool.spare_blocks()
    if sum(manager.planned_new_blocks(plan) for manager, plan in plans) <= spare:
        return True
    for index in range(1, sequences + 1):
        if sum(manager.planned_net_blocks(plan[:index]) for manager, plan in plans) > spare:
            return False
    return True


def _commit_in_request_order(plans: list[GroupPlan], sequences: int, rooms: list[int] | None) -> list[int]:
    """Commit a prefix-caching pool's planned growth sequence by sequence, as vLLM's scheduler
    allocates request by request: each frees every group's skipped blocks (cached), then takes its
    new ones. Which cached block an allocation evicts depends on that order, so a growth of several
    sequences in one call (event skipping's flushes) and one sequence at a time (single steps) must
    give the same. Returns the rooms after it, the least over the groups."""
    least: list[int] = [] if rooms is None else rooms
    for index in range(sequences):
        for manager, plan in plans:
            manager.release_skipped_of(plan[index])
        first, first_plan = plans[0]
        room = first.commit_step(first_plan[index])
        for group in range(1, len(plans)):
            manager, plan = plans[group]
            group_room = manager.commit_step(plan[index])
            if group_room < room:
                room = group_room
        if rooms is None:
            least.append(room)
        elif room < least[index]:
            least[index] = room
    return least


def _slots_needed(policy: KVCachePolicy, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> int:
    needed = 0
    assert len(seq_ids) == len(num_tokens)
    for seq_id, tokens in zip(seq_ids, num_tokens):  # noqa: B905 (lengths checked above; compiled, strict=True costs a call with keywords)
        needed += policy.slots_needed_to_grow(seq_id, tokens)
    return needed
