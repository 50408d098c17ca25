"""Files without ``name:`` keep working: experiment, sweep and plan files take their file's stem, as
earlier versions accepted them (issue 41)."""

from __future__ import annotations

from pathlib import Path

import yaml

from sim.config import load_experiment, name_from_file
from sim.planning.sweeps.spec import load_sweep_spec

EXPERIMENT = {
    "model": "Llama-3.1-8B",
    "gpu": "A100-80GB",
    "workload": {
        "num_requests": 5,
        "arrival": {"kind": "poisson", "rate_per_s": 1},
        "prompt_len": {"kind": "constant", "value": 100},
        "output_len": {"kind": "constant", "value": 10},
    },
    "variants": [{"name": "p", "policy": "paged"}],
}


def test_an_experiment_without_a_name_takes_its_files_stem(tmp_path: Path) -> None:
    path = tmp_path / "my run.yaml"
    path.write_text(yaml.safe_dump(EXPERIMENT))
    assert load_experiment(path).name == "my-run"
    assert load_experiment(path, ["name=given"]).name == "given"  # --set still wins


def test_a_sweep_without_a_name_takes_its_files_stem(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(EXPERIMENT | {"name": "base"}))
    path = tmp_path / "block-sizes.yaml"
    path.write_text(yaml.safe_dump({"base": "base.yaml", "axes": {"engine.block_size": [16, 32]}}))
    sweep = load_sweep_spec(path)
    assert sweep.spec.name == "block-sizes" and len(sweep.points) == 2


def test_a_stem_becomes_a_valid_folder_name() -> None:
    assert name_from_file({}, Path("_weird name!.yaml"))["name"] == "weird-name-"
    assert name_from_file({"name": "kept"}, Path("x.yaml"))["name"] == "kept"
    assert name_from_file({}, Path("___.yaml"))["name"] == "unnamed"
