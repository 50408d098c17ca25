"""The generated references stay in sync with the code: the config reference with the pydantic schema,
the output column dictionary with the columns a run really writes."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim import reference
from sim.cli import main
from sim.config import validate_experiment
from sim.outputs import columns
from sim.planning import reference as plan_reference
from sim.planning.plans.spec import (
    CandidateGrid,
    ClusterCheck,
    Goodput,
    GpuChoice,
    PlanSpec,
    SearchSpec,
    SLOs,
    load_plan_spec,
)
from sim.planning.sweeps.spec import RangeAxis, SweepSpec

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "regenerate it with `make docs`"


def test_config_reference_file_is_up_to_date():
    text = (ROOT / "docs" / "config-reference.md").read_text(encoding="utf-8")
    assert text == reference.markdown(), f"docs/config-reference.md is out of date: {REGENERATE}"


def test_plan_reference_file_is_up_to_date():
    text = (ROOT / "docs" / "plan-reference.md").read_text(encoding="utf-8")
    assert text == plan_reference.markdown(), f"docs/plan-reference.md is out of date: {REGENERATE}"


def test_the_cli_prints_the_plan_reference(capsys):
    assert main(["config-reference", "--plan"]) == 0
    assert capsys.readouterr().out == plan_reference.markdown()


def test_every_plan_and_sweep_model_is_documented_with_a_valid_example_and_every_key_a_meaning():
    plan_models = [model for _, _, model in plan_reference.plan_sections()]
    sweep_models = [model for _, _, model in plan_reference.sweep_sections()]
    assert plan_models == [PlanSpec, GpuChoice, SLOs, Goodput, CandidateGrid, SearchSpec, ClusterCheck]
    assert sweep_models == [SweepSpec, RangeAxis]
    assert set(plan_models + sweep_models) == set(plan_reference.EXAMPLES)
    for model in plan_models + sweep_models:
        model.model_validate(yaml.safe_load(plan_reference.EXAMPLES[model]))
        for name, field in model.model_fields.items():
            assert plan_reference.meaning(model, name, field), f"{model.__name__}.{name} has no meaning"
    for model, name in plan_reference.MEANINGS:
        assert not model.model_fields[name].description, (
            f"{model.__name__}.{name} has a description now: drop its entry from MEANINGS"
        )


def test_the_plan_example_is_a_loadable_plan(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(plan_reference.EXAMPLES[PlanSpec])
    plan = load_plan_spec(path)
    assert [c.key for c in plan.candidates][:2] == [
        "A100-80GB / paged / block 16",
        "A100-80GB / paged / block 32",
    ]


def test_plan_reference_names_aliases_and_the_experiment_sections_it_shares():
    text = plan_reference.markdown()
    assert "| `set` | mapping | `{}` |" in text and "| `from` | number | **required** |" in text
    assert "| `engine` | mapping (an experiment's `engine`, see config-reference.md) |" in text
    assert "| `policies` | list of mapping (an experiment's `variants[]`, see config-reference.md) |" in text
    assert "\n### `axes.<key>` (a range instead of a list of values)\n" in text


def test_output_columns_file_is_up_to_date():
    text = (ROOT / "docs" / "outputs.md").read_text(encoding="utf-8")
    assert text == columns.markdown(), f"docs/outputs.md is out of date: {REGENERATE}"


def test_every_section_has_a_valid_example_and_every_key_a_meaning():
    documented = [model for _, _, model in reference.sections()]
    assert len(documented) == len(set(documented)), "a section is documented twice"
    assert set(documented) == set(reference.EXAMPLES), "every section needs exactly one example"
    for model in documented:
        example = yaml.safe_load(reference.EXAMPLES[model])
        model.model_validate(example)  # raises if the example drifted from the schema
        for name, field in model.model_fields.items():
            assert name == "kind" or field.description, f"{model.__name__}.{name} has no description"


def test_the_top_level_example_is_a_runnable_experiment():
    example = yaml.safe_load(reference.EXAMPLES[reference.ExperimentConfig])
    assert validate_experiment(example, "example").variants[1].policy == "paged"


def test_type_words_for_typical_fields():
    fields = reference.EngineConfig.model_fields
    assert reference.type_text(fields["block_size"].annotation, fields["block_size"].metadata) == "int > 0"
    assert reference.type_text(fields["preemption_mode"].annotation) == "recompute | swap"
    length = reference.wl.SyntheticWorkloadConfig.model_fields["prompt_len"].annotation
    assert reference.type_text(length) == "int or distribution or null"


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """A small run of the quickstart (no figures): what kvsim really writes."""
    out = tmp_path_factory.mktemp("columns") / "run"
    args = ["run", str(ROOT / "configs" / "quickstart.yaml"), "-q", "-o", str(out)]
    assert main([*args, "--set", "workload.num_requests=30", "--set", "output.figures=false"]) == 0
    return out


def test_summary_columns_are_exactly_the_documented_ones(written):
    assert list(pd.read_csv(written / "summary.csv").columns) == list(columns.SUMMARY)
    assert list(json.loads((written / "paged" / "summary.json").read_text())) == list(columns.SUMMARY)


def test_timeseries_columns_are_exactly_the_documented_ones(written):
    frame = pd.read_parquet(written / "paged" / "timeseries.parquet")
    assert list(frame.columns) == list(columns.TIMESERIES)
    assert frame["kv_cache_usage_perc"].between(0, 1).all(), "a 0-1 fraction, like vLLM's gauge"


def test_requests_columns_are_exactly_the_documented_ones(written):
    assert list(pd.read_parquet(written / "paged" / "requests.parquet").columns) == list(columns.REQUESTS)
