"""A SimPy model of one GPU serving requests with continuous batching over any KV-cache policy.

One SimPy process runs the engine loop, one iteration (or one closed-form jump over many decode
iterations) per wake-up; arrivals are SimPy events. The scheduler follows vLLM: FCFS, running
requests first, then waiting requests while the policy can allocate; when a running sequence cannot
grow, the most recently admitted request is preempted (recompute: freed and requeued at the front;
swap: its KV moves to a host pool).

Event skipping: decode tokens are counted on a decode clock (``sim/decoding.py``) and reach the
policy only when a sequence's held slots run out, so a decode iteration costs nothing per sequence.
Between events (an arrival that can be admitted, a completion, a sequence that needs a block, a beam
decision) the iteration time is linear in the batch and the summed context, so ``k`` iterations are
one closed-form jump (``sim/event_skip.py``). ``step_mode="single"`` tells the policy every token and
steps every iteration: tests check both modes give the same results.

Memory model notes (documented simplifications):
- admission allocates the whole prompt (vLLM V1 checks the full prompt fits, ``scheduler_reserve_full_isl``);
  chunked prefill then spends the compute over several iterations;
- the iteration that finishes a prompt produces the first token; a request with ``n > 1`` or beam search
  forks right after its prompt, so the samples share the prompt blocks (copy-on-write where supported);
- ``max_num_seqs`` counts sequences in the batch (samples and beams each count).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import simpy

from policies.base import ChildSpec, KVCachePolicy, OutOfKVMemory, TokenContent
from sim.costs import CostModel
from sim.decoding import NEVER, DecodeClock, RequestState
from sim.event_skip import decode_series_s, iterations_to_reach
from sim.metrics import (
    CHUNK_ROWS,
    KV_MEMORY,
    MAX_NUM_SEQS,
    TOKEN_BUDGET,
    Counters,
    Recorder,
    RequestRecord,
)
from sim.outputs import MemorySink, OutputSink
from workloads.request import Request


@dataclass(frozen=True)
class EngineKnobs:
    """Scheduler knobs, named and defaulted as vLLM's engine arguments where vLLM has them."""

    max_model_len: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"  # recompute | swap
    swap_space_blocks: int = 0  # host pool for preemption_mode=swap, in blocks
    watermark: float = 0.0  # fraction of the pool kept free at admission (vLLM V0 used 0.01)
    on_oom: str = "queue"  # queue: a failed admission waits; fail: the request fails (the seeds' OOM story)
    beam_divergence_prob: float = 0.05  # per beam group and iteration: a beam is pruned, a survivor forked
    step_mode: str = "skip"  # skip | single


class EngineStalled(RuntimeError):
    """The engine reached a state in which nothing can ever progress (a bug or an impossible config)."""


class Engine:
    def __init__(
        self,
        policy: KVCachePolicy,
        costs: CostModel,
        knobs: EngineKnobs,
        requests: Iterator[Request],
        *,
        seed: int = 0,
        follow_up=None,
        block_size: int = 16,
        sink: OutputSink | None = None,
    ):
        self.policy = policy
        self.costs = costs
        self.knobs = knobs
        self.block_size = block_size
        self.env = simpy.Environment()
        self.rng = np.random.default_rng(seed)
        self._follow_up = follow_up
        self._source = iter(requests)
        self._next_open_arrival: Request | None = next(self._source, None)
        self._pending_follow_ups: list[Request] = []
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.sink: OutputSink = sink if sink is not None else MemorySink()
        self._done_records: list[RequestRecord] = []  # outcomes not yet handed to the sink
        self.counters = Counters()
        self.recorder = Recorder(policy.pool_slots, self.sink)
        self._wake = self.env.event()
        self._next_seq_id = 0
        self._next_child_stream = -1  # children's output streams: negative ids never clash with workloads
        self._host_tokens_used = 0
        self._running_seqs = 0  # sequences in the batch (samples and beams each count)
        self._unforked_seqs = 0  # samples/beams of admitted requests still in prefill (not forked yet)
        self._swap_out_pending = 0  # blocks swapped out at an iteration's end: the next iteration moves them
        self._admissions = 0
        self.clock = DecodeClock(policy, defer_growth=knobs.step_mode == "skip")
        self._jump_rest = 0  # iterations of the current jump still to put on the clock
        self._decoded_seqs = 0  # sequences that decoded in the current iteration(s)
        self._iterations_this_step = 0
        self._prefill_this_step: list[tuple[RequestState, int]] = []
        self.admission_blocker = 0  # what holds the queue's head back (see _admission_blocker)

    # ------------------------------------------------------------------------------------------ run
    def run(self, until_s: float | None = None) -> None:
        self.env.process(self._arrivals())
        self.env.process(self._loop())
        self._sample()
        self.env.run(until=until_s)
        # Requests still in the system at the end are reported as unfinished.
        self._done_records.extend(state.record for state in [*self.running, *self.waiting])
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

    def _arrivals(self):
        while self._next_open_arrival is not None:
            yield self.env.timeout(max(0.0, self._next_open_arrival.arrival_s - self.env.now))
            # Everything that arrives at this instant is delivered together, so one iteration sees it all.
            while self._next_open_arrival is not None and self._next_open_arrival.arrival_s <= self.env.now:
                request = self._next_open_arrival
                self._next_open_arrival = next(self._source, None)
                self._arrive(request)

    def _schedule_follow_up(self, request: Request) -> None:
        self._pending_follow_ups.append(request)

        def deliver(_event) -> None:
            self._pending_follow_ups.remove(request)
            self._arrive(request)

        self.env.timeout(max(0.0, request.arrival_s - self.env.now)).callbacks.append(deliver)

    def _next_arrival_s(self) -> float:
        times = [r.arrival_s for r in self._pending_follow_ups]
        if self._next_open_arrival is not None:
            times.append(self._next_open_arrival.arrival_s)
        return min(times, default=float("inf"))

    def _arrive(self, request: Request) -> None:
        record = RequestRecord(
            request.request_id,
            request.arrival_s,
            request.prompt_len,
            request.output_len,
            request.n,
            request.beam_width,
        )
        state = RequestState(request, record)
        reason = self._never_admissible(request)
        if reason:
            self._reject(state, reason)
        else:
            self.waiting.append(state)
        if not self._wake.triggered:
            self._wake.succeed()

    def _never_admissible(self, request: Request) -> str:
        knobs = self.knobs
        # The reason names both lengths: "600 tokens" alone reads as the prompt's length.
        lengths = (
            f"prompt {request.prompt_len:,} + output {request.output_len:,} = {request.final_len:,} tokens"
        )
        if request.final_len > knobs.max_model_len:
            return f"{lengths} exceeds max_model_len={knobs.max_model_len:,}"
        if request.output_len < 1:
            return "output_len must be at least 1"
        if self.width_of(request) > knobs.max_num_seqs:
            return f"n/beam_width={self.width_of(request)} exceeds max_num_seqs={knobs.max_num_seqs}"
        if request.final_len * self.width_of(request) > self.policy.pool_slots:
            return (
                f"{self.width_of(request)} sequence(s) x ({lengths}) exceed the KV pool "
                f"({self.policy.pool_slots:,} slots) even with nothing else running"
            )
        if not knobs.enable_chunked_prefill and request.final_len > knobs.max_num_batched_tokens:
            return (
                f"{lengths} cannot be prefilled in one iteration "
                f"(max_num_batched_tokens={knobs.max_num_batched_tokens:,}, chunked prefill off)"
            )
        return ""

    @staticmethod
    def width_of(request: Request) -> int:
        return max(request.n, request.beam_width)

    def _loop(self):
        idle_steps = 0
        while True:
            if not self.running and not self.waiting:
                if self._next_arrival_s() == float("inf") and not self._pending_follow_ups:
                    return
                idle_steps = 0  # rejections that emptied the queue are progress, not a stall
                self.admission_blocker = 0
                self._wake = self.env.event()
                yield self._wake
                continue
            # Samples bracket every discrete change (admission and growth at an iteration's start, the
            # rest of a jump's growth and completions at its end), so time averages are exact for
            # single steps and linear across a jump.
            self._sample()
            preemptions_before = self.counters.preemptions
            duration = self._advance()
            self.admission_blocker = self._admission_blocker(preemptions_before)
            if duration > 0:
                idle_steps = 0
                self._sample()
                yield self.env.timeout(duration)
                self._complete_jump()
                self._sample()
                self._finish_iterations()
            else:
                idle_steps += 1
                if idle_steps > 3:
                    raise EngineStalled(
                        f"at t={self.env.now:.6f}s no iteration can be scheduled: "
                        f"{len(self.running)} running, {len(self.waiting)} waiting"
                    )
            self._sample()

    # ------------------------------------------------------------------------------------ iteration
    def _advance(self) -> float:
        """Schedule the next iteration (or a closed-form jump over k decode iterations); return its time."""
        jump = self._decode_jump() if self.knobs.step_mode == "skip" else 0
        if jump >= 1:
            return self._apply_decode_jump(jump)
        return self._single_iteration()

    def _single_iteration(self) -> float:
        knobs = self.knobs
        budget = knobs.max_num_batched_tokens
        copies_before = self.policy.stats.cow_copies
        # 1. every decoding sequence takes a token (the policy hears of those that need a block)
        self.clock.now += 1
        preempted, swap_blocks = self._decode_growth()
        swap_blocks += self._swap_out_pending
        self._swap_out_pending = 0
        decode_batch = self.clock.sequences
        decode_context = self.clock.sum_context()
        budget -= decode_batch
        # 2. prompts in progress, then 3. admissions (not after a preemption, as vLLM)
        self._prefill_this_step = []
        for state in self.running:
            if not state.decoding and state.prefilled < state.tokens_to_prefill and budget > 0:
                budget = self._schedule_prefill(state, budget)
        if not preempted:
            budget, swap_in = self._admit_waiting(budget)
            swap_blocks += swap_in
        self._decoded_seqs = decode_batch
        self._iterations_this_step = 1
        if decode_batch == 0 and not self._prefill_this_step:
            if swap_blocks:
                return self.costs.swap_blocks_s(swap_blocks)  # a swap-in alone: the transfer, no forward pass
            self._check_progress()
            return 0.0
        # One forward pass: its fixed cost (the weight read) is paid once, however many prompts share it.
        # Each chunk started at state.prefilled - chunk (a state is scheduled at most once a step).
        chunks = [(chunk, state.prefilled - chunk) for state, chunk in self._prefill_this_step]
        duration = self.costs.iteration_s(decode_batch, decode_context, chunks)
        duration += self.costs.copy_blocks_s(self.policy.stats.cow_copies - copies_before)
        duration += self.costs.swap_blocks_s(swap_blocks) if swap_blocks else 0.0
        return duration

    def _schedule_prefill(self, state: RequestState, budget: int) -> int:
        chunk = min(budget, state.tokens_to_prefill - state.prefilled)
        if not self.knobs.enable_chunked_prefill and chunk < state.tokens_to_prefill - state.prefilled:
            return budget
        state.prefilled += chunk
        self._prefill_this_step.append((state, chunk))
        return budget - chunk

    def _complete_jump(self) -> None:
        self.clock.now += self._jump_rest
        self._jump_rest = 0

    def _finish_iterations(self) -> None:
        """Book what the iteration(s) that just ended produced: first tokens, completions, beams."""
        now = self.env.now
        steps = self._iterations_this_step
        self.counters.iterations += steps
        self.counters.output_tokens += steps * self._decoded_seqs
        for state, _chunk in self._prefill_this_step:
            if state.is_running and state.prefilled >= state.tokens_to_prefill and not state.decoding:
                self._start_decoding(state)
        for state in self.clock.due_ends():
            if not (state.is_running and state.decoding):
                continue
            if self.clock.generated(state) >= state.request.output_len:
                self._finish(state, now)
            else:
                self._beam_step(state)
        self._prefill_this_step = []
        self._decoded_seqs = 0

    def _start_decoding(self, state: RequestState) -> None:
        """The prompt is in (or back in, after a recompute): fork the samples/beams, and the
        iteration's token goes into every sequence."""
        if state.record.first_token_s != state.record.first_token_s:  # NaN: first time
            state.record.first_token_s = self.env.now
        if len(state.seq_ids) < state.width:
            self._release_unforked(state)
            self._fork(state, state.seq_ids[0], state.width - len(state.seq_ids))
            if not state.is_running:
                return  # the fork did not fit: the request was preempted
        for seq_id in list(state.seq_ids):
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
        return self.clock.now + self._draw_beam_interval()

    def _draw_beam_interval(self) -> int:
        probability = self.knobs.beam_divergence_prob
        return int(self.rng.geometric(probability)) if probability > 0 else 1 << 62

    def _fork(self, state: RequestState, parent: int, count: int) -> None:
        """Add ``count`` children of ``parent`` to the request; if they do not fit, the request itself
        is preempted (a simplification: vLLM V0 would preempt the newest request first)."""
        final_len = state.request.final_len
        children = []
        for _ in range(count):
            children.append(ChildSpec(self._new_seq_id(), final_len, self._next_child_stream))
            self._next_child_stream -= 1
        try:
            self.policy.fork(parent, children)
        except OutOfKVMemory:
            self.counters.oom_events += 1
            if len(self.running) == 1:
                # Alone in the pool and still no room: retrying could never succeed.
                self._leave_running(state)
                for seq_id in state.seq_ids:
                    self.policy.free(seq_id)
                state.seq_ids = []
                self._reject(state, f"its {state.width} samples/beams do not fit in the KV pool even alone")
                return
            self._preempt(state, self.clock.now)
            return
        state.seq_ids.extend(child.seq_id for child in children)
        self._running_seqs += len(children)

    def _beam_step(self, state: RequestState) -> None:
        """One beam falls behind: it is freed and a surviving beam is forked to keep the width."""
        self.clock.leave(state, self.clock.now)
        pruned = state.seq_ids.pop(int(self.rng.integers(len(state.seq_ids))))
        self.policy.free(pruned)
        self._running_seqs -= 1
        survivor = state.seq_ids[int(self.rng.integers(len(state.seq_ids)))]
        self._fork(state, survivor, 1)
        if state.is_running:
            self.clock.enter(state, beam_due=self._next_beam_due(state))

    # ----------------------------------------------------------------------------------- growth/OOM
    def _decode_growth(self) -> tuple[bool, int]:
        """This iteration's token for the requests whose held slots ran out, oldest first (the others
        take theirs on the clock). Returns whether anything was preempted, and blocks swapped out."""
        preempted = False
        swapped = 0
        before = self.clock.now - 1
        for state in self.clock.due_flushes():
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

    def _grow_all_pending(self, state: RequestState) -> bool:
        """Fast path of a flush: every sequence takes all its pending tokens in one call, when the
        pool has the blocks for all of them (then nothing could have failed token by token)."""
        pending = self.clock.now - state.synced_clock
        available = self.policy.available_slots()
        # A cheap upper bound first (new blocks, plus one copy-on-write block per sequence).
        if len(state.seq_ids) * (pending // self.block_size + 2) * self.block_size > available:
            needed = sum(self.policy.slots_needed_to_grow(seq_id, pending) for seq_id in state.seq_ids)
            if needed > available:
                return False
        self.clock.sync(state, self.clock.now)
        self.clock.reschedule_flush(state)
        return True

    def _grow_or_preempt(self, state: RequestState, seq_id: int, *, victims_at: int) -> int:
        """Grow one sequence by a token; on OOM preempt the newest request until it fits. Victims are
        taken back to clock ``victims_at`` (a newer request has not decoded this iteration yet).
        Returns 0 when nothing was preempted, else 1 + blocks swapped out."""
        outcome = 0
        while True:
            try:
                self.policy.grow(seq_id, 1)
                return outcome
            except OutOfKVMemory:
                self.counters.oom_events += 1
                victim = self.running[-1]
                outcome = max(outcome, 1) + self._preempt(victim, victims_at)
                if victim is state:
                    return outcome

    def _preempt(self, state: RequestState, at_clock: int) -> int:
        """Take ``state`` off the GPU (its tokens as of ``at_clock``); returns blocks swapped out."""
        self.counters.preemptions += 1
        state.record.preemptions += 1
        if state.decoding:
            self.clock.leave(state, at_clock)
        self._leave_running(state)
        swapped_blocks = 0
        held = sum(self.policy.seq_len(s) for s in state.seq_ids)
        single = state.width == 1
        if self.knobs.preemption_mode == "swap" and single and self._host_room() >= held:
            swapped_blocks = -(-held // self.block_size)
            state.swapped_tokens = held
            self._host_tokens_used += held
            self.counters.swapped_out_blocks += swapped_blocks
        for seq_id in state.seq_ids:
            self.policy.free(seq_id)
        state.seq_ids = []
        if not single:
            # Samples and beams restart from the prompt: their diverged tokens are not recoverable.
            state.generated = 0
        state.prefilled = 0
        self.waiting.appendleft(state)
        return swapped_blocks

    def _host_room(self) -> int:
        return self.knobs.swap_space_blocks * self.block_size - self._host_tokens_used

    # ------------------------------------------------------------------------------------ admission
    def _admit_waiting(self, budget: int) -> tuple[int, int]:
        swap_in_blocks = 0
        while self.waiting and budget > 0:
            state = self.waiting[0]
            if self._running_seqs + self._unforked_seqs + state.width > self.knobs.max_num_seqs:
                break
            content = self._content_on_admission(state)
            final_len = state.request.final_len
            if (
                not self.knobs.enable_chunked_prefill
                and not state.swapped_tokens
                and sum(length for _, length in content) > budget
            ):
                break  # vLLM: without chunked prefill a prompt waits until it fits one iteration
            if not self._fits_watermark(content, final_len):
                if not self._handle_admission_failure(state):
                    break
                continue
            seq_id = self._new_seq_id()
            try:
                cached = self.policy.admit(seq_id, content, final_len, state.request.output_content_id)
            except OutOfKVMemory:
                if not self._handle_admission_failure(state):
                    break
                continue
            self.waiting.popleft()
            state.blocked = False
            state.seq_ids = [seq_id]
            if state.record.admitted_s != state.record.admitted_s:  # NaN: first admission
                state.record.admitted_s = self.env.now
                state.record.cached_prompt_tokens = cached
            self.running.append(state)
            self._admissions += 1
            state.admission = self._admissions
            state.is_running = True
            self._running_seqs += 1
            state.unforked = state.width - 1
            self._unforked_seqs += state.unforked
            total = sum(length for _, length in content)
            if state.swapped_tokens:
                swap_in_blocks += -(-state.swapped_tokens // self.block_size)
                self._host_tokens_used -= state.swapped_tokens
                state.swapped_tokens = 0
                state.tokens_to_prefill = state.prefilled = total
                state.context = total
                self.clock.enter(state)
                continue
            state.tokens_to_prefill = total
            state.context = total
            state.prefilled = cached
            budget = self._schedule_prefill(state, budget)
        return budget, swap_in_blocks

    def _content_on_admission(self, state: RequestState) -> TokenContent:
        request = state.request
        if state.generated and state.width == 1:
            # Recompute (or swap-in) restores what the request had generated as part of its prompt.
            return request.prompt + ((request.output_content_id, state.generated),)
        return request.prompt

    def _fits_watermark(self, content: TokenContent, final_len: int) -> bool:
        if not self.policy.can_admit(content, final_len):
            return False
        if self.knobs.watermark <= 0:
            return True
        prompt_slots = -(-sum(length for _, length in content) // self.block_size) * self.block_size
        return self.policy.available_slots() - prompt_slots >= self.knobs.watermark * self.policy.pool_slots

    def _handle_admission_failure(self, state: RequestState) -> bool:
        """Returns True when the queue head was removed and admission may continue."""
        if not state.blocked:
            state.blocked = True
            self.counters.admissions_failed += 1
            self.counters.oom_events += 1
        if not self.running:
            self.waiting.popleft()
            self._reject(state, "does not fit in the KV pool even with nothing else running")
            return True
        if self.knobs.on_oom == "fail" and not state.record.preemptions:
            self.waiting.popleft()
            state.record.outcome = "failed_oom"
            state.record.reason = "KV cache out of memory at admission (on_oom: fail)"
            self._request_done(state)
            return True
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
        for seq_id in state.seq_ids:
            self.policy.free(seq_id)
        state.seq_ids = []
        state.record.finish_s = now
        state.record.outcome = "finished"
        self._request_done(state)

    def _request_done(self, state: RequestState) -> None:
        """A request reached its outcome; a closed-loop user (or a conversation) may send the next one."""
        self._record_done(state.record)
        if self._follow_up is not None:
            follow = self._follow_up(state.request, self.env.now)
            if follow is not None:
                self._schedule_follow_up(follow)

    def _leave_running(self, state: RequestState) -> None:
        self.running.remove(state)
        state.is_running = False
        self._running_seqs -= len(state.seq_ids)
        self._release_unforked(state)

    def _release_unforked(self, state: RequestState) -> None:
        self._unforked_seqs -= state.unforked
        state.unforked = 0

    def _admission_blocker(self, preemptions_before: int) -> int:
        """Why the queue's head is still waiting once this iteration's admissions are done, as an index
        into ``sim.metrics.ADMISSION_BLOCKERS``: nothing waits; ``kv_memory`` (it does not fit, or a preemption
        stopped admissions, as in vLLM); ``max_num_seqs`` (the batch is full); ``token_budget`` (it
        would fit, but this iteration's ``max_num_batched_tokens`` went to other work). Recorded in the
        time series so that capacity planning reads the binding limit from the simulation."""
        if not self.waiting:
            return 0
        if self.counters.preemptions > preemptions_before:
            return KV_MEMORY
        state = self.waiting[0]
        if self._running_seqs + state.width > self.knobs.max_num_seqs:
            return MAX_NUM_SEQS
        if not self._fits_watermark(self._content_on_admission(state), state.request.final_len):
            return KV_MEMORY
        return TOKEN_BUDGET

    def _check_progress(self) -> None:
        if self.running or not self.waiting:
            return
        if self.env.now >= self._next_arrival_s():
            return
        raise EngineStalled(
            f"at t={self.env.now:.6f}s nothing can run: {len(self.waiting)} waiting, none admissible"
        )

    def _new_seq_id(self) -> int:
        self._next_seq_id += 1
        return self._next_seq_id

    # ----------------------------------------------------------------------------------- event skip
    def _decode_jump(self) -> int:
        """How many decode iterations can go on the clock at once without missing an event (0 = step):
        up to, not including, the next iteration that needs the policy; up to and including the next
        completion or beam decision; up to the iteration during which the next request arrives."""
        if not self.running or self.clock.requests < len(self.running) or self._swap_out_pending:
            return 0
        if self.waiting and (not self.waiting[0].blocked or self._head_admissible()):
            return 0  # let a single step try (and count) the admission
        now = self.clock.now
        steps = min(self.clock.next_flush() - 1 - now, self.clock.next_end() - now)
        if not self.waiting:
            steps = min(steps, self._iterations_until(self._next_arrival_s()))
        return max(steps, 0)

    def _head_admissible(self) -> bool:
        state = self.waiting[0]
        if self._running_seqs + self._unforked_seqs + state.width > self.knobs.max_num_seqs:
            return False
        return self._fits_watermark(self._content_on_admission(state), state.request.final_len)

    def _iterations_until(self, time_s: float) -> int:
        """Smallest k >= 1 such that k decode iterations from now end at or after ``time_s``."""
        budget = time_s - self.env.now
        return iterations_to_reach(self.costs.decode, self.clock.sequences, self.clock.sum_context(), budget)

    def _apply_decode_jump(self, steps: int) -> float:
        """Put ``steps`` decode iterations on the clock: one now, the rest when the jump ends."""
        duration = decode_series_s(self.costs.decode, steps, self.clock.sequences, self.clock.sum_context())
        self.clock.now += 1
        self._jump_rest = steps - 1
        self._decoded_seqs = self.clock.sequences
        self._prefill_this_step = []
        self._iterations_this_step = steps
        return duration

    # -------------------------------------------------------------------------------------- record
    def _sample(self) -> None:
        breakdown = self.policy.breakdown()
        pending = self.clock.pending_tokens()
        if pending:
            # Decoded tokens the policy has not been told of fill slots it still counts as reserved.
            breakdown = replace(
                breakdown, used=breakdown.used + pending, reserved=breakdown.reserved - pending
            )
        self.recorder.sample(
            self.env.now,
            breakdown,
            len(self.running),
            len(self.waiting),
            self._running_seqs,
            self.counters,
            self.policy.stats.as_dict(),
            self.policy.sharing_slots(),
            self.admission_blocker,
        )
