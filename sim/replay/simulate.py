"""A measured run as a kvsim experiment: its requests written as a trace, its server settings as the
engine section, run by the same runner as ``kvsim run``.

The experiment is written beside its trace (``simulation/experiment.yaml`` and ``workload.jsonl``),
so ``kvsim run simulation/experiment.yaml`` reruns the replay exactly, and any knob can be tried on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from sim.config import ExperimentConfig, validate_experiment
from sim.replay.measured import MeasuredRun
from sim.replay.spec import ReplaySpec
from sim.runner import PreparedExperiment, VariantResult, prepare_experiment, run_experiment

WORKLOAD_FILE = "workload.jsonl"
EXPERIMENT_FILE = "experiment.yaml"


def engine_section(run: MeasuredRun, spec: ReplaySpec) -> dict[str, Any]:
    """The run's recorded server settings as an ``engine:`` section (what the run did not record
    stays at kvsim's defaults, which follow vLLM's), then the replay file's overrides."""
    settings = run.settings
    engine: dict[str, Any] = {
        "block_size": settings.block_size,
        "enable_chunked_prefill": settings.enable_chunked_prefill,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "data_parallel_size": settings.data_parallel_size,
        "enable_expert_parallel": settings.enable_expert_parallel,
        "kv_cache_dtype": settings.kv_cache_dtype,
        "preemption_mode": "recompute",  # vLLM V1
    }
    for key in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        value = getattr(settings, key)
        if value is not None:
            engine[key] = value
    if settings.num_gpu_blocks is not None:
        engine["num_gpu_blocks_override"] = settings.num_gpu_blocks
    if settings.async_scheduling is not None:
        engine["async_scheduling"] = settings.async_scheduling
    if run.anchor == "engine":
        engine["client_overhead_s"] = 0.0  # the data's clock is the engine's own
    return engine | spec.engine


def policy_for(run: MeasuredRun, spec: ReplaySpec) -> str:
    if spec.policy is not None:
        return spec.policy
    return "prefix" if run.settings.enable_prefix_caching else "paged"


def experiment_data(run: MeasuredRun, spec: ReplaySpec) -> dict[str, Any]:
    """The experiment config (as YAML data) that replays ``run``; its trace is :data:`WORKLOAD_FILE`."""
    model = spec.model or run.settings.model
    gpu = spec.gpu if spec.gpu is not None else run.settings.gpu
    missing = [name for name, value in (("model", model), ("gpu", gpu)) if value is None]
    if missing:
        from sim.config import ConfigError

        raise ConfigError(
            f"replay {spec.name!r}: the run's files do not say which {' and '.join(missing)} it ran on; "
            f"set {', '.join(f'`{name}:`' for name in missing)} in the replay file, or pass "
            + " ".join(f"--set {name}=..." for name in missing)
            + (" (e.g. --set gpu=H100-80GB; kvsim gpus lists them)" if "gpu" in missing else "")
        )
    source: dict[str, Any] = {
        "kind": "jsonl",
        "path": WORKLOAD_FILE,
        "arrival_field": "arrival_s",
        "prompt_len_field": "prompt_tokens",
        "output_len_field": "output_tokens",
    }
    if run.prompt_hashes is not None:
        source |= {"hash_ids_field": "hash_ids", "hash_block_len": run.hash_block_len}
    cost_model = spec.cost_model
    data: dict[str, Any] = {
        "name": spec.name,
        "description": f"replay of the measured run {run.name} ({run.source_format})",
        "model": model,
        "gpu": gpu,
        "engine": engine_section(run, spec),
        "cost_model": cost_model if isinstance(cost_model, str) else cost_model.model_dump(exclude_none=True),
        "workload": {"source": source}
        | ({"max_concurrency": run.max_concurrency} if run.max_concurrency is not None else {}),
        "variants": [{"name": "replay", "policy": policy_for(run, spec)}],
        "output": {"figures": False},
    }
    return data


def write_workload(run: MeasuredRun, path: Path) -> None:
    """The measured requests as a JSON Lines trace (arrival, lengths, prompt block chain)."""
    requests = run.requests
    arrivals = requests["arrival_s"].tolist()
    prompts = requests["prompt_tokens"].tolist()
    outputs = requests["output_tokens"].tolist()
    with path.open("w", encoding="utf-8") as handle:
        for index, (arrival, prompt, output) in enumerate(zip(arrivals, prompts, outputs, strict=True)):
            row: dict[str, Any] = {"arrival_s": arrival, "prompt_tokens": prompt, "output_tokens": output}
            if run.prompt_hashes is not None:
                row["hash_ids"] = run.prompt_hashes[index]
            handle.write(json.dumps(row) + "\n")


@dataclass
class SimulatedRun:
    """The replay's simulation: its config, its per-request table and time series (one row per
    measured request, same ``request_id``), and its summary."""

    config: ExperimentConfig
    result: VariantResult
    requests: pd.DataFrame
    timeseries: pd.DataFrame


def prepare_replay(run: MeasuredRun, spec: ReplaySpec, folder: Path) -> PreparedExperiment:
    """Write the replay's experiment and trace into ``folder`` and build it (every up-front check of
    ``kvsim run`` applies, before anything is simulated)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = experiment_data(run, spec)
    config_path = folder / EXPERIMENT_FILE
    config = validate_experiment(data, config_path)
    write_workload(run, folder / WORKLOAD_FILE)
    config_path.write_text(yaml.safe_dump(data, sort_keys=False))
    return prepare_experiment(config, config_path)


def simulate(prepared: PreparedExperiment, results_dir: Path) -> SimulatedRun:
    """Run the prepared replay; its tables stream into ``results_dir``."""
    from sim.results import write_run_files

    config = prepared.config
    results = run_experiment(
        config, prepared.base_dir / EXPERIMENT_FILE, out_dir=results_dir, prepared=prepared
    )
    write_run_files(results_dir, config.model_dump(mode="json"), results)
    result = results[0]
    requests = result.sink.requests().sort_values("request_id").reset_index(drop=True)
    return SimulatedRun(config, result, requests, result.sink.timeseries())
