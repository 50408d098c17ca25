"""A sweep or plan point's config.yaml runs where it is: its relative file paths (a length table, a
model's config.json, a cost profile) are rewritten from the sweep/plan file's folder to the point's."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import yaml

from sim.cli import main
from sim.config import ExperimentConfig, validate_experiment
from sim.planning.plans.run import run_plan
from sim.planning.plans.spec import load_plan_spec
from sim.planning.sweeps.config_paths import file_references, relocated
from sim.planning.sweeps.run import run_sweep
from sim.planning.sweeps.spec import load_sweep_spec
from sim.reference import sections
from tests.planning_helpers import TINY_EXPERIMENT, plan_data, sweep_file, write_yaml
from workloads.config import FILE_FIELD

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = (
    ROOT / "tests" / "data" / "traces" / "etalon" / "sharegpt_8k_filtered_stats_llama2_tokenizer_head200.csv"
)
MODEL_JSON = ROOT / "tests" / "data" / "hf_configs" / "llama-3.1-8b.json"
PROFILE = ROOT / "configs" / "profiles" / "analytic-llama-3.1-8b-a100-80gb.yaml"


def _inputs(folder: Path) -> None:
    """The files the configs below name, under names the project root does not hold (so that only
    the sweep/plan file's folder can resolve them)."""
    (folder / "inputs").mkdir()
    shutil.copy(LENGTHS, folder / "inputs" / "lengths.csv")
    shutil.copy(MODEL_JSON, folder / "inputs" / "llama.json")
    shutil.copy(PROFILE, folder / "inputs" / "profile.yaml")


def _rerun_matches(point: Path, elsewhere: Path, monkeypatch) -> dict:
    """Run the point's config.yaml with ``kvsim run`` from another folder; the rerun's variant summary
    must be the point's (but for the wall-clock time), and is returned."""
    monkeypatch.chdir(elsewhere)
    assert main(["run", str(point / "config.yaml"), "-q", "-o", str(elsewhere / "rerun")]) == 0
    summary = json.loads((point / "paged" / "summary.json").read_text())
    rerun = json.loads((elsewhere / "rerun" / "paged" / "summary.json").read_text())
    timing = {"wall_s"}
    assert {k: v for k, v in rerun.items() if k not in timing} == {
        k: v for k, v in summary.items() if k not in timing
    }
    return summary


def test_a_sweep_point_config_runs_where_it_is(tmp_path, monkeypatch):
    sweep_dir, elsewhere = tmp_path / "study", tmp_path / "elsewhere"
    sweep_dir.mkdir()
    elsewhere.mkdir()
    _inputs(sweep_dir)
    experiment = copy.deepcopy(TINY_EXPERIMENT)
    experiment["model"] = "inputs/llama.json"
    del experiment["workload"]["prompt_len"], experiment["workload"]["output_len"]
    experiment["workload"]["length_pairs"] = {"path": "inputs/lengths.csv"}
    experiment["workload"]["shared_prefix"] = {"num_prefixes": 2, "prefix_len": 32}
    path = sweep_file(sweep_dir, experiment=experiment, axes={"engine.block_size": [16]})
    monkeypatch.chdir(sweep_dir)  # the sweep runs from its own folder; the point's file must not
    sweep = load_sweep_spec(path)
    run_sweep(sweep, sweep_dir / "out")
    point = sweep_dir / "out" / "points" / sweep.points[0].point_id
    written = yaml.safe_load((point / "config.yaml").read_text())
    assert written["model"] == "../../../inputs/llama.json"
    assert written["workload"]["length_pairs"]["path"] == "../../../inputs/lengths.csv"
    summary = _rerun_matches(point, elsewhere, monkeypatch)
    assert summary["requests_finished"] > 0


def test_a_plan_probe_config_runs_where_it_is(tmp_path, monkeypatch):
    plan_dir, elsewhere = tmp_path / "plans", tmp_path / "elsewhere"
    plan_dir.mkdir()
    elsewhere.mkdir()
    _inputs(plan_dir)
    data = plan_data(
        cost_model="inputs/profile.yaml",
        workload={
            "arrival": {"kind": "poisson", "rate_per_s": 1.0},
            "source": {"kind": "length_table", "path": "inputs/lengths.csv"},
            "max_model_len": 1024,
        },
        candidates={"policies": [{"name": "paged", "policy": "paged"}], "block_sizes": [16]},
        # Both probes here break the SLO early on: a probe stopped there reruns to its end (its config
        # is the whole run's), so they run to their end here, to compare.
        search={
            "start_rate_per_s": 2,
            "seeds": [1],
            "min_requests": 60,
            "max_probes": 2,
            "early_stop": False,
        },
    )
    plan = load_plan_spec(write_yaml(plan_dir / "plan.yaml", data))
    run = run_plan(plan, plan_dir / "out")
    first = run.document["probes"][0]["seeds"][0]["point_id"]
    point = plan_dir / "out" / "points" / first
    written = yaml.safe_load((point / "config.yaml").read_text())
    assert written["cost_model"] == "../../../inputs/profile.yaml"
    assert written["workload"]["source"]["path"] == "../../../inputs/lengths.csv"
    _rerun_matches(point, elsewhere, monkeypatch)


def test_relocated_rewrites_only_paths_that_name_a_file_in_the_source_folder(tmp_path):
    source, target = tmp_path / "a", tmp_path / "b" / "c"
    source.mkdir()
    (source / "t.csv").write_text("num_prefill_tokens,num_decode_tokens\n10,5\n")
    absolute = str((source / "t.csv").resolve())
    data = {
        "name": "x",
        "model": "Llama-3.1-8B",  # a preset: a name, not a path
        "gpu": "A100-80GB",
        "cost_model": {"kind": "derated", "calibration": "default"},  # a name
        "workload": {
            "num_requests": 5,
            "arrival": {"kind": "poisson", "rate_per_s": 1},
            "prompt_len": {"kind": "table", "path": "t.csv", "column": "num_prefill_tokens"},
            "output_len": {"kind": "table", "path": absolute, "column": "num_decode_tokens"},
            # resolved under the project root, from anywhere
            "n": {
                "kind": "table",
                "path": "traces/etalon/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
                "column": "num_decode_tokens",
            },
        },
        "variants": [{"name": "p", "policy": "paged"}],
    }
    config = validate_experiment(data)
    dumped = config.model_dump(mode="json")
    moved = relocated(dumped, config, source, target)
    expected = copy.deepcopy(dumped)
    expected["workload"]["prompt_len"]["path"] = "../../a/t.csv"
    assert moved == expected
    assert dumped["workload"]["prompt_len"]["path"] == "t.csv"  # the input is not changed


def test_file_references_follow_the_schema_marks():
    config = validate_experiment(
        {
            "name": "x",
            "model": "models/m.json",
            "gpu": "A100-80GB",
            "cost_model": "profiles/p.yaml",
            "workload": {
                "source": {"kind": "length_table", "path": "t.csv"},
                "arrival": {"kind": "poisson", "rate_per_s": 1},
                "num_requests": 5,
            },
            "variants": [{"name": "p", "policy": "paged"}],
        }
    )
    assert list(file_references(config)) == [
        (("model",), "models/m.json"),
        (("cost_model",), "profiles/p.yaml"),
        (("workload", "source", "path"), "t.csv"),
    ]


def test_every_file_field_of_the_experiment_schema_is_marked():
    """A new field that names a file (a ``path`` or ``profile`` key) must carry the mark, or a point's
    config.yaml would copy it verbatim."""
    marked, unmarked = set(), set()
    for _, _, model in sections():
        for name, field in model.model_fields.items():
            is_marked = isinstance(field.json_schema_extra, dict) and FILE_FIELD in field.json_schema_extra
            (marked if is_marked else unmarked).add((model.__name__, name))
    assert {entry for entry in unmarked if entry[1] in ("path", "profile", "calibration")} == set()
    assert ("ExperimentConfig", "model") in marked and ("ExperimentConfig", "cost_model") in marked
    assert ExperimentConfig.model_fields["model"].json_schema_extra == {FILE_FIELD: [".json"]}
