"""Experiment configuration: one YAML file, validated with clear errors (file, key path, bad value).

An experiment names a model, a GPU, a workload, engine knobs and a list of **variants** (policy +
overrides) that are replayed on the identical request stream. Knob names and defaults follow vLLM's
engine arguments where vLLM has them.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from policies.base import policy_names
from sim.costs import CostModelConfig
from workloads.config import WorkloadConfig


class ConfigError(ValueError):
    """A config that cannot be run; the message names the file, the key path and the value."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineConfig(_Strict):
    """Engine and memory knobs (vLLM names and defaults where vLLM has the knob)."""

    block_size: int = Field(16, gt=0, description="Tokens per KV block (vLLM default 16).")
    max_model_len: int | None = Field(
        None, gt=0, description="Longest request (prompt + output); default: the model's context length."
    )
    max_num_seqs: int = Field(256, gt=0, description="Most sequences in one iteration's batch.")
    max_num_batched_tokens: int = Field(8192, gt=0, description="Token budget of one iteration.")
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool | None = Field(
        None, description="vLLM's switch; `true` with policy `paged` selects the `prefix` policy."
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Fraction of GPU memory for the engine."
    )
    activation_reserve_bytes: int | None = Field(
        None, ge=0, description="Memory kept for activations; default: see sim/capacity.py."
    )
    kv_cache_memory_bytes: int | None = Field(None, gt=0, description="Set the KV pool size directly.")
    num_gpu_blocks_override: int | None = Field(
        None, gt=0, description="Set the number of KV blocks directly."
    )
    kv_cache_dtype: Literal["auto", "fp16", "bf16", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"] = (
        "auto"
    )
    tensor_parallel_size: int = Field(1, gt=0)
    swap_space: float = Field(4.0, ge=0, description="Host swap space per GPU in GiB (vLLM V0 default 4).")
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    watermark: float = Field(0.0, ge=0, lt=1, description="Pool fraction kept free at admission (V0: 0.01).")
    on_oom: Literal["queue", "fail"] = Field(
        "queue", description="A request that does not fit at admission waits (queue) or fails (fail)."
    )
    beam_divergence_prob: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Per beam group and iteration: one beam is pruned and a survivor forked.",
    )
    step_mode: Literal["skip", "single"] = Field(
        "skip", description="skip: jump over decode iterations between events; single: one at a time."
    )


class VariantConfig(_Strict):
    """One policy run on the experiment's request stream."""

    name: str
    policy: str
    options: dict[str, Any] = Field(default_factory=dict, description="Policy options, e.g. reservation.")
    engine: dict[str, Any] = Field(default_factory=dict, description="Overrides of the engine section.")
    pin_shared_prefixes: bool = Field(
        False,
        description="Warm-up: pin the workload's shared system prompts in the prefix cache before the run "
        "(never evicted; prefix policy only).",
    )

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in policy_names():
            raise ValueError(f"unknown policy {value!r}{_did_you_mean(value, policy_names())}")
        return value

    @field_validator("engine")
    @classmethod
    def _known_engine_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if key not in EngineConfig.model_fields:
                raise ValueError(
                    f"unknown engine key {key!r}{_did_you_mean(key, list(EngineConfig.model_fields))}"
                )
        return value


class OutputConfig(_Strict):
    timeseries_format: Literal["parquet", "csv"] = "parquet"
    figures: bool = True


class ExperimentConfig(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="Also the default results folder name.")
    description: str = ""
    seed: int = 0
    model: str = Field(
        description="A preset name (see `kvsim models`) or a path to a HuggingFace config.json."
    )
    gpu: str | dict[str, Any] = Field(description="A GPU preset name or custom values.")
    engine: EngineConfig = Field(default_factory=EngineConfig)  # type: ignore[arg-type]
    cost_model: CostModelConfig | str = "derated"
    workload: WorkloadConfig
    variants: list[VariantConfig] = Field(min_length=1)
    until_s: float | None = Field(None, gt=0, description="Stop the simulation at this time (seconds).")
    output: OutputConfig = Field(default_factory=OutputConfig)

    @model_validator(mode="after")
    def _unique_variant_names(self) -> ExperimentConfig:
        names = [variant.name for variant in self.variants]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"variant names must be unique; repeated: {', '.join(duplicates)}")
        return self

    def engine_for(self, variant: VariantConfig) -> EngineConfig:
        return EngineConfig.model_validate(self.engine.model_dump() | variant.engine)


# --------------------------------------------------------------------------------------------------
# Loading, overrides and readable errors
# --------------------------------------------------------------------------------------------------


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read, override (``key.path=value``) and validate an experiment YAML."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} malformed YAML: {getattr(error, 'problem', error)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
    for override in overrides or []:
        apply_override(data, override, path)
    return validate_experiment(data, path)


def validate_experiment(data: dict[str, Any], path: str | Path = "<config>") -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, path, data)) from None


def apply_override(data: dict[str, Any], override: str, path: str | Path) -> None:
    """``engine.block_size=32`` or ``variants.0.policy=paged``; the value is parsed as YAML."""
    key_path, sep, raw_value = override.partition("=")
    if not sep or not key_path:
        raise ConfigError(f"--set {override!r}: expected KEY.PATH=VALUE")
    keys = key_path.split(".")
    node: Any = data
    for key in keys[:-1]:
        node = node[_list_index(key, override)] if isinstance(node, list) else node.setdefault(key, {})
    value = yaml.safe_load(raw_value)
    last = keys[-1]
    if isinstance(node, list):
        node[_list_index(last, override)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(f"{path}: --set {override!r}: {'.'.join(keys[:-1])} is not a mapping")


def _list_index(key: str, override: str) -> int:
    if not key.isdigit():
        raise ConfigError(f"--set {override!r}: {key!r} must be a list index")
    return int(key)


def format_validation_error(error: ValidationError, path: str | Path, data: Any) -> str:
    lines = [f"{path}: invalid experiment config ({error.error_count()} problem(s))"]
    for problem in error.errors():
        location = _data_path(
            problem["loc"], data, keep_last=problem["type"] in ("extra_forbidden", "missing")
        )
        key_path = ".".join(str(part) for part in location) or "(top level)"
        message = problem["msg"]
        if problem["type"] == "extra_forbidden":
            known = _known_keys_at(data, location[:-1])
            message = f"unknown key{_did_you_mean(str(location[-1]), known)}"
        elif problem["type"] == "missing":
            message = "required key is missing"
        value = problem.get("input")
        shown = "" if problem["type"] == "missing" or isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"  {key_path}: {message}{shown}")
    return "\n".join(lines)


def _data_path(loc: tuple[Any, ...], data: Any, *, keep_last: bool) -> list[Any]:
    """pydantic's error location without the union tags it inserts (``synthetic``, ``poisson``...):
    only the parts that index into the user's YAML are kept (plus the unknown or missing key)."""
    path: list[Any] = []
    node = data
    for position, part in enumerate(loc):
        indexes_node = (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        )
        if indexes_node:
            path.append(part)
            node = node[part]
        elif keep_last and position == len(loc) - 1:
            path.append(part)
    return path


def _known_keys_at(data: Any, location: list[Any]) -> list[str]:
    """Field names valid at ``location``, found by walking the models along the key path (for a
    union, the member whose fields best match the user's keys there)."""
    model: Any = ExperimentConfig
    node = data
    for part in location:
        node = node[part] if isinstance(node, dict | list) else None
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = _best_model(_models_in(field.annotation), node)
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for argument in getattr(annotation, "__args__", ()) for model in _models_in(argument)]


def _best_model(models: list[type[BaseModel]], node: Any) -> type[BaseModel] | None:
    if not models:
        return None
    keys = set(node) if isinstance(node, dict) else set()
    kind = node.get("kind") if isinstance(node, dict) else None

    def score(model: type[BaseModel]) -> tuple[int, int]:
        kind_field = model.model_fields.get("kind")
        kind_matches = kind_field is not None and kind in getattr(kind_field.annotation, "__args__", ())
        return int(kind_matches), len(keys & set(model.model_fields))

    return max(models, key=score)


def _did_you_mean(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.5)
    return (
        f"; did you mean {close[0]!r}?"
        if close
        else (f"; valid: {', '.join(sorted(candidates))}" if candidates else "")
    )
