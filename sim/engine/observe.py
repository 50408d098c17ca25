"""What the recorder keeps of one engine at an instant (``sim.outputs.metrics.STATE_COLUMNS``): the
pool's breakdown as the engine sees it, the batch and the queue, the counters, the host tier."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from policies.base import MemoryBreakdown
from sim.engine.decoding import DecodeClock

if TYPE_CHECKING:
    from sim.kv.coordinator import Breakdown, KVCoordinator
    from sim.outputs.metrics import Counters

_NO_HOST_TIER = (0, 0, 0, 0, 0, 0)
_WIDTH: Final = len(MemoryBreakdown.CATEGORIES)  # used, reserved, internal, external, cached, free


class StateObserver:
    def __init__(self, kv: KVCoordinator, clock: DecodeClock, counters: Counters):
        self.kv = kv
        # A decoded token the policies have not been told of fills a slot in every group that holds
        # tokens (not in a Mamba group's state).
        self._slots_per_token = kv.slots_per_token
        self.clock = clock
        self.counters = counters
        self.group_names, self.group_holds_tokens = kv.group_entries()
        # Per entry, the slots a token fills there (a flag counts 1; jenga's groups say how many).
        self._entry_token_slots = [int(holds) for holds in self.group_holds_tokens]
        # A hybrid allocator's split by KV group is recorded beside the totals (sim/outputs/group_series.py).
        self.split_by_group = len(kv.groups) > 1

    def observe(self, running: int) -> tuple[tuple, list[int] | None]:
        """:meth:`averaged` and, with a split by group, every group's breakdown
        (``KVCoordinator.group_breakdown_values``, its list kept) with the decoded tokens the policies
        have not been told of moved from reserved to used in each group that holds tokens, from one
        reading of the groups: their breakdowns sum to the pool's, so the pool's is their column sums,
        not a second walk over every group."""
        if not self.split_by_group:
            return self.averaged(running), None
        groups = self.kv.group_breakdown_values()
        pending = self.clock.pending_tokens()
        token_slots = self._entry_token_slots
        used = reserved = internal = external = cached = free = 0
        # (One loop, not slices: it runs compiled. The totals are the policies' own; averaged() moves
        # the pending tokens in them, this loop in each entry.)
        for entry in range(len(token_slots)):
            start = entry * _WIDTH
            entry_used, entry_reserved = groups[start], groups[start + 1]
            used += entry_used
            reserved += entry_reserved
            internal += groups[start + 2]
            external += groups[start + 3]
            cached += groups[start + 4]
            free += groups[start + 5]
            moved = pending * token_slots[entry]
            if moved:
                groups[start] = entry_used + moved
                groups[start + 1] = entry_reserved - moved
        totals = (used, reserved, internal, external, cached, free)
        return self.averaged(running, totals), groups

    def averaged(self, running: int, breakdown: Breakdown | None = None) -> tuple:
        """The leading part of the state, whose time averages the summary reports (``breakdown``: the
        pool's, when the caller has read it already)."""
        if breakdown is None:
            breakdown = self.kv.breakdown_values()
            physical, logical = self.kv.sharing_slots()
        else:
            physical, logical = self.kv.sharing_slots_of(breakdown)
        used, reserved, internal, external, cached, free = breakdown
        # Decoded tokens the policy has not been told of fill slots it still counts as reserved.
        pending = self.clock.pending_tokens() * self._slots_per_token
        return (
            used + pending,
            reserved - pending,
            internal,
            external,
            cached,
            free,
            running,
            physical,
            logical,
        )

    def state(
        self, running: int, waiting: int, running_seqs: int, admission_blocker: int
    ) -> tuple[tuple, list[int] | None]:
        """The whole state (the averaged part, the queue, the counters and the host tier's part) and,
        with a split by group, every group's breakdown (:meth:`observe`)."""
        averaged, groups = self.observe(running)
        stats = self.kv.stats
        counters = self.counters
        whole = (
            averaged
            + (
                waiting,
                running_seqs,
                counters.admission_waits,
                counters.preemptions,
                counters.oom_failures,
                stats.cow_copies,
                stats.prefix_cache_queries,
                stats.prefix_cache_hits,
                stats.evictions,
                admission_blocker,
            )
            + self._host_state()
        )
        return whole, groups

    def _host_state(self) -> tuple[int, ...]:
        """The host tier's part of the state (``sim.outputs.metrics.HOST_COLUMNS``); zeros without one."""
        tier = self.kv.host_tier
        if tier is None:
            return _NO_HOST_TIER
        stats = tier.stats
        return (
            *self.kv.host_breakdown_values(),
            stats.host_cache_hits,
            stats.host_loaded_blocks,
            stats.host_offloaded_blocks,
            stats.host_evictions,
        )
