"""Every experiment config the project ships loads and passes the whole preflight (every variant
built and checked, the workload probed), so that an example in the README cannot rot unnoticed.
Running them is left to the tests of each feature (some take minutes)."""

from __future__ import annotations

import re
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


# What the configs' comments said before tensor-parallel costs were modelled (docs/modelling.md).
STALE_TP_CLAIMS = re.compile(
    r"until tensor.parallel costs|tensor.parallel costs? (is|are) not modell?ed|as one GPU doing all the work",
    re.IGNORECASE,
)


def test_no_shipped_config_says_tensor_parallel_costs_are_not_modelled():
    def comments(path: Path) -> str:  # one string, so that a claim wrapped over two lines is found
        return " ".join(
            line.split("#", 1)[1].strip() for line in path.read_text().splitlines() if "#" in line
        )

    stale = [str(path.relative_to(ROOT)) for path in sorted(ROOT.glob("configs/**/*.yaml"))]
    assert [name for name in stale if STALE_TP_CLAIMS.search(comments(ROOT / name))] == []
