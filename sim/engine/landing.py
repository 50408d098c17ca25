"""Where a jump lands: the iterations a wake-up skipped over (``sim/engine/jumps.py`` planned them)
are applied when it ends, or, when the run stops inside it, as far as single steps would have got.
Their growth is taken in the order single steps would take it, each flush observed at the instant
it was due, so the recorded time averages are exactly those of stepping one iteration at a time."""

from __future__ import annotations

from functools import partial

from sim.engine.batch import Batch
from sim.engine.chunk_reports import ChunkReports
from sim.engine.decoding import DecodeClock, RequestState
from sim.engine.growth import DecodeGrowth
from sim.engine.jumps import Jump
from sim.engine.observe import StateObserver
from sim.engine.schedulers.base import Scheduler
from sim.engine.unbacked import UnbackedGrowth
from sim.kv.coordinator import KVCoordinator
from sim.outputs.group_series import GroupSeries
from sim.outputs.metrics import Counters, Recorder


class JumpLanding:
    def __init__(
        self,
        kv: KVCoordinator,
        clock: DecodeClock,
        batch: Batch,
        growth: DecodeGrowth,
        scheduler: Scheduler,
        recorder: Recorder,
        observer: StateObserver,
        counters: Counters,
        chunk_reports: ChunkReports,
        group_series: GroupSeries | None = None,
        unbacked: UnbackedGrowth | None = None,
    ):
        self.kv = kv
        self.clock = clock
        self.batch = batch
        self.growth = growth
        self.scheduler = scheduler
        self.recorder = recorder
        self.observer = observer
        self.counters = counters
        self.chunk_reports = chunk_reports  # (the pool hears of the prefill chunks through it)
        self.group_series = group_series  # a hybrid allocator's split by KV group (None: one group)
        self.unbacked = unbacked  # a token-granular pool's deferred growth (sim/engine/unbacked.py)
        # Where its pending tokens take free slots, per entry of the split by group.
        self._unbacked_draws = (
            kv.unbacked_draws() if unbacked is not None and group_series is not None else ()
        )

    def land(self, jump: Jump, prefill_this_step: list[tuple[RequestState, int]]) -> int:
        """The jump's iterations after the first have run: apply what they did, in order (their
        prefill chunks join ``prefill_this_step``). Returns the wake-up's iterations."""
        self._apply(jump, jump.timeline.extra, prefill_this_step)
        return 1 + jump.timeline.extra

    def _apply(self, jump: Jump, steps: int, prefill_this_step: list[tuple[RequestState, int]]) -> None:
        """The first ``steps`` iterations of the jump after iteration 1 took place: their growth, their
        prefill chunks and the area of the tokens they decoded."""
        if not jump.decodes:
            self._prefill(jump, steps, prefill_this_step)
            return  # prefill batches alone: the decode clock stood still, nothing grew
        self._prepare_second_iteration(jump, jump.first_clock + steps)
        if jump.grows:
            self._grow_inside(jump, jump.first_clock + steps)
        self._prefill(jump, steps, prefill_this_step)
        # (A decoded token fills a slot in every KV group that holds tokens: slots_per_token.)
        self._add_token_area(jump.timeline.batch, jump.timeline.token_weight_s(steps))
        self.clock.advance(steps)
        if jump.timeline.batch:
            prefills = sum(1 for chunks in jump.chunks[:steps] if chunks)
            self.scheduler.decode_steps(steps - prefills)

    def _prefill(self, jump: Jump, steps: int, prefill_this_step: list[tuple[RequestState, int]]) -> None:
        """The prefill chunks of the jump's first ``steps`` iterations after iteration 1, each told to
        the pool in the order it was scheduled, where the pool keys prompts' blocks as they are (no
        admission inside a jump looks them up before it lands)."""
        for chunks in jump.chunks[:steps]:
            for state, chunk in chunks:
                state.prefilled += chunk
                self.chunk_reports.scheduled(state)
            prefill_this_step.extend(chunks)

    def _prepare_second_iteration(self, jump: Jump, last_clock: int) -> None:
        """Iteration 1 took free slots (its growth and admissions): the jump's next iteration, if it
        has taken place by ``last_clock``, prepares its decode step first, as single steps would."""
        second = jump.first_clock + 1
        if second <= last_clock and self.growth.prepare_decode_step():
            self._observe(jump, second)

    def _grow_inside(self, jump: Jump, last_clock: int) -> None:
        """Flushes due inside the jump, in the order single steps would take them (clock, then
        admission), each group observed at the start of its iteration. The jump was planned so that
        the pool has every block they take."""
        copies_before = self.kv.cow_copies()
        unbacked = self.unbacked
        # The pending tokens' evictions up to an iteration, observed at theirs (built once per
        # landing, and only while growth is unbacked).
        evict_until = None
        if unbacked is not None and unbacked.active:
            evict_until = partial(
                unbacked.evict_inside, jump.first_clock, observe=partial(self._observe, jump)
            )
        clock = self.clock
        while (due := clock.iteration_needing(clock.next_flush())) <= last_clock:
            if evict_until is not None:
                # (The iteration's tokens evict before its flushes grow, as a decode step's allocation
                # evicts before the step: a flush may free slots a later iteration's tokens take.)
                evict_until(due)
            token = clock.first_token_of(due)
            self._flush_group(jump, clock.due_flushes(token), due, last_clock)
        if evict_until is not None:
            evict_until(last_clock)
        # Copy-on-write only follows a fork, which ends a wake-up: its write is the next iteration 1.
        assert self.kv.cow_copies() == copies_before, "a copy-on-write inside a jump"

    def _flush_group(self, jump: Jump, states: list[RequestState], due_clock: int, last_clock: int) -> None:
        # (Clocks here count iterations; the decode clock's tokens are its own: first_token_of.)
        """Flushes due at the start of the same iteration of the jump: one policy call, then the
        state observed at that instant. The next iteration, if the jump has it, prepares its decode
        step first (the flush took free slots a policy may want back), observed when it starts."""
        self.clock.landing_iteration = due_clock
        self.clock.flush(states, self.clock.first_token_of(due_clock))
        self.clock.landing_iteration = 0
        self._observe(jump, due_clock)
        if due_clock < last_clock and self.growth.prepare_decode_step():
            self._observe(jump, due_clock + 1)

    def _observe(self, jump: Jump, clock: int) -> None:
        """The state as the iteration at ``clock`` of the jump starts."""
        start_s = jump.start_s + jump.timeline.elapsed_s(clock - jump.first_clock)
        averaged, groups = self.observer.observe(len(self.batch.running))
        self.recorder.observe(start_s, averaged)
        if self.group_series is not None:
            assert groups is not None  # (a split by group is observed whenever it is recorded)
            self.group_series.observe(start_s, groups)

    def _add_token_area(self, batch: int, weight_s: float) -> None:
        """Tokens the ``batch`` decoded inside the jump (``weight_s``: seconds per sequence): each fills
        a slot in every KV group that holds tokens (``slots_per_token`` of the pool's)."""
        slots = batch * self.kv.slots_per_token * weight_s
        unbacked = self.unbacked
        if unbacked is not None and unbacked.active:
            # (Unbacked growth: the tokens took free slots, not reserved ones: sim/engine/unbacked.py.)
            self.recorder.add_unbacked_token_area(slots)
            if self.group_series is not None:
                self.group_series.add_unbacked_token_area(batch * weight_s, self._unbacked_draws)
            return
        self.recorder.add_token_area(slots)
        if self.group_series is not None:
            self.group_series.add_token_area(batch * weight_s)

    def stop_inside(self, jump: Jump, now: float) -> None:
        """The run ended (``until_s``) inside a jump: book what single steps would have by now."""
        elapsed = now - jump.start_s
        ended = jump.timeline.iterations_ended_before(elapsed)
        self.counters.iterations += ended
        if not jump.decodes:
            return  # prefill batches alone: no token decoded, nothing grew
        # Iteration ``ended + 1`` is in progress: its growth and tokens are in, its completions not.
        started = min(ended + 1, 1 + jump.timeline.extra)
        self._prepare_second_iteration(jump, jump.first_clock + started - 1)
        if jump.grows:
            self._grow_inside(jump, jump.first_clock + started - 1)
        timeline = jump.timeline
        partial = elapsed - timeline.elapsed_s(started - 1)
        # (The iteration in progress holds the tokens gained by its start, speculation included.)
        area = timeline.token_weight_s(started - 2) + timeline.tokens_gained(started - 1) * partial
        self._add_token_area(timeline.batch, area)
        if ended:
            tokens = self.clock.tokens_per_sequence(jump.first_clock, jump.first_clock + ended - 1)
            self.counters.output_tokens += tokens * timeline.batch
