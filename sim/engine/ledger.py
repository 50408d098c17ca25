"""The engine's book of request outcomes: each request's record from its arrival, the rejections of
requests no pool state could ever admit (checked as they arrive, with the reason named), and the
records of finished, failed and rejected requests handed to the output sink in chunks, each
followed, for a closed-loop user or a conversation, by the request that comes next."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import simpy

from sim.engine.arrivals import Arrivals
from sim.engine.batch import Batch
from sim.engine.decoding import RequestState
from sim.engine.handoff import KVHandOff
from sim.engine.knobs import EngineKnobs
from sim.kv.coordinator import KVCoordinator
from sim.outputs.metrics import CHUNK_ROWS, RequestRecord
from sim.outputs.sinks import MemorySink, OutputSink
from workloads.request import Request

if TYPE_CHECKING:
    from sim.engine.schedulers.base import Scheduler


class RequestLedger:
    def __init__(
        self,
        env: simpy.Environment,
        knobs: EngineKnobs,
        kv: KVCoordinator,
        scheduler: Scheduler,
        batch: Batch,
        handoff: KVHandOff,
        sink: OutputSink,
        arrivals: Arrivals,
        follow_up: Callable | None,
    ):
        self.env = env
        self.knobs = knobs
        self.kv = kv
        self.scheduler = scheduler
        self.batch = batch
        self.handoff = handoff
        self.sink = sink
        self.arrivals = arrivals
        self.follow_up = follow_up
        self.done_records: list[RequestRecord] = []  # outcomes not yet handed to the sink

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

    # --------------------------------------------------------------------------- never admissible
    def never_admissible(self, request: Request) -> str:
        """Why no state of the pool and the batch could ever admit ``request`` ("" when one could)."""
        knobs = self.knobs
        prompt_len = request.prompt_len
        longest = request.longest_output_len
        final_len = prompt_len + longest
        width = request.width
        if final_len > knobs.max_model_len:
            return f"{self._lengths(request)} exceeds max_model_len={knobs.max_model_len:,}"
        if request.output_len < 1:
            return "output_len must be at least 1"
        if width > knobs.max_num_seqs:
            return f"n/beam_width={width} exceeds max_num_seqs={knobs.max_num_seqs}"
        speculative = knobs.speculative
        if speculative is not None and width > 1:
            return (
                f"n/beam_width={width}: samples and beams are not modelled with speculative decoding "
                "(engine.speculative runs one sequence per request)"
            )
        output_lens = request.output_lens
        # (A prefill replica holds the prompt alone: the token it samples there takes no slot.)
        held_outputs = 0 if self.handoff.prefill_only else sum(output_lens)
        all_sequences = prompt_len * len(output_lens) + held_outputs
        if speculative is not None:
            all_sequences += speculative.lookahead_slots  # its drafts' slots, held with its tokens
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

    # ------------------------------------------------------------------------------------ outcomes
    def reject(self, state: RequestState, reason: str) -> None:
        state.record.outcome = "rejected"
        state.record.reason = reason
        if state.swapped_tokens:
            self.batch.release_swap(state)
        self.request_done(state)

    def fail_oom(self, state: RequestState) -> None:
        state.record.outcome = "failed_oom"
        state.record.reason = "KV cache out of memory at admission (on_oom: fail)"
        self.request_done(state)

    def request_done(self, state: RequestState) -> None:
        """A request reached its outcome; a closed-loop user (or a conversation) may send the next one."""
        self.handoff.dropped(state)
        self._record_done(state.record)
        if self.follow_up is not None:
            follow = self.follow_up(state.request, self.env.now)
            if follow is not None:
                self.arrivals.schedule_follow_up(follow)

    def _record_done(self, record: RequestRecord) -> None:
        self.done_records.append(record)
        if len(self.done_records) >= CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.done_records:
            self.sink.write_requests(self.done_records)
            self.done_records = []

    def close(self, in_system: list[RequestState]) -> None:
        """The clock stopped: requests still in the system are booked unfinished, and every row goes
        to the sink."""
        self.done_records.extend(state.record for state in in_system)
        self.flush()

    @property
    def records(self) -> list[RequestRecord]:
        """Every request's record (an in-memory sink only), in the order their outcomes were known."""
        if not isinstance(self.sink, MemorySink):
            raise AttributeError("records went to a file sink: read them with sink.requests()")
        return self.sink.records + self.done_records
