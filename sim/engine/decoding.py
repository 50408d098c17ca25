"""Decode bookkeeping that costs nothing per token: a decode clock and deferred growth.

Every decoding sequence gains one token per decode iteration. Rather than telling the policy about
each token, the engine counts decode iterations on a clock: a request synced at clock ``s`` holds
``context + (c - s)`` tokens per sequence at clock ``c``. The policy is told (``grow``) only when the
tokens no longer fit in the slots the sequences already hold (their *growth room*), when the request
leaves (finish, preemption) or changes shape (a beam decision). Until then the pending tokens sit in
slots the policy counts as *reserved*, so the exact breakdown is the policy's plus ``pending`` moved
from reserved to used (:meth:`DecodeClock.pending_tokens`).

Two schedules say when something must happen: the iteration at which a request's room runs out
(a *flush*: the policy must allocate, which may fail and preempt), and the iteration at which it
finishes or takes a beam decision. Flushes come once per block a sequence fills, so they are kept in
per-clock buckets (a list of requests per due clock, and a heap of the clocks only): scheduling one
is an append, and a request that stops decoding leaves its bucket. Ends are rarer (one per request
or beam decision) and sit in a heap of versioned entries, so rescheduling never needs a delete.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Final

from sim.engine.shared_reads import SharedReads
from sim.engine.speculation import TokenSchedule
from sim.engine.windows import AttendedWindows
from sim.kv.coordinator import KVCoordinator
from sim.outputs.metrics import RequestRecord
from workloads.request import Request

NEVER: Final = 1 << 61  # (below 2**62: compiled, a native int, not a boxed one)


@dataclass(slots=True, eq=False, init=False)
class RequestState:
    """A request inside the engine. (Its constructor is written out: the compiled build runs it
    natively, once per request, where a dataclass's generated one would stay interpreted.)"""

    request: Request
    record: RequestRecord
    seq_ids: list[int]
    tokens_to_prefill: int  # on the current admission (a recompute re-prefills generated tokens too)
    prefilled: int
    swapped_tokens: int  # > 0 while its KV sits in the host pool
    waited_for_memory: bool  # its admission failed for lack of KV memory at least once
    is_running: bool
    admission: int  # order of its latest admission: the running list is sorted by it
    unforked: int  # samples/beams admitted but not forked yet: they count against max_num_seqs
    decoding: bool  # prompt done: every sequence gains a token per decode iteration
    # Token counts as of ``synced_clock`` (exact whenever the request is not decoding).
    generated: int
    context: int  # tokens each of its sequences holds (they fork together and grow in step)
    synced_clock: int
    finish_due: int  # clock at whose iteration end a sample (or the request) finishes
    beam_due: int  # clock at whose iteration end its beams diverge
    flush_clock: int  # the clock of the flush bucket it is in (NEVER: in none)
    end_version: int  # end heap entries carry it: a stale entry is skipped, never deleted
    # Output lengths of its samples/beams still to finish, aligned with ``seq_ids`` once forked
    # (before the fork, entry 0 is the admitted sequence's). A sample that finishes leaves both.
    sample_lens: list[int]
    # Disaggregated serving (``sim/cluster/disaggregated.py``), on a decode replica: its prompt's KV is
    # computed by a prefill replica and comes over the link. ``remote_kv`` until it has landed;
    # ``kv_landed`` from then until it is scheduled (it holds its blocks meanwhile).
    remote_kv: bool
    kv_landed: bool
    queued_s: float  # when it came to this engine's queue (async scheduling: when it is first seen)
    entered_iteration: int  # the decode clock's iteration and token when it last started decoding
    entered_token: int
    windows_held: int  # bit i: its sequences hold the whole i-th attention window (sim/engine/windows.py)

    def __init__(self, request: Request, record: RequestRecord) -> None:
        self.request = request
        self.record = record
        self.seq_ids = []
        self.tokens_to_prefill = self.prefilled = self.swapped_tokens = 0
        self.waited_for_memory = self.is_running = self.decoding = False
        self.admission = self.unforked = 0
        self.generated = self.context = self.synced_clock = 0
        self.finish_due = self.beam_due = self.flush_clock = NEVER
        self.end_version = 0
        self.sample_lens = list(request.output_lens)
        self.remote_kv = self.kv_landed = False
        self.queued_s = float("-inf")
        self.entered_iteration = self.entered_token = self.windows_held = 0

    @property
    def width(self) -> int:
        """Sequences it runs once forked: its samples/beams not finished yet."""
        return len(self.sample_lens)

    @property
    def next_sample_end(self) -> int:
        """Generated tokens at which its next sample (or, the last one left, the request) finishes."""
        return min(self.sample_lens)

    def final_len_of(self, index: int) -> int:
        """Prompt plus the output of its ``index``-th unfinished sample: that sequence's final length."""
        return self.request.prompt_len + self.sample_lens[index]


class DecodeClock:
    """The decode clock, the aggregates of the decoding batch, and what falls due when."""

    def __init__(
        self,
        kv: KVCoordinator,
        *,
        defer_growth: bool,
        schedule: TokenSchedule | None = None,
        attention_windows: tuple[tuple[int, float], ...] = (),
        shared_reads: SharedReads | None = None,
    ):
        self.kv = kv
        self.defer_growth = defer_growth  # False: every token goes to the policy at once (the reference)
        # Tokens per sequence so far: one per iteration, or under speculative decoding the schedule's
        # (the first token of the iteration in flight; its accepted drafts join when it ends).
        self.now = 0
        self.iteration = 0  # iterations so far
        # The iteration of flushes a jump's landing applies now (0: none; operation_iteration).
        self.landing_iteration = 0
        self.schedule = schedule
        self.sequences = 0
        self._synced_sum = 0  # Σ over decoding sequences of their request's synced_clock
        self._offset_sum = 0  # Σ over decoding sequences of (context - synced_clock)
        self._flushes: dict[int, list[RequestState]] = {}  # due clock -> requests due then
        self._flush_clocks: list[int] = []  # heap of the buckets' clocks (emptied ones skipped)
        self._ends: list[_Entry] = []
        # Sliding-window / chunked-local layers: the context a step attends over (None: all of it).
        self.windows = AttendedWindows(attention_windows) if attention_windows else None
        # K/V blocks the running sequences share: read from memory once (sim/engine/shared_reads.py).
        self.shared_reads = shared_reads

    # ---------------------------------------------------------------------------- iterations and tokens
    def begin_iteration(self) -> None:
        """The next iteration starts: every decoding sequence holds its first token."""
        self.iteration += 1
        schedule = self.schedule
        self.now = self.now + 1 if schedule is None else schedule.first_token(self.iteration)
        if self.windows is not None:
            self.windows.cross(self.now)

    def advance(self, iterations: int) -> None:
        """``iterations`` more started (a jump's, after its first)."""
        self.iteration += iterations
        schedule = self.schedule
        self.now = self.now + iterations if schedule is None else schedule.first_token(self.iteration)
        if self.windows is not None:
            self.windows.cross(self.now)

    def operation_iteration(self) -> int:
        """The iteration whose operation the pool is doing: the current one, or inside a jump's
        landing the one its flush fell in (a pool stamping pages with time reads it)."""
        return self.landing_iteration if self.landing_iteration else self.iteration

    def end_iteration(self) -> None:
        """The iteration in flight ended: its accepted drafts join every decoding sequence."""
        if self.schedule is not None:
            self.now = self.schedule.last_token(self.iteration)

    def first_token_of(self, iteration: int) -> int:
        return iteration if self.schedule is None else self.schedule.first_token(iteration)

    def iteration_needing(self, token: int) -> int:
        """The iteration at whose start a sequence needs a slot for ``token`` (a flush due then)."""
        if self.schedule is None or token >= NEVER:
            return token
        return self.schedule.iteration_starting_at_or_after(token)

    def iteration_ending(self, token: int) -> int:
        """The iteration at whose end a request due at ``token`` finishes (or takes a beam step)."""
        if self.schedule is None or token >= NEVER:
            return token
        return self.schedule.iteration_ending_at_or_after(token)

    def tokens_per_sequence(self, first_iteration: int, last_iteration: int) -> int:
        """Tokens each sequence decoding throughout gained in iterations ``first..last``."""
        if self.schedule is None:
            return last_iteration - first_iteration + 1
        return self.schedule.last_token(last_iteration) - self.schedule.first_token(first_iteration) + 1

    # ------------------------------------------------------------------------------ batch aggregates
    def pending_tokens(self) -> int:
        """Tokens decoded but not yet told to the policy (they fill slots it counts as reserved)."""
        return self.sequences * self.now - self._synced_sum

    def sum_context(self) -> float:
        """The context the decoding sequences read from memory: their tokens, or with attention windows
        the windowed count (``sim/engine/windows.py``), less the re-reads of shared blocks that the
        GPU's cache serves (``sim/engine/shared_reads.py``)."""
        if self.windows is None:
            tokens = self._offset_sum + self.sequences * self.now
            if self.shared_reads is None:
                return tokens
            return tokens - min(self.shared_reads.credit(), tokens)
        attended = self.windows.attended(self._offset_sum, self.sequences, self.now)
        if self.shared_reads is None:
            return attended
        # Only the full-attention layers read the shared prefix (a window holds a sequence's own tail).
        return attended - min(self.shared_reads.credit() * self.windows.full_share, attended)

    def context_clamped(self) -> bool:
        """Does the cache's credit for shared reads exceed the context it is taken from? Then the step
        reads none of it, and goes on reading none as tokens grow until they outgrow the credit: not the
        token per sequence an iteration that a jump counts (``sim/engine/shared_reads.py``)."""
        if self.shared_reads is None or not self.sequences:
            return False
        if self.windows is None:
            return self.shared_reads.credit() > self._offset_sum + self.sequences * self.now
        attended = self.windows.attended(self._offset_sum, self.sequences, self.now)
        return self.shared_reads.credit() * self.windows.full_share > attended

    def context_growth(self) -> float | None:
        """What :meth:`sum_context` grows by per token every sequence gains, when it is not simply the
        number of sequences (attention windows); None otherwise."""
        return None if self.windows is None else self.windows.growth(self.sequences)

    def next_crossing(self) -> int:
        """The clock from which a sequence's tokens would count past its attention window."""
        return NEVER if self.windows is None else self.windows.next_crossing()

    def generated(self, state: RequestState) -> int:
        if not state.decoding:
            return state.generated
        now = self.now if self.now < state.finish_due else state.finish_due
        return state.generated + now - state.synced_clock

    # ------------------------------------------------------------------------------ enter and leave
    def enter(self, state: RequestState, beam_due: int = NEVER) -> None:
        """``state`` starts decoding now (its counts are exact at this clock)."""
        state.decoding = True
        state.synced_clock = self.now
        state.entered_iteration = self.iteration
        state.entered_token = self.now
        state.finish_due = self.now + state.next_sample_end - state.generated
        state.beam_due = beam_due
        self._add(state)
        self.reschedule_flush(state)
        state.end_version += 1
        if self.windows is not None:
            self.windows.add(state, self.now)
        end = min(state.finish_due, state.beam_due)
        heapq.heappush(self._ends, (end, state.admission, state.end_version, state))

    def leave(self, state: RequestState, at_clock: int) -> None:
        """``state`` stops decoding; its sequences are brought to ``at_clock`` in the policy first."""
        if self.schedule is None:
            if state.synced_clock > at_clock:
                self._take_back(state, at_clock)
            self.sync(state, at_clock)
        else:
            self._sync_leaving(state, at_clock)
        self._count_steps(state, at_clock)
        if self.windows is not None:
            self.windows.remove(state)
        self._remove(state)
        state.decoding = False
        self._cancel_flush(state)
        state.end_version += 1

    def _take_back(self, state: RequestState, at_clock: int) -> None:
        """A request taken off the GPU as of ``at_clock`` that was told this iteration's token before
        it was chosen (SGLang's retraction victim need not be the newest, and single steps tell every
        sequence, oldest first): it leaves without the token, as one whose flush was not due yet does.
        The policy still holds it; its sequences are freed next."""
        taken = state.synced_clock - at_clock
        self._synced_sum -= taken * len(state.seq_ids)
        state.generated -= taken
        state.context -= taken
        state.synced_clock = at_clock

    def sync(self, state: RequestState, at_clock: int) -> None:
        """Tell the policy the tokens decoded up to ``at_clock``; they fit the growth room."""
        if at_clock > state.finish_due:
            # (Speculation: drafts accepted past the last token are dropped, as the server stops there.)
            at_clock = state.finish_due
        pending = at_clock - state.synced_clock
        if pending <= 0:
            return
        # (No longer pending before the pool hears of them: a pool whose growth is unbacked counts
        # the pending tokens out of its free slots, sim/engine/unbacked.py.)
        self._synced_sum += pending * len(state.seq_ids)
        for seq_id in state.seq_ids:
            self.kv.grow(seq_id, pending)
        state.generated += pending
        state.context += pending
        state.synced_clock = at_clock

    def _count_steps(self, state: RequestState, at_clock: int) -> None:
        """Book the decode steps since it entered and the tokens they gave it (up to its last)."""
        record = state.record
        last = at_clock if at_clock < state.finish_due else state.finish_due
        record.decode_steps += self.iteration_ending(at_clock) - state.entered_iteration
        record.decode_step_tokens += last - state.entered_token

    def sync_within_room(self, state: RequestState, at_clock: int) -> int:
        """Tell the policy the tokens decoded up to ``at_clock``, or as many of them as its growth
        room holds; returns the clock it was brought to. (Speculation: the drafts a step accepted
        past the room sit in the lookahead slots its sequences hold.)"""
        room = min(self.kv.growth_room(seq_id) for seq_id in state.seq_ids) if state.seq_ids else 0
        # (A room below 0: a speculative sequence's blocks no longer cover its lookahead slots, as
        # after a swap-in; its next token takes blocks first. Nothing is told without them.)
        fits = state.synced_clock + (room if room > 0 else 0)
        reached = at_clock if at_clock < fits else fits
        self.sync(state, reached)
        return reached

    def _sync_leaving(self, state: RequestState, at_clock: int) -> None:
        """A speculative request leaves (its blocks are freed next): the policy hears of what its
        room holds; the accepted drafts past it count for the request without a slot of their own."""
        if at_clock > state.finish_due:
            at_clock = state.finish_due
        reached = self.sync_within_room(state, at_clock)
        untold = at_clock - reached
        if untold > 0:
            state.generated += untold
            state.context += untold
            state.synced_clock = at_clock
            self._synced_sum += untold * len(state.seq_ids)

    def flush(self, states: list[RequestState], at_clock: int) -> None:
        """The held slots of ``states`` ran out at ``at_clock``: all their sequences take every
        pending token in one policy call, in order (the caller made sure the pool has the blocks),
        and each request's next flush is scheduled."""
        seq_ids = [seq_id for state in states for seq_id in state.seq_ids]
        tokens = [at_clock - state.synced_clock for state in states for _ in state.seq_ids]
        synced = 0
        for pending in tokens:
            synced += pending
        self._synced_sum += synced  # (before the pool hears of them, as in sync)
        rooms = self.kv.grow_each(seq_ids, tokens)
        # The rest of sync, inlined: this runs once per block a sequence fills.
        defer = self.defer_growth
        first = 0
        for state in states:
            width = len(state.seq_ids)
            pending = at_clock - state.synced_clock
            state.generated += pending
            state.context += pending
            state.synced_clock = at_clock
            room = rooms[first] if width == 1 else min(rooms[first : first + width])
            first += width
            self._schedule_flush(state, at_clock + (room if defer else 0) + 1)

    def took_token(self, state: RequestState) -> None:
        """The policy was just told this iteration's token (a flush): the request is synced to now."""
        state.generated += 1
        state.context += 1
        state.synced_clock += 1
        self._synced_sum += len(state.seq_ids)

    def _add(self, state: RequestState) -> None:
        width = len(state.seq_ids)
        self.sequences += width
        self._synced_sum += width * state.synced_clock
        self._offset_sum += width * (state.context - state.synced_clock)

    def _remove(self, state: RequestState) -> None:
        width = len(state.seq_ids)
        self.sequences -= width
        self._synced_sum -= width * state.synced_clock
        self._offset_sum -= width * (state.context - state.synced_clock)

    # --------------------------------------------------------------------------------------- events
    def reschedule_flush(self, state: RequestState) -> None:
        """After a sync: the iteration at which its sequences' held slots run out."""
        room = min(self.kv.growth_room(seq_id) for seq_id in state.seq_ids) if self.defer_growth else 0
        if room < 0:
            room = 0  # (its lookahead slots are short: the next token takes blocks)
        self._cancel_flush(state)
        self._schedule_flush(state, state.synced_clock + room + 1)

    def _schedule_flush(self, state: RequestState, clock: int) -> None:
        """Put ``state`` (in no bucket) in the bucket of ``clock``."""
        bucket = self._flushes.get(clock)
        if bucket is None:
            self._flushes[clock] = [state]
            heapq.heappush(self._flush_clocks, clock)
        else:
            bucket.append(state)
        state.flush_clock = clock

    def _cancel_flush(self, state: RequestState) -> None:
        """Take ``state`` out of its bucket, if it is in one (an emptied bucket is dropped)."""
        clock = state.flush_clock
        if clock == NEVER:
            return
        state.flush_clock = NEVER
        bucket = self._flushes[clock]
        bucket.remove(state)  # (identity: RequestState compares by identity)
        if not bucket:
            del self._flushes[clock]

    def next_flush(self) -> int:
        clocks = self._flush_clocks
        while clocks and clocks[0] not in self._flushes:
            heapq.heappop(clocks)  # an emptied bucket's clock
        return clocks[0] if clocks else NEVER

    def next_end(self) -> int:
        return self._peek(self._ends, _end_valid)

    def due_flushes(self, at_clock: int | None = None) -> list[RequestState]:
        """Requests whose room runs out at this iteration (or by clock ``at_clock``), oldest
        admission first; they leave their buckets (the caller flushes or reschedules each)."""
        clock = self.now if at_clock is None else at_clock
        clocks = self._flush_clocks
        buckets = self._flushes
        due: list[RequestState] = []
        while clocks and clocks[0] <= clock:
            bucket = buckets.pop(heapq.heappop(clocks), None)
            if bucket is not None:
                if due:
                    due += bucket
                else:
                    due = bucket
        for state in due:
            state.flush_clock = NEVER
        if len(due) > 1:
            _sort_by_admission(due)
        return due

    def due_ends(self) -> list[RequestState]:
        """Requests that finish or take a beam decision at the end of this iteration, oldest first."""
        return _in_admission_order(self._pop_due(self._ends, _end_valid, self.now))

    @staticmethod
    def _peek(heap: list[_Entry], valid: Callable[[_Entry], bool]) -> int:
        while heap and not valid(heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else NEVER

    @staticmethod
    def _pop_due(heap: list[_Entry], valid: Callable[[_Entry], bool], clock: int) -> list[_Entry]:
        due = []
        pop = heapq.heappop
        while heap and heap[0][0] <= clock:
            entry = pop(heap)
            if valid(entry):
                due.append(entry)
        return due


def _in_admission_order(due: list[_Entry]) -> list[RequestState]:
    """The requests of popped entries, oldest admission first. Entries come off the heap ordered by
    (clock, admission): only entries of several clocks need sorting."""
    if len(due) > 1 and due[0][0] != due[-1][0]:
        due.sort(key=_admission_order)
    return [entry[3] for entry in due]


_Entry = tuple[int, int, int, RequestState]  # (clock due, admission order, version, request)
_ADMISSION = attrgetter("admission")
_INSERTION_SORT_MAX: Final = 16


def _sort_by_admission(states: list[RequestState]) -> None:
    """``states`` in place, oldest admission first. A short list (a flush group: one or a few
    sequences, nearly always) by insertion: compiled, that compares native ints, where a sort with a
    key function calls it once per element."""
    if len(states) > _INSERTION_SORT_MAX:
        states.sort(key=_ADMISSION)
        return
    for index in range(1, len(states)):
        state = states[index]
        position = index
        while position and states[position - 1].admission > state.admission:
            states[position] = states[position - 1]
            position -= 1
        states[position] = state


def _admission_order(entry: _Entry) -> int:
    return entry[1]


def _end_valid(entry: _Entry) -> bool:
    state = entry[3]
    return state.decoding and state.is_running and state.end_version == entry[2]
