"""Decode growth and preemption: the decoding sequences whose held slots ran out take their tokens
(in one coordinator call when the pool surely has the blocks, else token by token as single steps
would, oldest request first), and when the pool is short the scheduler's victim leaves the GPU:
recomputed later, or swapped to host memory (``preemption_mode: swap``, one sequence only)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from policies.base import OutOfKVMemory
from sim.engine.batch import Batch
from sim.engine.decoding import DecodeClock, RequestState
from sim.engine.handoff import KVHandOff
from sim.engine.knobs import EngineKnobs
from sim.engine.ledger import RequestLedger
from sim.engine.unbacked import UnbackedGrowth
from sim.kv.coordinator import KVCoordinator
from sim.outputs.metrics import Counters

if TYPE_CHECKING:
    from sim.engine.schedulers.base import Scheduler, SchedulingEngine


class DecodeGrowth:
    def __init__(
        self,
        kv: KVCoordinator,
        clock: DecodeClock,
        batch: Batch,
        counters: Counters,
        knobs: EngineKnobs,
        block_size: int,
        scheduler: Scheduler,
        ledger: RequestLedger,
        handoff: KVHandOff,
        unbacked: UnbackedGrowth | None = None,
    ):
        self.kv = kv
        self.clock = clock
        self.batch = batch
        self.counters = counters
        self.swap_preemption = knobs.preemption_mode == "swap"
        self.block_size = block_size
        self.scheduler = scheduler
        self.ledger = ledger
        self.handoff = handoff
        self.unbacked = unbacked  # a token-granular pool's deferred growth (sim/engine/unbacked.py)
        self.engine: SchedulingEngine | None = None  # what the scheduler's victim choice reads

    def decode_growth(self) -> tuple[bool, int]:
        """This iteration's token for the requests whose held slots ran out, oldest first (the others
        take theirs on the clock). Returns whether anything was preempted, and blocks swapped out."""
        preempted = False
        swapped = 0
        before = self.clock.now - 1
        due = self.clock.due_flushes()
        # (Unbacked growth: the pool holds every pending token, this iteration's included, or growth
        # would be told token by token now; what is due is a release, sim/engine/unbacked.py.)
        unbacked = self.unbacked
        if due and (
            (unbacked is not None and unbacked.active)
            or self.pool_holds(due, self.clock.now)
            or self._fit_together(due)
        ):
            self.clock.flush(due, self.clock.now)  # what one at a time would do, in one policy call
            return preempted, swapped
        for state in due:
            if not (state.is_running and state.decoding):
                continue  # preempted by an older request earlier in this loop
            if self._grow_all_pending(state):
                continue
            # Not enough blocks: replay it token by token as the reference would, preempting on OOM.
            # (Its room holds the tokens before this iteration's, unless a speculative step accepted
            # drafts past it: those are replayed too.)
            reached = self.clock.sync_within_room(state, before)
            for _ in range(self.clock.now - reached):
                for seq_id in list(state.seq_ids):
                    outcome = self.grow_or_preempt(state, seq_id, victims_at=before)
                    preempted |= outcome > 0
                    swapped += max(0, outcome - 1)
                    if not state.is_running:
                        break
                if not state.is_running:
                    break
                self.clock.took_token(state)
            if state.is_running:
                self.clock.reschedule_flush(state)
        return preempted, swapped

    def pool_holds(self, states: list[RequestState], at_clock: int) -> bool:
        """Does the pool have the blocks for every sequence of ``states`` to take its tokens up to
        ``at_clock``? (Then nothing could have failed token by token.) A cheap upper bound: the new
        blocks, plus one copy-on-write block per sequence."""
        block_size = self.block_size
        blocks = 0
        for state in states:  # (a loop, not sum() of a generator: this runs at every flush)
            blocks += len(state.seq_ids) * ((at_clock - state.synced_clock) // block_size + 2)
        return blocks * block_size <= self.kv.available_slots()

    def _fit_together(self, due: list[RequestState]) -> bool:
        """Does the pool's own check pass for every due sequence's pending tokens at once? Then they are
        told in one call, as when the cheap bound holds. A pool that frees before it takes (a window's
        blocks leaving, cached) evicts by the order it sees them in, so this must not hang on how many
        sequences are due: every running one when stepping singly, those whose room ran out when
        skipping. The cheap bound counts them all; the pool's check sees only those that move blocks."""
        if len(due) < 2:
            return False  # (one: the loop below asks the same)
        now = self.clock.now
        seq_ids: list[int] = []
        tokens: list[int] = []
        for state in due:
            for seq_id in state.seq_ids:
                seq_ids.append(seq_id)
                tokens.append(now - state.synced_clock)
        return self.kv.fits_growth_each(seq_ids, tokens)

    def _grow_all_pending(self, state: RequestState) -> bool:
        """A flush when the pool is short: every sequence takes all its pending tokens in one call if
        the pool has the blocks for all of them (then nothing could have failed token by token)."""
        pending = self.clock.now - state.synced_clock
        if not self.pool_holds([state], self.clock.now) and not self.kv.fits_growth(state.seq_ids, pending):
            return False
        self.clock.flush([state], self.clock.now)
        return True

    def grow_or_preempt(self, state: RequestState, seq_id: int, *, victims_at: int) -> int:
        """Grow one sequence by a token; on OOM preempt the newest request until it fits. Victims are
        taken back to clock ``victims_at`` (a newer request has not decoded this iteration yet).
        Returns 0 when nothing was preempted, else 1 + blocks swapped out."""
        # (The call made directly first: it nearly always fits, and a partial called through the
        # interpreter cost a third of a compiled SGLang pool's growth.)
        try:
            self.kv.grow(seq_id, 1)
            return 0
        except OutOfKVMemory:
            return self._preempt_until_fits(state, partial(self.kv.grow, seq_id, 1), victims_at)

    def make_room(self, state: RequestState, attempt: Callable[[], None], victims_at: int) -> int:
        """Run ``attempt``, a policy call for ``state`` that raises :class:`OutOfKVMemory` when the pool
        is short (a token, a fork of samples), preempting the scheduler's victim (vLLM: the newest
        request) until it succeeds or ``state`` itself is the one taken off. Returns 0 when nothing
        was preempted, else 1 + blocks swapped out."""
        try:
            attempt()
            return 0
        except OutOfKVMemory:
            return self._preempt_until_fits(state, attempt, victims_at)

    def _preempt_until_fits(self, state: RequestState, attempt: Callable[[], None], victims_at: int) -> int:
        """:meth:`make_room` once ``attempt`` has failed (and changed nothing)."""
        outcome = 0
        while True:
            assert self.engine is not None
            victim = self.scheduler.preemption_victim(self.engine)
            if victim is state and len(self.batch.running) == 1 and not self.handoff.pending:
                # Its samples/beams outgrow the pool with nothing else in it (whole blocks each
                # can exceed the tokens checked on arrival): a rejection, not a preemption.
                # (Blocks held for transfers will free: then it is preempted, to wait for them.)
                self.reject_alone(state, victims_at)
                return outcome
            outcome = max(outcome, 1) + self.preempt(victim, victims_at)
            if victim is state:
                return outcome
            try:
                attempt()
                return outcome
            except OutOfKVMemory:
                pass

    def preempt(self, state: RequestState, at_clock: int) -> int:
        """Take ``state`` off the GPU (its tokens as of ``at_clock``); returns blocks swapped out."""
        self.counters.preemptions += 1
        state.record.preemptions += 1
        self._off_the_gpu(state, at_clock)
        swapped_blocks = 0
        held = sum(self.kv.seq_len(seq_id) for seq_id in state.seq_ids)
        single = state.request.width == 1
        if self.swap_preemption and single and self.batch.swap_room() >= held:
            swapped_blocks = -(-held // self.block_size)
            self.batch.swap_out(state, held)
            self.counters.swapped_out_blocks += swapped_blocks
        self._free_all(state)
        if not single:
            # Samples and beams restart from the prompt: their diverged tokens are not recoverable.
            state.generated = 0
        state.prefilled = 0
        assert self.engine is not None
        self.scheduler.requeue(self.engine, state)
        return swapped_blocks

    def reject_alone(self, state: RequestState, at_clock: int) -> None:
        """Alone in the pool and still no room for its samples/beams: retrying could never succeed."""
        self._off_the_gpu(state, at_clock)
        self._free_all(state)
        self.ledger.reject(state, f"its {state.width} samples/beams do not fit in the KV pool even alone")

    def _off_the_gpu(self, state: RequestState, at_clock: int) -> None:
        if state.decoding:
            self.clock.leave(state, at_clock)
        self.batch.leave(state)

    def _free_all(self, state: RequestState) -> None:
        for seq_id in state.seq_ids:
            self.kv.free(seq_id, finished=False)
        state.seq_ids = []

    def prepare_decode_step(self) -> bool:
        """The decode step at the clock's iteration is about to take its tokens: the policy may make
        room first (``KVCachePolicy.prepare_decode_step``). Returns whether it evicted anything. Free
        slots change only when sequences take blocks (flushes, at iteration 1 or inside a jump), so
        that is when it runs; between flushes it would find nothing to do."""
        sequences = self.clock.sequences
        if not sequences:
            return False
        evictions = self.kv.evictions()
        self.kv.prepare_decode_step(sequences)
        return self.kv.evictions() != evictions
