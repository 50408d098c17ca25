"""Workload configs: the YAML shapes validate, bad ones fail with the key at fault."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from workloads import (
    SyntheticWorkloadConfig,
    TraceError,
    TraceWorkloadConfig,
    WorkloadConfig,
    build_workload,
    parse_workload_config,
)
from workloads.config import LognormalDist, TableDist
from workloads.distributions import load_column

BRIEF_EXAMPLE = """
workload:
  num_requests: 2000
  arrival: {kind: poisson, rate_per_s: 8}
  prompt_len: {kind: lognormal, mean: 500, sigma: 0.8, min: 4, max: 4000}
  output_len: {kind: table, path: traces/etalon/sharegpt_8k_filtered_stats_llama2_tokenizer.csv, column: num_decode_tokens}
  shared_prefix: {num_prefixes: 8, prefix_len: 512, zipf_s: 1.1}
"""

EXAMPLES = {
    "closed_loop_chat": """
num_requests: 500
arrival: {kind: closed_loop, num_users: 32, think_time_s: {kind: exponential, mean: 5}, ramp_up_s: 10}
prompt_len: {kind: uniform, low: 50, high: 300}
output_len: {kind: normal, mean: 200, std: 80, min: 1, max: 1000}
shared_prefix: {num_prefixes: 4, prefix_len: {kind: choice, values: [256, 1024]}, zipf_s: 0}
multi_turn: {turns: {kind: uniform, low: 2, high: 6}, user_turn_len: 60, think_time_s: 3, max_context_len: 8192}
n: {kind: choice, values: [1, 2, 4], weights: [0.8, 0.15, 0.05]}
""",
    "few_shot_gamma": """
duration_s: 600
arrival: {kind: gamma, rate_per_s: 4, cv: 3}
prompt_len: 200
output_len: {kind: lognormal, median: 120, sigma: 0.6, max: 2048}
few_shot: {num_templates: 10, instruction_len: 80, num_shots: 5, shot_len: {kind: uniform, low: 60, high: 200}}
beam_width: 4
""",
    "azure_conv": """
source: {kind: azure, path: traces/azure/AzureLLMInferenceTrace_conv.csv}
window: {start_s: 600, end_s: 1200}
target_rate_per_s: 10
max_model_len: 4096
on_too_long: cap
""",
    "mooncake": """
source: {kind: mooncake, path: traces/mooncake/conversation_trace.jsonl}
num_requests: 2000
spread_ties: {mode: even}
time_scale: 0.5
max_model_len: 131072
on_too_long: drop
""",
    "sharegpt_poisson": """
source: {kind: length_table, path: traces/etalon/sharegpt_8k_filtered_stats_llama2_tokenizer.csv, order: shuffle}
arrival: {kind: poisson, rate_per_s: 5}
num_requests: 1000
""",
    "generic_csv": """
source:
  kind: csv
  path: my_trace.csv
  arrival_column: t_ms
  arrival_unit: ms
  prompt_len_column: prompt_tokens
  output_len_column: completion_tokens
  hash_ids_column: block_hashes
  hash_block_len: 16
  session_column: chat_id
on_unsorted: sort
on_bad_row: skip
""",
    "generic_jsonl": """
source:
  kind: jsonl
  path: my_trace.jsonl
  arrival_field: created
  arrival_unit: datetime
  datetime_format: "%Y-%m-%dT%H:%M:%S"
  prompt_len_field: input_tokens
  output_len_field: output_tokens
sample_fraction: 0.25
""",
}


def test_the_brief_example_validates() -> None:
    config = parse_workload_config(yaml.safe_load(BRIEF_EXAMPLE)["workload"])
    assert isinstance(config, SyntheticWorkloadConfig)
    assert config.num_requests == 2000
    assert isinstance(config.prompt_len, LognormalDist) and config.prompt_len.max == 4000
    assert isinstance(config.output_len, TableDist) and config.output_len.column == "num_decode_tokens"
    assert config.shared_prefix is not None and config.shared_prefix.prefix_len == 512


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_validate(name: str) -> None:
    given = yaml.safe_load(EXAMPLES[name])
    config = parse_workload_config(given)
    expected = TraceWorkloadConfig if "source" in EXAMPLES[name] else SyntheticWorkloadConfig
    assert isinstance(config, expected)
    # Every value the YAML gives survives validation unchanged (nothing dropped, renamed or coerced).
    assert values_not_kept(given, config.model_dump()) == []


def values_not_kept(given: dict, validated: dict, path: str = "") -> list[str]:
    lost = []
    for key, value in given.items():
        here = validated.get(key, "<missing>")
        if isinstance(value, dict) and isinstance(here, dict):
            lost += values_not_kept(value, here, f"{path}{key}.")
        elif here != value:
            lost.append(f"{path}{key}: {value!r} -> {here!r}")
    return lost


def test_embeds_in_a_larger_model() -> None:
    class Experiment(BaseModel):
        seed: int
        workload: WorkloadConfig

    experiment = Experiment.model_validate({"seed": 3, **yaml.safe_load(BRIEF_EXAMPLE)})
    assert isinstance(experiment.workload, SyntheticWorkloadConfig)
    with pytest.raises(ValidationError, match="workload"):
        Experiment.model_validate({"seed": 3, "workload": {"source": {"kind": "nope", "path": "x"}}})


def _error(data: dict) -> str:
    with pytest.raises(ValidationError) as info:
        parse_workload_config(data)
    return str(info.value)


BASE = {
    "num_requests": 10,
    "arrival": {"kind": "poisson", "rate_per_s": 1},
    "prompt_len": 10,
    "output_len": 10,
}


def test_unknown_keys_are_rejected() -> None:
    assert "rate" in _error({**BASE, "arrival": {"kind": "poisson", "rate": 1}})
    assert "prompt_length" in _error({**BASE, "prompt_length": 3})
    assert "colum" in _error({"source": {"kind": "azure", "path": "x", "colum": 1}})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"arrival": {"kind": "gamma", "rate_per_s": 1}}, "exactly one of `cv` or `burstiness`"),
        ({"arrival": {"kind": "gamma", "rate_per_s": 1, "cv": 2, "burstiness": 1}}, "exactly one"),
        ({"prompt_len": {"kind": "lognormal", "sigma": 1}}, "exactly one of `mean` or `median`"),
        ({"prompt_len": {"kind": "uniform", "low": 5, "high": 1}}, "low=5.0 is above high=1.0"),
        (
            {"prompt_len": {"kind": "normal", "mean": 5, "std": 1, "min": 9, "max": 3}},
            "min=9.0 is above max=3.0",
        ),
        ({"prompt_len": 2.5}, "prompt_len"),
        ({"num_requests": None}, "must end"),
        ({"arrival": {"kind": "poisson", "rate_per_s": -1}}, "rate_per_s"),
        ({"shared_prefix": {"num_prefixes": 0, "prefix_len": 5}}, "num_prefixes"),
        (
            {"few_shot": {"num_templates": 2, "num_shots": 5, "shot_len": 9, "example_pool_size": 3}},
            "below num_shots",
        ),
    ],
)
def test_bad_synthetic_configs(change: dict, message: str) -> None:
    assert message in _error({**BASE, **change})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"source": {"kind": "length_table", "path": "x"}}, "has no arrival times"),
        (
            {
                "source": {"kind": "length_table", "path": "x", "order": "sample"},
                "arrival": {"kind": "batch"},
            },
            "never runs out",
        ),
        ({"source": {"kind": "azure", "path": "x"}, "time_scale": 2, "target_rate_per_s": 3}, "not both"),
        (
            {
                "source": {"kind": "azure", "path": "x"},
                "arrival": {"kind": "poisson", "rate_per_s": 1},
                "window": {},
            },
            "transform trace timestamps",
        ),
        ({"source": {"kind": "azure", "path": "x"}, "window": {"start_s": 5, "end_s": 5}}, "not after"),
        ({"source": {"kind": "azure", "path": "x"}, "on_too_long": "drop"}, "needs `max_model_len`"),
        (
            {
                "source": {
                    "kind": "csv",
                    "path": "x",
                    "prompt_len_column": "a",
                    "output_len_column": "b",
                    "hash_ids_column": "h",
                }
            },
            "hash_block_len",
        ),
        (
            {"source": {"kind": "azure", "path": "x"}, "arrival": {"kind": "closed_loop", "num_users": 2}},
            "closed_loop",
        ),
        ({"source": {"kind": "azure", "path": "x"}, "sample_fraction": 0}, "sample_fraction"),
    ],
)
def test_bad_trace_configs(data: dict, message: str) -> None:
    assert message in _error(data)


def test_relative_paths_resolve_next_to_the_yaml_then_from_the_project_root(tmp_path: Path) -> None:
    (tmp_path / "lens.csv").write_text("p,o\n5,7\n")
    config = {
        **BASE,
        "output_len": {"kind": "table", "path": "lens.csv", "column": "o"},
        "prompt_len": {
            "kind": "table",
            "path": "traces/etalon/bwb_stats_llama2_tokenizer_filtered_v2.csv",
            "column": "num_prefill_tokens",
        },
    }
    workload = build_workload(config, seed=0, base_dir=tmp_path)
    assert {request.output_len for request in workload.requests()} == {7}
    with pytest.raises(
        TraceError, match=r"file not found \(named by workload.output_len.path\) \(tried .*missing\.csv"
    ):
        build_workload(
            {**BASE, "output_len": {"kind": "table", "path": "missing.csv", "column": "o"}},
            seed=0,
            base_dir=tmp_path,
        )
    with pytest.raises(TraceError, match="no column 'oo'; columns found: p, o"):
        build_workload(
            {**BASE, "output_len": {"kind": "table", "path": "lens.csv", "column": "oo"}},
            seed=0,
            base_dir=tmp_path,
        )


def test_table_with_bad_values_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "lens.csv").write_text("o\n5\n-3\n")
    with pytest.raises(TraceError, match=r"lens.csv:3: .*'-3' is not a non-negative integer"):
        build_workload(
            {**BASE, "output_len": {"kind": "table", "path": "lens.csv", "column": "o"}},
            seed=0,
            base_dir=tmp_path,
        )


@pytest.mark.parametrize(
    ("cells", "quoted", "line"),
    [("1,5\n2,", "''", 3), ("1,5\n2,7.5", "'7.5'", 3), ("1,5\n2,abc", "'abc'", 3), ("1,-1\n2,5", "'-1'", 2)],
)
def test_length_column_errors_quote_the_cell_as_written(tmp_path: Path, cells, quoted, line) -> None:
    """A clean numeric column is read by the fast numeric parser; any bad cell falls back to the
    text read, so the error quotes it as the file has it (a blank, not 'nan')."""
    (tmp_path / "lens.csv").write_text(f"p,o\n{cells}\n")
    with pytest.raises(TraceError, match=rf"lens.csv:{line}: .*value {quoted} is not a non-negative integer"):
        load_column("lens.csv", "o", tmp_path, "output_len")


def test_length_column_is_read_once_per_file_content(tmp_path: Path) -> None:
    """A plan builds the same workload for every probe: the column is parsed once while the file's
    bytes stay the same (the same array comes back), and again as soon as they change (even with
    the same size and time). (Seen through what comes back, not by counting calls of the parser: the
    compiled build calls it directly, past any stand-in a test puts in the module.)"""
    import workloads.distributions as distributions

    distributions.forget_parsed_columns()
    path = tmp_path / "lens.csv"
    path.write_text("o\n5\n12.0\n")
    first = load_column("lens.csv", "o", tmp_path, "output_len")
    again = load_column("lens.csv", "o", tmp_path, "output_len")
    assert first.tolist() == [5, 12] and again is first
    with pytest.raises(ValueError, match="read-only"):
        first[0] = 7  # shared between callers: nobody may change it
    path.write_text("o\n6\n12.0\n")  # same size
    changed = load_column("lens.csv", "o", tmp_path, "output_len")
    assert changed.tolist() == [6, 12] and changed is not first
    assert load_column("lens.csv", "o", tmp_path, "output_len") is changed


def test_a_count_of_distinct_prompts_past_a_million_is_refused_naming_its_key():
    """Found by tests/fuzz_bad_input.py: ``num_prefixes: 9223372036854775808`` (2**63) raised Python's
    OverflowError while the workload was built. Distinct prompts, templates, examples and users are
    built up front, so more than a million of them is refused by the config check."""
    from sim.config import ConfigError, validate_experiment

    config = {
        "name": "x",
        "model": "Llama-3.1-8B",
        "gpu": "H100-80GB",
        "workload": {**BASE, "shared_prefix": {"num_prefixes": 2**63, "prefix_len": 16}},
        "variants": [{"name": "paged", "policy": "paged"}],
    }
    with pytest.raises(
        ConfigError,
        match=r"workload.shared_prefix.num_prefixes: Input should be less than or equal to 1000000",
    ):
        validate_experiment(config)
