"""The recorder: rows only on change, in chunks to the sink, and exact time averages."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.outputs.metrics
from sim.outputs.metrics import AREA_COLUMNS, SERIES_COLUMNS, STATE_COLUMNS, Recorder
from sim.outputs.sinks import MemorySink


def state(used: int, free: int, running: int = 1, waiting: int = 0) -> tuple:
    """A pool of 100 slots: ``used`` + ``free`` + the rest reserved; sharing nothing."""
    values = dict.fromkeys(STATE_COLUMNS, 0)
    values |= {"used_tokens": used, "reserved_tokens": 100 - used - free, "free_tokens": free}
    values |= {"num_requests_running": running, "num_requests_waiting": waiting}
    values |= {"physical_tokens": 100 - free, "logical_tokens": 100 - free}
    return tuple(values[name] for name in STATE_COLUMNS)


def test_rows_only_on_change_and_exact_averages():
    recorder = Recorder(100, MemorySink())
    recorder.record(0.0, state(0, 100, running=0))
    recorder.record(1.0, state(10, 80))
    recorder.record(1.5, state(10, 80))  # unchanged: no row
    recorder.observe(2.0, state(20, 70))  # inside a jump: counted, no row
    recorder.add_token_area(3.0)  # tokens that grew during it: 3 slot-seconds from reserved to used
    recorder.record(4.0, state(40, 60, waiting=2))
    frame = recorder.frame()
    assert list(frame.columns) == [*SERIES_COLUMNS, "kv_cache_usage_perc"]
    assert frame["time_s"].tolist() == [0.0, 1.0, 4.0]
    assert frame["used_tokens"].tolist() == [0, 10, 40]
    assert frame["num_requests_waiting"].tolist() == [0, 0, 2]
    assert frame["kv_cache_usage_perc"].tolist() == pytest.approx([0.0, 0.2, 0.4])
    # used: 10 x 1 s + 20 x 2 s + 3 (token area) + 40 x 1 s = 93; reserved: 10 + 20 - 3 + 0 = 27.
    averages = recorder.time_averages(5.0)
    assert averages["mean_used_frac"] == pytest.approx(93 / 5 / 100)
    assert averages["mean_reserved_frac"] == pytest.approx(27 / 5 / 100)
    assert averages["mean_free_frac"] == pytest.approx((100 + 80 + 140 + 60) / 5 / 100)
    assert averages["mean_running"] == pytest.approx(4 / 5)
    assert recorder.peak_running == 1


def test_full_chunks_go_to_the_sink(monkeypatch):
    monkeypatch.setattr(sim.outputs.metrics, "CHUNK_ROWS", 3)
    sink = MemorySink()
    recorder = Recorder(100, sink)
    for step in range(7):
        recorder.record(float(step), state(step, 100 - step))
    assert len(sink._series) == 2  # two chunks of 3 rows handed over, one row still buffered
    assert recorder.frame()["used_tokens"].tolist() == list(range(7))


class _OneAdditionPerEvent:
    """The areas as the recorder defines them, one Python addition per event in event order: an
    observation adds the state before it times the time since; a token area moves slot-seconds
    from reserved to used. Rows take the areas at their observation."""

    def __init__(self) -> None:
        self.area = [0.0] * 6
        self.state: tuple | None = None
        self.since = 0.0
        self.row_areas: list[list[float]] = []
        self.last_row: tuple | None = None

    def observe(self, time_s: float, state: tuple) -> None:
        if self.state is not None and time_s > self.since:
            self.area = [
                value + self.state[index] * (time_s - self.since) for index, value in enumerate(self.area)
            ]
        self.state, self.since = state, time_s

    def tokens(self, slot_seconds: float) -> None:
        self.area[0] += slot_seconds
        self.area[1] -= slot_seconds


def _replay(events: list) -> tuple[Recorder, _OneAdditionPerEvent]:
    recorder = Recorder(100, MemorySink())
    reference = _OneAdditionPerEvent()
    now = 0.0
    for kind, step, used, slot_seconds in events:
        now += step
        if kind == "tokens":
            recorder.add_token_area(slot_seconds)
            reference.tokens(slot_seconds)
            continue
        current = state(used, 100 - used - 7, waiting=int(now))
        if kind == "observe":
            recorder.observe(now, current)
            reference.observe(now, current)
        elif current != reference.state:  # record(): an unchanged state is no event
            recorder.record(now, current)
            reference.observe(now, current)
            if current != reference.last_row:
                reference.last_row = current
                reference.row_areas.append(list(reference.area))
    return recorder, reference


@settings(max_examples=60, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(["record", "observe", "tokens"]),
            st.floats(0.0, 3.0, allow_nan=False),  # time step (0: same instant)
            st.integers(0, 100),  # used
            st.floats(0.001, 50.0, allow_nan=False),  # token slot-seconds
        ),
        max_size=40,
    ),
    chunk=st.integers(1, 5),
)
def test_folded_areas_equal_one_addition_per_event_bit_for_bit(events, chunk):
    """Whatever the chunk size (folds anywhere, between an observation and its row too), every
    row's areas and the final areas equal the event-by-event sums exactly, not approximately."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sim.outputs.metrics, "CHUNK_ROWS", chunk)
        recorder, reference = _replay(events)
    frame = recorder.frame()
    areas = frame[list(AREA_COLUMNS)].to_numpy().tolist() if len(frame) else []
    assert areas == reference.row_areas
    end = reference.since + 1.0
    expected = None
    if reference.state is not None:
        expected = [
            value + reference.state[index] * (end - reference.since)
            for index, value in enumerate(reference.area)
        ]
    got = recorder.areas(end)
    assert (got[:6] if got is not None else None) == expected
