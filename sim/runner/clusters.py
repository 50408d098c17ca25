"""Running a variant's replicas: behind one router (a cluster, data parallelism), or as a
disaggregated cluster of prefill and decode pools with KV sent over a link; the cluster's totals are
the variant's summary and series, each replica's own kept beside them."""

from __future__ import annotations

import time
from typing import Any

from sim.cluster.cluster import Cluster, follow_up_of
from sim.cluster.disaggregated import Decider, DisaggregatedCluster, PoolShape
from sim.cluster.disaggregated_results import (
    TRANSFER_REQUEST_COLUMNS,
    TRANSFER_TIMESERIES,
    disaggregation_summary,
    transfer_series,
)
from sim.cluster.results import ClusterTotals, ReplicaSink, balance_metrics, replica_series, total_series
from sim.cluster.routers import make_router, make_router_named
from sim.config import ExperimentConfig
from sim.engine.core import Engine
from sim.engine.lockstep import LockstepGroup
from sim.outputs.sinks import FileSink, OutputSink
from sim.runner.engines import lockstep_group, make_engine
from sim.runner.prepared import PreparedVariant, VariantResult
from sim.runner.summary import SUMMARY_REQUEST_COLUMNS, variant_summary
from workloads import Workload

REPLICA_TIMESERIES = "replica_timeseries"  # a cluster variant's per-replica series, beside timeseries


def run_cluster(
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
                groups.append(lockstep_group(env, cluster_config.replicas, prepared.costs))
            lockstep = {"lockstep": groups[0]}
        return make_engine(
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
        variant_summary(
            engine, requests_table[requests_table["replica"] == index], prepared, wall_s, [policies[index]]
        )
        | {"replica": index, "role": "both", "requests_routed": cluster.routed[index]}
        for index, engine in enumerate(cluster.replicas)
    ]
    summary = variant_summary(
        ClusterTotals(cluster.replicas, total), requests_table, prepared, wall_s, policies
    )
    summary |= balance_metrics(cluster_config.router, cluster.routed, replica_summaries)
    return VariantResult(
        prepared.variant.name,
        summary,
        prepared.capacity_lines(),
        sink,
        replica_summaries,
        per_replica,
    )


def run_disaggregated(
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
        return make_engine(
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
        row = variant_summary(engine, requests_table[served], pools[index], wall_s, [policies[index]])
        replica_summaries.append(
            row | {"replica": index, "role": role, "requests_routed": cluster.routed[index]}
        )
    summary = variant_summary(
        ClusterTotals(cluster.replicas, total), requests_table, decode, wall_s, policies
    )
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
