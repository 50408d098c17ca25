"""Engine benchmark: simulated requests per wall second and peak memory, per size and policy.

Synthetic stream: prompt ~500 tokens, output ~250 (normal, clipped), Poisson arrivals at a rate that
keeps Llama-3.1-8B on an A100-80GB busy but stable (analytic costs). Each size runs in a fresh
subprocess so its peak RSS is its own; outputs stream to files (as `kvsim run` does)."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from itertools import product
from pathlib import Path

import numpy as np

from benchmarks.fresh import peak_rss_mib, run_fresh

RATE_PER_S = 20.0


def synthetic_requests(count: int, seed: int = 0, rate_per_s: float = RATE_PER_S) -> Iterator:
    from workloads.request import Request

    rng = np.random.default_rng(seed)
    arrival = 0.0
    chunk = 8192
    for start in range(0, count, chunk):
        size = min(chunk, count - start)
        # Drawn per chunk, converted to Python numbers in one go (indexing numpy arrays element by
        # element would cost the engine's loop ~2 µs per request).
        gaps = rng.exponential(1.0 / rate_per_s, size).tolist()
        prompts = np.clip(rng.normal(500, 150, size), 16, 2000).astype(int).tolist()
        outputs = np.clip(rng.normal(250, 80, size), 1, 1000).astype(int).tolist()
        for offset in range(size):
            arrival += gaps[offset]
            request_id = start + offset
            yield Request(
                request_id,
                arrival,
                ((2 * request_id, prompts[offset]),),
                outputs[offset],
                output_content_id=2 * request_id + 1,
            )


def run_once(count: int, policy_name: str) -> dict:

    import pyarrow.parquet as pq

    from benchmarks.bench_traces import simpy_reference_s
    from policies import PoolSpec, make_policy
    from sim.costs.core import AnalyticCostModel
    from sim.engine.core import Engine, EngineKnobs
    from sim.hardware.capacity import size_kv_pool
    from sim.hardware.gpus import resolve_gpu
    from sim.hardware.models import resolve_model
    from sim.outputs.sinks import FileSink

    reference_s = simpy_reference_s()  # 1M bare SimPy timeouts, timed in this subprocess
    model, gpu = resolve_model("Llama-3.1-8B"), resolve_gpu("A100-80GB")
    capacity = size_kv_pool(model, gpu, block_size=16)
    pool = PoolSpec(capacity.kv_pool_tokens, 16, 4096, capacity.kv_bytes_per_token)
    options = {"reservation": "oracle"} if policy_name == "contiguous" else {}
    policy = make_policy(policy_name, pool, **options)
    with tempfile.TemporaryDirectory() as folder:
        # Outputs stream to files as `kvsim run` does, so peak memory is the engine's own.
        sink = FileSink(Path(folder))
        engine = Engine(
            policy,
            AnalyticCostModel(model, gpu),
            EngineKnobs(max_model_len=4096),
            synthetic_requests(count),
            sink=sink,
        )
        started = time.perf_counter()
        engine.run()
        wall_s = time.perf_counter() - started
        sink.close()
        finished = int((sink.requests(columns=["outcome"])["outcome"] == "finished").sum())
        rows = pq.ParquetFile(sink.path("timeseries")).metadata.num_rows
    return {
        "policy": policy_name,
        "requests": count,
        "finished": finished,
        "wall_s": wall_s,
        "requests_per_s": count / wall_s,
        "simulated_s": engine.env.now,
        "iterations": engine.counters.iterations,
        "wakeups": engine.wakeups,
        "reference_s": reference_s,
        "ratio": wall_s / reference_s,
        "timeseries_rows": rows,
        "peak_rss_mib": peak_rss_mib(),
    }


def run_engine_benchmarks(
    sizes: list[int], policies: list[str], builds: Sequence[str] = ("python",)
) -> list[dict]:
    print(
        f"engine benchmark: Poisson {RATE_PER_S} req/s, prompt~500, output~250, Llama-3.1-8B, A100-80GB; "
        "ratio = engine wall / 1M bare SimPy timeouts"
    )
    rows = []
    for policy, size, build in product(policies, sizes, builds):
        row = run_fresh("benchmarks.bench_engine", str(size), policy, build=build)
        rows.append(row)
        print(
            f"  {policy:<10} {build:<6} {size:>9,} requests: {row['requests_per_s']:>9,.0f} req/s "
            f"({row['wall_s']:.1f} s wall for {row['simulated_s']:,.0f} s simulated, "
            f"reference {row['reference_s']:.2f} s, ratio {row['ratio']:.0f}), "
            f"{row['wakeups']:,} wake-ups for {row['iterations']:,} iterations "
            f"({row['wall_s'] / row['wakeups'] * 1e6:.0f} µs each), "
            f"peak RSS {row['peak_rss_mib']:,.0f} MiB, {row['timeseries_rows']:,} series rows"
        )
    return rows


if __name__ == "__main__":
    print(json.dumps(run_once(int(sys.argv[1]), sys.argv[2])))
