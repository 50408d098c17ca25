"""What preparing a variant gives the run: a :class:`PreparedVariant` (its engine section, pool, policy
instances, cost model and what it adds: a cluster, a host tier, a hybrid layout, speculation), the
experiment's :class:`PreparedExperiment`, and a finished run's :class:`VariantResult`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from policies.base import KVCachePolicy, PoolSpec
from sim.cluster.link import LinkSpec
from sim.config import (
    ClusterConfig,
    EngineConfig,
    ExperimentConfig,
    VariantConfig,
)
from sim.costs.core import CostModel
from sim.engine.speculation import SpeculativeDecoding
from sim.hardware.capacity import KVCapacity
from sim.hardware.draft import Draft
from sim.hardware.gpus import GpuSpec
from sim.kv.allocators import (
    HybridLayout,
    SGLangHybridLayout,
    SGLangMambaLayout,
)
from sim.kv.coordinator import KVCoordinator
from sim.kv.jenga_layout import JengaLayout
from sim.offload import OffloadConfig
from sim.outputs.sinks import OutputSink
from workloads import Workload

GIB = 1024**3


@dataclass
class VariantResult:
    """A finished variant: its summary, and its tables wherever the sink put them."""

    name: str
    summary: dict[str, Any]
    capacity_lines: list[str]
    sink: OutputSink
    replica_summaries: list[dict[str, Any]] | None = None
    """A cluster's per-replica summaries (None for a single engine)."""
    replica_timeseries: pd.DataFrame | None = None
    """A cluster's per-replica time series, a ``replica`` column first (None for a single engine)."""
    stopped_early: dict[str, Any] | None = None
    """Why a watch ended the run before its end (:class:`RunWatch`); None when it ran to the end."""
    kv_group_timeseries: pd.DataFrame | None = None
    """A hybrid allocator's memory by KV group over time (``sim/outputs/group_series.py``; None
    with one group)."""

    @property
    def timeseries(self) -> pd.DataFrame:
        return self.sink.timeseries()

    @property
    def requests(self) -> pd.DataFrame:
        return self.sink.requests()


@dataclass
class PreparedVariant:
    """A variant whose engine config, pool, policy, cost model and pinned prefixes are built and checked."""

    variant: VariantConfig
    engine: EngineConfig
    policy_name: str
    capacity: KVCapacity
    pool: PoolSpec
    max_model_len: int
    policy: KVCachePolicy | KVCoordinator  # a hybrid allocator's groups behind their coordinator
    costs: CostModel
    pinned_tokens: int
    cluster: ClusterConfig | None = None
    replica_policies: list[KVCachePolicy | KVCoordinator] | None = None
    """The policy instances, one per replica (``policy`` is the first; one for a single engine).
    Each replica has its own host tier and its own pinned prefixes."""
    ran: bool = False
    """A policy holds the state of its run: a prepared variant runs once."""
    offload: OffloadConfig | None = None
    # A disaggregated variant is its decode pool, with these beside it (None otherwise).
    prefill_pool: PreparedVariant | None = None
    link: LinkSpec | None = None
    gpu: GpuSpec | None = None  # a pool's own GPU
    replica_count: int = 1
    lockstep: bool = False
    """Expert parallelism: the engine (or each data-parallel rank) steps on a shared step clock."""
    hybrid: HybridLayout | SGLangHybridLayout | SGLangMambaLayout | JengaLayout | None = None
    """A hybrid allocator's pool (``sim/kv/allocators.py``); None for a single-group policy."""
    speculative: SpeculativeDecoding | None = None
    """``engine.speculative`` resolved (its acceptance read, its lookahead slots); None without."""
    draft: Draft | None = None
    """Speculative decoding's draft: the weights and per-token KV it adds to the pool's sizing."""

    def capacity_lines(self) -> list[str]:
        """vLLM's start-up lines for this pool (a hybrid pool's when a hybrid allocator runs), and what
        speculative decoding takes of it."""
        if self.hybrid is not None:
            return self.hybrid.capacity.capacity_lines()
        lines = self.capacity.capacity_lines(self.max_model_len)
        speculative, draft = self.speculative, self.draft
        if speculative is not None and draft is not None:
            footprint = (
                f": {draft.weight_bytes / GIB:.2f} GiB of weights, {draft.kv_bytes_per_token:,} B of KV per "
                "token (in the size above)"
                if draft.weight_bytes or draft.kv_bytes_per_token
                else ""
            )
            lines.append(
                f"Speculative decoding: {speculative.method}, k={speculative.num_speculative_tokens}, mean "
                f"acceptance length {speculative.acceptance.mean_acceptance_length:.2f}; {draft.description}"
                f"{footprint}; {speculative.lookahead_slots} lookahead slots per decoding request"
            )
        return lines


@dataclass
class PreparedExperiment:
    config: ExperimentConfig
    base_dir: Path
    workload: Workload
    variants: list[PreparedVariant]
    warnings: list[str]
