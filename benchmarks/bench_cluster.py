"""Cluster benchmark: wall time of 1, 2, 4 and 8 replicas at a fixed load per replica.

Each replica gets the engine benchmark's stream (prompt ~500, output ~250 tokens, Llama-3.1-8B on an
A100-80GB, analytic costs) at its rate: R replicas replay R x the requests at R x the rate, routed
round robin. Engine cost should grow linearly with replicas: the wall time per simulated request
stays flat (the router's work per request is O(replicas), small beside an engine's)."""

from __future__ import annotations

import time

from benchmarks.bench_engine import RATE_PER_S, synthetic_requests

REPLICAS = (1, 2, 4, 8)


def run_cluster_once(replicas: int, requests_per_replica: int, router: str = "round_robin") -> dict:
    from policies import PoolSpec, make_policy
    from sim.cluster.cluster import Cluster
    from sim.cluster.routers import make_router
    from sim.config import ClusterConfig
    from sim.costs.core import AnalyticCostModel
    from sim.engine.core import Engine, EngineKnobs
    from sim.hardware.capacity import size_kv_pool
    from sim.hardware.gpus import resolve_gpu
    from sim.hardware.models import resolve_model

    model, gpu = resolve_model("Llama-3.1-8B"), resolve_gpu("A100-80GB")
    capacity = size_kv_pool(model, gpu, block_size=16)
    pool = PoolSpec(capacity.kv_pool_tokens, 16, 4096, capacity.kv_bytes_per_token)
    costs = AnalyticCostModel(model, gpu)

    def build(index, env, upstream, follow_up):
        policy = make_policy("paged", pool)
        return Engine(
            policy,
            costs,
            EngineKnobs(max_model_len=4096),
            iter(()),  # a replica's requests come from the router
            env=env,
            upstream=upstream,
            follow_up=follow_up,
        )

    stream = synthetic_requests(replicas * requests_per_replica, rate_per_s=replicas * RATE_PER_S)
    router_config = ClusterConfig.model_validate({"replicas": replicas, "router": router})
    cluster = Cluster(replicas, build, make_router(router_config), stream)
    started = time.perf_counter()
    cluster.run()
    wall_s = time.perf_counter() - started
    iterations = sum(engine.counters.iterations for engine in cluster.replicas)
    return {
        "replicas": replicas,
        "requests": replicas * requests_per_replica,
        "wall_s": wall_s,
        "us_per_request": wall_s / (replicas * requests_per_replica) * 1e6,
        "iterations": iterations,
        "simulated_s": float(cluster.env.now),
    }


def run_cluster_benchmarks(requests_per_replica: int = 2_000) -> list[dict]:
    print(f"\ncluster: {requests_per_replica:,} requests per replica at {RATE_PER_S:g}/s each, round robin")
    print(
        f"{'replicas':>8} {'requests':>9} {'wall s':>8} {'us/request':>11} {'x 1 replica':>12} {'iterations':>11}"
    )
    rows = []
    for replicas in REPLICAS:
        row = run_cluster_once(replicas, requests_per_replica)
        rows.append(row)
        ratio = row["wall_s"] / rows[0]["wall_s"]
        print(
            f"{replicas:>8} {row['requests']:>9,} {row['wall_s']:>8.2f} {row['us_per_request']:>11.1f} "
            f"{ratio:>12.2f} {row['iterations']:>11,}"
        )
    return rows
