"""``build_workload``: a validated ``workload:`` config -> a :class:`Workload`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.base import Workload
from workloads.config import (
    AnyWorkloadConfig,
    SyntheticWorkloadConfig,
    TraceWorkloadConfig,
    parse_workload_config,
)


def build_workload(
    config: AnyWorkloadConfig | dict[str, Any], *, seed: int, base_dir: Path | None = None
) -> Workload:
    """The workload a config describes. ``base_dir`` is the YAML file's folder (for relative paths).

    Raises :class:`workloads.base.WorkloadError` (or its subclass ``TraceError``) when a file is missing
    or unusable, before any request is produced."""
    if isinstance(config, dict):
        config = parse_workload_config(config)
    if isinstance(config, TraceWorkloadConfig):
        from workloads.traces import TraceWorkload

        return TraceWorkload(config, seed=seed, base_dir=base_dir)
    if isinstance(config, SyntheticWorkloadConfig):
        from workloads.synthetic import SyntheticWorkload

        return SyntheticWorkload(config, seed=seed, base_dir=base_dir)
    raise TypeError(f"not a workload config: {config!r}")
