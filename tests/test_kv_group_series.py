"""A hybrid allocator's memory split by KV group: the series' time integrals by hand, and on real
runs the split accounting for the whole pool at every instant and on average, in both step modes."""

from __future__ import annotations

import pandas as pd
import pytest

from sim.outputs import columns
from sim.outputs.group_series import GroupSeries
from sim.results import load_results, write_run_files
from tests.test_hybrid_runs import BREAKDOWN, config, run


def breakdown(used=0, reserved=0, internal=0, external=0, cached=0, free=0) -> list[int]:
    return [used, reserved, internal, external, cached, free]


def test_areas_by_hand():
    # Two groups and a shared pool's free blocks; group "a" holds tokens, a Mamba-like "b" does not.
    series = GroupSeries(("a", "b", "pool"), (True, False, False))
    series.record(0.0, breakdown(10, 5) + breakdown(4) + breakdown(free=81))
    series.observe(2.0, breakdown(12, 3) + breakdown(4) + breakdown(free=81))  # inside a jump: no row
    series.add_token_area(3.0)  # 3 token-seconds decoded in the jump: a's reserved slots, not b's
    series.record(4.0, breakdown(20, 0, 1) + breakdown(4) + breakdown(free=75))
    series.record(4.5, breakdown(20, 0, 1) + breakdown(4) + breakdown(free=75))  # unchanged: no row
    means = series.time_averages(5.0, 100)
    # a used: 10 x 2 + 12 x 2 + 3 + 20 x 1 = 67 slot-seconds over 5 s of a 100-slot pool
    assert means["a"]["used"] == pytest.approx(0.134, abs=1e-15)
    assert means["a"]["reserved"] == pytest.approx(0.026, abs=1e-15)  # 5 x 2 + 3 x 2 - 3
    assert means["a"]["internal_fragmentation"] == pytest.approx(0.002, abs=1e-15)
    assert means["b"]["used"] == pytest.approx(0.04, abs=1e-15)
    assert means["b"]["reserved"] == 0.0
    assert means["pool"]["free"] == pytest.approx(0.798, abs=1e-15)  # 81 x 4 + 75 x 1
    # every slot-second of the pool is somewhere: 67 + 13 + 1 + 20 + 399 = 500
    assert sum(sum(entry.values()) for entry in means.values()) == pytest.approx(1.0, abs=1e-15)
    frame = series.frame()
    assert list(frame["time_s"]) == [0.0] * 3 + [4.0] * 3
    assert list(frame["kv_group"]) == ["a", "b", "pool"] * 2
    assert list(frame.loc[3, BREAKDOWN]) == [20, 0, 1, 0, 0, 0]
    assert frame["time_s"].dtype == "float64" and pd.api.types.is_string_dtype(frame["kv_group"])
    assert [str(frame[column].dtype) for column in BREAKDOWN] == ["int64"] * len(BREAKDOWN)


def test_mismatched_flags_refused():
    with pytest.raises(ValueError, match="2 entry names for 1 token flags"):
        GroupSeries(("a", "b"), (True,))


SGLANG = {"name": "sglang", "policy": "sglang-hybrid"}
HYBRID = {"name": "hybrid", "policy": "vllm-hybrid"}


@pytest.mark.parametrize("step_mode", ["skip", "single"])
def test_the_split_accounts_for_the_whole_pool(tmp_path, step_mode):
    results = run(
        config("gpt-oss-20b", [HYBRID, SGLANG, {"name": "paged", "policy": "paged"}], step_mode=step_mode),
        tmp_path,
    )
    assert results["paged"].summary["kv_group_means"] is None
    assert results["paged"].kv_group_timeseries is None
    write_run_files(tmp_path / "out", {}, list(results.values()))
    loaded = load_results(tmp_path / "out")
    assert [loaded.has_kv_groups(name) for name in ("hybrid", "sglang", "paged")] == [True, True, False]
    for name in ("hybrid", "sglang"):
        summary = results[name].summary
        means = summary["kv_group_means"]
        groups = {
            "hybrid": ["sliding(128)", "full", "shared pool"],
            "sglang": ["full", "sliding(128)", "shared pool (full)", "shared pool (sliding(128))"],
        }[name]
        assert list(means) == groups
        # per category, the groups' time-averaged shares add up to the pool-wide share
        for category in ("used", "reserved", "internal_fragmentation", "cached", "free"):
            key = f"mean_{category.replace('fragmentation', 'frag')}_frac"
            assert sum(entry[category] for entry in means.values()) == pytest.approx(summary[key], abs=1e-12)
        # and at every instant the groups' rows add up to the pool-wide state in force then (a row
        # may move slots between groups and leave the pool-wide breakdown as it was: no pool row)
        groups_series = loaded.kv_group_timeseries(name)
        assert groups_series.equals(results[name].kv_group_timeseries)
        pool_series = loaded.timeseries(name)
        summed = groups_series.groupby(groups_series.index // len(groups)).agg(
            {"time_s": "first", **{column: "sum" for column in BREAKDOWN}}
        )
        last_summed = summed.groupby("time_s")[BREAKDOWN].last()
        last_pool = pool_series.groupby("time_s")[BREAKDOWN].last()
        assert set(last_pool.index) <= set(last_summed.index)
        in_force = last_pool.reindex(last_summed.index, method="ffill")
        assert (last_summed.to_numpy() == in_force.to_numpy()).all()
        # the sliding window's group holds far less than the full-attention group
        full, sliding = means["full"]["used"], means["sliding(128)"]["used"]
        assert 0 < sliding < full / 5
    assert list(loaded.kv_group_timeseries("hybrid").columns) == list(columns.KV_GROUPS)
    if step_mode == "skip":  # the figure is drawn from the folder, one panel per hybrid variant
        from sim.figures import write_figures

        drawn = write_figures(loaded, tmp_path / "figures")
        assert tmp_path / "figures" / "kv_groups.png" in drawn
        assert (tmp_path / "figures" / "kv_groups.png").stat().st_size > 10_000
    assert not (tmp_path / "out" / "paged" / "kv_groups.parquet").exists()


def test_step_modes_agree_on_the_split(tmp_path):
    means = {}
    for step_mode in ("skip", "single"):
        out = tmp_path / step_mode
        out.mkdir()
        means[step_mode] = run(config("gpt-oss-20b", [HYBRID], step_mode=step_mode), out)["hybrid"].summary[
            "kv_group_means"
        ]
    for group, categories in means["skip"].items():
        for category, share in categories.items():
            assert share == pytest.approx(means["single"][group][category], rel=1e-9, abs=1e-12), (
                group,
                category,
            )


class _FakeKV:
    """Three entries: a group whose token fills one slot, a Mamba-like one (no token slots) and a
    Jenga-like one whose token fills three small-page slots; each (used, reserved, ...) by hand."""

    slots_per_token = 4
    groups = ("full", "mamba", "jenga-sliding")  # several: the observer records the split by group

    def group_entries(self):
        return ("full", "mamba", "jenga-sliding"), (True, 0, 3)

    def group_breakdown_values(self):
        return [10, 20, 0, 0, 0, 70, 5, 0, 0, 0, 0, 95, 30, 60, 0, 0, 0, 10]  # a new list, as a coordinator's

    def sharing_slots(self):
        return 7, 9

    def sharing_slots_of(self, breakdown):
        return self.sharing_slots()


class _FakeClock:
    def __init__(self, pending: int):
        self.pending = pending

    def pending_tokens(self) -> int:
        return self.pending


@pytest.mark.python_sources  # hands the observer stand-ins for the coordinator and the clock
def test_pending_tokens_move_from_reserved_to_used_by_each_groups_slots_per_token():
    # 2 decoded tokens the policies have not been told of: 2 slots move in the full group, none in
    # the Mamba-like one, 2 x 3 in the Jenga-like one; nothing moves when none is pending.
    from sim.engine.observe import StateObserver

    observer = StateObserver(_FakeKV(), _FakeClock(2), counters=None)
    assert observer.observe(0)[1] == [12, 18, 0, 0, 0, 70, 5, 0, 0, 0, 0, 95, 36, 54, 0, 0, 0, 10]
    observer.clock = _FakeClock(0)
    assert observer.observe(0)[1] == _FakeKV().group_breakdown_values()


@pytest.mark.python_sources  # hands the observer stand-ins for the coordinator and the clock
def test_one_reading_of_the_groups_gives_the_pools_totals_and_the_split():
    """The pool's breakdown is the groups' column sums (45 used, 80 reserved, 175 free), the stand-in
    has no ``breakdown_values`` to read twice; 2 pending tokens fill 4 slots each (its
    ``slots_per_token``): 8 move from reserved to used in the totals, 2 + 0 + 6 in the split."""
    from sim.engine.observe import StateObserver

    observer = StateObserver(_FakeKV(), _FakeClock(2), counters=None)
    averaged, groups = observer.observe(running=3)
    assert averaged == (53, 72, 0, 0, 0, 175, 3, 7, 9)
    assert groups == [12, 18, 0, 0, 0, 70, 5, 0, 0, 0, 0, 95, 36, 54, 0, 0, 0, 10]


def test_a_token_decoded_inside_a_jump_fills_as_many_slots_as_its_group_says():
    """Jenga's small-page groups fill several slots per token (sim/kv/jenga.py): 2 token-seconds
    decoded inside a jump move 3 x 2 = 6 slot-seconds from reserved to used in such a group, 2 in a
    group of one slot per token, none in a shared pool's free blocks. Over 1 s of a 50-slot pool with
    10 reserved slots in each group: used 0.12 and 0.04, reserved 0.08 and 0.16."""
    series = GroupSeries(("jenga small", "full", "shared pool"), (3, 1, False))
    series.observe(0.0, [0, 10, 0, 0, 0, 0] * 2 + [0, 0, 0, 0, 0, 30])
    series.add_token_area(2.0)
    means = series.time_averages(1.0, 50)
    assert (means["jenga small"]["used"], means["jenga small"]["reserved"]) == pytest.approx((0.12, 0.08))
    assert (means["full"]["used"], means["full"]["reserved"]) == pytest.approx((0.04, 0.16))
    assert means["shared pool"]["used"] == 0.0 and means["shared pool"]["free"] == pytest.approx(0.6)
