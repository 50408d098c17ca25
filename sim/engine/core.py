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

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import simpy

from policies.base import KVCachePolicy
from sim.costs.core import CostModel
from sim.engine.admission import AdmissionDesk
from sim.engine.arrivals import Arrivals
from sim.engine.batch import Batch
from sim.engine.beams import BeamDraws
from sim.engine.chunk_reports import ChunkReports
from sim.engine.completions import Completions
from sim.engine.decoding import DecodeClock, RequestState
from sim.engine.errors import EngineStalled
from sim.engine.gc_tuning import fewer_collections
from sim.engine.growth import DecodeGrowth
from sim.engine.handoff import KVHandOff
from sim.engine.jumps import IterationCost, JumpCounts, JumpPlanner
from sim.engine.knobs import EngineKnobs
from sim.engine.landing import JumpLanding
from sim.engine.ledger import RequestLedger
from sim.engine.observe import StateObserver
from sim.engine.schedulers import make_scheduler
from sim.engine.shared_reads import shared_reads_for
from sim.engine.speculation import SPECULATION_STREAM
from sim.engine.transfer import KVTransferHooks
from sim.engine.unbacked import UnbackedGrowth
from sim.engine.wakeup import WakeUp
from sim.kv.coordinator import KVCoordinator, SingleGroupCoordinator, make_coordinator
from sim.outputs.group_series import GroupSeries
from sim.outputs.metrics import (
    Counters,
    Recorder,
    RequestRecord,
)
from sim.outputs.sinks import MemorySink, OutputSink
from workloads.request import Request

if TYPE_CHECKING:
    from sim.engine.lockstep import LockstepGroup


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
        self.knobs = knobs
        self.block_size = block_size
        self.env = env if env is not None else simpy.Environment()
        self._upstream = upstream
        self._lockstep = lockstep
        self.busy_until = float("inf")  # end of the wake-up in flight: no completion comes before it
        self.rng = np.random.default_rng(seed)
        self._arrivals = Arrivals(self.env, requests, self._arrive, on_delivered=on_delivered)
        self._on_arrival = on_arrival
        self._loop_process: simpy.Process | None = None
        self.batch = Batch(knobs.max_num_seqs, knobs.swap_space_blocks * block_size)
        self.waiting = self.batch.waiting
        self.running = self.batch.running
        self.sink: OutputSink = sink if sink is not None else MemorySink()
        self.counters = Counters()
        # Loop wake-ups that ran iterations (one each, or a jump): what the run's wall time scales
        # with. Not a counter of the results: the step modes differ in it by design.
        self.wakeups = 0
        self.recorder = Recorder(self.kv.pool_slots, self.sink)
        self._wake = self.env.event()
        # Speculative decoding: the tokens each iteration gives every decoding sequence, drawn from a
        # stream of its own (the beams' draws stay those of a run without it).
        speculative = knobs.speculative
        schedule = None if speculative is None else speculative.schedule([seed, SPECULATION_STREAM])
        if speculative is not None:
            self.kv.hold_lookahead(speculative.lookahead_slots)
        self.clock = DecodeClock(
            self.kv,
            defer_growth=knobs.step_mode == "skip",
            schedule=schedule,
            # Sliding-window and chunked-local layers read a window of the context (sim/engine/windows.py).
            attention_windows=costs.attention_windows,
            shared_reads=shared_reads_for(self.kv, costs.shared_kv_cached_tokens),
        )
        # (jenga's cache stamps the pages given back with the scheduler step.)
        self.kv.follow_steps(self.clock.operation_iteration)
        self._observer = StateObserver(self.kv, self.clock, self.counters)
        # A hybrid allocator's memory split by KV group, beside the pool-wide series.
        observer = self._observer
        self.group_series = (
            GroupSeries(observer.group_names, observer.group_holds_tokens)
            if len(self.kv.groups) > 1
            else None
        )
        # What differs between the servers (admission, budgets, preemption victims): sim/engine/schedulers/.
        self.scheduler = make_scheduler(knobs)
        self._chunks_prompts = self.scheduler.chunks_prompts
        # Disaggregated serving's KV hand-off (sim/engine/handoff.py): what this replica holds for a
        # send, or waits for to land.
        self.handoff = KVHandOff(transfer, prefill_only)
        self._build_parts(follow_up, transfer is not None, host_load_s)
        self.admission_blocker = 0  # what holds the queue's head back (AdmissionDesk.admission_blocker)

    def _build_parts(
        self, follow_up: Callable | None, disaggregated: bool, host_load_s: Callable[[float], float] | None
    ) -> None:
        """The parts of the lifecycle, each a module of its own, over the books they share."""
        kv, clock, batch, counters = self.kv, self.clock, self.batch, self.counters
        self.ledger = RequestLedger(
            self.env,
            self.knobs,
            kv,
            self.scheduler,
            batch,
            self.handoff,
            self.sink,
            self._arrivals,
            follow_up,
        )
        # A pool of one-token pages defers growth past held slots while it has room (sim/engine/unbacked.py).
        self.unbacked = (
            UnbackedGrowth(kv, clock, batch)
            if self.knobs.step_mode == "skip" and kv.can_defer_unbacked()
            else None
        )
        self.growth = DecodeGrowth(
            kv,
            clock,
            batch,
            counters,
            self.knobs,
            self.block_size,
            self.scheduler,
            self.ledger,
            self.handoff,
            self.unbacked,
        )
        self.completions = Completions(
            self.env,
            kv,
            clock,
            batch,
            self.growth,
            BeamDraws(self.rng, self.knobs.beam_reparent_prob),
            self.ledger,
            self.handoff,
            counters,
        )
        alternates = not self.scheduler.mixes_batches  # prefill batches first (SGLang's default)
        iteration_cost = IterationCost(self.costs)
        planner = JumpPlanner(
            clock,
            kv,
            self.costs,
            iteration_cost,
            self.scheduler,
            self.block_size,
            self._next_arrival_s,
            async_jumps=self.knobs.async_scheduling and self._upstream is None,
            disaggregated=disaggregated,
            unbacked=self.unbacked,
            alternates=alternates,
        )
        # When the pool hears of the prompt chunks scheduled: as scheduled (vLLM), or once run (SGLang).
        chunk_reports = ChunkReports(kv, self.scheduler.caches_chunks_after_run)
        self.desk = AdmissionDesk(
            self.env,
            self.knobs,
            self.block_size,
            kv,
            clock,
            batch,
            self.growth,
            self.ledger,
            self.handoff,
            counters,
            self._chunks_prompts,
            # Seconds to load blocks from the host tier (offload:); by default the swap link.
            host_load_s if host_load_s is not None else self.costs.swap_blocks_s,
            chunk_reports,
        )
        self.growth.engine = self.desk  # the scheduler's victim choice sees what its admissions see
        landing = JumpLanding(
            kv,
            clock,
            batch,
            self.growth,
            self.scheduler,
            self.recorder,
            self._observer,
            counters,
            chunk_reports,
            self.group_series,
            self.unbacked,
        )
        self.wakeup = WakeUp(
            self.env,
            kv,
            clock,
            batch,
            (self.growth, self.desk, self.completions, planner, landing),
            self.scheduler,
            self.handoff,
            iteration_cost,
            counters,
            self.knobs.step_mode == "skip",
            self._next_arrival_s,
            self.unbacked,
            alternates,
        )

    @property
    def jumps(self) -> JumpCounts:
        """How the wake-ups went: single iterations, decode and prefill jumps (``sim.engine.jumps``)."""
        return self.wakeup.jumps

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
        # (The tables handed over at the end too: they allocate an object or two per request and
        # per row while the whole run's objects are alive, which a young collection every 700
        # allocations walked again and again, two thirds of building the requests table.)
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

    def let_arrivals_read_kv_state(self) -> None:
        """A cluster's router reads this replica's KV pool at every arrival (``Router.reads_kv_state``):
        jumps end before the iteration an arrival falls in, so that it reads what single steps show."""
        self.wakeup.planner.arrivals_read_state = True

    def submit(self, request: Request, record: RequestRecord | None = None) -> None:
        """A request a cluster's router sends to this replica arrives now (``record``: the one a
        disaggregated cluster keeps for it across its replicas)."""
        self._arrive(request, record)

    def submit_remote(self, request: Request, record: RequestRecord) -> None:
        """(Decode replica) ``request``'s prompt was computed on a prefill replica: it waits for its
        blocks here, then for its KV. One that can never run here is rejected now (the cluster hears
        of it through ``remote_dropped``)."""
        state = RequestState(request, record)
        state.remote_kv = True
        if self._queue(state):
            self._wake_up()

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
        self.wakeup.stop_inside()
        # Requests still in the system at the end are reported as unfinished (a disaggregated request
        # once, by the decode replica that has it: a prefill replica's held ones are there too).
        self.ledger.close([*self.running, *self.waiting, *self.receiving.values()])
        self.recorder.flush()

    @property
    def records(self) -> list[RequestRecord]:
        """Every request's record (an in-memory sink only), in the order their outcomes were known."""
        return self.ledger.records

    def _next_arrival_s(self) -> float:
        if self._upstream is not None:
            return self._upstream()
        return self._arrivals.next_arrival_s()

    def _arrive(self, request: Request, record: RequestRecord | None = None) -> None:
        if record is None:
            record = self.new_record(request)
        if self._on_arrival is not None:
            self._on_arrival(record)
        self._queue(RequestState(request, record))
        self._wake_up()

    def _queue(self, state: RequestState) -> bool:
        """An arrival joins the queue, unless no state of the engine could ever admit it (then it is
        rejected now, and False returned)."""
        state.queued_s = self.env.now
        reason = self.ledger.never_admissible(state.request)
        if reason:
            self.ledger.reject(state, reason)
        else:
            self.waiting.append(state)
        return not reason

    def new_record(self, request: Request) -> RequestRecord:
        return self.ledger.new_record(request)

    def rejects_on_arrival(self, request: Request) -> bool:
        """Whether ``request`` would be rejected as it arrives (nothing could ever admit it)."""
        return bool(self.ledger.never_admissible(request))

    def _loop(self):
        idle_steps = 0
        while True:
            if self.handoff.notices_waiting and not self.running and not self.waiting:
                self.handoff.take_notices(self.kv, self.waiting)  # idle: a send finished, or a prompt landed
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
            duration = self.wakeup.advance()
            self.admission_blocker = self.desk.admission_blocker(
                preemptions_before, self.wakeup.admission_stop
            )
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
                self.desk.last_ended_s = self.env.now
                jump = self.wakeup.jump
                self.desk.last_started_s = started_s + (
                    0.0 if jump is None else jump.timeline.elapsed_s(jump.timeline.extra)
                )
                if self.wakeup.land():
                    self._record()
                if self.wakeup.finish_iterations() and not (self.running or self.waiting):
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
        return self._lockstep.join(self, duration, self.wakeup.decoded_seqs + self.wakeup.prefill_tokens())

    # -------------------------------------------------------------------------------------- record
    def _record(self) -> None:
        state, groups = self._observer.state(
            len(self.running), len(self.waiting), self.batch.running_seqs, self.admission_blocker
        )
        self.recorder.record(self.env.now, state)
        if self.group_series is not None:
            assert groups is not None  # (a split by group is observed whenever it is recorded)
            self.group_series.record(self.env.now, groups)
