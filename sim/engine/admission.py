"""The engine as its scheduler sees it (``SchedulingEngine`` in ``sim/engine/schedulers/base.py``):
the queue, the batch, the KV coordinator and the decode clock, and the services a scheduler admits
and preempts through, which keep the engine's books: a request admitted starts running (prefilling
the part of its prompt the cache does not hold, or decoding at once when swapped back in), a prompt
chunk is scheduled into this iteration, a head that does not fit waits, fails or is rejected."""

from __future__ import annotations

from collections.abc import Callable

import simpy

from sim.engine.batch import Batch
from sim.engine.chunk_reports import ChunkReports
from sim.engine.decoding import DecodeClock, RequestState
from sim.engine.growth import DecodeGrowth
from sim.engine.handoff import KVHandOff
from sim.engine.jumps import prefill_chunk
from sim.engine.knobs import EngineKnobs
from sim.engine.ledger import RequestLedger
from sim.engine.schedulers.base import (
    HEAD_LATCHED,
    HEAD_NOT_SEEN,
    HEAD_OUT_OF_MEMORY,
    HEAD_OVER_BUDGET,
    SchedulingEngine,
)
from sim.kv.coordinator import KVCoordinator
from sim.outputs.metrics import KV_MEMORY, MAX_NUM_SEQS, TOKEN_BUDGET, Counters
from token_content import TokenContent, content_length


class AdmissionDesk(SchedulingEngine):
    def __init__(
        self,
        env: simpy.Environment,
        knobs: EngineKnobs,
        block_size: int,
        kv: KVCoordinator,
        clock: DecodeClock,
        batch: Batch,
        growth: DecodeGrowth,
        ledger: RequestLedger,
        handoff: KVHandOff,
        counters: Counters,
        chunks_prompts: bool,
        host_load_s: Callable[[float], float],
        chunk_reports: ChunkReports,
    ):
        self.env = env
        self.knobs = knobs
        self.block_size = block_size
        self.kv = kv
        self.clock = clock
        self.batch = batch
        self.waiting = batch.waiting
        self.running = batch.running
        self.growth = growth
        self.ledger = ledger
        self.handoff = handoff
        self.counters = counters
        self.chunks_prompts = chunks_prompts
        self.host_load_s = host_load_s
        # Prompts' blocks are hittable as their chunks are scheduled or have run, not at admission
        # (sim/engine/chunk_reports.py): the desk and the jump landing report every chunk.
        self.chunk_reports = chunk_reports
        # This iteration's prompt chunks, (request, tokens), in the order they were scheduled.
        self.prefill_this_step: list[tuple[RequestState, int]] = []
        # Async scheduling: when the last iteration started and ended (see scheduled_at).
        self.last_started_s = self.last_ended_s = float("-inf")

    # -- admitting --------------------------------------------------------------------------------
    def batch_has_room(self, width: int) -> bool:
        return self.batch.has_room(width)

    def new_seq_id(self) -> int:
        return self.batch.new_seq_id()

    def content_on_admission(self, state: RequestState) -> TokenContent:
        request = state.request
        if state.generated and request.width == 1:
            # Recompute (or swap-in) restores what the request had generated as part of its prompt.
            return request.prompt + ((request.output_content_id, state.generated),)
        return request.prompt

    def fits_watermark(self, content: TokenContent, final_len: int) -> bool:
        return self.kv.can_admit(content, final_len) and self._leaves_watermark(content)

    def _leaves_watermark(self, content: TokenContent) -> bool:
        """Would admitting ``content`` leave the watermark's share of the pool free (vLLM V0's)?"""
        if self.knobs.watermark <= 0:
            return True
        prompt_slots = -(-content_length(content) // self.block_size) * self.block_size
        return self.kv.available_slots() - prompt_slots >= self.knobs.watermark * self.kv.pool_slots

    def start_running(self, state: RequestState, seq_id: int, cached: int, content: TokenContent) -> int:
        """The queue's head was just admitted as ``seq_id`` with ``cached`` prompt tokens from cache:
        it leaves the queue and runs, prefilling the rest (or, swapped in, decoding at once).
        Returns blocks swapped in."""
        self.waiting.popleft()
        state.seq_ids = [seq_id]
        if state.record.admitted_s != state.record.admitted_s:  # NaN: first admission
            state.record.admitted_s = self.env.now
            state.record.cached_prompt_tokens = cached
        self.batch.join(state)
        total = content_length(content)
        state.context = total
        if state.swapped_tokens:
            swapped_in = -(-state.swapped_tokens // self.block_size)
            self.batch.release_swap(state)
            state.tokens_to_prefill = state.prefilled = total
            self._scheduled(state)
            self.clock.enter(state)
            return swapped_in
        state.tokens_to_prefill = total
        state.prefilled = cached
        self.batch.prefilling.append(state)
        return 0

    def schedule_prefill(self, state: RequestState, budget: int, chunks: list[tuple[int, int]]) -> int:
        """This iteration prefills the next chunk of ``state``'s prompt within ``budget`` tokens;
        returns the budget left."""
        chunk = prefill_chunk(state, budget, self.chunks_prompts)
        if not chunk:
            return budget
        chunks.append((chunk, state.prefilled))
        state.prefilled += chunk
        self._scheduled(state)
        self.prefill_this_step.append((state, chunk))
        return budget - chunk

    def _scheduled(self, state: RequestState) -> None:
        """``state``'s prompt is scheduled (or swapped in, or landed) up to ``prefilled``."""
        self.chunk_reports.scheduled(state)

    def admission_failed(self, state: RequestState) -> bool:
        """The queue head does not fit now. Returns True when it was removed (admission may go on)."""
        if not self.running and not self.handoff.pending:
            self.waiting.popleft()
            self.ledger.reject(state, "does not fit in the KV pool even with nothing else running")
            return True
        if self.knobs.on_oom == "fail" and not state.record.preemptions:
            self.waiting.popleft()
            self.counters.oom_failures += 1
            self.ledger.fail_oom(state)
            return True
        if not state.waited_for_memory:
            state.waited_for_memory = True
            self.counters.admission_waits += 1
        return False

    def preempt(self, state: RequestState, at_clock: int) -> int:
        """Take ``state`` off the GPU (its tokens as of ``at_clock``); returns blocks swapped out."""
        return self.growth.preempt(state, at_clock)

    def scheduled_at(self) -> float:
        """When vLLM scheduled the iteration starting now: with async scheduling, at the start of the
        iteration before it, which ran up to now (vLLM's engine core schedules one step ahead of the
        GPU: ``step_with_batch_queue``), so requests queued since wait one more iteration; else now.
        An engine with nothing running schedules at once: the step ahead had nothing to overlap."""
        now = self.env.now
        if self.knobs.async_scheduling and self.running and self.last_ended_s == now:
            return self.last_started_s
        return now

    # -- prefix hits loaded from the host tier ----------------------------------------------------
    def host_loads(self) -> int:
        """Tokens loaded from the host tier so far (the radix policy's HiCache loads whole nodes, not
        always whole engine blocks: the transfer is charged per token, as blocks of ``block_size``)."""
        tier = self.kv.host_tier
        return tier.stats.host_loaded_tokens if tier is not None else 0

    def charge_host_loads(self, loads_before: int) -> float:
        """Seconds the iteration waits for what admissions loaded from the host tier since
        ``loads_before`` (:meth:`host_loads`): they need it, like a swap-in."""
        loaded = self.host_loads() - loads_before
        if not loaded:
            return 0.0
        seconds = self.host_load_s(loaded / self.block_size)
        self.counters.host_load_s += seconds
        return seconds

    # -- disaggregated serving: prompts computed elsewhere ----------------------------------------
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
        self.batch.join(state)
        state.context = state.tokens_to_prefill = state.request.prompt_len
        state.prefilled = state.tokens_to_prefill - 1
        self._scheduled(state)  # (vLLM caches a remote prompt's blocks once they have arrived)
        self.batch.prefilling.append(state)

    # -- what holds the queue back ----------------------------------------------------------------
    def admission_blocker(self, preemptions_before: int, admission_stop: str) -> int:
        """Why the queue's head is still waiting once this iteration's admissions are done, as an index
        into ``sim.outputs.metrics.ADMISSION_BLOCKERS``: nothing waits; ``kv_memory`` (it does not
        fit, or a preemption stopped admissions, as in vLLM); ``max_num_seqs`` (the batch is full);
        ``token_budget`` (it would fit, but this iteration's ``max_num_batched_tokens`` went to other
        work). Recorded in the time series so that capacity planning reads the binding limit from
        the simulation."""
        if not self.waiting or admission_stop == HEAD_NOT_SEEN:
            return 0  # (not seen: no limit holds it back; the next iteration schedules it)
        if self.counters.preemptions > preemptions_before or admission_stop in (
            HEAD_OUT_OF_MEMORY,
            HEAD_OVER_BUDGET,
            HEAD_LATCHED,
        ):
            # (Out of memory: the head's admission just failed, and nothing changed the pool since;
            # latched: it failed before, and nothing left the batch since.)
            return KV_MEMORY
        state = self.waiting[0]
        if not self.batch_has_room(state.width):
            return MAX_NUM_SEQS
        if state.kv_landed:
            return TOKEN_BUDGET  # it holds its blocks already
        # (A reading: it must not change what the pool shows, which single steps would read more often.)
        content = self.content_on_admission(state)
        fits = self.kv.can_admit_quietly(content, state.final_len_of(0))
        if not (fits and self._leaves_watermark(content)):
            return KV_MEMORY
        return TOKEN_BUDGET
