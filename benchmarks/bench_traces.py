"""Trace replay benchmark: the full Azure 2023 conversation trace through every policy, and the full
Mooncake conversation trace through prefix caching, as `kvsim run` would (outputs streamed to files).

The job (issue 10): Llama-2-7B on one A100-80GB, analytic costs, block_size 16, max_model_len 4096,
max_num_seqs 128, max_num_batched_tokens 512, one variant per run. Each replay runs in a fresh
subprocess, which first times one million bare SimPy ``env.timeout`` events: the engine's wall time
divided by that reference is a figure that busy or slower machines leave (nearly) unchanged.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Sequence
from itertools import product
from pathlib import Path
from typing import Any

from benchmarks.fresh import ROOT, available_builds, peak_rss_mib, run_fresh

REFERENCE_EVENTS = 1_000_000

ENGINE = {
    "block_size": 16,
    "max_model_len": 4096,
    "max_num_seqs": 128,
    "max_num_batched_tokens": 512,
}
SOURCES = {
    "azure-conv": {"kind": "azure", "path": "traces/azure/AzureLLMInferenceTrace_conv.csv"},
    "mooncake-conv": {"kind": "mooncake", "path": "traces/mooncake/conversation_trace.jsonl"},
}
VARIANTS: dict[str, dict[str, Any]] = {
    "contiguous-max": {"policy": "contiguous", "options": {"reservation": "max", "placement": "first_fit"}},
    "contiguous-buddy": {"policy": "contiguous", "options": {"reservation": "max", "placement": "buddy"}},
    "paged": {"policy": "paged"},
    "prefix": {"policy": "prefix"},
    # SGLang's radix cache with its page of one token (its growth deferred unbacked, sim/engine/unbacked.py).
    "radix": {"policy": "radix"},
}
JOBS = [
    ("azure-conv", "contiguous-max"),
    ("azure-conv", "contiguous-buddy"),
    ("azure-conv", "paged"),
    ("azure-conv", "prefix"),
    ("azure-conv", "radix"),
    ("mooncake-conv", "prefix"),
]


def experiment(trace: str, variant: str) -> dict[str, Any]:
    return {
        "name": f"bench-{trace}",
        "seed": 1,
        "model": "Llama-2-7B",
        "gpu": "A100-80GB",
        "engine": ENGINE,
        "workload": {"source": SOURCES[trace], "max_model_len": ENGINE["max_model_len"]},
        "variants": [{"name": variant, **VARIANTS[variant]}],
        "output": {"figures": False},
    }


def simpy_reference_s(events: int = REFERENCE_EVENTS, repeats: int = 3) -> float:
    """Seconds SimPy takes for ``events`` bare timeouts (the best of ``repeats``)."""
    import simpy

    def once() -> float:
        env = simpy.Environment()

        def ticks():
            for _ in range(events):
                yield env.timeout(1.0)

        env.process(ticks())
        started = time.perf_counter()
        env.run()
        return time.perf_counter() - started

    return min(once() for _ in range(repeats))


def replay_once(trace: str, variant: str) -> dict[str, Any]:

    from sim.config import validate_experiment
    from sim.runner import run_variant

    reference_s = simpy_reference_s()
    config = validate_experiment(experiment(trace, variant))
    with tempfile.TemporaryDirectory() as folder:
        result = run_variant(config, config.variants[0], ROOT, out_dir=Path(folder))
    summary = result.summary
    return {
        "trace": trace,
        "variant": variant,
        "requests": summary["requests_total"],
        "finished": summary["requests_finished"],
        "iterations": summary["iterations"],
        "wakeups": summary["engine_wakeups"],
        "wall_s": summary["wall_s"],
        "requests_per_s": summary["requests_total"] / summary["wall_s"],
        "reference_s": reference_s,
        "ratio": summary["wall_s"] / reference_s,
        "peak_rss_mib": peak_rss_mib(),
    }


def run_trace_benchmarks(
    jobs: list[tuple[str, str]] = JOBS, builds: Sequence[str] = ("python",)
) -> list[dict[str, Any]]:
    print(
        "trace replay: Llama-2-7B, A100-80GB, block 16, max_model_len 4096, max_num_seqs 128, "
        "max_num_batched_tokens 512, outputs on; ratio = engine wall / 1M bare SimPy timeouts"
    )
    rows = []
    for (trace, variant), build in product(jobs, builds):
        row = run_fresh("benchmarks.bench_traces", trace, variant, build=build)
        rows.append(row)
        print(
            f"  {trace:<14} {variant:<17} {build:<6} {row['requests']:>6,} requests: "
            f"{row['requests_per_s']:>8,.0f} req/s, "
            f"engine {row['wall_s']:.2f} s, reference {row['reference_s']:.2f} s, ratio {row['ratio']:.2f}, "
            f"{row['wakeups']:,} wake-ups for {row['iterations']:,} iterations "
            f"({row['wall_s'] / row['wakeups'] * 1e6:.0f} µs each), peak RSS {row['peak_rss_mib']:,.0f} MiB"
        )
    return rows


if __name__ == "__main__":
    if len(sys.argv) == 3:
        print(json.dumps(replay_once(sys.argv[1], sys.argv[2])))
    else:
        run_trace_benchmarks(JOBS, available_builds())
