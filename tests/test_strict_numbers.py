"""Booleans never pass as numbers (pydantic's lax mode would read ``true`` as 1): every config model
builds on ``workloads.config_base.ConfigModel``; numeric strings stay accepted, as they always were."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from pydantic import BaseModel

from sim.config import ConfigError, load_experiment
from tests.test_up_front_checks import config_file
from workloads.config_base import ConfigModel, boolean_as_number


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"engine.block_size": True}, "engine: block_size: true: a boolean where a number is expected"),
        ({"engine.max_num_seqs": True}, "engine: max_num_seqs: true: a boolean where a number is expected"),
        ({"workload.output_len": False}, "workload: output_len: false: a boolean"),
        ({"workload.arrival.rate_per_s": True}, "rate_per_s: true: a boolean"),
        (
            {"variants.1.engine": {"max_num_batched_tokens": False}},
            "max_num_batched_tokens: false: a boolean",
        ),
        ({"engine.gpu_memory_utilization": True}, "gpu_memory_utilization: true: a boolean"),
    ],
)
def test_a_boolean_for_a_number_is_refused_naming_the_key(tmp_path, changes, message):
    with pytest.raises(ConfigError, match=message):
        load_experiment(config_file(tmp_path, changes))


def test_two_booleans_in_one_section_are_named_together(tmp_path):
    path = config_file(tmp_path, {"engine.block_size": True, "engine.max_num_seqs": False})
    with pytest.raises(ConfigError, match="block_size: true; max_num_seqs: false: a boolean"):
        load_experiment(path)


def test_booleans_where_booleans_belong_and_numeric_strings_still_load(tmp_path):
    path = config_file(
        tmp_path,
        {"engine.enable_chunked_prefill": False, "engine.max_num_seqs": "200", "workload.num_requests": "12"},
    )
    config = load_experiment(path)
    assert config.engine.max_num_seqs == 200 and config.engine.enable_chunked_prefill is False


def test_every_config_model_carries_the_rule():
    """A new config model that forgets the base would let ``true`` through again."""
    import sim.config
    import sim.costs.core
    import sim.offload
    import sim.planning.schema
    import sim.replay.spec
    import sim.validation.claims
    import workloads.config

    modules = [sim.config, sim.costs.core, sim.offload, sim.planning.schema, sim.replay.spec]
    modules += [sim.validation.claims, workloads.config]
    models = [
        member
        for module in modules
        for member in vars(module).values()
        if isinstance(member, type) and issubclass(member, BaseModel) and member.__module__ == module.__name__
    ]
    assert len(models) > 20
    assert [model.__name__ for model in models if not issubclass(model, ConfigModel)] == []


class _Example(ConfigModel):
    count: int = 1
    share: float | None = None
    switch: bool = False
    either: bool | int = 0
    mode: Literal["auto"] | float = "auto"
    flag_or_number: Literal[False] | int = False
    shares: list[float] = []
    limits: dict[str, int] = {}
    anything: Any = None
    label: str = ""


@pytest.mark.parametrize(
    ("field", "value", "refused"),
    [
        ("count", True, True),
        ("share", False, True),
        ("switch", True, False),
        ("either", True, False),
        ("mode", True, True),
        ("flag_or_number", False, False),
        ("shares", [0.5, True], True),
        ("limits", {"a": 1, "b": False}, True),
        ("shares", [0.5, 1], False),
        ("anything", True, False),
        ("label", True, False),  # not a number: pydantic's own str check refuses it
        ("count", "3", False),
    ],
)
def test_the_rule_by_field_type(field, value, refused):
    assert boolean_as_number(value, _Example.model_fields[field].annotation) is refused


# ------------------------------------------------------------------------------------------------
# One line per problem: a union's other members say nothing about a mapping meant for one of them
# ------------------------------------------------------------------------------------------------


def _problem_lines(error: ConfigError) -> list[str]:
    return [line.strip() for line in str(error).splitlines()[1:] if not line.strip().startswith("(")]


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        (
            {"workload.prompt_len": {"kind": "uniform", "low": 500, "high": 100}},
            "workload.prompt_len: low=500.0 is above high=100.0",
        ),
        (
            {"workload.prompt_len": {"kind": "lognormal", "median": float("nan"), "sigma": 1}},
            "workload.prompt_len.median: Input should be a finite number (got nan)",
        ),
        (
            {"variants.1.offload": {"host_memory_gib": 0}},
            "variants.1.offload.host_memory_gib: Input should be greater than 0 (got 0)",
        ),
        (
            {"variants.1.offload": {"host_memory_gib": 8, "write_policy": "sometimes"}},
            "variants.1.offload.write_policy: Input should be 'write_through', 'write_through_selective' or "
            "'write_back' (got 'sometimes')",
        ),
    ],
)
def test_a_problem_is_one_line_without_the_unions_other_members(tmp_path, changes, line):
    with pytest.raises(ConfigError) as caught:
        load_experiment(config_file(tmp_path, changes))
    assert _problem_lines(caught.value) == [line]
    assert "(1 problem(s))" in str(caught.value)


def test_a_scalar_given_for_a_distribution_keeps_its_line(tmp_path):
    """Only a mapping or list is judged by the member it was meant for: `prompt_len: abc` still says
    what a number would have needed."""
    with pytest.raises(ConfigError) as caught:
        load_experiment(config_file(tmp_path, {"workload.prompt_len": "abc"}))
    assert any("valid integer" in line or "valid number" in line for line in _problem_lines(caught.value))
