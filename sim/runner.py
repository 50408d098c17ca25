"""Run an experiment: every variant replays the identical request stream; results go to one folder."""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
import simpy
from pydantic import ValidationError
from tqdm.auto import tqdm

from policies.base import KVCachePolicy, OutOfKVMemory, PolicyInputError, PoolSpec, make_policy, policy_class
from policies.contiguous import ContiguousPolicy
from policies.hybrid.mamba import ALIGN_NEEDS_A_BLOCK
from sim.cluster.cluster import Cluster, follow_up_of
from sim.cluster.disaggregated import Decider, DisaggregatedCluster, PoolShape
from sim.cluster.disaggregated_results import (
    TRANSFER_REQUEST_COLUMNS,
    TRANSFER_TIMESERIES,
    disaggregation_summary,
    transfer_series,
)
from sim.cluster.link import LinkSpec, resolve_link
from sim.cluster.results import ClusterTotals, ReplicaSink, balance_metrics, replica_series, total_series
from sim.cluster.routers import ROUTER_CLASSES, make_router, make_router_named
from sim.config import (
    DATA_PARALLEL_ROUTER,
    VLLM_BLOCK_SIZES,
    ClusterConfig,
    ConfigError,
    ConfigWarning,
    DisaggregationConfig,
    EngineConfig,
    ExperimentConfig,
    PoolConfig,
    VariantConfig,
)
from sim.costs.core import CostModel, CostModelError
from sim.costs.factory import make_cost_model
from sim.costs.speculative import SpeculativeCostModel, speculative_step
from sim.engine.core import Engine, EngineKnobs
from sim.engine.lockstep import LockstepGroup
from sim.engine.schedulers.sglang import chunked_prefill_size_for
from sim.engine.speculation import AcceptanceModel, SpeculativeDecoding, lookahead_slots
from sim.hardware.capacity import KVCapacity, size_kv_pool
from sim.hardware.draft import Draft, draft_for
from sim.hardware.gpus import GpuSpec, resolve_gpu
from sim.hardware.hybrid_capacity import vllm_hybrid_kv_capacity
from sim.hardware.jenga_capacity import jenga_kv_capacity
from sim.hardware.layers import STATE_KINDS, kind_counts
from sim.hardware.models import ModelSpec, expert_parallel_problems, expert_parallel_size, resolve_model
from sim.kv.allocators import (
    HybridLayout,
    SGLangHybridLayout,
    SGLangMambaLayout,
    hybrid_allocator_options,
    is_hybrid_allocator,
    mamba_prefix_policy,
    sglang_hybrid_layout,
    vllm_mamba_cache_mode,
    vllm_mamba_chunk_size,
)
from sim.kv.coordinator import KVCoordinator
from sim.kv.jenga_layout import JengaLayout
from sim.native import engine_build
from sim.offload import OffloadConfig, host_load_seconds, host_tier_blocks, host_tier_summary
from sim.outputs.group_series import KV_GROUP_TIMESERIES
from sim.outputs.metrics import RequestRecord
from sim.outputs.progress import ProgressMode, request_progress
from sim.outputs.sinks import FileSink, MemorySink, OutputSink
from token_content import TokenContent
from workloads import Workload, build_workload
from workloads.base import TraceError, resolve_path
from workloads.request import Request

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


def resolve_hardware(
    config: ExperimentConfig, base_dir: Path, where: str | Path | None = None
) -> tuple[ModelSpec, GpuSpec]:
    """The model and GPU a config names; errors name the config file (``where``) and the key."""
    where = where if where is not None else base_dir
    model_ref = config.model
    candidate = base_dir / model_ref
    if model_ref.endswith(".json") and candidate.is_file():
        model_ref = str(candidate)
    try:
        model = resolve_model(model_ref)
    except (ValueError, KeyError) as error:
        raise ConfigError(f"{where}: model: {_text(error)}") from None
    try:
        gpu = resolve_gpu(config.gpu)
    except (ValueError, KeyError) as error:
        raise ConfigError(f"{where}: gpu: {_text(error)}") from None
    return model, gpu


def _text(error: BaseException) -> str:
    # KeyError's str() is the repr of its argument: strip the quotes it adds.
    return str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)


def policy_name_for(variant: VariantConfig, engine: EngineConfig) -> str:
    if engine.enable_prefix_caching is None:
        return variant.policy
    if engine.enable_prefix_caching and variant.policy == "paged":
        return "prefix"
    if not engine.enable_prefix_caching and variant.policy in ("prefix", "radix"):
        raise ConfigError(
            f"variant {variant.name!r}: policy {variant.policy!r} contradicts enable_prefix_caching: false"
        )
    if engine.enable_prefix_caching and variant.policy == "contiguous":
        raise ConfigError(f"variant {variant.name!r}: the contiguous policy has no prefix cache")
    return variant.policy


def engine_expert_parallel_size(model: ModelSpec, engine: EngineConfig) -> int:
    """The GPUs the engine section deals the routed experts over (1 without expert parallelism);
    raises ``ValueError`` for data or expert parallelism kvsim does not run."""
    return expert_parallel_size(
        model, engine.data_parallel_size, engine.tensor_parallel_size, engine.enable_expert_parallel
    )


def engine_draft(model: ModelSpec, engine: EngineConfig) -> Draft | None:
    """Speculative decoding's draft for the engine section, None without speculation."""
    speculative = engine.speculative
    if speculative is None:
        return None
    try:
        return draft_for(
            speculative.method,
            model,
            kv_cache_dtype=engine.kv_cache_dtype,
            tensor_parallel_size=engine.tensor_parallel_size,
            draft_model=speculative.draft_model,
            draft_layers=speculative.draft_layers,
            draft_vocab_size=speculative.draft_vocab_size,
        )
    except ValueError as error:
        raise ConfigError(f"engine.speculative.draft_model: {error}") from None


def engine_pool(model: ModelSpec, gpu: GpuSpec, engine: EngineConfig) -> KVCapacity:
    """The KV pool the engine section's sizing keys give (one data-parallel rank's); raises what
    :func:`size_kv_pool` raises (:class:`ModelDoesNotFitError` when the weights leave no room)."""
    draft = engine_draft(model, engine)
    return size_kv_pool(
        model,
        gpu,
        block_size=engine.block_size,
        kv_cache_dtype=engine.kv_cache_dtype,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        activation_reserve_bytes=engine.activation_reserve_bytes,
        kv_cache_memory_bytes=engine.kv_cache_memory_bytes,
        num_gpu_blocks_override=engine.num_gpu_blocks_override,
        tensor_parallel_size=engine.tensor_parallel_size,
        expert_parallel_size=engine_expert_parallel_size(model, engine),
        data_parallel_size=engine.data_parallel_size,
        draft_weight_bytes=0 if draft is None else draft.weight_bytes,
        draft_kv_bytes_per_token=0 if draft is None else draft.kv_bytes_per_token,
    )


def size_pool(model: ModelSpec, gpu: GpuSpec, engine: EngineConfig) -> KVCapacity:
    try:
        return engine_pool(model, gpu, engine)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def engine_cost_model(
    config: ExperimentConfig, model: ModelSpec, gpu: GpuSpec, engine: EngineConfig, base_dir: Path
) -> CostModel:
    """The experiment's cost model for one instance of the engine section (block size, cache dtype,
    tensor parallelism; with expert parallelism, one data-parallel rank's); with speculative
    decoding its decode step is the speculative step (``sim/costs/speculative.py``)."""
    target = make_cost_model(
        config.cost_model,
        model,
        gpu,
        block_size=engine.block_size,
        kv_cache_dtype=engine.kv_cache_dtype,
        base_dir=base_dir,
        tensor_parallel_size=engine.tensor_parallel_size,
        data_parallel_size=engine.data_parallel_size,
        expert_parallel_size=engine_expert_parallel_size(model, engine),
    )
    speculative = engine.speculative
    if speculative is None:
        return target
    draft = engine_draft(model, engine)
    assert draft is not None
    draft_decode = None
    if draft.step_shapes is not None:
        # The draft priced by the same cost model as the target, on the draft's shapes.
        draft_costs = make_cost_model(
            config.cost_model,
            draft.step_shapes,
            gpu,
            block_size=engine.block_size,
            kv_cache_dtype=engine.kv_cache_dtype,
            base_dir=base_dir,
            tensor_parallel_size=engine.tensor_parallel_size,
        )
        draft_decode = draft_costs.decode
    step = speculative_step(target, speculative.num_speculative_tokens, draft_decode, engine.max_num_seqs)
    return SpeculativeCostModel(target, step, f"{speculative.method}, k={speculative.num_speculative_tokens}")


def speculation_problem(policy_name: str, key: Callable[[str], str]) -> str:
    """Why ``policy_name`` cannot serve speculative decoding ("" when it can)."""
    if is_hybrid_allocator(policy_name):
        return (
            f"{policy_name} with {key('speculative')} is not modelled yet (a draft's slots in every "
            "KV group); use policy paged, prefix or contiguous"
        )
    if not policy_class(policy_name).HOLDS_LOOKAHEAD:
        return (
            f"policy {policy_name!r} cannot hold the lookahead slots {key('speculative')} needs "
            "(each decoding request's drafts); use policy paged, prefix or contiguous"
        )
    return ""


def speculative_knobs(
    engine: EngineConfig, base_dir: Path | None = None, key: Callable[[str], str] | None = None
) -> SpeculativeDecoding | None:
    """What the engine needs of ``engine.speculative``: the acceptance distribution (a histogram file
    read relative to ``base_dir``) and the slots a decoding sequence holds past its tokens."""
    speculative = engine.speculative
    if speculative is None:
        return None
    k = speculative.num_speculative_tokens
    acceptance = speculative.acceptance
    if acceptance.rates is not None:
        model = AcceptanceModel.from_rates(acceptance.rates)
    elif acceptance.mean_acceptance_length is not None:
        model = AcceptanceModel.from_mean_length(acceptance.mean_acceptance_length, k)
    else:
        histogram = acceptance.histogram
        if histogram is None:
            where = (key or (lambda name: f"engine.{name}"))("speculative") + ".acceptance.histogram_file"
            try:
                path = resolve_path(acceptance.histogram_file or "", base_dir)
            except TraceError as error:
                raise ConfigError(f"{where}: {error}") from None
            histogram = read_acceptance_histogram(path, k, where)
        counts = [histogram.get(accepted, 0.0) for accepted in range(k + 1)]
        model = AcceptanceModel.from_histogram(counts, k)
    return SpeculativeDecoding(speculative.method, k, model, lookahead_slots(speculative.method, k))


def read_acceptance_histogram(path: Path, num_speculative_tokens: int, where: str) -> dict[int, float]:
    """A measured acceptance histogram: a CSV with columns ``accepted_drafts,count``, one row per
    number of accepted drafts (0..k). Every problem names the file, the line and the value."""
    import csv

    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"{where}: cannot read {path}: {error.strerror or error}") from None
    rows = list(csv.reader(text.splitlines()))
    if not rows or [cell.strip() for cell in rows[0]] != ["accepted_drafts", "count"]:
        raise ConfigError(f"{where}: {path}: line 1 must be the header accepted_drafts,count")
    histogram: dict[int, float] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        try:
            accepted, count = int(row[0]), float(row[1])
        except (ValueError, IndexError):
            raise ConfigError(
                f"{where}: {path}: line {line}: {','.join(row)!r} is not a whole number and a count"
            ) from None
        if not 0 <= accepted <= num_speculative_tokens:
            raise ConfigError(
                f"{where}: {path}: line {line}: {accepted} accepted drafts is outside 0..{num_speculative_tokens} "
                "(num_speculative_tokens)"
            )
        if count < 0 or count != count:
            raise ConfigError(f"{where}: {path}: line {line}: count {row[1]!r} must be >= 0")
        histogram[accepted] = histogram.get(accepted, 0.0) + count
    if not any(count > 0 for count in histogram.values()):
        raise ConfigError(f"{where}: {path}: no step counted (every count is 0, or no rows)")
    return histogram


def speculative_summary(prepared: PreparedVariant) -> dict[str, Any]:
    """What speculative decoding adds to a run's summary (empty text and zeros without it)."""
    speculative, draft = prepared.speculative, prepared.draft
    if speculative is None or draft is None:
        return {
            "speculative": "",
            "lookahead_slots": 0,
            "draft_weight_bytes": 0,
            "draft_kv_bytes_per_token": 0,
        }
    acceptance = speculative.acceptance
    return {
        "speculative": (
            f"{speculative.method}, k={speculative.num_speculative_tokens}, mean acceptance length "
            f"{acceptance.mean_acceptance_length:.3g} ({acceptance.source}); {draft.description}"
        ),
        "lookahead_slots": speculative.lookahead_slots,
        "draft_weight_bytes": draft.weight_bytes,
        "draft_kv_bytes_per_token": draft.kv_bytes_per_token,
    }


# --------------------------------------------------------------------------------------------------
# Preparing: every variant is built and checked before the first one runs
# --------------------------------------------------------------------------------------------------


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
    """A cluster's policy instances, one per replica (``policy`` is the first)."""
    ran: bool = False
    """A policy holds the state of its run: a prepared variant runs once."""
    offload: OffloadConfig | None = None
    # A disaggregated variant is its decode pool, with these beside it (None otherwise).
    prefill_pool: PreparedVariant | None = None
    link: LinkSpec | None = None
    gpu: GpuSpec | None = None  # a pool's own GPU
    role: str = ""
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

    def new_kv(self) -> KVCachePolicy | KVCoordinator:
        """A fresh instance of this variant's KV memory (one more replica's)."""
        if self.hybrid is not None:
            return self.hybrid.make_coordinator()
        return make_policy(self.policy_name, self.pool, **self.variant.options)


@dataclass
class PreparedExperiment:
    config: ExperimentConfig
    base_dir: Path
    workload: Workload
    variants: list[PreparedVariant]
    warnings: list[str]


def prepare_experiment(config: ExperimentConfig, config_path: Path) -> PreparedExperiment:
    """Build and check every variant (merged engine section, vLLM's start-up checks, pool sizing,
    policy and its options, cost model, pinned prefixes) and the workload, so that a bad later variant
    fails before the first simulation. Every variant's problems are reported together."""
    base_dir = config_path.parent
    model, gpu = resolve_hardware(config, base_dir, config_path)
    workload = build_workload(config.workload, seed=config.seed, base_dir=base_dir)
    prefixes = workload.shared_prefixes()
    prepared: list[PreparedVariant] = []
    problems: dict[str, list[int]] = {}  # one line per message: a shared engine section fails every variant
    notes: dict[str, list[int]] = {}
    for index in range(len(config.variants)):
        try:
            item, warnings = _prepare_variant(config, index, model, gpu, base_dir, prefixes)
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


def _prepare_variant(
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
        return _prepare_disaggregated(config, index, cluster, model, gpu, base_dir, prefixes)
    engine_config = config.engine_for(variant)

    def key(name: str) -> str:
        return f"variants.{index}.engine.{name}" if name in variant.engine else f"engine.{name}"

    replicas = cluster.replicas if cluster is not None else 1
    return _prepare_instance(
        config, index, variant, engine_config, model, gpu, base_dir, prefixes, key, cluster, replicas
    )


def _prepare_instance(
    config: ExperimentConfig,
    index: int,
    variant: VariantConfig,
    engine_config: EngineConfig,
    model: ModelSpec,
    gpu: GpuSpec,
    base_dir: Path,
    prefixes: list[TokenContent] | None,
    key: Callable[[str], str],
    cluster: ClusterConfig | None,
    replicas: int,
) -> tuple[PreparedVariant, list[str]]:
    """``replicas`` instances of one engine configuration (a variant's, or a disaggregated pool's)."""
    errors, warnings = check_engine(engine_config, model.name, model.max_position_embeddings, key)
    parallel_errors, parallel_warnings = check_parallelism(config, index, engine_config, model, key)
    errors += parallel_errors
    warnings += parallel_warnings
    if not parallel_errors:
        try:
            capacity = size_pool(model, gpu, engine_config)
        except ConfigError as error:
            errors.insert(0, f"model, gpu: {error}")
    if errors:
        raise ConfigError("\n".join(errors))  # one problem per line
    max_model_len = engine_config.max_model_len or model.max_position_embeddings
    policy_name = policy_name_for(variant, engine_config)
    if not is_hybrid_allocator(policy_name) and model.state_bytes_per_request() > 0:
        # vLLM too refuses a Mamba model with the hybrid manager off: a state is not per-token K/V.
        raise ConfigError(
            f"variants.{index}.policy: {model.name} has Mamba/linear-attention layers, a state of "
            f"{model.state_bytes_per_request():,} B per request that policy {policy_name!r} cannot hold "
            "(it keeps per-token K/V only); use policy vllm-hybrid"
        )
    # (A hybrid pool holds less per request than full attention would: vLLM checks it per group.)
    if not is_hybrid_allocator(policy_name):
        pool_error = check_pool_holds_a_request(capacity, engine_config.block_size, max_model_len, key)
        if pool_error:
            raise ConfigError(pool_error)
    option_error = unknown_options_error(policy_name, variant.options)
    if option_error:
        raise ConfigError(f"variants.{index}.options: {option_error}")
    if engine_config.speculative is not None:
        speculation_error = speculation_problem(policy_name, key)
        if speculation_error:
            raise ConfigError(f"variants.{index}.policy: {speculation_error}")
    if engine_config.data_parallel_size > 1:
        # A data-parallel server's ranks are a cluster behind vLLM's own balancer.
        cluster = ClusterConfig.model_validate(
            {"replicas": engine_config.data_parallel_size, "router": DATA_PARALLEL_ROUTER}
        )
        replicas = engine_config.data_parallel_size
    if (
        cluster is not None
        and cluster.disaggregation is None
        and make_router(cluster).needs_prefix_lookup
        and not has_prefix_lookup(policy_name)
    ):
        raise ConfigError(
            f"{_cluster_key(config, index, 'router')}: router {cluster.router!r} routes by the prefix each "
            f"replica's cache would serve, but policy {policy_name!r} has no prefix cache (no lookup). "
            "Use policy prefix or radix, or another router"
        )
    hybrid = None
    if is_hybrid_allocator(policy_name):
        hybrid = _hybrid_layout(config, index, variant, engine_config, model, capacity, max_model_len, key)
        pool = hybrid.pool
        replica_policies: list[KVCachePolicy | KVCoordinator] = [
            hybrid.make_coordinator() for _ in range(replicas)
        ]
        policy: KVCachePolicy | KVCoordinator = replica_policies[0]
        offload = None
    else:
        pool, policies_made, offload = _single_group_policies(
            config, index, variant, engine_config, capacity, policy_name, max_model_len, key, replicas
        )
        replica_policies = list(policies_made)
        policy = policies_made[0]
    costs = engine_cost_model(config, model, gpu, engine_config, base_dir)
    pinned_tokens = 0
    if variant.pin_shared_prefixes:
        try:
            # Every replica pins the same prefixes in its own cache: the summary reports one replica's.
            pinned = [
                pin_prefixes(item, prefixes or [])
                for item in replica_policies
                if isinstance(item, KVCachePolicy)
            ]
            pinned_tokens = pinned[0]
        except ConfigError as error:
            raise ConfigError(f"variants.{index}.{error}") from None
    prepared = PreparedVariant(
        variant,
        engine_config,
        policy_name,
        capacity,
        pool,
        max_model_len,
        policy,
        costs,
        pinned_tokens,
        cluster,
        replica_policies if cluster is not None else None,
    )
    prepared.offload = offload
    prepared.lockstep = costs.expert_parallel is not None
    prepared.hybrid = hybrid
    prepared.speculative = speculative_knobs(engine_config, base_dir, key)
    prepared.draft = engine_draft(model, engine_config)
    return prepared, warnings


def _single_group_policies(
    config: ExperimentConfig,
    index: int,
    variant: VariantConfig,
    engine_config: EngineConfig,
    capacity: KVCapacity,
    policy_name: str,
    max_model_len: int,
    key: Callable[[str], str],
    replicas: int,
) -> tuple[PoolSpec, list[KVCachePolicy], OffloadConfig | None]:
    """A single-group policy's pool and its instances, one per replica, with their host tiers."""
    pool = PoolSpec(
        policy_class(policy_name).pool_slots_from_memory(
            capacity.kv_memory_slots, engine_config.block_size, variant.options
        ),
        engine_config.block_size,
        max_model_len,
        capacity.kv_bytes_per_token,
    )
    try:
        replica_policies = [make_policy(policy_name, pool, **variant.options) for _ in range(replicas)]
    except (TypeError, PolicyInputError) as error:
        raise ConfigError(f"variants.{index}.options: {error}") from None
    policy = replica_policies[0]
    reservation_error = check_reservation_fits(policy, max_model_len, key)
    if reservation_error:
        raise ConfigError(reservation_error)
    offload = config.offload_for(variant)
    if offload is not None:
        for replica_policy in replica_policies:  # each replica has its own host memory
            attach_host_tier(
                replica_policy,
                offload,
                engine_config.block_size * capacity.kv_bytes_per_token,
                variant,
                index,
            )
    return pool, replica_policies, offload


def _warn_of_windows_past_max_model_len(variant: VariantConfig, model: ModelSpec, max_model_len: int) -> None:
    """A window (or chunk) no request reaches frees nothing: those layers hold every token, as full
    attention would. vLLM runs such a server the same way, so it is a warning, not an error."""
    spans = sorted(
        {kind.label for kind, _ in kind_counts(model.layer_kinds or ()) if _reaches(kind, max_model_len)}
    )
    if spans:
        warnings.warn(
            f"variant {variant.name}: {model.name}'s {', '.join(spans)} layers never release a block: "
            f"no request is longer than max_model_len ({max_model_len:,} tokens), so they hold every "
            f"token, as full attention would",
            ConfigWarning,
            stacklevel=2,
        )


def _reaches(kind: object, max_model_len: int) -> bool:
    """Whether a sliding window or a chunk spans every request of up to ``max_model_len`` tokens."""
    span = getattr(kind, "window", None) or getattr(kind, "chunk", None)
    return span is not None and span >= max_model_len


def _hybrid_layout(
    config: ExperimentConfig,
    index: int,
    variant: VariantConfig,
    engine_config: EngineConfig,
    model: ModelSpec,
    capacity: KVCapacity,
    max_model_len: int,
    key: Callable[[str], str],
) -> HybridLayout | SGLangHybridLayout | SGLangMambaLayout | JengaLayout:
    """A hybrid allocator's pool from the memory the sizing left for KV, as vLLM groups the layers
    (sglang-hybrid: as SGLang splits it into its two pools; jenga: in large pages of the LCM of the
    layer types' pages; sglang-hybrid on a Mamba model: its full-attention and Mamba pools)."""
    where = f"variants.{index}.policy"
    problems = []
    if config.offload_for(variant) is not None:
        problems.append(f"{where}: {variant.policy} has no host tier (offload:); use policy prefix or radix")
    if variant.pin_shared_prefixes:
        problems.append(
            f"variants.{index}.pin_shared_prefixes: {variant.policy} has no prefix cache to pin into"
        )
    if engine_config.preemption_mode == "swap":
        problems.append(f"{key('preemption_mode')}: {variant.policy} preempts by recompute only")
    if variant.policy == "jenga" and engine_config.num_gpu_blocks_override is not None:
        problems.append(f"{key('num_gpu_blocks_override')}: jenga sizes its large pages from the KV memory")
    if variant.policy == "jenga" and engine_config.scheduler != "vllm":
        # (SGLang's budget is one count of free tokens; Jenga's room is per type, in small pages.)
        problems.append(f"{key('scheduler')}: jenga runs with vLLM's scheduler (Jenga is built on vLLM)")
    jenga_caching = variant.policy == "jenga" and bool(engine_config.enable_prefix_caching)
    if jenga_caching and any(isinstance(kind, STATE_KINDS) for kind, _ in model.layer_kind_counts):
        problems.append(
            f"{key('enable_prefix_caching')}: jenga's prefix caching has no rule for {model.name}'s Mamba / "
            "linear-attention layers (sim/kv/jenga_prefix.py); set it false, or use policy vllm-hybrid"
        )
    if problems:
        raise ConfigError("\n".join(problems))
    _warn_of_windows_past_max_model_len(variant, model, max_model_len)
    prefill_tokens = min(
        engine_config.max_num_batched_tokens if engine_config.enable_chunked_prefill else max_model_len,
        max_model_len,
    )
    batches_in_flight = 2 if engine_config.async_scheduling else 1
    try:
        if variant.policy == "sglang-hybrid":
            return sglang_hybrid_layout(
                model,
                capacity.available_kv_bytes,
                max_model_len=max_model_len,
                prefill_tokens=prefill_tokens,
                kv_cache_dtype=engine_config.kv_cache_dtype,
                tensor_parallel_size=engine_config.tensor_parallel_size,
                overlap=engine_config.async_scheduling,
                # (SGLang's SWA or Mamba radix cache)
                prefix_caching=bool(engine_config.enable_prefix_caching),
                **variant.options,
            )
        if variant.policy == "jenga":
            jenga = jenga_kv_capacity(
                model,
                capacity.available_kv_bytes,
                max_model_len=max_model_len,
                block_size=engine_config.block_size,
                kv_cache_dtype=engine_config.kv_cache_dtype,
                # (With prefix caching a prompt is allocated whole in every type: sim/kv/jenga_prefix.py.)
                max_in_flight_tokens=max_model_len
                if jenga_caching
                else batches_in_flight * engine_config.max_num_batched_tokens,
                tensor_parallel_size=engine_config.tensor_parallel_size,
                **variant.options,
            )
            return JengaLayout(jenga, max_model_len, prefill_tokens, jenga_caching)
    except ValueError as error:
        if str(error).startswith("large_page_bytes"):  # (jenga's option: the key it came from)
            raise ConfigError(f"variants.{index}.options.{error}") from None
        raise ConfigError(f"{where}: {variant.policy}: {error}") from None
    # (vllm-hybrid caches prefixes when enable_prefix_caching is true; unset keeps it off.)
    prefix_caching = bool(engine_config.enable_prefix_caching)
    try:
        mamba_cache_mode = vllm_mamba_cache_mode(
            model,
            variant.options.get("mamba_cache_mode"),
            prefix_caching,
            engine_config.enable_chunked_prefill,
            option_key=f"variants.{index}.options.mamba_cache_mode",
            caching_key=key("enable_prefix_caching"),
            chunked_key=key("enable_chunked_prefill"),
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None
    try:
        hybrid = vllm_hybrid_kv_capacity(
            model,
            capacity.available_kv_bytes,
            max_model_len=max_model_len,
            block_size=engine_config.block_size,
            kv_cache_dtype=engine_config.kv_cache_dtype,
            mamba_cache_mode=mamba_cache_mode,
            mamba_chunk_size=vllm_mamba_chunk_size(model) if mamba_cache_mode == "all" else None,
            max_num_batched_tokens=engine_config.max_num_batched_tokens,
            max_concurrent_batches=batches_in_flight,
            tensor_parallel_size=engine_config.tensor_parallel_size,
            num_gpu_blocks_override=engine_config.num_gpu_blocks_override,
        )
    except ValueError as error:
        raise ConfigError(f"{where}: {variant.policy}: {error}") from None
    if mamba_cache_mode == "align" and prefill_tokens < hybrid.block_size <= max_model_len:
        raise ConfigError(
            f"{key('max_num_batched_tokens')}: {engine_config.max_num_batched_tokens:,} is less than the "
            f"{hybrid.block_size:,}-token block {model.name} takes with Mamba layers: {ALIGN_NEEDS_A_BLOCK}"
        )
    try:
        marconi = mamba_prefix_policy(
            model,
            hybrid,
            variant.options,
            mamba_cache_mode,
            option_prefix=f"variants.{index}.options.",
            caching_key=key("enable_prefix_caching"),
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return HybridLayout(hybrid, max_model_len, prefill_tokens, prefix_caching, marconi, mamba_cache_mode)


def _prepare_disaggregated(
    config: ExperimentConfig,
    index: int,
    cluster: ClusterConfig,
    model: ModelSpec,
    gpu: GpuSpec,
    base_dir: Path,
    prefixes: list[TokenContent] | None,
) -> tuple[PreparedVariant, list[str]]:
    """Both pools of a disaggregated variant, each prepared as an instance of its own (its GPU, engine
    overrides, policy); the variant is its decode pool, with the prefill pool beside it."""
    variant = config.variants[index]
    spec = cluster.disaggregation
    assert spec is not None
    where = _cluster_key(config, index, "disaggregation")
    problems: list[str] = []
    pools: dict[str, PreparedVariant] = {}
    warnings: list[str] = []
    for role, pool in (("prefill", spec.prefill), ("decode", spec.decode)):
        prefix = f"{where}.{role}"
        try:
            pools[role], notes = _prepare_pool(
                config, index, variant, role, pool, prefix, model, gpu, base_dir, prefixes, cluster
            )
            warnings += notes
        except ConfigError as error:
            problems += str(error).split("\n")
    if not problems:
        problems += _disaggregation_problems(pools["prefill"], pools["decode"], spec, where)
        if any(pool.engine.speculative is not None for pool in pools.values()):
            problems.append(f"{where}: speculative decoding with disaggregated pools is not modelled yet")
    if problems:
        raise ConfigError("\n".join(problems))
    prepared = pools["decode"]
    prepared.prefill_pool = pools["prefill"]
    prepared.cluster = cluster
    try:
        prepared.link = resolve_link(spec.link, pools["prefill"].gpu or gpu, f"{where}.link")
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return prepared, warnings


def _prepare_pool(
    config: ExperimentConfig,
    index: int,
    variant: VariantConfig,
    role: str,
    pool: PoolConfig,
    prefix: str,
    model: ModelSpec,
    gpu: GpuSpec,
    base_dir: Path,
    prefixes: list[TokenContent] | None,
    cluster: ClusterConfig,
) -> tuple[PreparedVariant, list[str]]:
    """One pool: the variant with the pool's policy and options, the engine section with the variant's
    then the pool's overrides, on the pool's GPU."""
    try:
        pool_gpu = resolve_gpu(pool.gpu) if pool.gpu is not None else gpu
    except (ValueError, KeyError) as error:
        raise ConfigError(f"{prefix}.gpu: {_text(error)}") from None
    engine_config = config.engine_for(variant)
    try:
        engine_config = EngineConfig.model_validate(engine_config.model_dump() | pool.engine)
    except ValidationError as error:
        raise ConfigError(f"{prefix}.engine: {error.errors()[0]['msg']}") from None
    update: dict[str, Any] = {"name": f"{variant.name}-{role}"} if role == "prefill" else {}
    if pool.policy is not None:
        update["policy"] = pool.policy
    if pool.options is not None:
        update["options"] = pool.options
    pool_variant = variant.model_copy(update=update)

    def key(name: str) -> str:
        if name in pool.engine:
            return f"{prefix}.engine.{name}"
        return f"variants.{index}.engine.{name}" if name in variant.engine else f"engine.{name}"

    prepared, warnings = _prepare_instance(
        config,
        index,
        pool_variant,
        engine_config,
        model,
        pool_gpu,
        base_dir,
        prefixes,
        key,
        None,
        pool.replicas,
    )
    prepared.gpu = pool_gpu
    prepared.role = role
    prepared.replica_count = pool.replicas
    if prepared.replica_policies is None:
        prepared.replica_policies = _more_policies(prepared, pool.replicas)
    return prepared, [f"{prefix}: {note}" for note in warnings]


def _more_policies(prepared: PreparedVariant, replicas: int) -> list[KVCachePolicy | KVCoordinator]:
    """A pool's policy instances, one per replica (the first is ``prepared.policy``)."""
    return [prepared.policy] + [prepared.new_kv() for _ in range(replicas - 1)]


def _disaggregation_problems(
    prefill: PreparedVariant, decode: PreparedVariant, spec: DisaggregationConfig, where: str
) -> list[str]:
    """What a disaggregated cluster cannot do, each naming its key."""
    problems = []
    for role, pool in (("prefill", prefill), ("decode", decode)):
        if is_hybrid_allocator(pool.policy_name):
            problems.append(
                f"{where}.{role}.policy: {pool.policy_name} does not run in a disaggregated cluster yet"
            )
        elif not policy_class(pool.policy_name).uses_blocks:
            problems.append(
                f"{where}.{role}.policy: {pool.policy_name} has no blocks: KV is sent and received block by "
                "block (vLLM's NIXL connector, Mooncake); use paged, prefix or radix"
            )
        if pool.engine.data_parallel_size > 1 or pool.engine.enable_expert_parallel:
            problems.append(
                f"{where}.{role}.engine: data or expert parallelism inside a disaggregated pool is not modelled "
                "(give the pool more replicas instead)"
            )
        if pool.engine.scheduler != "vllm":
            problems.append(
                f"{where}.{role}.engine.scheduler: {pool.engine.scheduler} is not modelled in disaggregated "
                "pools (only vllm's scheduler)"
            )
    if prefill.engine.block_size != decode.engine.block_size:
        problems.append(
            f"{where}: the pools' block sizes differ ({prefill.engine.block_size} and "
            f"{decode.engine.block_size}): blocks are sent as they are; give both the same engine.block_size"
        )
    if spec.decider.mode == "prefix_threshold" and not has_prefix_lookup(decode.policy_name):
        problems.append(
            f"{where}.decider.mode: prefix_threshold reads the decode replica's prefix cache, but policy "
            f"{decode.policy_name!r} has none; use prefix or radix in the decode pool, or mode: always"
        )
    for role, pool_config in (("prefill", spec.prefill), ("decode", spec.decode)):
        pool = prefill if role == "prefill" else decode
        if ROUTER_CLASSES[pool_config.router].needs_prefix_lookup and not has_prefix_lookup(pool.policy_name):
            problems.append(
                f"{where}.{role}.router: {pool_config.router} routes by prefix, but policy {pool.policy_name!r} "
                "has no prefix cache"
            )
    return problems


def attach_host_tier(
    policy: KVCachePolicy, offload: OffloadConfig, block_bytes: int, variant: VariantConfig, index: int
) -> None:
    """Give ``policy`` the host tier ``offload`` asks for, or say why it cannot have one."""
    where = f"variants.{index}.offload" if variant.offload else "offload"
    blocks = host_tier_blocks(offload, block_bytes)
    if blocks < 1:
        raise ConfigError(
            f"{where}.host_memory_gib: {offload.host_memory_gib:g} GiB holds no KV block "
            f"({block_bytes:,} bytes each)"
        )
    try:
        policy.enable_host_tier(blocks, offload.write_policy)
    except PolicyInputError as error:
        raise ConfigError(f"{where}: {error}") from None


def has_prefix_lookup(policy_name: str) -> bool:
    """Does the policy implement the side-effect-free prefix lookup (a prefix cache)?"""
    if is_hybrid_allocator(policy_name):
        return False
    return policy_class(policy_name).lookup is not KVCachePolicy.lookup


def _cluster_key(config: ExperimentConfig, index: int, name: str) -> str:
    return f"variants.{index}.cluster.{name}" if name in config.variants[index].cluster else f"cluster.{name}"


def unknown_options_error(policy_name: str, options: Mapping[str, object]) -> str | None:
    """The options the policy does not take, named with the valid ones; None when there are none.
    (Checked by name up front, not from the constructor's TypeError, whose wording a compiled build
    changes.)"""
    valid = policy_options(policy_name)
    unknown = sorted(set(options) - set(valid))
    if not unknown:
        return None
    return (
        f"unknown option(s) {', '.join(map(repr, unknown))} for policy {policy_name!r} "
        f"(valid: {', '.join(valid) or 'none'})"
    )


def policy_options(name: str) -> list[str]:
    """The options a policy takes (its constructor's keyword arguments after the pool)."""
    if is_hybrid_allocator(name):
        return list(hybrid_allocator_options(name))
    # The class's signature, not its __init__'s: a compiled class's __init__ shows only *args, **kwargs.
    return list(inspect.signature(policy_class(name)).parameters)[1:]


def check_engine(
    engine: EngineConfig, model_name: str, model_max_len: int, key: Callable[[str], str]
) -> tuple[list[str], list[str]]:
    """vLLM's start-up checks of the engine knobs against the model: ``(errors, warnings)``, each
    naming the key (``key(name)`` gives its path in the config)."""
    errors: list[str] = []
    warnings: list[str] = []
    max_model_len = engine.max_model_len or model_max_len
    if engine.max_model_len is not None and engine.max_model_len > model_max_len:
        text = (
            f"{key('max_model_len')}: {engine.max_model_len:,} is beyond {model_name}'s context length "
            f"({model_max_len:,} tokens, max_position_embeddings)"
        )
        if engine.allow_long_max_model_len:
            warnings.append(f"{text}; accepted (allow_long_max_model_len: true)")
        else:
            errors.append(
                f"{text}; vLLM refuses this too. Lower it, or set engine.allow_long_max_model_len: true "
                "(vLLM: VLLM_ALLOW_LONG_MAX_MODEL_LEN=1) if the model really handles longer contexts"
            )
    if engine.block_size > max_model_len:
        errors.append(
            f"{key('block_size')}: {engine.block_size:,} is larger than max_model_len ({max_model_len:,}): "
            "even the longest request would leave most of its only block empty"
        )
    elif engine.block_size not in VLLM_BLOCK_SIZES:
        warnings.append(
            f"{key('block_size')}: {engine.block_size} is not a block size vLLM accepts "
            f"({', '.join(map(str, VLLM_BLOCK_SIZES))}); simulated as given"
        )
    if not engine.enable_chunked_prefill and engine.max_num_batched_tokens < max_model_len:
        errors.append(
            f"{key('max_num_batched_tokens')}: {engine.max_num_batched_tokens:,} is smaller than "
            f"max_model_len ({max_model_len:,}) with enable_chunked_prefill: false, which vLLM refuses "
            "(longer prompts could never be prefilled). Raise max_num_batched_tokens, lower "
            "max_model_len, or enable chunked prefill"
        )
    return errors, warnings


def check_parallelism(
    config: ExperimentConfig, index: int, engine: EngineConfig, model: ModelSpec, key: Callable[[str], str]
) -> tuple[list[str], list[str]]:
    """Data and expert parallelism kvsim runs (:func:`expert_parallel_problems`), and data
    parallelism's own limits: ``(errors, warnings)``, each naming the key."""
    errors = [
        f"{key(knob)}: {text}"
        for knob, text in expert_parallel_problems(
            model, engine.data_parallel_size, engine.tensor_parallel_size, engine.enable_expert_parallel
        )
    ]
    warnings: list[str] = []
    variant = config.variants[index]
    if engine.data_parallel_size > 1 and (config.cluster is not None or variant.cluster):
        where = f"variants.{index}.cluster" if variant.cluster else "cluster"
        errors.append(
            f"{key('data_parallel_size')}: {engine.data_parallel_size} makes the server a group of ranks "
            f"behind vLLM's own balancer; a {where}: section of such servers is not modelled. Use one or "
            "the other"
        )
    if (
        engine.enable_expert_parallel
        and not errors
        and engine.data_parallel_size * engine.tensor_parallel_size == 1
    ):
        warnings.append(
            f"{key('enable_expert_parallel')}: one GPU (data_parallel_size x tensor_parallel_size = 1) "
            "has every expert; nothing is dealt out, as in vLLM"
        )
    return errors, warnings


def check_pool_holds_a_request(
    capacity: KVCapacity, block_size: int, max_model_len: int, key: Callable[[str], str]
) -> str:
    """vLLM refuses to start when one request of ``max_model_len`` tokens cannot fit in the KV cache."""
    pool_tokens = capacity.num_gpu_blocks * block_size
    if max_model_len <= pool_tokens:
        return ""
    return (
        f"max_model_len ({max_model_len:,} tokens) is larger than the KV cache holds "
        f"({capacity.num_gpu_blocks:,} blocks x {block_size} = {pool_tokens:,} tokens), which vLLM refuses "
        f"at start-up. Lower {key('max_model_len')} to at most {pool_tokens:,}, or give the KV cache more "
        "memory (gpu_memory_utilization, kv_cache_memory_bytes, num_gpu_blocks_override, a bigger GPU)"
    )


def check_reservation_fits(policy: KVCachePolicy, max_model_len: int, key: Callable[[str], str]) -> str:
    """A contiguous ``max`` reservation (rounded up by buddy placement) larger than the biggest region an
    empty pool can place would reject every request: refuse it with the numbers."""
    if not isinstance(policy, ContiguousPolicy) or policy.reservation != "max":
        return ""
    region = policy.region_size(policy.reservation_size(1, 1))
    largest = policy.largest_region()
    if region <= largest:
        return ""
    rounding = f" (rounded up to {region:,} by buddy placement)" if region != max_model_len else ""
    biggest = (
        f"its largest buddy chunk is {largest:,} slots"
        if policy.placement == "buddy"
        else f"the KV pool holds {largest:,} slots"
    )
    return (
        f"contiguous reservation 'max' reserves max_model_len = {max_model_len:,} slots per request"
        f"{rounding}, but {biggest}: no request could ever be admitted. Lower {key('max_model_len')} "
        f"to at most {largest:,}, or give the KV cache more memory"
    )


# --------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------


class RunWatch(Protocol):
    """Watches one engine's run and may end it early (``kvsim plan``: a probe whose failure is
    already certain, ``sim/planning/sweeps/early_stop.py``). It is shown only runs whose every arrival
    is known up front (the workload's whole stream, no follow-ups) and that nothing cuts short (no
    ``until_s``, no cluster, no pinned prefixes): what happens to a request after it arrives is then
    the engine's doing alone."""

    def arrived(self, record: RequestRecord) -> None:
        """A request arrived; its record shows its progress from now on (first token, finish)."""

    def begin(self, engine: Engine, requests: list[Request]) -> simpy.Event | None:
        """The run is about to start on ``requests``: register any process on ``engine.env`` and
        return the event that stops the run, or None to leave this run alone."""

    def outcome(self) -> dict[str, Any] | None:
        """After the run: why it was stopped (JSON-able), or None if it was not."""


def run_variant(
    config: ExperimentConfig,
    variant: VariantConfig,
    base_dir: Path,
    *,
    progress: ProgressMode = False,
    out_dir: Path | None = None,
) -> VariantResult:
    """Prepare and run one variant (the validation checks use it). With ``out_dir`` its tables stream to
    ``out_dir/<variant>/`` as it runs (memory stays bounded by the running requests); without, they are
    kept in memory."""
    model, gpu = resolve_hardware(config, base_dir)
    workload = build_workload(config.workload, seed=config.seed, base_dir=base_dir)
    index = config.variants.index(variant)
    prefixes = workload.shared_prefixes() if variant.pin_shared_prefixes else None
    prepared, _ = _prepare_variant(config, index, model, gpu, base_dir, prefixes)
    return run_prepared(config, prepared, workload, progress=progress, out_dir=out_dir)


def run_prepared(
    config: ExperimentConfig,
    prepared: PreparedVariant,
    workload: Workload,
    *,
    progress: ProgressMode = False,
    out_dir: Path | None = None,
    watch: RunWatch | None = None,
    keep_tables: bool = False,
) -> VariantResult:
    """Run one prepared variant on ``workload``'s request stream (replayed afresh); ``watch`` may end
    it early (only where :class:`RunWatch` says a watch is shown the run). With ``out_dir`` and
    ``keep_tables`` the tables stream to files and stay in memory too (read right after the run)."""
    if prepared.ran:
        raise RuntimeError(f"variant {prepared.variant.name!r} already ran: prepare it again")
    prepared.ran = True
    variant = prepared.variant
    total = workload.describe().get("num_requests")
    label = variant.name if progress != "log" else f"kvsim run {config.name}: {variant.name}"
    counter = request_progress(progress, label, total)
    bar = counter if counter is not None else tqdm(total=total, disable=True)
    sink: OutputSink = (
        FileSink(out_dir / variant.name, config.output.timeseries_format, keep=keep_tables)
        if out_dir is not None
        else MemorySink()
    )
    requests = workload.requests()
    # The bar counts requests as they arrive in the simulation (the engine reads the stream ahead).
    on_delivered = counter.update if counter is not None else None
    if prepared.prefill_pool is not None:
        return _run_disaggregated(config, prepared, workload, requests, sink, bar, on_delivered)
    if prepared.cluster is not None:
        return _run_cluster(config, prepared, workload, requests, sink, bar, on_delivered)
    lockstep: dict[str, Any] = {}
    if prepared.lockstep:
        # Expert parallelism within one server's TP group: a group of one rank, which pays the
        # shared part of each step (its experts over its own tokens) alone.
        env = simpy.Environment()
        lockstep = {"env": env, "lockstep": _lockstep_group(env, 1, prepared.costs)}
    watching = watch if watch is not None and _watchable(config, prepared, workload) else None
    known = list(requests) if watching is not None else None  # the watch reads every arrival up front
    engine = _make_engine(
        config,
        prepared,
        prepared.policy,
        iter(known) if known is not None else requests,
        sink,
        follow_up=workload.follow_up,
        on_delivered=on_delivered,
        **lockstep,
        on_arrival=watching.arrived if watching is not None else None,
    )
    stop = watching.begin(engine, known) if watching is not None and known is not None else None
    started = time.perf_counter()
    engine.run(until_s=config.until_s, stop=stop)
    wall_s = time.perf_counter() - started
    bar.close()
    group_frame = engine.group_series.frame() if engine.group_series is not None else None
    if group_frame is not None and isinstance(sink, FileSink):
        sink.write_table(KV_GROUP_TIMESERIES, group_frame)
    sink.close()
    requests_table = sink.requests(columns=SUMMARY_REQUEST_COLUMNS)
    summary = _summary(engine, requests_table, prepared, wall_s, [prepared.policy])
    summary |= balance_metrics("none", [len(requests_table)], [summary])
    stopped = watching.outcome() if stop is not None and watching is not None else None
    return VariantResult(
        variant.name,
        summary,
        prepared.capacity_lines(),
        sink,
        stopped_early=stopped,
        kv_group_timeseries=group_frame,
    )


def _watchable(config: ExperimentConfig, prepared: PreparedVariant, workload: Workload) -> bool:
    """Whether a :class:`RunWatch` may see this run: every arrival known up front, nothing cut short."""
    return config.until_s is None and prepared.pinned_tokens == 0 and workload.arrivals_known_up_front


def _max_num_seqs(prepared: PreparedVariant) -> int:
    """``engine.max_num_seqs``, capped where SGLang caps its running requests by its Mamba pool
    (``sglang-hybrid`` on a Mamba model: ``sim/hardware/sglang_mamba_capacity.py``)."""
    if isinstance(prepared.hybrid, SGLangMambaLayout):
        return min(prepared.engine.max_num_seqs, prepared.hybrid.max_running_requests)
    return prepared.engine.max_num_seqs


def _make_engine(
    config: ExperimentConfig,
    prepared: PreparedVariant,
    policy: KVCachePolicy | KVCoordinator,
    requests,
    sink: OutputSink,
    **engine_options: Any,
) -> Engine:
    """One engine (or cluster replica: ``engine_options`` carry its clock and hooks) for the variant."""
    engine_config = prepared.engine
    # (The pool's block, which a Mamba hybrid raises above engine.block_size.)
    block_bytes = prepared.pool.block_size * prepared.pool.kv_bytes_per_token
    knobs = EngineKnobs(
        max_model_len=prepared.max_model_len,
        max_num_seqs=_max_num_seqs(prepared),
        max_num_batched_tokens=engine_config.max_num_batched_tokens,
        enable_chunked_prefill=engine_config.enable_chunked_prefill,
        preemption_mode=engine_config.preemption_mode,
        swap_space_blocks=int(engine_config.swap_space * GIB // block_bytes),
        watermark=engine_config.watermark,
        on_oom=engine_config.on_oom,
        beam_reparent_prob=engine_config.beam_reparent_prob,
        scheduler=engine_config.scheduler,
        schedule_policy=engine_config.schedule_policy,
        schedule_conservativeness=engine_config.schedule_conservativeness,
        chunked_prefill_size=(
            chunked_prefill_size_for(resolve_gpu(config.gpu).memory_bytes)
            if engine_config.chunked_prefill_size is None
            else engine_config.chunked_prefill_size
        ),
        max_prefill_tokens=engine_config.max_prefill_tokens,
        # a lockstep group's ranks step together, one iteration at a time (sim/engine/lockstep.py)
        step_mode="single" if prepared.lockstep else engine_config.step_mode,
        async_scheduling=engine_config.async_scheduling,
        speculative=prepared.speculative,
        client_overhead_s=(
            prepared.costs.request_overhead_s
            if engine_config.client_overhead_s is None
            else engine_config.client_overhead_s
        ),
    )
    return Engine(
        policy,
        prepared.costs,
        knobs,
        requests,
        seed=config.seed,
        block_size=prepared.pool.block_size,
        sink=sink,
        host_load_s=(
            host_load_seconds(prepared.offload, prepared.costs, block_bytes) if prepared.offload else None
        ),
        **engine_options,
    )


def _summary(
    engine,
    requests_table: pd.DataFrame,
    prepared: PreparedVariant,
    wall_s: float,
    policies: list[KVCachePolicy | KVCoordinator],
) -> dict[str, Any]:
    """The summary row of ``engine`` (one engine, a replica, or a cluster's totals) whose host tiers,
    if any, are those of ``policies``."""
    summary = summarize(
        engine,
        requests_table,
        prepared.variant,
        prepared.policy_name,
        prepared.pool,
        prepared.capacity,
        prepared.costs.label,
        wall_s,
        prepared.max_model_len,
        cost_error_band=prepared.costs.error_band,
        kv_groups=len(prepared.hybrid.capacity.groups) if prepared.hybrid is not None else 1,
    )
    summary["pinned_tokens"] = prepared.pinned_tokens
    summary.update(speculative_summary(prepared))
    group_series = getattr(engine, "group_series", None)  # one engine with several KV groups
    summary["kv_group_means"] = (
        group_series.time_averages(float(engine.env.now), prepared.pool.kv_pool_tokens)
        if group_series is not None
        else None
    )
    if prepared.hybrid is not None:
        summary["num_gpu_blocks"] = prepared.hybrid.capacity.num_blocks
    block_bytes = prepared.engine.block_size * prepared.capacity.kv_bytes_per_token
    summary.update(host_tier_summary(policies, block_bytes, engine.counters.host_load_s))
    return summary


def _run_cluster(
    config: ExperimentConfig,
    prepared: PreparedVariant,
    workload: Workload,
    requests,
    sink: OutputSink,
    bar,
    on_delivered,
) -> VariantResult:
    """Run a variant's replicas behind its router; the cluster total is the variant's summary and
    time series, the replicas' own are kept beside it (``sim/cluster/results.py``)."""
    cluster_config = prepared.cluster
    policies = prepared.replica_policies
    assert cluster_config is not None and policies is not None
    sinks = [ReplicaSink(sink, index) for index in range(cluster_config.replicas)]
    groups: list[LockstepGroup] = []  # the data-parallel ranks' step clock, with expert parallelism

    def build_replica(index, env, upstream, follow_up) -> Engine:
        lockstep: dict[str, Any] = {}
        if prepared.lockstep:
            if not groups:
                groups.append(_lockstep_group(env, cluster_config.replicas, prepared.costs))
            lockstep = {"lockstep": groups[0]}
        return _make_engine(
            config,
            prepared,
            policies[index],
            (),
            sinks[index],
            env=env,
            upstream=upstream,
            follow_up=follow_up,
            **lockstep,
        )

    cluster = Cluster(
        cluster_config.replicas,
        build_replica,
        make_router(cluster_config),
        requests,
        follow_up_of(workload),
        on_delivered=on_delivered,
    )
    wall_s = _timed_run(cluster, config, bar)
    per_replica = replica_series(sinks)
    total = total_series(per_replica, prepared.pool.kv_pool_tokens * cluster_config.replicas)
    sink.write_timeseries(total)
    if isinstance(sink, FileSink):
        sink.write_table(REPLICA_TIMESERIES, per_replica)
    sink.close()
    requests_table = sink.requests(columns=[*SUMMARY_REQUEST_COLUMNS, "replica"])
    replica_summaries = [
        _summary(
            engine, requests_table[requests_table["replica"] == index], prepared, wall_s, [engine.policy]
        )
        | {"replica": index, "role": "both", "requests_routed": cluster.routed[index]}
        for index, engine in enumerate(cluster.replicas)
    ]
    summary = _summary(ClusterTotals(cluster.replicas, total), requests_table, prepared, wall_s, policies)
    summary |= balance_metrics(cluster_config.router, cluster.routed, replica_summaries)
    return VariantResult(
        prepared.variant.name,
        summary,
        prepared.capacity_lines(),
        sink,
        replica_summaries,
        per_replica,
    )


def _run_disaggregated(
    config: ExperimentConfig,
    prepared: PreparedVariant,
    workload: Workload,
    requests,
    sink: OutputSink,
    bar,
    on_delivered,
) -> VariantResult:
    """Run a disaggregated variant: its prefill and decode pools on one clock, KV sent over its link
    (``sim/cluster/disaggregated.py``). Replicas are numbered across the cluster, prefill pool first."""
    prefill, decode = prepared.prefill_pool, prepared
    assert prefill is not None and prepared.cluster is not None and prepared.link is not None
    spec = prepared.cluster.disaggregation
    assert spec is not None and prefill.replica_policies is not None and decode.replica_policies is not None
    pools = [prefill] * prefill.replica_count + [decode] * decode.replica_count
    policies = [*prefill.replica_policies, *decode.replica_policies]
    sinks = [ReplicaSink(sink, index) for index in range(len(pools))]

    def build_replica(index, role, env, upstream, follow_up, transfer) -> Engine:
        return _make_engine(
            config,
            pools[index],
            policies[index],
            (),
            sinks[index],
            env=env,
            upstream=upstream,
            follow_up=follow_up,
            transfer=transfer,
            prefill_only=role == "prefill",
        )

    routers = (
        make_router_named(spec.prefill.router, prepared.cluster),
        make_router_named(spec.decode.router, prepared.cluster),
    )
    cluster = DisaggregatedCluster(
        _pool_shape(prefill),
        _pool_shape(decode),
        build_replica,
        routers,
        Decider(spec.decider),
        prepared.link,
        requests,
        follow_up_of(workload),
        on_delivered=on_delivered,
    )
    wall_s = _timed_run(cluster, config, bar)
    per_replica = replica_series(sinks)
    per_replica.insert(1, "role", [cluster.role_of(index) for index in per_replica["replica"]])
    pool_tokens = sum(pool.pool.kv_pool_tokens for pool in pools)
    total = total_series(per_replica.drop(columns="role"), pool_tokens)
    sink.write_timeseries(total)
    link_series = transfer_series(cluster.rows)
    if isinstance(sink, FileSink):
        sink.write_table(REPLICA_TIMESERIES, per_replica)
        sink.write_table(TRANSFER_TIMESERIES, link_series)
    sink.close()
    requests_table = sink.requests(columns=[*SUMMARY_REQUEST_COLUMNS, *TRANSFER_REQUEST_COLUMNS, "replica"])
    replica_summaries = []
    for index, engine in enumerate(cluster.replicas):
        role = cluster.role_of(index)
        served = requests_table["prefill_replica" if role == "prefill" else "replica"] == index
        row = _summary(engine, requests_table[served], pools[index], wall_s, [engine.policy])
        replica_summaries.append(
            row | {"replica": index, "role": role, "requests_routed": cluster.routed[index]}
        )
    summary = _summary(ClusterTotals(cluster.replicas, total), requests_table, decode, wall_s, policies)
    router_label = f"prefill {spec.prefill.router}, decode {spec.decode.router}"
    summary |= balance_metrics(router_label, cluster.routed, replica_summaries)
    summary |= disaggregation_summary(cluster, requests_table, replica_summaries, prefill, decode)
    capacity_lines = [
        *(f"prefill pool: {line}" for line in prefill.capacity.capacity_lines(prefill.max_model_len)),
        *(f"decode pool: {line}" for line in decode.capacity.capacity_lines(decode.max_model_len)),
        f"link: {prepared.link.label}",
    ]
    return VariantResult(prepared.variant.name, summary, capacity_lines, sink, replica_summaries, per_replica)


def _timed_run(cluster: Cluster | DisaggregatedCluster, config: ExperimentConfig, bar) -> float:
    """Run a cluster to the end (or ``until_s``); returns the wall seconds it took."""
    started = time.perf_counter()
    cluster.run(until_s=config.until_s)
    wall_s = time.perf_counter() - started
    bar.close()
    return wall_s


def _pool_shape(pool: PreparedVariant) -> PoolShape:
    return PoolShape(
        pool.replica_count,
        pool.engine.block_size,
        pool.capacity.kv_bytes_per_token,
        pool.capacity.tensor_parallel_size,
    )


def _lockstep_group(env: simpy.Environment, ranks: int, costs: CostModel) -> LockstepGroup:
    expert_parallel = costs.expert_parallel
    assert expert_parallel is not None
    return LockstepGroup(env, ranks, expert_parallel.step_s)


REPLICA_TIMESERIES = "replica_timeseries"  # a cluster variant's per-replica series, beside timeseries

# The per-request columns a summary needs (read back alone from a streamed file).
SUMMARY_REQUEST_COLUMNS = [
    "outcome",
    "sample_output_tokens",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "decode_steps",
    "decode_step_tokens",
]


def pin_prefixes(policy: KVCachePolicy, prefixes: list[TokenContent]) -> int:
    """Warm-up: pin each shared prefix's full blocks. Returns the slots pinned."""
    try:
        return sum(policy.pin_prefix(prefix) for prefix in prefixes)
    except (PolicyInputError, OutOfKVMemory) as error:
        raise ConfigError(f"pin_shared_prefixes: {error}") from None


def _tokens_per_decode_step(finished: pd.DataFrame) -> float | None:
    """Tokens a decode step gave the finished requests, on average over their steps (None without
    steps, or for a table without the step columns: one read back from an older run)."""
    if "decode_steps" not in finished or "decode_step_tokens" not in finished:
        return None
    steps = float(finished["decode_steps"].sum())
    return float(finished["decode_step_tokens"].sum()) / steps if steps else None


def _kv_pool_bytes(engine: Engine | ClusterTotals, pool: PoolSpec) -> int:
    """The pool's bytes per GPU: its slots at one token's bytes, or, where KV groups or pools hold
    slots of different sizes (a Mamba state beside per-token K/V), the sum of their breakdown in
    bytes, which the accounting identity keeps equal to the pool at every instant."""
    kv = getattr(engine, "kv", None)
    breakdown_bytes = getattr(kv, "breakdown_bytes", None)
    if breakdown_bytes is None:
        return pool.kv_pool_tokens * pool.kv_bytes_per_token
    return sum(breakdown_bytes().values())


def _kv_context_tokens(engine: Engine | ClusterTotals, pool: PoolSpec) -> int:
    """Tokens of context one replica's pool holds (``KVCoordinator.context_tokens``: a hybrid pool's
    slots count a token once per layer group); the pool's slots where a cluster's replicas differ."""
    return getattr(getattr(engine, "kv", None), "context_tokens", 0) or pool.kv_pool_tokens


def summarize(
    engine: Engine | ClusterTotals,
    requests: pd.DataFrame,
    variant: VariantConfig,
    policy_name: str,
    pool: PoolSpec,
    capacity: KVCapacity,
    cost_label: str,
    wall_s: float,
    max_model_len: int,
    cost_error_band: str = "not validated",
    kv_groups: int = 1,
) -> dict[str, Any]:
    simulated_s = float(engine.env.now)
    finished = requests[requests["outcome"] == "finished"]
    stats = engine.kv.stats
    output_tokens = float(finished["sample_output_tokens"].sum()) if len(finished) else 0.0
    summary: dict[str, Any] = {
        "variant": variant.name,
        "policy": policy_name,
        "policy_options": dict(variant.options),
        "block_size": pool.block_size,
        "tensor_parallel_size": capacity.tensor_parallel_size,
        "data_parallel_size": capacity.data_parallel_size,
        "expert_parallel_size": capacity.expert_parallel_size,
        "max_model_len": max_model_len,
        "kv_pool_tokens": pool.kv_pool_tokens,
        "kv_context_tokens": _kv_context_tokens(engine, pool),
        "kv_pool_bytes": _kv_pool_bytes(engine, pool),
        "kv_bytes_per_token": pool.kv_bytes_per_token,
        "kv_groups": kv_groups,
        "num_gpu_blocks": capacity.num_gpu_blocks,
        "cost_model": cost_label,
        "cost_model_error_band": cost_error_band,
        "requests_total": len(requests),
        "requests_finished": len(finished),
        "requests_rejected": int((requests["outcome"] == "rejected").sum()),
        "requests_failed_oom": int((requests["outcome"] == "failed_oom").sum()),
        "requests_unfinished": int((requests["outcome"] == "unfinished").sum()),
        "admission_waits": engine.counters.admission_waits,
        "preemptions": engine.counters.preemptions,
        "oom_failures": engine.counters.oom_failures,
        "swapped_out_blocks": engine.counters.swapped_out_blocks,
        "peak_running": engine.recorder.peak_running,
        "cow_copies": stats.cow_copies,
        "fork_copied_tokens": stats.fork_copied_tokens,
        "evictions": stats.evictions,
        "prefix_cache_queries": stats.prefix_cache_queries,
        "prefix_cache_hits": stats.prefix_cache_hits,
        "prefix_cache_hit_rate": (
            stats.prefix_cache_hits / stats.prefix_cache_queries if stats.prefix_cache_queries else None
        ),
        "output_tokens_per_s": output_tokens / simulated_s if simulated_s > 0 else 0.0,
        "ttft_p50_s": _percentile(finished["ttft_s"], 50),
        "ttft_p99_s": _percentile(finished["ttft_s"], 99),
        "tpot_p50_s": _percentile(finished["tpot_s"], 50),
        "tokens_per_decode_step": _tokens_per_decode_step(finished),
        "e2e_p50_s": _percentile(finished["e2e_s"], 50),
        "e2e_p99_s": _percentile(finished["e2e_s"], 99),
        "iterations": engine.counters.iterations,
        "engine_wakeups": engine.wakeups,
        "simulated_s": simulated_s,
        "wall_s": wall_s,
        "engine_build": engine_build(),
    }
    summary.update(engine.recorder.time_averages(simulated_s))
    return summary


def _percentile(values: pd.Series, q: float) -> float | None:
    clean = values.dropna()
    return float(np.percentile(clean, q)) if len(clean) else None


def run_experiment(
    config: ExperimentConfig,
    config_path: Path,
    *,
    progress: ProgressMode = False,
    out_dir: Path | None = None,
    prepared: PreparedExperiment | None = None,
    watch: Callable[[], RunWatch] | None = None,
    keep_tables: bool = False,
) -> list[VariantResult]:
    """Run every variant on the identical request stream; all are prepared (checked) before the first.
    ``watch`` makes a fresh :class:`RunWatch` for each variant's run; ``keep_tables``: as
    :func:`run_prepared`'s."""
    prepared = prepared or prepare_experiment(config, config_path)
    variants = tqdm(
        prepared.variants, desc=config.name, unit="variant", disable=progress in (None, False, "log")
    )
    return [
        run_prepared(
            config,
            item,
            prepared.workload,
            progress=progress,
            out_dir=out_dir,
            watch=watch() if watch is not None else None,
            keep_tables=keep_tables,
        )
        for item in variants
    ]
