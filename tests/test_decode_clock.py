"""The decode clock's small parts, against an independent method."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


class _State:
    """Stands in for a RequestState: only its admission number is read."""

    def __init__(self, admission: int):
        self.admission = admission


@pytest.mark.python_sources  # hands the compiled function stand-ins for RequestState
@settings(deadline=None)
@given(st.lists(st.integers(0, 10_000), unique=True, max_size=40))
def test_sort_by_admission_is_sorted_by_admission(admissions):
    """Flush groups of any length (insertion sort up to 16, a keyed sort past it), sorted in place:
    the same objects in the order ``sorted`` gives their admission numbers (unique, as the engine's)."""
    from sim.engine.decoding import _sort_by_admission

    states = [_State(admission) for admission in admissions]
    expected = sorted(states, key=lambda state: state.admission)
    _sort_by_admission(states)
    assert [id(state) for state in states] == [id(state) for state in expected]


# --------------------------------------------------------------------------------------------------
# The clock against a stand-in coordinator: what it tells the policy, and when the next flush falls
# --------------------------------------------------------------------------------------------------


class _Pool:
    """Stands in for the KV coordinator: each sequence's growth room is set by the test; the clock's
    calls are recorded."""

    def __init__(self, rooms: dict[int, int]):
        self.rooms = rooms
        self.grown: list[tuple[int, int]] = []

    def grow(self, seq_id: int, num_tokens: int) -> None:
        self.grown.append((seq_id, num_tokens))
        self.rooms[seq_id] -= num_tokens

    def grow_each(self, seq_ids, num_tokens) -> list[int]:
        for seq_id, tokens in zip(seq_ids, num_tokens, strict=True):
            self.grow(seq_id, tokens)
        return [self.rooms[seq_id] for seq_id in seq_ids]

    def growth_room(self, seq_id: int) -> int:
        return self.rooms[seq_id]


def _decoding(seq_ids: list[int], output_len: int = 20, n: int = 1):
    from sim.engine.decoding import RequestState
    from sim.outputs.metrics import RequestRecord
    from tests.engine_helpers import request

    state = RequestState(
        request(1, 0.0, 8, output_len, n=n), RequestRecord(1, 0.0, 8, output_len, n, 1, output_len)
    )
    state.seq_ids = list(seq_ids)
    state.sample_lens = [output_len] * len(seq_ids)
    state.context = 8
    state.is_running = True
    return state


def _clock(rooms: dict[int, int], *, defer_growth: bool = True):
    from sim.engine.decoding import DecodeClock

    pool = _Pool(rooms)
    return DecodeClock(pool, defer_growth=defer_growth), pool


def test_a_new_request_has_nothing_admitted_and_nothing_decoded():
    """Every field of a new request's state, as the engine's first reads of it expect."""
    from sim.engine.decoding import NEVER, RequestState
    from sim.outputs.metrics import RequestRecord
    from tests.engine_helpers import request

    state = RequestState(request(1, 0.0, 8, 4), RequestRecord(1, 0.0, 8, 4, 1, 1, 4))
    assert state.seq_ids == []
    assert (state.tokens_to_prefill, state.prefilled, state.swapped_tokens) == (0, 0, 0)
    assert (state.waited_for_memory, state.is_running, state.decoding) == (False, False, False)
    assert all(type(flag) is bool for flag in (state.waited_for_memory, state.is_running, state.decoding))
    assert (state.admission, state.unforked, state.end_version) == (0, 0, 0)
    assert (state.generated, state.context, state.synced_clock) == (0, 0, 0)
    assert (state.finish_due, state.beam_due, state.flush_clock) == (NEVER, NEVER, NEVER)
    assert (state.remote_kv, state.kv_landed) == (False, False)
    assert type(state.remote_kv) is bool and type(state.kv_landed) is bool
    assert state.queued_s == float("-inf")
    assert (state.entered_iteration, state.entered_token, state.windows_held) == (0, 0, 0)
    assert state.sample_lens == [4]


@pytest.mark.python_sources  # a stand-in for the compiled coordinator
@pytest.mark.parametrize(("defer_growth", "first_flush"), [(True, 5 + 1), (False, 1)])
def test_the_first_flush_falls_when_the_room_runs_out_or_at_once_in_single_steps(defer_growth, first_flush):
    """A request entering at clock 0 with 5 tokens of room: its first flush is at clock 6 (the token
    past its room); stepping singly (``step_mode: single``, no deferred growth) at clock 1."""
    clock, _pool = _clock({1: 5}, defer_growth=defer_growth)
    state = _decoding([1])
    clock.enter(state)
    assert clock.next_flush() == first_flush


@pytest.mark.python_sources
@pytest.mark.parametrize(("defer_growth", "next_flush"), [(True, 4 + 3 + 1), (False, 4 + 1)])
def test_a_flush_schedules_the_next_at_the_smallest_room_of_the_requests_sequences(defer_growth, next_flush):
    """Two sequences (samples) of one request, flushed at clock 4 with 4 pending tokens each; the
    pool leaves them 7 and 3 tokens of room: the next flush is at 4 + 3 + 1 = 8 (the sequence that
    runs out first), or at 5 when every token goes to the policy at once."""
    clock, pool = _clock({1: 11, 2: 7}, defer_growth=defer_growth)
    state = _decoding([1, 2], n=2)
    clock.enter(state)
    for _ in range(4):
        clock.begin_iteration()
    clock.flush(clock.due_flushes(NEVER_CLOCK), 4)
    assert pool.grown == [(1, 4), (2, 4)]
    assert (state.generated, state.context, state.synced_clock) == (4, 12, 4)
    assert clock.next_flush() == next_flush


NEVER_CLOCK = 1 << 61  # past any flush of these tests


@pytest.mark.python_sources
def test_sync_within_room_tells_the_policy_only_what_the_room_holds():
    """Synced at 0 with 5 tokens of room: brought to clock 3, the policy hears of 3 tokens; asked for
    clock 9, of the 5 the room holds (the rest is left for a flush)."""
    clock, pool = _clock({1: 5})
    state = _decoding([1])
    clock.enter(state)
    assert clock.sync_within_room(state, 3) == 3
    assert pool.grown == [(1, 3)]
    assert clock.sync_within_room(state, 9) == 5
    assert pool.grown == [(1, 3), (1, 2)]
    assert (state.generated, state.synced_clock) == (5, 5)


@pytest.mark.python_sources
def test_sync_within_room_without_sequences_brings_nothing():
    """A request holding no sequence (preempted: its blocks freed) has no room: nothing is synced."""
    clock, pool = _clock({})
    state = _decoding([])
    assert clock.sync_within_room(state, 4) == 0
    assert (state.generated, state.synced_clock, pool.grown) == (0, 0, [])


@pytest.mark.python_sources
def test_sync_and_generated_stop_at_the_last_token():
    """Output of 3 tokens: the request finishes at clock 3. Asked about clock 5 (a speculative step's
    accepted drafts ran past it), it has generated 3 and the policy hears of 3, not 5."""
    clock, pool = _clock({1: 10})
    state = _decoding([1], output_len=3)
    clock.enter(state)
    for _ in range(5):
        clock.begin_iteration()
    assert clock.now == 5
    assert clock.generated(state) == 3
    clock.sync(state, 5)
    assert pool.grown == [(1, 3)]
    assert (state.generated, state.context, state.synced_clock) == (3, 11, 3)


@pytest.mark.python_sources
def test_decode_steps_and_their_tokens_add_up_over_two_spells():
    """Decoding from clock 0 to 4, preempted, back from 6 to 9: 4 + 3 = 7 steps, 7 tokens (one a
    step without speculation), each spell counted from where it entered, not up to its last token."""
    clock, _pool = _clock({1: 100})
    state = _decoding([1])
    clock.enter(state)
    for _ in range(4):
        clock.begin_iteration()
    clock.leave(state, 4)
    assert (state.record.decode_steps, state.record.decode_step_tokens) == (4, 4)
    for _ in range(2):
        clock.begin_iteration()
    clock.enter(state)
    for _ in range(3):
        clock.begin_iteration()
    clock.leave(state, 9)
    assert (state.record.decode_steps, state.record.decode_step_tokens) == (7, 7)
    assert state.generated == 7


@pytest.mark.python_sources
def test_a_request_told_this_iterations_token_leaves_without_it():
    """Single steps tell every sequence its token, oldest first; SGLang may then retract one of them
    as of the iteration before (its victim is the one with fewest decoded tokens, not the newest).
    Told 5 tokens by clock 5, taken off as of clock 4: it has generated 4 (context 8 + 4), as a
    request whose flush was not due would have, and the clock's sums are as if it had left at 4."""
    clock, pool = _clock({1: 100, 2: 100}, defer_growth=False)
    state, other = _decoding([1]), _decoding([2])
    state.admission, other.admission = 1, 2
    clock.enter(state)
    clock.enter(other)
    for _ in range(5):
        clock.begin_iteration()
        clock.flush(clock.due_flushes(NEVER_CLOCK), clock.now)
    assert (state.generated, state.synced_clock) == (5, 5)
    clock.leave(state, 4)
    assert (state.generated, state.context, state.synced_clock) == (4, 12, 4)
    assert (state.record.decode_steps, state.record.decode_step_tokens) == (4, 4)
    assert clock.sequences == 1 and clock.sum_context() == 8 + 5  # the other one alone, at clock 5


@pytest.mark.python_sources
def test_a_speculative_request_leaving_keeps_the_drafts_past_its_room():
    """Every step accepts 2 drafts (3 tokens a step: iteration 1 holds clocks 1-3, iteration 2 4-6).
    A (two samples) and B decode from clock 0; A's sequences have 5 tokens of room. A leaves at clock
    6: the policy hears of the 5 its room holds, the 6th (an accepted draft) still counts for A
    (generated 6, context 8 + 6), and what is pending for B alone is left: 6 tokens."""
    from sim.engine.decoding import DecodeClock
    from sim.engine.speculation import AcceptanceModel, TokenSchedule

    pool = _Pool({1: 5, 2: 5, 3: 100})
    clock = DecodeClock(
        pool, defer_growth=True, schedule=TokenSchedule(AcceptanceModel((0.0, 0.0, 1.0), "test"), 1)
    )
    a, b = _decoding([1, 2], n=2), _decoding([3])
    b.admission = 1
    clock.enter(a)
    clock.enter(b)
    for _ in range(2):
        clock.begin_iteration()
        clock.end_iteration()
    assert clock.now == 6
    clock.leave(a, 6)
    assert pool.grown == [(1, 5), (2, 5)]
    assert (a.generated, a.context, a.synced_clock) == (6, 14, 6)
    assert clock.pending_tokens() == 6


@pytest.mark.python_sources
def test_iterations_start_where_the_speculative_schedule_says():
    """Every step accepts 2 drafts: iteration i starts at clock 3i - 2 and ends at 3i. A jump's
    further iterations (``advance``) and a step begun before the last one ended both read the
    schedule, not the previous clock plus one."""
    from sim.engine.decoding import DecodeClock
    from sim.engine.speculation import AcceptanceModel, TokenSchedule

    clock = DecodeClock(
        _Pool({}), defer_growth=True, schedule=TokenSchedule(AcceptanceModel((0.0, 0.0, 1.0), "t"), 1)
    )
    clock.begin_iteration()
    assert (clock.iteration, clock.now) == (1, 1)
    clock.advance(2)
    assert (clock.iteration, clock.now) == (3, 7)
    clock.end_iteration()
    assert clock.now == 9
    clock.begin_iteration()
    clock.begin_iteration()
    assert (clock.iteration, clock.now) == (5, 13)
    assert clock.tokens_per_sequence(4, 5) == 15 - 10 + 1
