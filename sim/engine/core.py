"""A SimPy model of one GPU serving requests with continuous batching over any KV-cache policy.

One SimPy process runs the engine loop: each wake-up starts one iteration (growth, prefill chunks,
admissions) and, when nothing can happen in between, jumps over the iterations after it in closed
form; arrivals are SimPy events. The scheduler follows vLLM: FCFS, running
requests first, then waiting requests while the policy can allocate; when a running sequence cannot
grow, the most recently admitted request is preempted (recompute: freed and requeued at the front;
swap: its KV moves to a host pool).

Event skipping: decode tokens are counted on a decode clock (``sim/engine/decoding.py``) and reach the
policy only when a sequence's held slots run out, so a decode iteration costs nothing per sequence.
After an iteration has started, the ones that follow are deterministic until an event: a completion
(a prompt done, a request finished, a beam decision), an iteration start at which an admission could
change something (a free token budget and a waiting head that might fit, or an arrival), or a
sequence needing a block when the pool might not have it. Up to that event the decode batch is
fixed, so decode-only iterations are an arithmetic series (``sim/engine/event_skip.py``) and chunked-prefill
iterations a short deterministic schedule; the blocks sequences take inside the jump are taken, in the
order single steps would take them, when the jump ends, and observed at the instants they were due
so time averages stay exact. ``step_mode="single"`` tells the policy every token and steps every
iteration: tests check both modes give the same results.

Memory model notes (documented simplifications):
- admission allocates the whole prompt (vLLM V1 checks the full prompt fits, ``scheduler_reserve_full_isl``);
  chunked prefill then spends the compute over several iterations;
- the iteration that finishes a prompt produces the first token; a request with ``n > 1`` or beam search
  forks right after its prompt, so the samples share the prompt blocks (copy-on-write where supported);
- ``max_num_seqs`` counts sequences in the batch (samples and beams each count);
- samples stop independently: a sample that generated its last token frees its own blocks and the
  request finishes with its last one; beams re-parent: at each decode step each beam is replaced by
  a fork of a surviving beam with probability ``beam_reparent_prob`` (``_beam_step``).
"""

from __future__ import annotations

import gc
import math
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import simpy

from policies.base import ChildSpec, KVCachePolicy, OutOfKVMemory
from sim.costs.core import CostModel
from sim.engine.arrivals import Arrivals
from sim.engine.beams import BeamDraws
from sim.engine.decoding import NEVER, DecodeClock, RequestState
from sim.engine.errors import EngineStalled
from sim.engine.handoff import KVHandOff
from sim.engine.jumps import IterationCost, IterationOne, Jump, JumpCounts, JumpPlanner, prefill_chunk
from sim.engine.knobs import EngineKnobs
from sim.engine.observe import StateObserver
from sim.engine.schedulers import make_scheduler
from sim.engine.schedulers.base import (
    HEAD_NOT_SEEN,
    HEAD_OUT_OF_MEMORY,
    HEAD_OVER_BUDGET,
    NOT_TRIED,
    QUEUE_EMPTY,
)
from sim.engine.transfer import KVTransferHooks
from sim.kv.coordinator import KVCoordinator, SingleGroupCoordinator, make_coordinator
from sim.outputs.metrics import (
    CHUNK_ROWS,
    KV_MEMORY,
    MAX_NUM_SEQS,
    TOKEN_BUDGET,
    Counters,
    Recorder,
    RequestRecord,
)
from sim.outputs.sinks import MemorySink, OutputSink
from token_content import TokenContent, content_length
from workloads.request import Request

if TYPE_CHECKING:
    from sim.engine.lockstep import LockstepGroup


YOUNG_COLLECTION_EVERY = 1_000_000
"""Allocations between two collections of the cyclic garbage collector's youngest generation during a
run (Python's default is 700). A run allocates many objects that live a while (request states and
records, time-series rows, block tables) and nearly no cycles; each collection walks every young
object's references, which are scattered in memory. Measured on 300k synthetic requests with prefix
caching (compiled): at 10,000, 77 collections took 1.3 s of an 18.7 s run; at 100,000, 9 took
0.45 s; at 1,000,000, 5 took 0.04 s, with the same peak memory (1M requests: 334 MiB)."""


@contextmanager
def fewer_collections(first_generation: int = YOUNG_COLLECTION_EVERY) -> Iterator[None]:
    """Run with the cyclic garbage collector's youngest generation collected every
    ``first_generation`` allocations (:data:`YOUNG_COLLECTION_EVERY`) instead of Python's 700. Nothing
    a run allocates relies on prompt collection; the threshold is restored afterwards (a larger one,
    or a disabled collector, is left as it is)."""
    thresholds = gc.get_threshold()
    if thresholds[0] and thresholds[0] < first_generation:
        gc.set_threshold(first_generation, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


class Engine:
    def __init__(
        self,
        policy: KVCachePolicy | KVCoordinator,
        costs: CostModel,
        knobs: EngineKnobs,
        requests: Iterator[Request],
        *,
        seed: int = 0,
        follow_up=None,
        block_size: int = 16,
        sink: OutputSink | None = None,
        host_load_s: Callable[[float], float] | None = None,
        env: simpy.Environment | None = None,
        upstream: Callable[[], float] | None = None,
        on_delivered: Callable[[int], None] | None = None,
        transfer: KVTransferHooks | None = None,
        prefill_only: bool = False,
        lockstep: LockstepGroup | None = None,
        on_arrival: Callable[[RequestRecord], None] | None = None,
    ):
        """``env`` and ``upstream`` make the engine a replica of a cluster (``sim/cluster/``): it shares
        the cluster's clock, receives its requests through :meth:`submit`, and ``upstream()`` bounds
        when the next one may come (the engine plans its event-skipping jumps with it).
        ``on_delivered(count)`` follows the requests of ``requests`` as they arrive (a progress bar);
        ``on_arrival(record)`` receives each request's record as it arrives, to read its progress
        later (a watch that may stop the run: :meth:`run`'s ``stop``).
        ``transfer``: the replica of a disaggregated cluster (``sim/engine/transfer.py``); with
        ``prefill_only`` a prefill replica (every request hands its blocks off), else one that can
        receive prompts computed elsewhere (a decode replica). ``upstream()`` then also bounds when a
        transfer may land or release blocks.

        ``lockstep`` makes it a rank of an expert-parallel group (``sim/engine/lockstep.py``): its
        iterations last as long as the group's steps, one at a time (``step_mode: single``)."""
        if lockstep is not None and knobs.step_mode != "single":
            raise ValueError("a rank of a lockstep group steps one iteration at a time (step_mode single)")
        # Every KV operation goes through the coordinator of the model's KV groups (sim/kv/).
        self.kv = policy if isinstance(policy, KVCoordinator) else make_coordinator(policy)
        self.costs = costs
        self._iteration_cost = IterationCost(costs)
        # Seconds to load blocks from the host tier (offload:); by default the swap link.
        self._host_load_s = host_load_s if host_load_s is not None else costs.swap_blocks_s
        self.knobs = knobs
        self.block_size = block_size
        self.env = env if env is not None else simpy.Environment()
        self._upstream = upstream
        self._lockstep = lockstep
        self.busy_until = float("inf")  # end of the wake-up in flight: no completion comes before it
        self.rng = np.random.default_rng(seed)
        self.beams = BeamDraws(self.rng, knobs.beam_reparent_prob)
        self._follow_up = follow_up
        self._arrivals = Arrivals(self.env, requests, self._arrive, on_delivered=on_delivered)
        self._on_arrival = on_arrival
        self._loop_process: simpy.Process | None = None
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        # The running requests whose prompt is in progress, in running order: every iteration
        # schedules their chunks, so they are kept apart rather than found among the running.
        self._prefilling: list[RequestState] = []
        self.sink: OutputSink = sink if sink is not None else MemorySink()
        self._done_records: list[RequestRecord] = []  # outcomes not yet handed to the sink
        self.counters = Counters()
        # Loop wake-ups that ran iterations (one each, or a jump): what the run's wall time scales
        # with. Not a counter of the results: the step modes differ in it by design.
        self.wakeups = 0
        self.jumps = JumpCounts()
        self.recorder = Recorder(self.kv.pool_slots, self.sink)
        self._wake = self.env.event()
        self._next_seq_id = 0
        self._next_child_stream = -1  # children's output streams: negative ids never clash with workloads
        self._host_tokens_used = 0
        self._running_seqs = 0  # sequences in the batch (samples and beams each count)
        self._unforked_seqs = 0  # samples/beams of admitted requests still in prefill (not forked yet)
        self._swap_out_pending = 0  # blocks swapped out at an iteration's end: the next iteration moves them
        # Blocks copied on write at an iteration's end (a fork's first token): the next iteration copies them.
        self._copies_pending = 0
        self._admissions = 0
        self.clock = DecodeClock(self.kv, defer_growth=knobs.step_mode == "skip")
        self._observer = StateObserver(self.kv, self.clock, self.counters)
        # What differs between the servers (admission, budgets, preemption victims): sim/engine/schedulers/.
        self.scheduler = make_scheduler(knobs)
        self._chunks_prompts = self.scheduler.chunks_prompts
        self._jump: Jump | None = None  # the wake-up in flight, when it spans several iterations
        self._planner = JumpPlanner(
            self.clock,
            self.kv,
            costs,
            self._iteration_cost,
            self.scheduler,
            block_size,
            self._next_arrival_s,
            async_jumps=knobs.async_scheduling and upstream is None,
            disaggregated=transfer is not None,
        )
        self._decoded_seqs = 0  # sequences that decoded in each iteration of the current wake-up
        self._iterations_this_step = 0
        self._prefill_this_step: list[tuple[RequestState, int]] = []
        self.admission_blocker = 0  # what holds the queue's head back (see _admission_blocker)
        # What iteration 1 of the current wake-up did that its successors depend on.
        self._preempted = False
        self._swapped_in = False
        self._admission_stop = QUEUE_EMPTY
        # Async scheduling: when the last iteration started and ended (see scheduled_at).
        self._last_started_s = self._last_ended_s = float("-inf")
        # Disaggregated serving's KV hand-off (sim/engine/handoff.py): what this replica holds for a
        # send, or waits for to land.
        self.handoff = KVHandOff(transfer, prefill_only)

    @property
    def policy(self) -> KVCachePolicy:
        """The policy of a model with one KV group (every layer full attention): the one the engine
        was given. A hybrid model's groups each have their own (``self.kv.groups``)."""
        if not isinstance(self.kv, SingleGroupCoordinator):
            raise AttributeError(f"this engine has {len(self.kv.groups)} KV groups: read engine.kv.groups")
        return self.kv.policy

    # ------------------------------------------------------------------------------------------ run
    def run(self, until_s: float | None = None, stop: simpy.Event | None = None) -> None:
        """Run to the end (every request done) or to ``until_s``; or, given ``stop`` (not with
        ``until_s``), until that event fires. What is in flight at a stop is booked unfinished. If
        ``stop`` never fires, the run ends exactly as without it: at the last request's end, not at
        a later event of whatever would have fired it."""
        if stop is not None and until_s is not None:
            raise ValueError("an engine run takes until_s or a stop event, not both")
        self.start()
        with fewer_collections():
            if stop is None:
                self.env.run(until=until_s)
            else:
                assert self._loop_process is not None
                self.env.run(until=self.env.any_of([stop, self._loop_process]))
        self.finish()

    def start(self) -> None:
        """Register the engine's processes (a cluster starts every replica, then runs the clock)."""
        if self._upstream is None:
            self.env.process(self._arrivals.process())
        self._loop_process = self.env.process(self._loop())
        self._record()

    def submit(self, request: Request, record: RequestRecord | None = None) -> None:
        """A request a cluster's router sends to this replica arrives now (``record``: the one a
        disaggregated cluster keeps for it across its replicas)."""
        self._arrive(request, record)

    def submit_remote(self, request: Request, record: RequestRecord) -> bool:
        """(Decode replica) ``request``'s prompt was computed on a prefill replica: it waits for its
        blocks here, then for its KV. Returns False when it can never run here (rejected now)."""
        state = RequestState(request, record)
        state.queued_s = self.env.now
        state.remote_kv = True
        reason = self._never_admissible(request)
        if reason:
            self._reject(state, reason)  # (the cluster hears of it: remote_dropped)
            return False
        self.waiting.append(state)
        self._wake_up()
        return True

    def kv_received(self, state: RequestState) -> None:
        """(Decode replica) ``state``'s KV has landed: it runs from the next iteration."""
        self.handoff.landed(state)
        self._wake_up()

    def release_held(self, state: RequestState) -> None:
        """(Prefill replica) ``state``'s KV has been sent: its blocks go at the next iteration start."""
        self.handoff.released(state)
        self._wake_up()

    @property
    def held(self) -> dict[int, RequestState]:
        """(Prefill replica) requests whose blocks wait to be sent, by id."""
        return self.handoff.held

    @property
    def receiving(self) -> dict[int, RequestState]:
        """(Decode replica) requests whose blocks are allocated and whose KV is on its way, by id."""
        return self.handoff.receiving

    def _wake_up(self) -> None:
        if not self._wake.triggered:
            self._wake.succeed()

    @property
    def transfers_pending(self) -> bool:
        """Blocks held for a transfer (sent or received): memory will change without a completion here."""
        return self.handoff.pending

    def finish(self) -> None:
        """The clock stopped: book what was in flight and hand every row to the sink."""
        if self._jump is not None:
            self._stop_inside_jump()
        # Requests still in the system at the end are reported as unfinished (a disaggregated request
        # once, by the decode replica that has it: a prefill replica's held ones are there too).
        in_system = [*self.running, *self.waiting, *self.receiving.values()]
        self._done_records.extend(state.record for state in in_system)
        self._flush_records()
        self.recorder.flush()

    @property
    def records(self) -> list[RequestRecord]:
        """Every request's record (an in-memory sink only), in the order their outcomes were known."""
        if not isinstance(self.sink, MemorySink):
            raise AttributeError("records went to a file sink: read them with sink.requests()")
        return self.sink.records + self._done_records

    def _record_done(self, record: RequestRecord) -> None:
        self._done_records.append(record)
        if len(self._done_records) >= CHUNK_ROWS:
            self._flush_records()

    def _flush_records(self) -> None:
        if self._done_records:
            self.sink.write_requests(self._done_records)
            self._done_records = []

    def _next_arrival_s(self) -> float:
        if self._upstream is not None:
            return self._upstream()
        return self._arrivals.next_arrival_s()

    def _arrive(self, request: Request, record: RequestRecord | None = None) -> None:
        if record is None:
            record = self.new_record(request)
        if self._on_arrival is not None:
            self._on_arrival(record)
        state = RequestState(request, record)
        state.queued_s = self.env.now
        reason = self._never_admissible(request)
        if reason:
            self._reject(state, reason)
        else:
            self.waiting.append(state)
        if not self._wake.triggered:
            self._wake.succeed()

    def new_record(self, request: Request) -> RequestRecord:
        record = RequestRecord(
            request.request_id,
            request.arrival_s,
            request.prompt_len,
            request.longest_output_len,
            request.n,
            request.beam_width,
            sum(request.output_lens),
        )
        record.client_overhead_s = self.knobs.client_overhead_s
        return record

    def rejects_on_arrival(self, request: Request) -> bool:
        """Whether ``request`` would be rejected as it arrives (nothing could ever admit it)."""
        return bool(self._never_admissible(request))

    def _never_admissible(self, request: Request) -> str:
        knobs = self.knobs
        prompt_len = request.prompt_len
        longest = request.longest_output_len
        final_len = prompt_len + longest
        width = self.width_of(request)
        if final_len > knobs.max_model_len:
            return f"{self._lengths(request)} exceeds max_model_len={knobs.max_model_len:,}"
        if request.output_len < 1:
            return "output_len must be at least 1"
        if width > knobs.max_num_seqs:
            return f"n/beam_width={width} exceeds max_num_seqs={knobs.max_num_seqs}"
        output_lens = request.output_lens
        all_sequences = prompt_len * len(output_lens) + sum(output_lens)
        if all_sequences > self.kv.pool_slots:
            shape = (
                f"x ({self._lengths(request)})"
                if not request.sample_output_lens
                else f"of {all_sequences:,} tokens in all"
            )
            return (
                f"{width} sequence(s) {shape} exceed the KV pool "
                f"({self.kv.pool_slots:,} slots) even with nothing else running"
            )
        why = self.scheduler.never_admissible(final_len)
        return f"{self._lengths(request)} {why}" if why else ""

    @staticmethod
    def _lengths(request: Request) -> str:
        # A rejection names both lengths: "600 tokens" alone reads as the prompt's length.
        output = "longest sample" if request.sample_output_lens else "output"
        return (
            f"prompt {request.prompt_len:,} + {output} {request.longest_output_len:,} = "
            f"{request.final_len:,} tokens"
        )

    @staticmethod
    def width_of(request: Request) -> int:
        return request.width

    def _loop(self):
        idle_steps = 0
        while True:
            if self.handoff.notices_waiting and not self.running and not self.waiting:
                self._take_transfer_notices()  # idle: a send finished, or a prompt landed
                self._record()
            if not self.running and not self.waiting:
                # A replica stays until the clock stops: another replica's request may have a follow-up.
                done = self._next_arrival_s() == float("inf") and not self._arrivals.pending_follow_ups
                if done and self._upstream is None:
                    return
                idle_steps = 0  # rejections that emptied the queue are progress, not a stall
                self.admission_blocker = 0
                self._wake = self.env.event()
                yield self._wake
                continue
            if self._lockstep is not None and self._lockstep.in_flight():
                # A rank that was idle joins the group's steps at the next boundary.
                yield self._lockstep.boundary()
                continue
            preemptions_before = self.counters.preemptions
            duration = self._advance()
            self.admission_blocker = self._admission_blocker(preemptions_before)
            if duration > 0:
                idle_steps = 0
                self.wakeups += 1
                # Rows bracket every discrete change: the state during iteration 1 (after its growth
                # and admissions), the state at the end of a jump, and after the completions when the
                # engine goes idle. (The end of a jump holds for no time when completions follow, but
                # it samples the tokens that grew during the jump: readers of the series interpolate
                # between samples.)
                self._record()
                started_s = self.env.now
                self.busy_until = started_s + duration
                yield self._run_for(duration)
                self.busy_until = float("inf")
                self._last_ended_s = self.env.now
                jump = self._jump
                self._last_started_s = started_s + (
                    0.0 if jump is None else jump.timeline.elapsed_s(jump.timeline.extra)
                )
                if self._jump is not None:
                    self._end_jump()
                    self._record()
                if self._finish_iterations() and not (self.running or self.waiting):
                    # Only when the engine goes idle: otherwise the next iteration starts at this
                    # instant and records its state, which would replace this one after no time.
                    self._record()
                continue
            elif self.handoff.notices_waiting:
                idle_steps = 0  # a transfer's notice came in meanwhile: the next iteration sees it
                continue
            elif self.transfers_pending:
                # Nothing can run until a transfer lands or releases blocks (the cluster wakes us).
                idle_steps = 0
                self._wake = self.env.event()
                yield self._wake
                continue
            else:
                idle_steps += 1
                if idle_steps > 3:
                    raise EngineStalled(
                        f"at t={self.env.now:.6f}s no iteration can be scheduled: "
                        f"{len(self.running)} running, {len(self.waiting)} waiting"
                    )
            self._record()

    # ------------------------------------------------------------------------------------ iteration
    def _run_for(self, duration: float) -> simpy.Event:
        """The event that ends the wake-up just planned: ``duration`` from now, or, for a rank of a
        lockstep group, the end of the group's step (this iteration's own time is one rank's part)."""
        if self._lockstep is None:
            return self.env.timeout(duration)
        tokens = self._decoded_seqs
        for _state, chunk in self._prefill_this_step:
            tokens += chunk
        return self._lockstep.join(self, duration, tokens)

    def _advance(self) -> float:
        """Start the next iteration and plan the deterministic ones after it; return their time."""
        first_s = self._first_iteration()
        if first_s <= 0 or self.knobs.step_mode != "skip":
            return first_s
        iteration = IterationOne(
            self._preempted,
            self._swapped_in,
            self._swap_out_pending,
            self._prefill_this_step,
            self._prefilling,
            self._decoded_seqs,
            self._admission_stop,
        )
        jump = self._jump = self._planner.plan(self.env.now, first_s, iteration)
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
        """One iteration as vLLM schedules it: decode growth, prompts in progress, then admissions."""
        copies_before = self.kv.stats.cow_copies
        loads_before = self._host_loads()
        if self.handoff.notices_waiting:
            self._take_transfer_notices()
        # 1. every decoding sequence takes a token (the policy hears of those that need a block)
        self.clock.now += 1
        self._prepare_decode_step()
        preempted, swap_blocks = self._decode_growth()
        if preempted:
            self.scheduler.after_preemption(self)
        swap_blocks += self._swap_out_pending
        self._swap_out_pending = 0
        decode_batch = self.clock.sequences
        decode_context = self.clock.sum_context()
        budget = self._prefill_budget(decode_batch)
        # 2. prompts in progress, then 3. admissions (not after a preemption, as vLLM)
        chunks: list[tuple[int, int]] = []
        self._prefill_this_step = []
        for state in self._prefilling:
            if state.prefilled < state.tokens_to_prefill and budget > 0:
                budget = self.schedule_prefill(state, budget, chunks)
        self._admission_stop = NOT_TRIED
        swap_in = 0
        if not preempted:  # (not after a preemption, as vLLM; SGLang's retraction step admits nothing)
            budget, swap_in, self._admission_stop = self.scheduler.admit(self, budget, chunks)
            swap_blocks += swap_in
            if decode_batch and not self._prefill_this_step:
                self.scheduler.decode_steps(1)  # a decode batch (SGLang's update_running_batch)
        self._preempted = preempted
        self._swapped_in = swap_in > 0
        self._decoded_seqs = decode_batch
        self._iterations_this_step = 1
        # Prefix hits loaded from the host tier at admission: their transfer delays this iteration,
        # which needs them, like a swap-in (a host hit always leaves its prompt's last token to compute).
        load_s = self._charge_host_loads(loads_before)
        if decode_batch == 0 and not self._prefill_this_step:
            if swap_blocks:
                return (
                    self.costs.swap_blocks_s(swap_blocks) + load_s
                )  # a swap-in alone: the transfer, no forward pass
            self._check_progress()
            return 0.0
        duration = self._iteration_cost.duration(decode_batch, decode_context, chunks)
        copies = self.kv.stats.cow_copies - copies_before + self._copies_pending
        self._copies_pending = 0
        duration += self.costs.copy_blocks_s(copies) if copies else 0.0
        duration += self.costs.swap_blocks_s(swap_blocks) if swap_blocks else 0.0
        return duration + load_s

    def scheduled_at(self) -> float:
        """When vLLM scheduled the iteration starting now: with async scheduling, at the start of the
        iteration before it, which ran up to now (vLLM's engine core schedules one step ahead of the
        GPU: ``step_with_batch_queue``), so requests queued since wait one more iteration; else now.
        An engine with nothing running schedules at once: the step ahead had nothing to overlap."""
        now = self.env.now
        if self.knobs.async_scheduling and self.running and self._last_ended_s == now:
            return self._last_started_s
        return now

    def _take_transfer_notices(self) -> None:
        self.handoff.take_notices(self.kv, self.waiting)

    def _host_loads(self) -> int:
        """Tokens loaded from the host tier so far (the radix policy's HiCache loads whole nodes, not
        always whole engine blocks: the transfer is charged per token, as blocks of ``block_size``)."""
        tier = self.kv.host_tier
        return tier.stats.host_loaded_tokens if tier is not None else 0

    def _charge_host_loads(self, loads_before: int) -> float:
        loaded = self._host_loads() - loads_before
        if not loaded:
            return 0.0
        seconds = self._host_load_s(loaded / self.block_size)
        self.counters.host_load_s += seconds
        return seconds

    def _prefill_budget(self, decode_batch: int) -> int:
        """Prompt tokens an iteration that decodes ``decode_batch`` sequences may prefill."""
        return self.scheduler.prefill_budget(decode_batch)

    def schedule_prefill(self, state: RequestState, budget: int, chunks: list[tuple[int, int]]) -> int:
        chunk = prefill_chunk(state, budget, self._chunks_prompts)
        if not chunk:
            return budget
        chunks.append((chunk, state.prefilled))
        state.prefilled += chunk
        self._prefill_this_step.append((state, chunk))
        return budget - chunk

    def _finish_iterations(self) -> bool:
        """Book what the iteration(s) that just ended produced: first tokens, completions, beams.
        Returns whether any of those happened (the state changed)."""
        now = self.env.now
        steps = self._iterations_this_step
        copies_before = self.kv.stats.cow_copies
        self.counters.iterations += steps
        self.counters.output_tokens += steps * self._decoded_seqs
        changed = False
        for prefilled in self._prefill_this_step:
            state = prefilled[0]  # (indexed: see content_length)
            if state.is_running and state.prefilled >= state.tokens_to_prefill and not state.decoding:
                self._start_decoding(state)
                changed = True
        for state in self.clock.due_ends():
            if not (state.is_running and state.decoding):
                continue
            changed = True
            if self.clock.generated(state) >= state.next_sample_end:
                self._end_samples(state, now)
            else:
                self._beam_step(state)
        self._prefill_this_step = []
        self._decoded_seqs = 0
        self._copies_pending += self.kv.stats.cow_copies - copies_before
        return changed

    def _start_decoding(self, state: RequestState) -> None:
        """The prompt is in (or back in, after a recompute): fork the samples/beams, and the
        iteration's token goes into every sequence."""
        self._prefilling.remove(state)
        if state.record.first_token_s != state.record.first_token_s:  # NaN: first time
            state.record.first_token_s = self.env.now
        if len(state.seq_ids) < state.width:
            self._release_unforked(state)
            # Sample i (i >= 1) runs to its own length: the children take entries 1.. of sample_lens.
            final_lens = [state.final_len_of(index) for index in range(len(state.seq_ids), state.width)]
            self._fork(state, [(state.seq_ids[0], final_lens)])
            if not state.is_running:
                return  # the fork did not fit: the request was preempted
        # (A prefill replica samples its one token and stops: vLLM allocates it no slot.)
        for seq_id in list(state.seq_ids) if not self.handoff.prefill_only else ():
            outcome = self._grow_or_preempt(state, seq_id, victims_at=self.clock.now)
            self._swap_out_pending += max(0, outcome - 1)
            if not state.is_running:
                return
        state.context += 1
        state.generated += 1
        self.counters.output_tokens += len(state.seq_ids)
        self.clock.enter(state, beam_due=self._next_beam_due(state))

    def _next_beam_due(self, state: RequestState) -> int:
        if state.request.beam_width <= 1:
            return NEVER
        return self.clock.now + self.beams.interval(len(state.seq_ids))

    def _fork(self, state: RequestState, forks: list[tuple[int, list[int]]]) -> None:
        """Add children to the request: for each ``(parent, final lengths)``, one child of ``parent``
        per length. If they do not all fit, the request itself is preempted (a simplification: vLLM
        V0 would preempt the newest request first)."""
        planned: list[tuple[int, list[ChildSpec]]] = []
        for parent, final_lens in forks:
            children = []
            for final_len in final_lens:
                children.append(ChildSpec(self.new_seq_id(), final_len, self._next_child_stream))
                self._next_child_stream -= 1
            planned.append((parent, children))
        forked: list[int] = []
        try:
            for parent, children in planned:
                self.kv.fork(parent, children)
                forked.extend(child.seq_id for child in children)
        except OutOfKVMemory:
            for seq_id in forked:
                self.kv.free(seq_id, finished=False)
            if len(self.running) == 1:
                self._reject_alone(state, self.clock.now)
                return
            self.preempt(state, self.clock.now)
            return
        state.seq_ids.extend(forked)
        self._running_seqs += len(forked)

    def _beam_step(self, state: RequestState) -> None:
        """Some beams fall out of the top ``width``: each is freed and replaced by a fork of a
        surviving beam (its blocks shared, its partly filled tail copied on the next write)."""
        self.clock.leave(state, self.clock.now)
        width = len(state.seq_ids)
        replaced = self.beams.replaced(width)
        survivors = [seq for index, seq in enumerate(state.seq_ids) if index not in replaced]
        parents = self.beams.parents(len(survivors), len(replaced))
        # A replaced beam's tokens are a decoded prefix like any finished sample's: freed as finished.
        for index in sorted(replaced, reverse=True):
            self.kv.free(state.seq_ids.pop(index))
        self._running_seqs -= len(replaced)
        final_len = state.final_len_of(0)  # beams all run to the request's length
        children_of: dict[int, list[int]] = {}
        for parent in parents:
            children_of.setdefault(survivors[parent], []).append(final_len)
        self._fork(state, list(children_of.items()))
        if state.is_running:
            self.clock.enter(state, beam_due=self._next_beam_due(state))

    def _end_samples(self, state: RequestState, now: float) -> None:
        """Samples that generated their last token stop and free their blocks (blocks they share stay
        with the others); the request finishes with its last sample."""
        generated = self.clock.generated(state)
        if max(state.sample_lens) <= generated:
            self._finish(state, now)
            return
        self.clock.leave(state, self.clock.now)
        ending = [index for index, length in enumerate(state.sample_lens) if length <= generated]
        for index in reversed(ending):
            self.kv.free(state.seq_ids.pop(index))
            state.sample_lens.pop(index)
        self._running_seqs -= len(ending)
        self.clock.enter(state, beam_due=state.beam_due)

    # ----------------------------------------------------------------------------------- growth/OOM
    def _decode_growth(self) -> tuple[bool, int]:
        """This iteration's token for the requests whose held slots ran out, oldest first (the others
        take theirs on the clock). Returns whether anything was preempted, and blocks swapped out."""
        preempted = False
        swapped = 0
        before = self.clock.now - 1
        due = self.clock.due_flushes()
        if due and self._pool_holds(due, self.clock.now):
            self.clock.flush(due, self.clock.now)  # what one at a time would do, in one policy call
            return preempted, swapped
        for state in due:
            if not (state.is_running and state.decoding):
                continue  # preempted by an older request earlier in this loop
            if self._grow_all_pending(state):
                continue
            # Not enough blocks: replay it token by token as the reference would, preempting on OOM.
            self.clock.sync(state, before)
            for seq_id in list(state.seq_ids):
                outcome = self._grow_or_preempt(state, seq_id, victims_at=before)
                preempted |= outcome > 0
                swapped += max(0, outcome - 1)
                if not state.is_running:
                    break
            if state.is_running:
                self.clock.took_token(state)
                self.clock.reschedule_flush(state)
        return preempted, swapped

    def _pool_holds(self, states: list[RequestState], at_clock: int) -> bool:
        """Does the pool have the blocks for every sequence of ``states`` to take its tokens up to
        ``at_clock``? (Then nothing could have failed token by token.) A cheap upper bound: the new
        blocks, plus one copy-on-write block per sequence."""
        block_size = self.block_size
        blocks = 0
        for state in states:  # (a loop, not sum() of a generator: this runs at every flush)
            blocks += len(state.seq_ids) * ((at_clock - state.synced_clock) // block_size + 2)
        return blocks * block_size <= self.kv.available_slots()

    def _grow_all_pending(self, state: RequestState) -> bool:
        """A flush when the pool is short: every sequence takes all its pending tokens in one call if
        the pool has the blocks for all of them (then nothing could have failed token by token)."""
        pending = self.clock.now - state.synced_clock
        if not self._pool_holds([state], self.clock.now) and not self.kv.fits_growth(state.seq_ids, pending):
            return False
        self.clock.flush([state], self.clock.now)
        return True

    def _grow_or_preempt(self, state: RequestState, seq_id: int, *, victims_at: int) -> int:
        """Grow one sequence by a token; on OOM preempt the newest request until it fits. Victims are
        taken back to clock ``victims_at`` (a newer request has not decoded this iteration yet).
        Returns 0 when nothing was preempted, else 1 + blocks swapped out."""
        outcome = 0
        while True:
            try:
                self.kv.grow(seq_id, 1)
                return outcome
            except OutOfKVMemory:
                victim = self.scheduler.preemption_victim(self)
                if victim is state and len(self.running) == 1 and not self.transfers_pending:
                    # Its samples/beams outgrow the pool with nothing else in it (whole blocks each
                    # can exceed the tokens checked on arrival): a rejection, not a preemption.
                    # (Blocks held for transfers will free: then it is preempted, to wait for them.)
                    self._reject_alone(state, victims_at)
                    return outcome
                outcome = max(outcome, 1) + self.preempt(victim, victims_at)
                if victim is state:
                    return outcome

    def preempt(self, state: RequestState, at_clock: int) -> int:
        """Take ``state`` off the GPU (its tokens as of ``at_clock``); returns blocks swapped out."""
        self.counters.preemptions += 1
        state.record.preemptions += 1
        if state.decoding:
            self.clock.leave(state, at_clock)
        self._leave_running(state)
        swapped_blocks = 0
        held = sum(self.kv.seq_len(s) for s in state.seq_ids)
        single = self.width_of(state.request) == 1
        if self.knobs.preemption_mode == "swap" and single and self._host_room() >= held:
            swapped_blocks = -(-held // self.block_size)
            state.swapped_tokens = held
            self._host_tokens_used += held
            self.counters.swapped_out_blocks += swapped_blocks
        for seq_id in state.seq_ids:
            self.kv.free(seq_id, finished=False)
        state.seq_ids = []
        if not single:
            # Samples and beams restart from the prompt: their diverged tokens are not recoverable.
            state.generated = 0
        state.prefilled = 0
        self.scheduler.requeue(self, state)
        return swapped_blocks

    def _reject_alone(self, state: RequestState, at_clock: int) -> None:
        """Alone in the pool and still no room for its samples/beams: retrying could never succeed."""
        if state.decoding:
            self.clock.leave(state, at_clock)
        self._leave_running(state)
        for seq_id in state.seq_ids:
            self.kv.free(seq_id, finished=False)
        state.seq_ids = []
        self._reject(state, f"its {state.width} samples/beams do not fit in the KV pool even alone")

    def _host_room(self) -> int:
        return self.knobs.swap_space_blocks * self.block_size - self._host_tokens_used

    # ------------------------------------------------------------------------------------ admission
    # The services a scheduler admits and preempts through (sim/engine/schedulers/base.py,
    # SchedulingEngine); they keep the core's books.
    def batch_has_room(self, width: int) -> bool:
        return self._running_seqs + self._unforked_seqs + width <= self.knobs.max_num_seqs

    def start_running(self, state: RequestState, seq_id: int, cached: int, content: TokenContent) -> int:
        """The queue's head was just admitted as ``seq_id`` with ``cached`` prompt tokens from cache:
        it leaves the queue and runs, prefilling the rest (or, swapped in, decoding at once).
        Returns blocks swapped in."""
        self.waiting.popleft()
        state.seq_ids = [seq_id]
        if state.record.admitted_s != state.record.admitted_s:  # NaN: first admission
            state.record.admitted_s = self.env.now
            state.record.cached_prompt_tokens = cached
        self._join_running(state)
        total = content_length(content)
        state.context = total
        if state.swapped_tokens:
            swapped_in = -(-state.swapped_tokens // self.block_size)
            self._host_tokens_used -= state.swapped_tokens
            state.swapped_tokens = 0
            state.tokens_to_prefill = state.prefilled = total
            self.clock.enter(state)
            return swapped_in
        state.tokens_to_prefill = total
        state.prefilled = cached
        self._prefilling.append(state)
        return 0

    def _join_running(self, state: RequestState) -> None:
        """The queue's head (its blocks allocated) joins the batch, newest in the preemption order."""
        self.running.append(state)
        self._admissions += 1
        state.admission = self._admissions
        state.is_running = True
        self._running_seqs += 1
        state.unforked = state.width - 1
        self._unforked_seqs += state.unforked

    def await_kv(self, state: RequestState, seq_id: int, cached: int) -> None:
        """A remote prompt's blocks are allocated: it leaves the queue to wait for its KV."""
        self.waiting.popleft()
        state.seq_ids = [seq_id]
        state.record.transfer_start_s = self.env.now
        state.record.decode_cached_tokens = cached
        self.handoff.receive(state, cached)

    def start_landed(self, state: RequestState) -> None:
        """A landed prompt runs, holding its blocks: only its last token is computed (vLLM recomputes
        it to sample the first token on this side)."""
        state.kv_landed = False
        self.waiting.popleft()
        self._join_running(state)
        state.context = state.tokens_to_prefill = state.request.prompt_len
        state.prefilled = state.tokens_to_prefill - 1
        self._prefilling.append(state)

    def content_on_admission(self, state: RequestState) -> TokenContent:
        request = state.request
        if state.generated and self.width_of(request) == 1:
            # Recompute (or swap-in) restores what the request had generated as part of its prompt.
            return request.prompt + ((request.output_content_id, state.generated),)
        return request.prompt

    def fits_watermark(self, content: TokenContent, final_len: int) -> bool:
        if not self.kv.can_admit(content, final_len):
            return False
        if self.knobs.watermark <= 0:
            return True
        prompt_slots = -(-content_length(content) // self.block_size) * self.block_size
        return self.kv.available_slots() - prompt_slots >= self.knobs.watermark * self.kv.pool_slots

    def admission_failed(self, state: RequestState) -> bool:
        """The queue head does not fit now. Returns True when it was removed (admission may go on)."""
        if not self.running and not self.transfers_pending:
            self.waiting.popleft()
            self._reject(state, "does not fit in the KV pool even with nothing else running")
            return True
        if self.knobs.on_oom == "fail" and not state.record.preemptions:
            self.waiting.popleft()
            self.counters.oom_failures += 1
            state.record.outcome = "failed_oom"
            state.record.reason = "KV cache out of memory at admission (on_oom: fail)"
            self._request_done(state)
            return True
        if not state.waited_for_memory:
            state.waited_for_memory = True
            self.counters.admission_waits += 1
        return False

    def _reject(self, state: RequestState, reason: str) -> None:
        state.record.outcome = "rejected"
        state.record.reason = reason
        if state.swapped_tokens:
            self._host_tokens_used -= state.swapped_tokens
            state.swapped_tokens = 0
        self._request_done(state)

    def _finish(self, state: RequestState, now: float) -> None:
        self.clock.leave(state, self.clock.now)
        self._leave_running(state)
        if self.handoff.prefill_only:
            self._hand_off(state, now)
            return
        for seq_id in state.seq_ids:
            self.kv.free(seq_id)
        state.seq_ids = []
        state.record.finish_s = now
        state.record.outcome = "finished"
        self._request_done(state)

    def _hand_off(self, state: RequestState, now: float) -> None:
        """(Prefill replica) The prompt is done and its first token sampled (the client gets the decode
        replica's): the blocks stay until the cluster has sent them."""
        record = state.record
        record.prefill_done_s = now
        record.first_token_s = math.nan
        self.handoff.hold(state)

    def _request_done(self, state: RequestState) -> None:
        """A request reached its outcome; a closed-loop user (or a conversation) may send the next one."""
        self.handoff.dropped(state)
        self._record_done(state.record)
        if self._follow_up is not None:
            follow = self._follow_up(state.request, self.env.now)
            if follow is not None:
                self._arrivals.schedule_follow_up(follow)

    def _leave_running(self, state: RequestState) -> None:
        self.running.remove(state)
        if not state.decoding and state in self._prefilling:
            self._prefilling.remove(state)
        state.is_running = False
        self._running_seqs -= len(state.seq_ids)
        self._release_unforked(state)

    def _release_unforked(self, state: RequestState) -> None:
        self._unforked_seqs -= state.unforked
        state.unforked = 0

    def _admission_blocker(self, preemptions_before: int) -> int:
        """Why the queue's head is still waiting once this iteration's admissions are done, as an index
        into ``sim.outputs.metrics.ADMISSION_BLOCKERS``: nothing waits; ``kv_memory`` (it does not fit, or a preemption
        stopped admissions, as in vLLM); ``max_num_seqs`` (the batch is full); ``token_budget`` (it
        would fit, but this iteration's ``max_num_batched_tokens`` went to other work). Recorded in the
        time series so that capacity planning reads the binding limit from the simulation."""
        if not self.waiting or self._admission_stop == HEAD_NOT_SEEN:
            return 0  # (not seen: no limit holds it back; the next iteration schedules it)
        if self.counters.preemptions > preemptions_before or self._admission_stop in (
            HEAD_OUT_OF_MEMORY,
            HEAD_OVER_BUDGET,
        ):
            # (Out of memory: the head's admission just failed, and nothing changed the pool since.)
            return KV_MEMORY
        state = self.waiting[0]
        if not self.batch_has_room(state.width):
            return MAX_NUM_SEQS
        if state.kv_landed:
            return TOKEN_BUDGET  # it holds its blocks already
        if not self.fits_watermark(self.content_on_admission(state), state.final_len_of(0)):
            return KV_MEMORY
        return TOKEN_BUDGET

    def _check_progress(self) -> None:
        if self.running or not self.waiting or self.transfers_pending:
            return
        if self.env.now >= self._next_arrival_s():
            return
        raise EngineStalled(
            f"at t={self.env.now:.6f}s nothing can run: {len(self.waiting)} waiting, none admissible"
        )

    def new_seq_id(self) -> int:
        self._next_seq_id += 1
        return self._next_seq_id

    # ----------------------------------------------------------------------------------- event skip
    def _end_jump(self) -> None:
        """The jump's iterations after the first have run: apply what they did, in order."""
        jump = self._jump
        assert jump is not None
        self._jump = None
        self._apply_jump(jump, jump.timeline.extra)
        self._iterations_this_step = 1 + jump.timeline.extra

    def _apply_jump(self, jump: Jump, steps: int) -> None:
        """The first ``steps`` iterations of the jump after iteration 1 took place: their growth, their
        prefill chunks and the area of the tokens they decoded."""
        self._prepare_second_iteration(jump, jump.first_clock + steps)
        if jump.grows:
            self._grow_inside_jump(jump, jump.first_clock + steps)
        for chunks in jump.chunks[:steps]:
            for state, chunk in chunks:
                state.prefilled += chunk
            self._prefill_this_step.extend(chunks)
        self.recorder.add_token_area(jump.timeline.batch * jump.timeline.token_weight_s(steps))
        self.clock.now += steps
        if jump.timeline.batch:
            prefills = sum(1 for chunks in jump.chunks[:steps] if chunks)
            self.scheduler.decode_steps(steps - prefills)

    def _prepare_second_iteration(self, jump: Jump, last_clock: int) -> None:
        """Iteration 1 took free slots (its growth and admissions): the jump's next iteration, if it
        has taken place by ``last_clock``, prepares its decode step first, as single steps would."""
        second = jump.first_clock + 1
        if second <= last_clock and self._prepare_decode_step():
            self.recorder.observe(self._iteration_start_s(jump, second), self._averaged_state())

    def _grow_inside_jump(self, jump: Jump, last_clock: int) -> None:
        """Flushes due inside the jump, in the order single steps would take them (clock, then
        admission), each group observed at the start of its iteration. The jump was planned so that
        the pool has every block they take."""
        copies_before = self.kv.stats.cow_copies
        clock = self.clock
        while (due := clock.next_flush()) <= last_clock:
            self._flush_group(jump, clock.due_flushes(due), due, last_clock)
        # Copy-on-write only follows a fork, which ends a wake-up: its write is the next iteration 1.
        assert self.kv.stats.cow_copies == copies_before, "a copy-on-write inside a jump"

    def _flush_group(self, jump: Jump, states: list[RequestState], due_clock: int, last_clock: int) -> None:
        """Flushes due at the start of the same iteration of the jump: one policy call, then the
        state observed at that instant. The next iteration, if the jump has it, prepares its decode
        step first (the flush took free slots a policy may want back), observed when it starts."""
        self.clock.flush(states, due_clock)
        self.recorder.observe(self._iteration_start_s(jump, due_clock), self._averaged_state())
        if due_clock < last_clock and self._prepare_decode_step():
            self.recorder.observe(self._iteration_start_s(jump, due_clock + 1), self._averaged_state())

    @staticmethod
    def _iteration_start_s(jump: Jump, clock: int) -> float:
        return jump.start_s + jump.timeline.elapsed_s(clock - jump.first_clock)

    def _prepare_decode_step(self) -> bool:
        """The decode step at the clock's iteration is about to take its tokens: the policy may make
        room first (``KVCachePolicy.prepare_decode_step``). Returns whether it evicted anything. Free
        slots change only when sequences take blocks (flushes, at iteration 1 or inside a jump), so
        that is when it runs; between flushes it would find nothing to do."""
        sequences = self.clock.sequences
        if not sequences:
            return False
        evictions = self.kv.stats.evictions
        self.kv.prepare_decode_step(sequences)
        return self.kv.stats.evictions != evictions

    def _stop_inside_jump(self) -> None:
        """The run ended (``until_s``) inside a jump: book what single steps would have by now."""
        jump = self._jump
        assert jump is not None
        self._jump = None
        elapsed = self.env.now - jump.start_s
        ended = jump.timeline.iterations_ended_before(elapsed)
        # Iteration ``ended + 1`` is in progress: its growth and tokens are in, its completions not.
        started = min(ended + 1, 1 + jump.timeline.extra)
        self._prepare_second_iteration(jump, jump.first_clock + started - 1)
        if jump.grows:
            self._grow_inside_jump(jump, jump.first_clock + started - 1)
        timeline = jump.timeline
        partial = elapsed - timeline.elapsed_s(started - 1)
        area = timeline.token_weight_s(started - 2) + (started - 1) * partial if started > 1 else 0.0
        self.recorder.add_token_area(timeline.batch * area)
        self.counters.iterations += ended
        self.counters.output_tokens += ended * timeline.batch

    # -------------------------------------------------------------------------------------- record
    def _averaged_state(self) -> tuple:
        return self._observer.averaged(len(self.running))

    def _state(self) -> tuple:
        return self._observer.state(
            len(self.running), len(self.waiting), self._running_seqs, self.admission_blocker
        )

    def _record(self) -> None:
        self.recorder.record(self.env.now, self._state())
