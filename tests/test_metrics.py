"""The recorder's time-weighted averages and rows, fed by hand (no engine): every number below is
worked out in the comments."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pandas as pd
import pytest

from sim.outputs.metrics import (
    RECORD_FIELDS,
    STATE_COLUMNS,
    Recorder,
    RequestRecord,
    cumulative_area_at,
    requests_frame,
    without_residue,
)
from sim.outputs.sinks import MemorySink

KEYS = {
    "mean_used_frac",
    "mean_reserved_frac",
    "mean_internal_frag_frac",
    "mean_external_frag_frac",
    "mean_cached_frac",
    "mean_free_frac",
    "mean_running",
    "memory_saved_by_sharing_frac",
}


def state(used: int, running: int, sharing: tuple[int, int], cached: int = 0) -> tuple:
    """A pool of 100 slots: 5 reserved, 3 internal, 2 external, ``cached``, the rest free."""
    values = dict.fromkeys(STATE_COLUMNS, 0)
    values |= {"used_tokens": used, "reserved_tokens": 5, "internal_fragmentation_tokens": 3}
    values |= {
        "external_fragmentation_tokens": 2,
        "cached_tokens": cached,
        "free_tokens": 100 - used - 10 - cached,
    }
    values |= {"num_requests_running": running, "num_sequences_running": running}
    values |= {"physical_tokens": sharing[0], "logical_tokens": sharing[1]}
    assert set(values) == set(STATE_COLUMNS), "a misspelt column"
    return tuple(values[name] for name in STATE_COLUMNS)


def sample(recorder: Recorder, time_s: float, used: int, running: int, sharing: tuple[int, int]) -> None:
    recorder.record(time_s, state(used, running, sharing))


def test_each_state_holds_until_the_next_and_the_last_to_the_end():
    recorder = Recorder(100, MemorySink())
    sample(recorder, 0.0, 10, 1, (10, 20))
    sample(recorder, 2.0, 30, 2, (30, 40))  # the engine records after each event: a step, not a ramp
    sample(recorder, 3.0, 30, 2, (30, 40))  # nothing changed: no new row
    # Over [0, 4]: used 10 x 2 + 30 x 2 (held to the end) = 80 -> 80 / 4 / 100.
    # Free = 90 - used: 80 x 2 + 60 x 2 = 280 -> 0.7. Reserved 5, internal 3, external 2 throughout.
    # Running: 1 x 2 + 2 x 2 = 6 -> 1.5.
    # Sharing: physical 10 x 2 + 30 x 2 = 80, logical 20 x 2 + 40 x 2 = 120: 1 - 80/120.
    averages = recorder.time_averages(4.0)
    assert averages == pytest.approx(
        {
            "mean_used_frac": 0.2,
            "mean_reserved_frac": 0.05,
            "mean_internal_frag_frac": 0.03,
            "mean_external_frag_frac": 0.02,
            "mean_cached_frac": 0.0,
            "mean_free_frac": 0.7,
            "mean_running": 1.5,
            "memory_saved_by_sharing_frac": 1 - 80 / 120,
        },
        rel=1e-12,
    )
    # Up to 3.0 only: used 10 x 2 + 30 x 1 = 50 -> 50 / 3 / 100.
    assert recorder.time_averages(3.0)["mean_used_frac"] == pytest.approx(50 / 300, rel=1e-12)
    frame = recorder.frame()
    assert list(frame["time_s"]) == [0.0, 2.0]
    assert list(frame["used_tokens"]) == [10, 30]
    # vLLM's usage: 1 - (free + cached) / pool = 1 - 80/100, 1 - 60/100.
    assert list(frame["kv_cache_usage_perc"]) == pytest.approx([0.2, 0.4])
    assert recorder.peak_running == 2


def test_nothing_to_average_gives_zeros():
    empty = Recorder(100, MemorySink())
    assert empty.time_averages(5.0) == dict.fromkeys(KEYS, 0.0)
    recorder = Recorder(100, MemorySink())
    sample(recorder, 0.0, 10, 1, (10, 20))
    assert recorder.time_averages(0.0) == dict.fromkeys(KEYS, 0.0)


def test_sharing_saved_without_and_with_little_logical_memory():
    # No live sequence ever (logical 0): nothing saved, not a division by zero.
    recorder = Recorder(100, MemorySink())
    sample(recorder, 0.0, 0, 0, (0, 0))
    sample(recorder, 1.0, 0, 0, (0, 0))
    assert recorder.time_averages(1.0)["memory_saved_by_sharing_frac"] == 0.0
    # 1 logical slot for half a second, nothing physical (area 0.5 < 1): all of it saved.
    recorder = Recorder(100, MemorySink())
    sample(recorder, 0.0, 0, 0, (0, 1))
    sample(recorder, 0.5, 0, 0, (0, 1))
    assert recorder.time_averages(0.5)["memory_saved_by_sharing_frac"] == 1.0


def test_time_before_the_first_sample_counts_nothing_and_cached_counts_as_idle():
    # The first sample at 1.0 (used 10, cached 20, free 60): nothing is integrated over [0, 1);
    # [1, 2] holds these values: used 10 x 1 / 2 / 100 = 0.05; cached 20 x 1 / 2 / 100 = 0.1.
    recorder = Recorder(100, MemorySink())
    recorder.record(1.0, state(10, 1, (10, 10), cached=20))
    averages = recorder.time_averages(2.0)
    assert (averages["mean_used_frac"], averages["mean_cached_frac"]) == pytest.approx((0.05, 0.1))
    # vLLM's usage counts evictable cache as free: 1 - (60 + 20) / 100.
    assert list(recorder.frame()["kv_cache_usage_perc"]) == pytest.approx([0.2])


def test_the_series_keeps_counts_as_integers_and_times_as_floats():
    """Slot counts are written as int64 and times as float64, whatever Python numbers came in: a
    SimPy clock on whole seconds hands the recorder ints (0, 2), and a reader of
    timeseries.parquet must not see counts turned into floats or times into ints."""
    recorder = Recorder(100, MemorySink())
    sample(recorder, 0, 10, 1, (10, 20))
    sample(recorder, 2, 30, 2, (30, 40))
    frame = recorder.frame()
    assert frame["time_s"].dtype == "float64" and list(frame["time_s"]) == [0.0, 2.0]
    assert {str(frame[name].dtype) for name in STATE_COLUMNS} == {"int64"}


def _record(request_id: int, **times: float) -> RequestRecord:
    record = RequestRecord(request_id, 1.0, 40, 5, 1, 1, 5)
    for name, value in times.items():
        setattr(record, name, value)
    return record


def test_requests_frame_splits_a_disaggregated_ttft_by_hand():
    """Request 0, disaggregated: arrives at 1.0 s, admitted on the prefill replica at 1.5, its prompt
    done at 2.25, its KV crosses the link from 2.5 to 3.0, first token at 3.5 (the decode replica's
    first step), finish 4.5, 0.125 s of client overhead. Request 1, served in one place, has NaN for
    the split. Numeric columns are typed, not Python objects."""
    disaggregated = _record(
        0,
        admitted_s=1.5,
        prefill_done_s=2.25,
        transfer_start_s=2.5,
        transfer_end_s=3.0,
        first_token_s=3.5,
        finish_s=4.5,
        client_overhead_s=0.125,
    )
    local = _record(1, admitted_s=1.25, first_token_s=2.0, finish_s=3.0)
    frame = requests_frame([disaggregated, local])
    row = frame.iloc[0]
    # queue 1.5 - 1.0; prefill 2.25 - 1.5; waiting for the link 2.5 - 2.25; on it 3.0 - 2.5;
    # TTFT 3.5 - 1.0 + 0.125; E2E 4.5 - 1.0 + 0.125; TPOT (4.5 - 3.5) / (5 - 1).
    assert (row["queue_s"], row["prefill_s"], row["transfer_wait_s"], row["transfer_s"]) == (
        0.5,
        0.75,
        0.25,
        0.5,
    )
    assert (row["ttft_s"], row["e2e_s"], row["tpot_s"]) == (2.625, 3.625, 0.25)
    assert frame.iloc[1][["prefill_s", "transfer_wait_s", "transfer_s"]].isna().all()
    assert (frame.iloc[1]["queue_s"], frame.iloc[1]["ttft_s"]) == (0.25, 1.0)
    assert frame["arrival_s"].dtype == "float64" and frame["prompt_tokens"].dtype == "int64"
    assert frame["outcome"].tolist() == ["unfinished", "unfinished"]


def test_the_requests_table_reads_every_field_back_unchanged():
    """The table packs each record's numbers into one row of bytes: each field set to a value of its
    own (1, 2, 3, ... in field order, floats with a half added, an int field past 2**53, text fields
    their name), every column reads its field back unchanged, and two records keep their order."""
    record = RequestRecord(0, 0.0, 0, 0, 1, 1, 0)
    expected = []
    for number, field in enumerate(fields(RequestRecord), start=1):
        value: object = field.name if field.name in ("outcome", "reason") else number
        if getattr(field.type, "__name__", str(field.type)) == "float":
            value = number + 0.5
        if field.name == "transfer_bytes":
            value = 2**53 + number  # (exact only as an int64, not through a float)
        setattr(record, field.name, value)
        expected.append(value)
    assert tuple(field.name for field in fields(RequestRecord)) == RECORD_FIELDS
    frame = requests_frame([record, RequestRecord(7, 0.25, 3, 2, 1, 1, 2)])
    assert [frame[name].iloc[0] for name in RECORD_FIELDS] == expected
    assert frame["request_id"].tolist() == [1, 7] and frame["arrival_s"].tolist() == [2.5, 0.25]
    assert frame["outcome"].tolist() == ["outcome", "unfinished"]
    assert frame["transfer_bytes"].dtype == "int64" and frame["finish_s"].dtype == "float64"


def test_cumulative_area_between_rows_and_after_the_last():
    """Rows at 0, 2 and 4 s with cumulative areas 0, 10 and 30 and the state 5, 10, 7 held from each:
    at 1 s halfway up the first segment (5); at 3 s halfway up the second (20); at the last row its
    area (30); past it the last state held on: 30 + 7 x (6 - 4) = 44, 30 + 7 x 0.5 = 33.5."""
    series = pd.DataFrame({"time_s": [0.0, 2.0, 4.0], "area": [0.0, 10.0, 30.0], "used": [5, 10, 7]})
    at = np.array([1.0, 3.0, 4.0, 6.0, 4.5])
    assert cumulative_area_at(series, "area", "used", at).tolist() == [5.0, 20.0, 30.0, 44.0, 33.5]


def test_a_state_observed_inside_a_jump_and_back_writes_no_second_row():
    """Row A at 0 s; B observed at 1 s inside a jump (no row); A recorded again at 2 s is the last row
    written, so no row: the series has the one row, and the areas still count B's second."""
    recorder = Recorder(100, MemorySink())
    a, b = state(10, 1, (10, 10)), state(20, 1, (20, 20))
    recorder.record(0.0, a)
    recorder.observe(1.0, b)
    recorder.record(2.0, a)
    assert list(recorder.frame()["time_s"]) == [0.0]
    # used: 10 x 1 + 20 x 1 + 10 x 1 over [0, 3] = 40 -> 40 / 3 / 100
    assert recorder.time_averages(3.0)["mean_used_frac"] == pytest.approx(40 / 300, rel=1e-12)


def test_peak_running_of_a_run_that_never_ran_anything_is_zero():
    recorder = Recorder(100, MemorySink())
    sample(recorder, 0.0, 0, 0, (0, 0))
    assert recorder.peak_running == 0


def test_only_a_float_residue_is_taken_for_zero():
    """|share| under 1e-12 is the residue of summing areas (a category never held); 1e-12 itself and a
    real negative share are kept."""
    assert without_residue(-1e-17) == 0.0 and without_residue(3e-13) == 0.0
    assert without_residue(1e-12) == 1e-12 and without_residue(-0.25) == -0.25


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_a_run_that_booked_no_request_still_writes_its_requests_table(tmp_path, fmt) -> None:
    """A sink closed before any request was booked (a run stopped before the first arrival) writes
    the requests table with its columns and no row, so that reading it back works like any other."""
    from sim.outputs.sinks import FileSink, read_requests

    sink = FileSink(tmp_path, fmt)
    sink.close()
    table = read_requests(tmp_path / f"requests.{fmt}")
    assert len(table) == 0
    assert list(table.columns) == list(requests_frame([]).columns)
    assert "ttft_s" in table.columns and "transfer_s" in table.columns
