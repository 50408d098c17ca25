"""The recorder's time-weighted averages and rows, fed by hand (no engine): every number below is
worked out in the comments."""

from __future__ import annotations

import pytest

from policies.base import MemoryBreakdown
from sim.metrics import Counters, Recorder
from sim.outputs import MemorySink

STATS = {"cow_copies": 0, "prefix_cache_queries": 0, "prefix_cache_hits": 0, "evictions": 0}
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


def sample(recorder: Recorder, time_s: float, used: int, running: int, sharing: tuple[int, int]) -> None:
    # Pool of 100 slots: 5 reserved, 3 internal, 2 external, 0 cached, the rest free.
    breakdown = MemoryBreakdown(used, 5, 3, 2, 0, 100 - used - 10)
    recorder.sample(time_s, breakdown, running, 0, running, Counters(), STATS, sharing)


def test_trapezoid_between_samples_and_the_last_value_held_to_the_end():
    recorder = Recorder(100, MemorySink())
    sample(recorder, 0.0, 10, 1, (10, 20))
    sample(recorder, 2.0, 30, 2, (30, 40))  # used grew linearly from 10 to 30 over [0, 2]
    sample(recorder, 3.0, 30, 2, (30, 40))  # nothing changed: no new row
    # Over [0, 4]: used (10 + 30) / 2 x 2 + 30 x 1 + 30 x 1 (held to the end) = 100 -> 100 / 4 / 100.
    # Free = 90 - used: (80 + 60) / 2 x 2 + 60 + 60 = 260 -> 0.65. Reserved 5, internal 3,
    # external 2 throughout. Running: (1 + 2) / 2 x 2 + 2 + 2 = 7 -> 1.75.
    # Sharing: physical (10 + 30) + 30 + 30 = 100, logical (20 + 40) + 40 + 40 = 140: 1 - 100/140.
    averages = recorder.time_averages(4.0)
    assert averages == pytest.approx(
        {
            "mean_used_frac": 0.25,
            "mean_reserved_frac": 0.05,
            "mean_internal_frag_frac": 0.03,
            "mean_external_frag_frac": 0.02,
            "mean_cached_frac": 0.0,
            "mean_free_frac": 0.65,
            "mean_running": 1.75,
            "memory_saved_by_sharing_frac": 1 - 100 / 140,
        },
        rel=1e-12,
    )
    # Up to the last sample only: [0, 3]: used 40 + 30 = 70 -> 70 / 3 / 100.
    assert recorder.time_averages(3.0)["mean_used_frac"] == pytest.approx(70 / 300, rel=1e-12)
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
    breakdown = MemoryBreakdown(10, 5, 3, 2, 20, 60)
    recorder.sample(1.0, breakdown, 1, 0, 1, Counters(), STATS, (10, 10))
    averages = recorder.time_averages(2.0)
    assert (averages["mean_used_frac"], averages["mean_cached_frac"]) == pytest.approx((0.05, 0.1))
    # vLLM's usage counts evictable cache as free: 1 - (60 + 20) / 100.
    assert list(recorder.frame()["kv_cache_usage_perc"]) == pytest.approx([0.2])
