"""Running an experiment: every variant replays the identical request stream, streamed to its own
folder or kept in memory; a :class:`RunWatch` may end a run early."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import simpy
from tqdm.auto import tqdm

from sim.cluster.results import balance_metrics
from sim.config import (
    ExperimentConfig,
    VariantConfig,
)
from sim.engine.core import Engine
from sim.outputs.group_series import KV_GROUP_TIMESERIES
from sim.outputs.metrics import RequestRecord
from sim.outputs.progress import ProgressMode, request_progress
from sim.outputs.sinks import FileSink, MemorySink, OutputSink
from sim.runner.clusters import run_cluster, run_disaggregated
from sim.runner.engines import lockstep_group, make_engine
from sim.runner.prepare import prepare_experiment, prepare_variant
from sim.runner.prepared import PreparedExperiment, PreparedVariant, VariantResult
from sim.runner.resolve import resolve_hardware
from sim.runner.summary import SUMMARY_REQUEST_COLUMNS, variant_summary
from workloads import Workload, build_workload
from workloads.request import Request


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
    prepared, _ = prepare_variant(config, index, model, gpu, base_dir, prefixes)
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
        return run_disaggregated(config, prepared, workload, requests, sink, bar, on_delivered)
    if prepared.cluster is not None:
        return run_cluster(config, prepared, workload, requests, sink, bar, on_delivered)
    lockstep: dict[str, Any] = {}
    if prepared.lockstep:
        # Expert parallelism within one server's TP group: a group of one rank, which pays the
        # shared part of each step (its experts over its own tokens) alone.
        env = simpy.Environment()
        lockstep = {"env": env, "lockstep": lockstep_group(env, 1, prepared.costs)}
    watching = watch if watch is not None and _watchable(config, prepared, workload) else None
    known = list(requests) if watching is not None else None  # the watch reads every arrival up front
    engine = make_engine(
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
    summary = variant_summary(engine, requests_table, prepared, wall_s, [prepared.policy])
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
