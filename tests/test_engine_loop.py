"""The engine's step loop (``Engine._loop``) on its own: when it ends, when it waits, and its guard
against a loop that makes no progress. The wake-up planner is replaced by a scripted stand-in whose
``advance`` returns the durations a test chooses, so each branch of the loop is reached on purpose;
a correct planner never lets the guard fire (its own stall check comes first, tested in
tests/test_scheduler_interface.py)."""

from __future__ import annotations

import pytest

from policies import PoolSpec, make_policy
from sim.engine.core import Engine, EngineKnobs
from sim.engine.errors import EngineStalled
from tests.engine_helpers import ConstantCost, request

POOL = PoolSpec(256, 4, 64)


def one_request_engine() -> Engine:
    return Engine(
        make_policy("paged", POOL),
        ConstantCost(),
        EngineKnobs(max_model_len=64),
        iter([request(0, 0.0, 10, 2)]),
        block_size=POOL.block_size,
    )


class ScriptedWakeUps:
    """``advance`` returns the scripted durations in turn (0 once they run out) and notes the clock
    of each call; a wake-up that ran lands nothing and finishes nothing."""

    def __init__(self, engine: Engine, durations: list[float]):
        self.calls: list[float] = []
        self._engine = engine
        self._durations = list(durations)

    def advance(self) -> float:
        self.calls.append(self._engine.env.now)
        return self._durations.pop(0) if self._durations else 0.0

    @staticmethod
    def land() -> bool:
        return False

    @staticmethod
    def finish_iterations() -> bool:
        return False


class ScriptedHandoff:
    """The real hand-off, except that a notice (or a pending transfer) is reported while the wake-up
    stand-in has been called exactly ``at_call`` times."""

    def __init__(self, real, wakeups: ScriptedWakeUps, *, notice_at: int = -1, pending_at: int = -1):
        self._real = real
        self._wakeups = wakeups
        self._notice_at = notice_at
        self._pending_at = pending_at

    @property
    def notices_waiting(self) -> bool:
        return len(self._wakeups.calls) == self._notice_at

    @property
    def pending(self) -> bool:
        return len(self._wakeups.calls) == self._pending_at

    def __getattr__(self, name):
        return getattr(self._real, name)


def scripted(monkeypatch, engine: Engine, durations: list[float], **handoff) -> ScriptedWakeUps:
    wakeups = ScriptedWakeUps(engine, durations)
    monkeypatch.setattr(engine.wakeup, "advance", wakeups.advance)
    monkeypatch.setattr(engine.wakeup, "land", wakeups.land)
    monkeypatch.setattr(engine.wakeup, "finish_iterations", wakeups.finish_iterations)
    if handoff:
        engine.handoff = ScriptedHandoff(engine.handoff, wakeups, **handoff)
    return wakeups


@pytest.mark.python_sources
def test_four_wake_ups_in_a_row_that_schedule_nothing_stop_the_run(monkeypatch):
    """One request waits and nothing runs: the loop tries four times at t=0 (no time passes between
    the tries), then stops with the counts of running and waiting requests."""
    engine = one_request_engine()
    wakeups = scripted(monkeypatch, engine, [])
    with pytest.raises(
        EngineStalled, match=r"^at t=0\.000000s no iteration can be scheduled: 0 running, 1 waiting$"
    ):
        engine.run()
    assert wakeups.calls == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.python_sources
def test_a_wake_up_that_runs_restarts_the_count_of_idle_ones(monkeypatch):
    """Three idle tries at t=0, one wake-up of 1 s (the loop is busy until 0 + 1 = 1 s while it runs),
    then four idle tries at t=1: the stall is called at the eighth try, not the fifth."""
    engine = one_request_engine()
    wakeups = scripted(monkeypatch, engine, [0.0, 0.0, 0.0, 1.0])
    busy_until_mid_step = []

    def look_mid_step():
        yield engine.env.timeout(0.5)
        busy_until_mid_step.append(engine.busy_until)

    engine.env.process(look_mid_step())
    with pytest.raises(EngineStalled, match=r"^at t=1\.000000s no iteration can be scheduled"):
        engine.run()
    assert wakeups.calls == [0.0] * 4 + [1.0] * 4
    assert busy_until_mid_step == [1.0]
    assert engine.busy_until == float("inf")
    assert engine.wakeups == 1


@pytest.mark.python_sources
def test_a_transfer_notice_between_idle_tries_restarts_the_count(monkeypatch):
    """A notice comes in after the third idle try (a send finished, or a prompt landed): the next
    iteration will see it, so the count starts again and the stall is called at the seventh try."""
    engine = one_request_engine()
    wakeups = scripted(monkeypatch, engine, [], notice_at=3)
    with pytest.raises(EngineStalled, match=r"^at t=0\.000000s "):
        engine.run()
    assert wakeups.calls == [0.0] * 7


@pytest.mark.python_sources
def test_a_pending_transfer_makes_the_loop_wait_to_be_woken(monkeypatch):
    """After the third idle try blocks are held for a transfer: nothing can run until it lands, so the
    loop waits (no tries in between) until the cluster wakes it at t=2, then counts four tries anew."""
    engine = one_request_engine()
    wakeups = scripted(monkeypatch, engine, [], pending_at=3)

    def wake_at_2():
        yield engine.env.timeout(2.0)
        engine._wake_up()

    engine.env.process(wake_at_2())
    with pytest.raises(EngineStalled, match=r"^at t=2\.000000s "):
        engine.run()
    assert wakeups.calls == [0.0] * 3 + [2.0] * 4


def test_a_run_with_a_stop_that_never_fires_ends_with_the_last_request():
    """With nothing left to arrive and nothing in the system, the loop returns: a run given a stop
    event that never fires ends at the last request's end (two 1 s iterations: t=2), not with SimPy's
    "no scheduled events left" for an event that cannot come."""
    engine = one_request_engine()
    engine.run(stop=engine.env.event())
    assert engine.env.now == 2.0
    assert engine._loop_process is not None and engine._loop_process.processed
    [record] = engine.records
    assert (record.outcome, record.finish_s) == ("finished", 2.0)


def test_a_rank_of_a_lockstep_group_is_refused_event_skipping():
    """A rank's iterations last as long as the group's steps, known only as each step runs: it cannot
    jump over several at once, so step_mode skip is refused, naming the mode it needs."""
    from sim.engine.lockstep import LockstepGroup

    group = LockstepGroup.__new__(LockstepGroup)  # never used: the check comes first
    with pytest.raises(
        ValueError, match=r"^a rank of a lockstep group steps one iteration at a time \(step_mode single\)$"
    ):
        Engine(
            make_policy("paged", POOL),
            ConstantCost(),
            EngineKnobs(max_model_len=64, step_mode="skip"),
            iter([]),
            block_size=POOL.block_size,
            lockstep=group,
        )


def test_a_run_on_a_file_sink_hands_the_records_to_it_not_to_memory():
    """Given a sink, the engine writes every record to it; an in-memory sink is only the default."""
    from sim.outputs.sinks import MemorySink

    class NotingSink(MemorySink):
        pass

    sink = NotingSink()
    engine = Engine(
        make_policy("paged", POOL),
        ConstantCost(),
        EngineKnobs(max_model_len=64),
        iter([request(0, 0.0, 10, 2)]),
        block_size=POOL.block_size,
        sink=sink,
    )
    engine.run()
    assert engine.sink is sink
    assert [record.request_id for record in sink.records] == [0]


def test_the_series_starts_with_an_empty_pool_and_nothing_holding_the_queue_back():
    """The row recorded as the run starts (t=0, before any request arrives): nothing waits, nothing
    runs, and the blocker column says "none" (index 0), as at every instant the queue is empty. The
    last row is the one recorded as the engine goes idle after the last completion."""
    engine = one_request_engine()
    engine.run()
    frame = engine.recorder.frame()
    first = frame.iloc[0]
    assert first["time_s"] == 0.0
    assert (first["num_requests_waiting"], first["num_sequences_running"], first["admission_blocker"]) == (
        0,
        0,
        0,
    )
    # One row per change: the start, the admission at t=0 (the prompt's 10 slots), the second
    # iteration at t=1 (prompt + both output tokens: 12), idle at t=2; none in between at any instant.
    rows = list(zip(frame["time_s"], frame["used_tokens"], strict=True))
    assert rows == [(0.0, 0), (0.0, 10), (1.0, 12), (2.0, 0)]
    last = frame.iloc[-1]  # the engine going idle after the last completion (two 1 s iterations)
    assert (last["time_s"], last["used_tokens"], last["num_requests_running"], last["admission_blocker"]) == (
        2.0,
        0,
        0,
        0,
    )
