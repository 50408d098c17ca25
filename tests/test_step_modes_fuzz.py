"""Event skipping against single stepping on whole experiments (``tests/fuzz_step_modes.py``): the
cases the fuzzer found that differed, kept as regression files, and a short fuzz run of fixed seeds.
``make fuzz-step-modes`` runs thousands more."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from tests.fuzz_step_modes import accounting_errors, differences, draw_case, run_case

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
        assert outcome != "differs", (index, notes)
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
