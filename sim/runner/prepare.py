"""Every variant of an experiment built and checked before the first one runs; one variant's problems
and warnings gathered into one message."""

from __future__ import annotations

from pathlib import Path

from sim.config import (
    ConfigError,
    ExperimentConfig,
)
from sim.costs.core import CostModelError
from sim.hardware.gpus import GpuSpec
from sim.hardware.models import ModelSpec
from sim.runner.disaggregated import prepare_disaggregated
from sim.runner.instance import prepare_instance
from sim.runner.prepared import PreparedExperiment, PreparedVariant
from sim.runner.resolve import resolve_hardware
from token_content import TokenContent
from workloads import build_workload


def prepare_experiment(config: ExperimentConfig, config_path: Path) -> PreparedExperiment:
    """Build and check every variant (merged engine section, vLLM's start-up checks, pool sizing,
    policy and its options, cost model, pinned prefixes) and the workload, so that a bad later variant
    fails before the first simulation. Every variant's problems are reported together."""
    base_dir = config_path.parent
    model, gpu = resolve_hardware(config, base_dir, config_path)
    workload = build_workload(config.workload, seed=config.seed, base_dir=base_dir)
    workload.check_input()  # (a trace's rows: a bad one fails here, not inside a run)
    prefixes = workload.shared_prefixes()
    prepared: list[PreparedVariant] = []
    problems: dict[str, list[int]] = {}  # one line per message: a shared engine section fails every variant
    notes: dict[str, list[int]] = {}
    for index in range(len(config.variants)):
        try:
            item, warnings = prepare_variant(config, index, model, gpu, base_dir, prefixes)
        except (ConfigError, CostModelError) as error:
            for text in str(error).split("\n"):
                problems.setdefault(text, []).append(index)
            continue
        prepared.append(item)
        for note in warnings:
            notes.setdefault(note, []).append(index)
    if problems:
        lines = [f"{_variants_label(config, indexes)}: {text}" for text, indexes in problems.items()]
        raise ConfigError(
            f"{config_path}: cannot run ({len(lines)} problem(s); nothing was simulated)\n  "
            + "\n  ".join(lines)
        )
    warnings = [f"{_variants_label(config, indexes)}: {text}" for text, indexes in notes.items()]
    return PreparedExperiment(config, base_dir, workload, prepared, warnings)


def _variants_label(config: ExperimentConfig, indexes: list[int]) -> str:
    if len(indexes) == len(config.variants) > 1:
        return "every variant"
    return ", ".join(f"variants.{i} ({config.variants[i].name})" for i in indexes)


def prepare_variant(
    config: ExperimentConfig,
    index: int,
    model: ModelSpec,
    gpu: GpuSpec,
    base_dir: Path,
    prefixes: list[TokenContent] | None,
) -> tuple[PreparedVariant, list[str]]:
    """One variant, built; ``prefixes`` are pinned when the variant asks for it. Returns warnings too."""
    variant = config.variants[index]
    cluster = config.cluster_for(variant)
    if cluster is not None and cluster.disaggregation is not None:
        return prepare_disaggregated(config, index, cluster, model, gpu, base_dir, prefixes)
    engine_config = config.engine_for(variant)

    def key(name: str) -> str:
        return f"variants.{index}.engine.{name}" if name in variant.engine else f"engine.{name}"

    replicas = cluster.replicas if cluster is not None else 1
    return prepare_instance(
        config, index, variant, engine_config, model, gpu, base_dir, prefixes, key, cluster, replicas
    )
