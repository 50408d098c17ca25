"""Event skipping's plan: which iterations after a wake-up's first nothing can interrupt.

After iteration 1 of a wake-up has started, the ones that follow are deterministic until an event:
a completion (a prompt done, a request finished, a beam decision), an iteration start at which an
admission could change something (a free token budget and a waiting head that might fit, or an
arrival), or a sequence needing a block when the pool might not have it. :class:`JumpPlanner` finds
how many, and what each prefills; the engine core applies them when the wake-up ends (``Jump``).
The arithmetic of a run of decode iterations is ``sim/engine/event_skip.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sim.engine.decoding import DecodeClock, RequestState
from sim.engine.event_skip import (
    JumpTimeline,
    iterations_to_reach,
    scheduled_durations,
    scheduled_iterations_to_reach,
)
from sim.engine.schedulers.base import (
    HEAD_OUT_OF_MEMORY,
    NEXT_TRIES_HEAD,
    QUEUE_EMPTY,
    Scheduler,
)
from sim.engine.unbacked import UnbackedGrowth

if TYPE_CHECKING:
    from sim.costs.core import CostModel
    from sim.costs.terms import LinearIterationCost
    from sim.kv.coordinator import KVCoordinator

UNLIMITED: Final = 1 << 61  # (below 2**62: compiled, a native int, not a boxed one)


@dataclass(slots=True, init=False)
class Jump:
    """The iterations of one wake-up after the first, planned when it starts and applied when it
    ends (nothing can observe them in between): the chunks each prefills, and whether sequences
    take blocks inside it. (The constructor is written out: compiled, it runs natively.)"""

    start_s: float
    first_clock: int  # the decode clock's iteration number of iteration 1
    timeline: JumpTimeline
    chunks: list[list[tuple[RequestState, int]]]
    grows: bool
    # False for prefill batches that run alone (prefill batches first): the decode clock stands still.
    decodes: bool

    def __init__(
        self,
        start_s: float,
        first_clock: int,
        timeline: JumpTimeline,
        chunks: list[list[tuple[RequestState, int]]] | None = None,
        decodes: bool = True,
    ) -> None:
        self.start_s = start_s
        self.first_clock = first_clock
        self.timeline = timeline
        self.chunks = [] if chunks is None else chunks
        self.grows = False
        self.decodes = decodes

    @property
    def last_clock(self) -> int:
        return self.first_clock + self.timeline.extra


@dataclass(slots=True)
class JumpCounts:
    """Skip-mode wake-ups by what they jumped over (diagnostics: single stepping has none)."""

    single: int = 0  # no jump: one iteration
    decode: int = 0  # decode iterations only
    prefill: int = 0  # iterations that prefill chunks too
    with_growth: int = 0  # jumps (either kind) inside which sequences take blocks


class IterationCost:
    """What one iteration costs: the cost model's compiled terms when it has them (called without a
    Python call), else the model itself."""

    def __init__(self, costs: CostModel):
        self.costs = costs
        self.linear: LinearIterationCost | None = costs.linear_iteration

    def duration(self, decode_batch: int, sum_context: float, chunks: list[tuple[int, int]]) -> float:
        """Compute time of one iteration: ``decode_batch`` sequences decoding over ``sum_context``
        tokens, plus prefill ``chunks`` of ``(tokens, start position)``. Every iteration's time comes
        from here, except runs of decode-only ones (a closed-form series of the same ``step_s``)."""
        # One forward pass: its fixed cost (the weight read) is paid once, however many prompts
        # share it (``CostModel.iteration_s``); without chunks this is ``decode.step_s``.
        linear = self.linear
        if linear is not None:
            return linear.iteration_s(decode_batch, sum_context, chunks)
        return self.costs.iteration_s(decode_batch, sum_context, chunks)


def prefill_chunk(
    state: RequestState, budget: int, chunks_prompts: bool, prefilled: int | None = None
) -> int:
    """Prompt tokens ``state`` prefills with ``budget`` tokens left (0: none; without chunked
    prefill a prompt goes in whole or waits). ``prefilled``: as planned, instead of now."""
    remaining = state.tokens_to_prefill - (state.prefilled if prefilled is None else prefilled)
    if remaining <= budget:
        return remaining if remaining > 0 else 0
    # (Comparisons, not min/max: this runs for every prompt at every iteration that plans chunks.)
    if not chunks_prompts or budget <= 0:
        return 0
    return budget


@dataclass(slots=True, init=False)
class IterationOne:
    """What iteration 1 of the wake-up did that its successors depend on. (Its constructor is
    written out: compiled, it runs natively, once per wake-up.)"""

    preempted: bool
    swapped_in: bool
    swap_out_pending: int
    prefill_this_step: list[tuple[RequestState, int]]
    prefilling: list[RequestState]
    decoded_seqs: int
    admission_stop: str

    def __init__(
        self,
        preempted: bool,
        swapped_in: bool,
        swap_out_pending: int,
        prefill_this_step: list[tuple[RequestState, int]],
        prefilling: list[RequestState],
        decoded_seqs: int,
        admission_stop: str,
    ) -> None:
        self.preempted = preempted
        self.swapped_in = swapped_in
        self.swap_out_pending = swap_out_pending
        self.prefill_this_step = prefill_this_step
        self.prefilling = prefilling
        self.decoded_seqs = decoded_seqs
        self.admission_stop = admission_stop


class JumpPlanner:
    """Plans one engine's jumps; it reads the engine's clock, pool, costs and scheduler and changes
    nothing."""

    def __init__(
        self,
        clock: DecodeClock,
        kv: KVCoordinator,
        costs: CostModel,
        iteration_cost: IterationCost,
        scheduler: Scheduler,
        block_size: int,
        next_arrival_s: Callable[[], float],
        *,
        async_jumps: bool,
        disaggregated: bool,
        unbacked: UnbackedGrowth | None = None,
        alternates: bool = False,
    ):
        self.clock = clock
        self.kv = kv
        self.costs = costs
        self.iteration_cost = iteration_cost
        self.scheduler = scheduler
        self.chunks_prompts = scheduler.chunks_prompts
        self.block_size = block_size
        # Most tokens a sequence gains per iteration (1 + the speculative tokens).
        schedule = clock.schedule
        self.tokens_per_iteration = 1 if schedule is None else len(schedule.acceptance.probabilities)
        # Async scheduling lets a jump run the iteration after an arrival's (scheduled before it
        # came), except under a cluster: its router reads the replica's state when the request
        # arrives, so the replica must stand at that iteration as single stepping would.
        self.async_jumps = async_jumps
        # A transfer's notice can come at any time (a disaggregated cluster's replica).
        self.disaggregated = disaggregated
        # A cluster's router reads this replica's KV state at every arrival (least_kv, prefix_aware):
        # no jump may hold an iteration an arrival falls in, whose growth single steps have booked
        # by then (a jump books it when it lands).
        self.arrivals_read_state = False
        # When the next request arrives (asked only when a plan depends on it: under a cluster it is
        # the cluster's answer).
        self.next_arrival_s = next_arrival_s
        self.unbacked = unbacked  # a token-granular pool's deferred growth (sim/engine/unbacked.py)
        # Prefill batches first (sim/engine/wakeup.py): an iteration that prefills decodes nothing,
        # its decode clock stopped, so it is stepped, never jumped over.
        self.alternates = alternates
        self._now_s = 0.0
        self._iteration = IterationOne(False, False, 0, [], [], 0, QUEUE_EMPTY)  # the current plan's

    def plan(self, now_s: float, first_s: float, iteration: IterationOne) -> Jump | None:
        """The iterations after iteration 1 that nothing can interrupt, or None to take one step.

        The jump ends with the iteration at whose end something completes; before any iteration
        whose start could admit a request; and, unless the pool has blocks for every sequence's
        growth over the whole jump, before the first iteration that needs one."""
        self._now_s, self._iteration = now_s, iteration
        if iteration.preempted or iteration.swapped_in or iteration.swap_out_pending:
            return None  # the batch (or the swap traffic) of the next iteration differs from this one's
        if any(state.prefilled >= state.tokens_to_prefill for state, _ in iteration.prefill_this_step):
            return None  # a prompt completes at the end of iteration 1
        if self.kv.scheduled_chunks_move_slots() and any(
            state.prefilled < state.tokens_to_prefill for state in iteration.prefilling
        ):
            return None  # each chunk reported moves slots: observed at its own iteration
        if self.alternates and iteration.prefill_this_step:
            return self._prefill_batches_jump(first_s)
        clock = self.clock
        if clock.context_clamped():
            return None  # (the context read stays 0 for a while: steps, not a closed form)
        # (In iterations: the decode clock counts tokens, one per iteration without speculation.)
        limit = clock.iteration_ending(clock.next_end()) - clock.iteration  # up to the next completion
        if limit <= 0:
            return None
        sequences = clock.sequences
        room = self.kv.available_slots()
        # Every sequence takes at most ceil(t / block_size) blocks for t tokens; when the pool has
        # them all, no growth inside the jump can fail and the jump need not stop at flushes.
        safe = UNLIMITED if sequences == 0 else room // (sequences * self.block_size) * self.block_size
        safe //= self.tokens_per_iteration
        next_flush = clock.iteration_needing(clock.next_flush()) - clock.iteration - 1
        limit = min(limit, max(safe, next_flush))
        if iteration.admission_stop == HEAD_OUT_OF_MEMORY and self.kv.releases_while_decoding():
            # A flush may give blocks back (a window moving on) and let the waiting head in: the
            # iteration of the flush admits after its growth, as single steps would.
            limit = min(limit, next_flush)
        # An attention window filling up changes how the attended context grows: it starts a wake-up.
        limit = min(limit, clock.iteration_needing(clock.next_crossing()) - clock.iteration - 1)
        if self.unbacked is not None:
            limit = self.unbacked.jump_limit(limit)  # (its sequences flush never: its pool stops the jump)
        if limit <= 0:
            return None
        budget = self.scheduler.prefill_budget(iteration.decoded_seqs)
        prompts = [state for state in iteration.prefilling if state.prefilled < state.tokens_to_prefill]
        if any(prefill_chunk(state, budget, self.chunks_prompts) for state in prompts):
            jump = self._prefill_jump(first_s, prompts, budget, limit)
        else:
            jump = self._decode_jump(first_s, budget, limit)
        if jump is not None:
            jump.grows = jump.last_clock >= clock.iteration_needing(clock.next_flush()) or (
                self.unbacked is not None and self.unbacked.active and sequences > 0
            )
        return jump

    def _decode_jump(self, first_s: float, budget: int, limit: int) -> Jump | None:
        """Decode-only iterations: each has ``budget`` tokens left for admissions."""
        extra = limit
        if self.arrivals_read_state or self.disaggregated:
            # A router reading the pool: the jump ends before the iteration an arrival falls in. A
            # transfer's notice is taken at every iteration start, whatever the budget: sent blocks
            # are freed, landed prompts queued (and can unblock any head: landed prompts hold their
            # blocks, released blocks are room).
            until = self._iterations_until_arrival(first_s)
            extra = min(extra, until - 1 if self.arrivals_read_state else until)
        if budget > 0:
            if self._iteration.admission_stop in NEXT_TRIES_HEAD or self.scheduler.rematches:
                return None  # the next iteration tries the head
            if self._iteration.admission_stop == QUEUE_EMPTY and not self.disaggregated:
                # With async scheduling the iteration after the arrival's was scheduled before it
                # came, so it can run too; not after one at iteration 1's very start (a follow-up
                # sent at a completion), which the next iteration, scheduled then, sees.
                unseen = 1 if self.async_jumps and self.next_arrival_s() > self._now_s else 0
                extra = min(extra, self._iterations_until_arrival(first_s) + unseen)
        if extra <= 0:
            return None
        timeline = self._timeline(first_s, extra, self._iteration.decoded_seqs, self.clock.sum_context())
        return Jump(self._now_s, self.clock.iteration, timeline)

    def _timeline(
        self,
        first_s: float,
        extra: int,
        batch: int,
        context: float,
        durations: tuple[float, ...] | None = None,
    ) -> JumpTimeline:
        schedule = self.clock.schedule
        rate = self.clock.context_growth()
        if schedule is None:
            return JumpTimeline(first_s, extra, self.costs.decode, batch, context, durations, rate=rate)
        growth = schedule.starts(self.clock.iteration, extra)
        if durations is None:
            durations = scheduled_durations(self.costs.decode, batch, context, growth, rate)
        return JumpTimeline(
            first_s, extra, self.costs.decode, batch, context, durations, tuple(growth.tolist()), rate
        )

    def _iterations_until_arrival(self, first_s: float) -> int:
        """Iterations after the first up to and including the one during which the next request
        arrives (the one after it sees the arrival); 0 when it arrives during iteration 1."""
        budget_s = self.next_arrival_s() - self._now_s - first_s
        if budget_s <= 0:
            return 0
        context = self.clock.sum_context()
        schedule = self.clock.schedule
        rate = self.clock.context_growth()
        batch = self._iteration.decoded_seqs
        if schedule is not None:
            return scheduled_iterations_to_reach(
                self.costs.decode, batch, context, budget_s, schedule, self.clock.iteration, rate
            )
        return iterations_to_reach(self.costs.decode, batch, context, budget_s, rate)

    def _prefill_batches_jump(self, first_s: float) -> Jump | None:
        """Prefill batches first: iteration 1 ran a prefill batch alone, the decoding requests waiting
        (their clock stopped), and so do the prefill batches after it that continue the prompts in
        progress with the whole budget, up to the one that completes a prompt (its end may start a
        decode batch, or preempt). Nothing grows or completes in them: only their admissions can
        change what follows, as for the prefill iterations beside a decode batch."""
        budget = self.scheduler.prefill_budget(0)
        prompts = [state for state in self._iteration.prefilling if state.prefilled < state.tokens_to_prefill]
        if not any(prefill_chunk(state, budget, self.chunks_prompts) for state in prompts):
            return None  # the next iteration admits, or runs the decode batch
        return self._prefill_jump(first_s, prompts, budget, UNLIMITED, decodes=False)

    def _prefill_jump(
        self, first_s: float, prompts: list[RequestState], budget: int, limit: int, decodes: bool = True
    ) -> Jump | None:
        """Iterations that prefill ``prompts`` in running order with ``budget`` tokens each, up to the
        one that completes a prompt; an iteration that leaves budget for admissions must not start
        after an arrival (or at all, when the queue head is untried). ``decodes``: the decode batch
        runs in each of them (else they are prefill batches alone, the decode clock stopped)."""
        batch = self._iteration.decoded_seqs if decodes else 0
        context = self.clock.sum_context() if decodes else 0.0
        positions = [state.prefilled for state in prompts]
        schedule = self.clock.schedule  # (speculation: each iteration grows the context by its tokens)
        first = self.clock.iteration
        start = self.clock.now
        growth = self.clock.context_growth()  # (attention windows: the attended context's, per token)
        rate = (batch if growth is None else growth) if decodes else 0
        arrival_s = self.next_arrival_s() - self._now_s
        elapsed_s = first_s
        started_s = 0.0  # when the iteration before the next one started
        durations: list[float] = []
        all_chunks: list[list[tuple[RequestState, int]]] = []
        for step in range(1, limit + 1):
            left = budget
            chunks: list[tuple[RequestState, int]] = []
            sized: list[tuple[int, int]] = []
            completes = False
            for index, state in enumerate(prompts):
                if left <= 0:
                    break
                chunk = prefill_chunk(state, left, self.chunks_prompts, positions[index])
                if not chunk:
                    continue
                chunks.append((state, chunk))
                sized.append((chunk, positions[index]))
                positions[index] += chunk
                completes |= positions[index] == state.tokens_to_prefill
                left -= chunk
            # (Async scheduling: an iteration's admissions see the queue as it was when the iteration
            # before it started.)
            seen_s = started_s if self.async_jumps else elapsed_s
            if left > 0 and self._admission_may_change(seen_s, arrival_s):
                break
            if self.disaggregated and arrival_s <= elapsed_s:
                break  # a transfer's notice is taken at this iteration's start, budget or not
            grown = step if schedule is None else self.clock.first_token_of(first + step) - start
            duration = self.iteration_cost.duration(batch, context + grown * rate, sized)
            if self.arrivals_read_state and arrival_s < elapsed_s + duration:
                break  # an arrival falls in this iteration and reads the state its start booked
            durations.append(duration)
            all_chunks.append(chunks)
            started_s = elapsed_s
            elapsed_s += durations[-1]
            if completes:
                break
        if not durations:
            return None
        if not decodes:
            timeline = JumpTimeline(first_s, len(durations), self.costs.decode, 0, 0.0, tuple(durations))
            return Jump(self._now_s, self.clock.iteration, timeline, all_chunks, decodes=False)
        timeline = self._timeline(first_s, len(durations), batch, context, tuple(durations))
        return Jump(self._now_s, self.clock.iteration, timeline, all_chunks)

    def _admission_may_change(self, seen_s: float, arrival_s: float) -> bool:
        """Could an admission attempt that sees the requests queued up to ``seen_s`` after iteration 1
        started change anything? (``arrival_s``: when the next request arrives, same origin.)"""
        if self._iteration.admission_stop in NEXT_TRIES_HEAD or self.scheduler.rematches:
            return True
        return (self._iteration.admission_stop == QUEUE_EMPTY or self.disaggregated) and arrival_s <= seen_s
