"""The replay file: which measured run to replay, and what its own files do not say.

Example (``configs/replays/*.yaml``)::

    name: h100-llama-2-7b-codegen
    run:
      format: blis_csv
      path: ../../reference_runs/.../20260217-155451-llama-2-7b-tp1-codegen.csv
    gpu: H100-80GB                      # the files do not name it
    prompts: from_source                # or none, or a rule
    cost_model: derated                 # kvsim's default

Everything else (model, TP, ``max_num_seqs``, ``max_num_batched_tokens``, block size and count,
prefix caching) comes from the run's files; ``engine:`` overrides any of them (keys of an
experiment's ``engine:`` section). Errors name the file, the key and the value, before anything runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator

from sim.config import (
    ConfigError,
    EngineConfig,
    apply_overrides,
    check_slug,
    format_problems,
    name_from_file,
    yaml_mapping,
)
from sim.costs.core import CostModelConfig
from sim.replay.measured import MeasuredRun
from sim.replay.prompts import CyclingPrompts
from sim.replay.readers import (
    ReplayInputError,
    read_blis_csv,
    read_llmservingsim_bench,
    read_vllm_bench_json,
)
from workloads.config_base import ConfigModel

FORMATS = ("blis_csv", "llmservingsim_bench", "vllm_bench_json")


class _Strict(ConfigModel):
    # (Numbers are finite: an infinite one raised deep inside, or ran as NaN.)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RunSource(_Strict):
    """Where the measured run is (relative paths: against the replay file's folder)."""

    format: Literal["auto", "blis_csv", "llmservingsim_bench", "vllm_bench_json"] = Field(
        "auto",
        description="blis_csv (per-request CSV + runs.csv), llmservingsim_bench (a bench folder with "
        "vllm/meta.json), vllm_bench_json (vllm bench serve --save-detailed), or auto (from the path).",
    )
    path: str = Field(description="The run's file or folder.")
    runs_csv: str | None = Field(None, description="blis_csv: the runs table (default: runs.csv beside it).")
    run: str | None = Field(None, description="blis_csv: the row of runs.csv (default: the CSV's name).")
    workload: str | None = Field(
        None, description="llmservingsim_bench: the workload JSONL it replayed (default: meta.json's)."
    )
    arrival_seed: int = Field(
        0, ge=0, description="vllm_bench_json without start_times: seed of the regenerated arrivals."
    )


class PromptRule(_Strict):
    """Request i sends prompt i mod ``distinct``; groups of ``group_size`` share a system prompt."""

    distinct: int = Field(gt=0, description="Distinct prompts the client cycled through.")
    group_size: int = Field(gt=0, description="Consecutive prompts that share one system prompt.")
    system_prompt_tokens: int = Field(ge=0, description="Tokens of each group's system prompt.")


class ReplaySpec(_Strict):
    name: str = Field(
        description="The replay's name (a folder name: letters, digits, -, _, .; default: the file's stem)."
    )
    description: str = Field("", description="Free text, kept in the report.")
    run: RunSource = Field(description="The measured run.")
    gpu: str | dict[str, Any] | None = Field(
        None, description="GPU preset or custom values (required when the run's files do not name it)."
    )
    model: str | None = Field(None, description="Model preset or config.json (default: the run's).")
    prompts: Literal["from_source", "none"] | PromptRule = Field(
        "from_source",
        description="Prompt identity: from_source (token ids, or the source's documented rule), none "
        "(every prompt unique), or a rule {distinct, group_size, system_prompt_tokens}.",
    )
    engine: dict[str, Any] = Field(
        default_factory=dict, description="Overrides of the recorded server settings (engine: keys)."
    )
    cost_model: CostModelConfig | str = Field("derated", description="As in an experiment.")
    policy: str | None = Field(
        None, description="Allocator (default: prefix when the run had prefix caching, else paged)."
    )

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return check_slug(value, "replay name")

    @field_validator("engine")
    @classmethod
    def _engine_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = [key for key in value if key not in EngineConfig.model_fields]
        if unknown:
            raise ValueError(f"unknown engine key(s) {', '.join(unknown)}")
        return value


def load_replay_spec(path: Path, overrides: list[str] | None = None) -> ReplaySpec:
    """Read and validate a replay file (``--set key.path=value`` applied first)."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such replay file")
    data = name_from_file(yaml_mapping(path), path)
    apply_overrides(data, overrides or [])
    return validate_replay_spec(data, path)


def validate_replay_spec(data: dict[str, Any], path: Path | str) -> ReplaySpec:
    try:
        return ReplaySpec.model_validate(data)
    except ValidationError as error:
        raise ConfigError(
            format_problems(
                f"{path}: invalid replay file",
                error.errors(),
                location=lambda problem: list(problem["loc"]),
            )
        ) from None


def detect_format(path: Path) -> str:
    """The format a run's path holds, from what is there."""
    if path.is_dir():
        if (path / "vllm" / "meta.json").is_file():
            return "llmservingsim_bench"
        raise ConfigError(f"{path}: a folder, but not an LLMServingSim bench run (no vllm/meta.json)")
    if path.suffix == ".csv":
        return "blis_csv"
    if path.suffix == ".json":
        return "vllm_bench_json"
    raise ConfigError(
        f"{path}: cannot tell the run's format from its name; set run.format ({', '.join(FORMATS)})"
    )


def read_run(spec: ReplaySpec, base_dir: Path) -> MeasuredRun:
    """The measured run a replay file names, read and checked."""
    source = spec.run
    path = _resolve(source.path, base_dir, "run.path")
    kind = detect_format(path) if source.format == "auto" else source.format
    gpu = spec.gpu if isinstance(spec.gpu, str) else None
    use_prompts = spec.prompts != "none"
    try:
        if kind == "blis_csv":
            runs_csv = _resolve(source.runs_csv, base_dir, "run.runs_csv") if source.runs_csv else None
            rule: CyclingPrompts | str | None = "from_runs" if spec.prompts == "from_source" else None
            if isinstance(spec.prompts, PromptRule):
                rule = CyclingPrompts(**spec.prompts.model_dump())
            return read_blis_csv(path, runs_csv, run=source.run, gpu=gpu, prompts=rule)
        if kind == "llmservingsim_bench":
            if isinstance(spec.prompts, PromptRule):
                raise ConfigError("prompts: a rule applies to blis_csv runs; this run has token ids")
            workload = _resolve(source.workload, base_dir, "run.workload") if source.workload else None
            return read_llmservingsim_bench(path, workload=workload, gpu=gpu, use_token_ids=use_prompts)
        if isinstance(spec.prompts, PromptRule):
            raise ConfigError("prompts: vllm bench serve saves no prompts; only `none` or from_source apply")
        return read_vllm_bench_json(path, model=spec.model, gpu=gpu, arrival_seed=source.arrival_seed)
    except ReplayInputError as error:
        raise ConfigError(str(error)) from None


def _resolve(value: str, base_dir: Path, key: str) -> Path:
    candidate = Path(value).expanduser()
    full = candidate if candidate.is_absolute() else base_dir / candidate
    if not full.exists():
        shown = os.path.normpath(full)
        raise ConfigError(f"{key}: {value!r} not found (looked at {shown}){_how_to_fetch(full)}")
    return full


def _how_to_fetch(missing: Path) -> str:
    """Where a shipped replay's data is not shipped (no licence to copy it), the README beside
    where it belongs says how to fetch it: point there."""
    folder = missing.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    readme = folder / "README.md"
    if folder.is_dir() and readme.is_file():
        return f"; {os.path.normpath(readme)} says where this data comes from and how to fetch it"
    return ""
