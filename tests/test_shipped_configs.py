"""Every experiment config the project ships loads and passes the whole preflight (every variant
built and checked, the workload probed), so that an example in the README cannot rot unnoticed.
Running them is left to the tests of each feature (some take minutes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.config import load_experiment
from sim.runner import prepare_experiment

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted([*ROOT.glob("configs/*.yaml"), *ROOT.glob("configs/traces/*.yaml")])


def test_the_shipped_experiments_are_found():
    names = {path.name for path in EXPERIMENTS}
    assert {"quickstart.yaml", "cluster-mooncake-offload.yaml", "mooncake.yaml"} <= names


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda path: str(path.relative_to(ROOT / "configs")))
def test_a_shipped_experiment_passes_the_preflight(path):
    config = load_experiment(path)
    prepared = prepare_experiment(config, path)
    assert [variant.variant.name for variant in prepared.variants] == [v.name for v in config.variants]
