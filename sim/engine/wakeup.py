"""One wake-up of the engine: iteration 1 as the scheduler runs it (vLLM's order: the decoding
sequences' growth, the prompts in progress, then admissions; or SGLang's, prefill batches first),
the jump over the deterministic iterations after it (``jumps.py`` plans it, ``landing.py`` applies
it), and the books of what they produced once they end. What an iteration leaves to the next
(blocks swapped out or copied at its end) waits here."""

from __future__ import annotations

from collections.abc import Callable

import simpy

from sim.engine.admission import AdmissionDesk
from sim.engine.batch import Batch
from sim.engine.completions import Completions
from sim.engine.decoding import DecodeClock
from sim.engine.errors import EngineStalled
from sim.engine.growth import DecodeGrowth
from sim.engine.handoff import KVHandOff
from sim.engine.jumps import IterationCost, IterationOne, Jump, JumpCounts, JumpPlanner
from sim.engine.landing import JumpLanding
from sim.engine.schedulers.base import NOT_TRIED, QUEUE_EMPTY, Scheduler
from sim.engine.unbacked import UnbackedGrowth
from sim.kv.coordinator import KVCoordinator
from sim.outputs.metrics import Counters


class WakeUp:
    def __init__(
        self,
        env: simpy.Environment,
        kv: KVCoordinator,
        clock: DecodeClock,
        batch: Batch,
        parts: tuple[DecodeGrowth, AdmissionDesk, Completions, JumpPlanner, JumpLanding],
        scheduler: Scheduler,
        handoff: KVHandOff,
        iteration_cost: IterationCost,
        counters: Counters,
        skip: bool,
        next_arrival_s: Callable[[], float],
        unbacked: UnbackedGrowth | None = None,
        alternates: bool = False,
    ):
        self.env = env
        self.kv = kv
        self.clock = clock
        self.batch = batch
        self.growth, self.desk, self.completions, self.planner, self.landing = parts
        self.scheduler = scheduler
        self.handoff = handoff
        self.costs = iteration_cost.costs
        self.iteration_cost = iteration_cost
        self.counters = counters
        self.skip = skip  # step_mode "skip": plan jumps
        self.next_arrival_s = next_arrival_s
        self.unbacked = unbacked  # a token-granular pool's growth, deferred while it has room
        self.jumps = JumpCounts()
        self.jump: Jump | None = None  # the wake-up in flight, when it spans several iterations
        self.decoded_seqs = 0  # sequences that decoded in each iteration of the current wake-up
        self.decode_context = 0.0  # the context they read in iteration 1
        # Prefill batches first (the scheduler's mixes_batches False): an iteration that prefills
        # decodes nothing.
        self.alternates = alternates
        self.retract_next = False  # (prefill batches first) the next iteration retracts and decodes
        self.iterations = 0
        self.first_iteration = 0  # the decode clock's number of the current wake-up's iteration 1
        self.swap_out_pending = 0  # blocks swapped out at an iteration's end: the next iteration moves them
        # Blocks copied on write at an iteration's end (a fork's first token): the next iteration copies them.
        self.copies_pending = 0
        # What iteration 1 of the current wake-up did that its successors depend on.
        self.preempted = False
        self.swapped_in = False
        self.admission_stop = QUEUE_EMPTY

    def advance(self) -> float:
        """Start the next iteration and plan the deterministic ones after it; return their time."""
        first_s = self._first_iteration()
        if first_s <= 0 or not self.skip:
            return first_s
        iteration = IterationOne(
            self.preempted,
            self.swapped_in,
            self.swap_out_pending,
            self.desk.prefill_this_step,
            self.batch.prefilling,
            self.decoded_seqs,
            self.admission_stop,
        )
        jump = self.jump = self.planner.plan(self.env.now, first_s, iteration)
        jumps = self.jumps
        if jump is None:
            jumps.single += 1
            return first_s
        if jump.chunks:
            jumps.prefill += 1
        else:
            jumps.decode += 1
        if jump.grows:
            jumps.with_growth += 1
        return jump.timeline.total_s

    def _first_iteration(self) -> float:
        """One iteration as the scheduler runs it: decode growth, prompts in progress, then admissions
        (or, prefill batches first, a decode batch only when nothing is prefilled)."""
        desk = self.desk
        copies_before = self.kv.cow_copies()
        loads_before = desk.host_loads()
        if self.handoff.notices_waiting:
            self.handoff.take_notices(self.kv, self.batch.waiting)
        desk.prefill_this_step = []
        chunks: list[tuple[int, int]] = []
        if self.alternates:
            preempted, swap_blocks, swap_in = self._prefill_first(chunks)
        else:
            preempted, swap_blocks, swap_in = self._mixed(chunks)
        decode_batch = self.decoded_seqs
        self.preempted = preempted
        self.swapped_in = swap_in > 0
        self.iterations = 1
        # Prefix hits loaded from the host tier at admission: their transfer delays this iteration,
        # which needs them, like a swap-in (a host hit always leaves its prompt's last token to compute).
        load_s = desk.charge_host_loads(loads_before)
        if decode_batch == 0 and not desk.prefill_this_step:
            if swap_blocks:
                return self.costs.swap_blocks_s(swap_blocks) + load_s  # a swap-in alone: no forward pass
            self._check_progress()
            return 0.0
        duration = self.iteration_cost.duration(decode_batch, self.decode_context, chunks)
        copies = self.kv.cow_copies() - copies_before + self.copies_pending
        self.copies_pending = 0
        duration += self.costs.copy_blocks_s(copies) if copies else 0.0
        duration += self.costs.swap_blocks_s(swap_blocks) if swap_blocks else 0.0
        return duration + load_s

    def _mixed(self, chunks: list[tuple[int, int]]) -> tuple[bool, int, int]:
        """The decoding sequences take their tokens, then prompts in progress and admissions prefill
        beside them within the budget they leave. Returns (preempted, blocks to swap, of which in)."""
        preempted, swap_blocks = self._decode_step()
        budget = self._prompts_in_progress(self.scheduler.prefill_budget(self.decoded_seqs), chunks)
        self.admission_stop = NOT_TRIED
        swap_in = 0
        if not preempted:  # (not after a preemption, as vLLM; SGLang's retraction step admits nothing)
            budget, swap_in, self.admission_stop = self.scheduler.admit(self.desk, budget, chunks)
            if self.decoded_seqs and not self.desk.prefill_this_step:
                self.scheduler.decode_steps(1)  # a decode batch (SGLang's update_running_batch)
        return preempted, swap_blocks + swap_in, swap_in

    def _prefill_first(self, chunks: list[tuple[int, int]]) -> tuple[bool, int, int]:
        """SGLang's ``get_next_batch_to_run``: prompts in progress and admissions first, with the whole
        budget; a prefill batch runs alone (the decoding sequences wait, their clock stopped), and
        only an iteration that prefills nothing decodes."""
        if self.retract_next:
            self.retract_next = False
            if self.clock.sequences:  # (nothing decoding: no decode batch to retract in)
                return self._retracting_decode()
        budget = self._prompts_in_progress(self.scheduler.prefill_budget(0), chunks)
        budget, swap_in, self.admission_stop = self.scheduler.admit(self.desk, budget, chunks)
        if self.desk.prefill_this_step:
            self.decoded_seqs = 0
            self.decode_context = 0.0
            swap_blocks = self.swap_out_pending
            self.swap_out_pending = 0
            return False, swap_blocks + swap_in, swap_in
        preempted, swap_blocks = self._decode_step()
        if self.decoded_seqs and not preempted:
            self.scheduler.decode_steps(1)  # update_running_batch without a retraction
        return preempted, swap_blocks + swap_in, swap_in

    def _retracting_decode(self) -> tuple[bool, int, int]:
        """The decode batch after a prefill batch at whose end requests were preempted: kvsim gives a
        finished prompt its first token's slot (and forks its samples) then, SGLang at the next
        decode batch, where ``update_running_batch`` retracts. So this iteration is that decode
        batch, admitting nothing, with the retraction's rules (more retracted until 20 tokens per
        request are free, the ratio re-estimated). Without it, a request refused at its prompt's
        end could be admitted again at every iteration, the decode batch never running."""
        self.admission_stop = NOT_TRIED
        _, swap_blocks = self._decode_step(retracts=True)
        return True, swap_blocks, 0

    def _decode_step(self, retracts: bool = False) -> tuple[bool, int]:
        """Every decoding sequence takes a token (the policy hears of those that need a block).
        Returns whether that preempted, and the blocks to swap (with those left from before).
        ``retracts``: the scheduler's after-preemption rules run even if nothing was preempted now."""
        self.clock.begin_iteration()
        self.first_iteration = self.clock.iteration
        if self.unbacked is not None:
            self.unbacked.at_iteration_start()
        self.growth.prepare_decode_step()
        preempted, swap_blocks = self.growth.decode_growth()
        if preempted or retracts:
            self.scheduler.after_preemption(self.desk)
        swap_blocks += self.swap_out_pending
        self.swap_out_pending = 0
        # The batch this iteration decodes (a request swapped in by the admissions after this joins
        # the next one).
        self.decoded_seqs = self.clock.sequences
        self.decode_context = self.clock.sum_context()
        return preempted, swap_blocks

    def _prompts_in_progress(self, budget: int, chunks: list[tuple[int, int]]) -> int:
        """Schedule the next chunk of every prompt in progress within ``budget``; returns what is left."""
        desk = self.desk
        for state in self.batch.prefilling:
            if state.prefilled < state.tokens_to_prefill and budget > 0:
                budget = desk.schedule_prefill(state, budget, chunks)
        return budget

    def land(self) -> bool:
        """The wake-up's time has passed: apply its jump, if it had one. Returns whether it had."""
        jump = self.jump
        if jump is None:
            return False
        self.jump = None
        self.iterations = self.landing.land(jump, self.desk.prefill_this_step)
        return True

    def stop_inside(self) -> None:
        """The run ended inside the wake-up: book what single steps would have by now."""
        jump = self.jump
        if jump is not None:
            self.jump = None
            self.landing.stop_inside(jump, self.env.now)

    def finish_iterations(self) -> bool:
        """Book what the iteration(s) that just ended produced: first tokens, completions, beams.
        Returns whether any of those happened (the state changed)."""
        copies_before = self.kv.cow_copies()
        self.counters.iterations += self.iterations
        clock = self.clock
        if self.decoded_seqs:
            last = self.first_iteration + self.iterations - 1
            self.counters.output_tokens += (
                clock.tokens_per_sequence(self.first_iteration, last) * self.decoded_seqs
            )
        clock.end_iteration()
        self.desk.chunk_reports.batch_ran()  # (SGLang caches the chunks that ran before their completions)
        preemptions_before = self.counters.preemptions
        changed, swapped_out = self.completions.after_iterations(self.desk.prefill_this_step)
        self.retract_next = self.alternates and self.counters.preemptions > preemptions_before
        self.swap_out_pending += swapped_out
        self.desk.prefill_this_step = []
        self.decoded_seqs = 0
        self.copies_pending += self.kv.cow_copies() - copies_before
        return changed

    def prefill_tokens(self) -> int:
        """Prompt tokens the iteration in flight computes."""
        tokens = 0
        for _state, chunk in self.desk.prefill_this_step:
            tokens += chunk
        return tokens

    def _check_progress(self) -> None:
        batch = self.batch
        if batch.running or not batch.waiting or self.handoff.pending:
            return
        if self.env.now >= self.next_arrival_s():
            return
        raise EngineStalled(
            f"at t={self.env.now:.6f}s nothing can run: {len(batch.waiting)} waiting, none admissible"
        )
