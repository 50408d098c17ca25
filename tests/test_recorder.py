"""The recorder: rows only on change, in chunks to the sink, and exact time averages."""

from __future__ import annotations

import pytest

import sim.outputs.metrics
from sim.outputs.metrics import SERIES_COLUMNS, STATE_COLUMNS, Recorder
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
