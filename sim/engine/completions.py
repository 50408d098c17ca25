"""What the end of an iteration does to a request: its prompt done, it takes its first token and forks
its samples or beams; a beam step replaces the beams that fall out of the top ``width`` by forks of
survivors; samples that generated their last token free their blocks, and the request finishes with
its last one (or, on a prefill replica of a disaggregated cluster, holds its blocks to be sent)."""

from __future__ import annotations

import math

import simpy

from policies.base import ChildSpec, OutOfKVMemory
from sim.engine.batch import Batch
from sim.engine.beams import BeamDraws
from sim.engine.decoding import NEVER, DecodeClock, RequestState
from sim.engine.growth import DecodeGrowth
from sim.engine.handoff import KVHandOff
from sim.engine.ledger import RequestLedger
from sim.kv.coordinator import KVCoordinator
from sim.outputs.metrics import Counters


class Completions:
    def __init__(
        self,
        env: simpy.Environment,
        kv: KVCoordinator,
        clock: DecodeClock,
        batch: Batch,
        growth: DecodeGrowth,
        beams: BeamDraws,
        ledger: RequestLedger,
        handoff: KVHandOff,
        counters: Counters,
    ):
        self.env = env
        self.kv = kv
        self.clock = clock
        self.batch = batch
        self.growth = growth
        self.beams = beams
        self.ledger = ledger
        self.handoff = handoff
        self.counters = counters
        self._next_child_stream = -1  # children's output streams: negative ids never clash with workloads

    def after_iterations(self, prefill_this_step: list[tuple[RequestState, int]]) -> tuple[bool, int]:
        """The iteration(s) that just ended finished the prompts of ``prefill_this_step`` whose last
        chunk they ran (each takes its first token) and the samples, requests and beam steps the clock
        had due. Returns whether any of those happened, and blocks swapped out by preemptions."""
        now = self.env.now
        changed = False
        swapped_out = 0
        done = [
            prefilled[0]  # (indexed, not unpacked: see token_content.segments.content_length)
            for prefilled in prefill_this_step
            if prefilled[0].is_running
            and prefilled[0].prefilled >= prefilled[0].tokens_to_prefill
            and not prefilled[0].decoding
        ]
        for state in done:
            # Every prompt of the batch sampled its first token as the iteration ended, before any of
            # them takes a slot for it: one preempted by an older request's slot keeps its TTFT.
            if state.record.first_token_s != state.record.first_token_s:  # NaN: first time
                state.record.first_token_s = now
        for state in done:
            if state.is_running and not state.decoding:
                swapped_out += self.start_decoding(state)
                changed = True
        for state in self.clock.due_ends():
            if not (state.is_running and state.decoding):
                continue
            changed = True
            if self.clock.generated(state) >= state.next_sample_end:
                self.end_samples(state, now)
            else:
                swapped_out += self.beam_step(state)
        return changed, swapped_out

    def start_decoding(self, state: RequestState) -> int:
        """The prompt is in (or back in, after a recompute): fork the samples/beams, and the
        iteration's token goes into every sequence. Returns blocks swapped out by preemptions."""
        self.batch.prefilling.remove(state)
        swapped = 0
        if len(state.seq_ids) < state.width:
            self.batch.release_unforked(state)
            # Sample i (i >= 1) runs to its own length: the children take entries 1.. of sample_lens.
            final_lens = [state.final_len_of(index) for index in range(len(state.seq_ids), state.width)]
            swapped = self.fork(state, [(state.seq_ids[0], final_lens)])
            if not state.is_running:
                return swapped  # the fork did not fit even alone, or the request was the victim
        # (A prefill replica samples its one token and stops: vLLM allocates it no slot.)
        for seq_id in list(state.seq_ids) if not self.handoff.prefill_only else ():
            outcome = self.growth.grow_or_preempt(state, seq_id, victims_at=self.clock.now)
            swapped += max(0, outcome - 1)
            if not state.is_running:
                return swapped
        state.context += 1
        state.generated += 1
        self.counters.output_tokens += len(state.seq_ids)
        self.clock.enter(state, beam_due=self._next_beam_due(state))
        return swapped

    def _next_beam_due(self, state: RequestState) -> int:
        if state.request.beam_width <= 1:
            return NEVER
        return self.clock.now + self.beams.interval(len(state.seq_ids))

    def fork(self, state: RequestState, forks: list[tuple[int, list[int]]]) -> int:
        """Add children to the request: for each ``(parent, final lengths)``, one child of ``parent``
        per length. When they do not all fit, the scheduler's victims (vLLM: the newest request) are
        preempted until they do, as for a token; the request itself when it is the victim, or
        rejected when it is alone. (Preempting the forking request first, as kvsim did, let two
        requests whose forks fit only one at a time preempt each other for ever.) Returns blocks
        swapped out."""
        planned: list[tuple[int, list[ChildSpec]]] = []
        for parent, final_lens in forks:
            children = []
            for final_len in final_lens:
                children.append(ChildSpec(self.batch.new_seq_id(), final_len, self._next_child_stream))
                self._next_child_stream -= 1
            planned.append((parent, children))
        forked: list[int] = []

        def fork_all() -> None:
            try:
                for parent, children in planned:
                    self.kv.fork(parent, children)
                    forked.extend(child.seq_id for child in children)
            except OutOfKVMemory:
                for seq_id in forked:
                    self.kv.free(seq_id, finished=False)
                forked.clear()
                raise

        outcome = self.growth.make_room(state, fork_all, self.clock.now)
        if state.is_running:
            state.seq_ids.extend(forked)
            self.batch.running_seqs += len(forked)
        return max(0, outcome - 1)

    def beam_step(self, state: RequestState) -> int:
        """Some beams fall out of the top ``width``: each is freed and replaced by a fork of a
        surviving beam (its blocks shared, its partly filled tail copied on the next write). Returns
        blocks swapped out by preemptions."""
        self.clock.leave(state, self.clock.now)
        width = len(state.seq_ids)
        replaced = self.beams.replaced(width)
        survivors = [seq for index, seq in enumerate(state.seq_ids) if index not in replaced]
        parents = self.beams.parents(len(survivors), len(replaced))
        # A replaced beam's tokens are a decoded prefix like any finished sample's: freed as finished.
        for index in sorted(replaced, reverse=True):
            self.kv.free(state.seq_ids.pop(index))
        self.batch.running_seqs -= len(replaced)
        final_len = state.final_len_of(0)  # beams all run to the request's length
        children_of: dict[int, list[int]] = {}
        for parent in parents:
            children_of.setdefault(survivors[parent], []).append(final_len)
        swapped = self.fork(state, list(children_of.items()))
        if state.is_running:
            self.clock.enter(state, beam_due=self._next_beam_due(state))
        return swapped

    def end_samples(self, state: RequestState, now: float) -> None:
        """Samples that generated their last token stop and free their blocks (blocks they share stay
        with the others); the request finishes with its last sample."""
        generated = self.clock.generated(state)
        if max(state.sample_lens) <= generated:
            self.finish(state, now)
            return
        self.clock.leave(state, self.clock.now)
        ending = [index for index, length in enumerate(state.sample_lens) if length <= generated]
        for index in reversed(ending):
            self.kv.free(state.seq_ids.pop(index))
            state.sample_lens.pop(index)
        self.batch.running_seqs -= len(ending)
        self.clock.enter(state, beam_due=state.beam_due)

    def finish(self, state: RequestState, now: float) -> None:
        self.clock.leave(state, self.clock.now)
        self.batch.leave(state)
        if self.handoff.prefill_only:
            self._hand_off(state, now)
            return
        for seq_id in state.seq_ids:
            self.kv.free(seq_id)
        state.seq_ids = []
        state.record.finish_s = now
        state.record.outcome = "finished"
        self.ledger.request_done(state)

    def _hand_off(self, state: RequestState, now: float) -> None:
        """(Prefill replica) The prompt is done and its first token sampled (the client gets the decode
        replica's): the blocks stay until the cluster has sent them."""
        record = state.record
        record.prefill_done_s = now
        record.first_token_s = math.nan
        self.handoff.hold(state)
