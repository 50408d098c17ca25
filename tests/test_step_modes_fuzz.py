"""Event skipping against single stepping on whole experiments (``tests/fuzz_step_modes.py``): the
cases the fuzzer found that differed, kept as regression files, and a short fuzz run of fixed seeds.
``make fuzz-step-modes`` runs thousands more."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from policies.base import MemoryBreakdown
from tests.fuzz_step_modes import (
    accounting_errors,
    differences,
    digest_differences,
    draw_case,
    group_accounting_errors,
    run_case,
)

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "data" / "step_modes"


@pytest.mark.parametrize("path", sorted(CASES.glob("*.yaml")), ids=lambda path: path.stem)
def test_a_case_that_once_differed_agrees_in_both_step_modes(path):
    config = yaml.safe_load(path.read_text())
    if config["model"].endswith(".json"):  # a derived model kept beside the case (from the project root)
        config["model"] = str(ROOT / config["model"])
    outcome, notes = run_case(config)
    assert (outcome, notes) == ("same", [])


def test_random_experiments_agree_in_both_step_modes(tmp_path):
    """24 experiments drawn from fixed seeds. Those the configuration checks refuse test nothing
    here; most are not refused."""
    outcomes = []
    for index in range(24):
        outcome, notes = run_case(draw_case(random.Random(f"suite-{index}"), index, tmp_path))
        assert outcome in ("same", "refused"), (index, notes)
        outcomes.append(outcome)
    assert outcomes.count("same") >= 12


class _Result:
    def __init__(self, summary, requests=None, timeseries=None):
        self.summary = summary
        self.requests = requests
        self.timeseries = timeseries


def test_the_comparison_names_what_differs():
    """The oracle itself: a summary value beyond 1e-9, a request's field, and the rows of a series
    that break the pool identity or hold other slots than the held ones are each reported."""
    import pandas as pd

    requests = pd.DataFrame(
        {
            "request_id": [0, 1],
            "outcome": ["finished", "finished"],
            "preemptions": [0, 0],
            "cached_prompt_tokens": [0, 16],
            "admitted_s": [0.0, 1.0],
            "first_token_s": [0.5, 1.5],
            "finish_s": [2.0, 3.0],
        }
    )
    later = requests.assign(finish_s=[2.0, 3.0 + 1e-6])
    single = _Result({"ttft_p50_s": 0.5, "engine_wakeups": 9, "requests_total": 2}, requests)
    skip = _Result({"ttft_p50_s": 0.5 + 1e-7, "engine_wakeups": 4, "requests_total": 2}, later)
    assert differences(single, skip) == [
        f"summary ttft_p50_s: single 0.5, skip {0.5 + 1e-7!r}",
        f"request 1 finish_s: single 3.0, skip {3.0 + 1e-6!r}",
    ]
    assert differences(single, single) == []
    series = pd.DataFrame(
        {
            "used_tokens": [10, 10],
            "reserved_tokens": [2, 2],
            "internal_fragmentation_tokens": [1, 1],
            "external_fragmentation_tokens": [0, 0],
            "cached_tokens": [0, 3],
            "free_tokens": [87, 84],
            "physical_tokens": [13, 14],
        }
    )
    assert accounting_errors(_Result({"kv_pool_tokens": 100}, timeseries=series), "skip", True) == [
        "skip: row 1 physical 14, held 13"
    ]
    assert accounting_errors(_Result({"kv_pool_tokens": 99}, timeseries=series), "skip", True) == [
        "skip: row 0 sums to 100, not the pool's 99",
        "skip: row 1 physical 14, held 13",
    ]


def test_nested_and_missing_summary_values_are_compared():
    """A KV group's time average (nested in ``kv_group_means``) and a value one run leaves empty are
    each compared, not skipped."""
    single = _Result({"kv_group_means": {"full": {"cached": 0.25}}, "ttft_p50_s": None, "wall_s": 1.0})
    skip = _Result({"kv_group_means": {"full": {"cached": 0.2501}}, "ttft_p50_s": 0.5, "wall_s": 2.0})
    import pandas as pd

    single.requests = skip.requests = pd.DataFrame({"request_id": []})
    assert differences(single, skip) == [
        "summary kv_group_means.full.cached: single 0.25, skip 0.2501",
        "summary ttft_p50_s: single None, skip 0.5",
    ]


def test_the_split_by_kv_group_is_checked_against_the_pool_and_the_series():
    """Each instant of ``kv_groups`` (one row per entry) sums to the pool; its last instant adds up,
    category by category, to the pool-wide series' last row."""
    import pandas as pd

    columns = [f"{name}_tokens" for name in MemoryBreakdown.CATEGORIES]
    rows = [  # two instants, two entries: a group and the shared pool's free blocks
        (0.0, "full", 0, 0, 0, 0, 0, 0),
        (0.0, "shared", 0, 0, 0, 0, 0, 100),
        (1.0, "full", 30, 2, 0, 0, 8, 0),
        (1.0, "shared", 0, 0, 0, 0, 0, 60),
    ]
    groups = pd.DataFrame(rows, columns=["time_s", "kv_group", *columns])
    series = pd.DataFrame([(0, 0, 0, 0, 0, 100), (30, 2, 0, 0, 8, 60)], columns=columns)
    result = _Result({}, timeseries=series)
    result.kv_group_timeseries = groups
    assert group_accounting_errors(result, "skip", 100) == []
    assert group_accounting_errors(result, "skip", 99) == [
        "skip: kv_groups instant 0 sums to 100, not the pool's 99"
    ]
    result.timeseries = series.assign(cached_tokens=[0, 7], free_tokens=[100, 61])
    assert group_accounting_errors(result, "skip", 100) == [
        "skip: kv_groups' last instant [30, 2, 0, 0, 8, 60], the series' last row [30, 2, 0, 0, 7, 61]"
    ]


def test_two_builds_digests_are_compared_exactly():
    """The compiled build against the sources: any summary value or table checksum that is not the
    same bit for bit is named, with the variant."""
    sources = {"skip": {"summary": {"ttft_p50_s": 0.5, "preemptions": 3}, "tables": {"requests": "ab12"}}}
    same = {"skip": {"summary": {"ttft_p50_s": 0.5, "preemptions": 3}, "tables": {"requests": "ab12"}}}
    assert digest_differences(sources, same) == []
    compiled = {
        "skip": {
            "summary": {"ttft_p50_s": 0.5000000000000001, "preemptions": 3},
            "tables": {"requests": "ff00"},
        }
    }
    assert digest_differences(sources, compiled) == [
        "skip summary ttft_p50_s: sources 0.5, compiled 0.5000000000000001",
        "skip tables requests: sources 'ab12', compiled 'ff00'",
    ]
    assert digest_differences(sources, {}) == ["skip: only the sources ran it"]


def test_a_case_that_differs_is_shrunk_to_what_still_differs():
    """The shrinker keeps a simplification only while the case still differs: here a case differs
    while it has a shared prefix and at least 5 requests. From 40 requests it halves to 5 (2 would
    not differ), drops every other feature, and halves the prompt and output lengths while they are
    at least 16 tokens high."""
    from tests.fuzz_step_modes import shrink

    config = {
        "cost_model": "derated",
        "until_s": 9.0,
        "engine": {"watermark": 0.02, "async_scheduling": True},
        "workload": {
            "num_requests": 40,
            "arrival": {"kind": "gamma", "rate_per_s": 3, "cv": 3.0},
            "prompt_len": {"kind": "uniform", "low": 10, "high": 100},
            "output_len": {"kind": "uniform", "low": 1, "high": 20},
            "shared_prefix": {"num_prefixes": 2},
            "multi_turn": {"turns": 2},
            "n": 2,
        },
    }
    calls = []

    def differs(candidate):
        calls.append(candidate)
        workload = candidate["workload"]
        return workload["num_requests"] >= 5 and "shared_prefix" in workload

    assert shrink(config, differs) == {
        "cost_model": "analytic",
        "engine": {"async_scheduling": False},
        "workload": {
            "num_requests": 5,
            "arrival": {"kind": "poisson", "rate_per_s": 3},
            "prompt_len": {"kind": "uniform", "low": 10, "high": 12},  # 100 -> 50 -> 25 -> 12
            "output_len": {"kind": "uniform", "low": 1, "high": 10},  # 20 -> 10
            "shared_prefix": {"num_prefixes": 2},
        },
    }
    assert config["workload"]["num_requests"] == 40  # (the case as drawn is not changed)
    assert len(calls) <= 80


def test_the_shrinker_tries_the_default_options_and_vllms_scheduler():
    """A case that differs whatever the allocator's options and the scheduler ends with neither: the
    options emptied in both variants, SGLang's scheduler and the keys only it reads gone; one whose
    difference needs SGLang's scheduler keeps it and its keys."""
    from tests.fuzz_step_modes import shrink

    options = {"reservation": "pow2", "placement": "buddy"}
    config = {
        "engine": {"scheduler": "sglang", "schedule_policy": "lpm", "chunked_prefill_size": 512},
        "workload": {"num_requests": 2},
        "variants": [{"name": "single", "options": options}, {"name": "skip", "options": options}],
    }
    assert shrink(config, lambda candidate: True) == {
        "engine": {"scheduler": "vllm", "async_scheduling": False},  # (the shrinker sets both of these)
        "cost_model": "analytic",
        "workload": {"num_requests": 2},
        "variants": [{"name": "single", "options": {}}, {"name": "skip", "options": {}}],
    }
    needs_sglang = shrink(config, lambda candidate: candidate["engine"]["scheduler"] == "sglang")
    assert needs_sglang["engine"] == config["engine"] | {"async_scheduling": False}
    assert needs_sglang["variants"][0]["options"] == {}


def test_a_run_that_raises_is_reported_not_fatal(monkeypatch, tmp_path):
    """Anything but a configuration error raised by a run is a bug of its own: the case is reported
    as crashed, with the exception, and the fuzzer goes on to the next."""
    import tests.fuzz_step_modes as fuzz

    def boom(*args, **kwargs):
        raise RuntimeError("a policy's assertion")

    monkeypatch.setattr(fuzz, "run_experiment", boom)
    config = draw_case(random.Random("suite-0"), 0, tmp_path)
    assert run_case(config) == ("crashed", ["RuntimeError: a policy's assertion"])
