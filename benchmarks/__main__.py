"""Run every benchmark: `python -m benchmarks [--quick] [--engine-sizes 10000,100000,1000000]`.

Speed and memory targets live here, never in unit tests. Each figure printed is measured on this
machine, one core, in a fresh subprocess per engine run (so peak RSS is that run's alone). The trace
replays also print their ratio to one million bare SimPy timeouts timed in the same subprocess, a
figure that a busy or different machine changes much less than seconds. The trace replays and the
engine benchmark run under the Python sources and, when `make native` built a current one, under the
compiled build (``sim.native``).
"""

from __future__ import annotations

import argparse

from benchmarks.bench_allocators import run_allocator_benchmarks
from benchmarks.bench_cluster import run_cluster_benchmarks
from benchmarks.bench_engine import run_engine_benchmarks
from benchmarks.bench_plan import run_plan_benchmarks
from benchmarks.bench_replay import run_replay_benchmarks
from benchmarks.bench_traces import JOBS, run_trace_benchmarks
from benchmarks.fresh import available_builds


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--engine-sizes", default=None, help="comma-separated request counts")
    parser.add_argument("--policies", default="paged,prefix,contiguous", help="engine benchmark policies")
    args = parser.parse_args()
    builds = available_builds()  # the sources, and the compiled build when it is current
    run_allocator_benchmarks(cycles=2_000 if args.quick else 20_000)
    run_trace_benchmarks(JOBS[-1:] if args.quick else JOBS, builds)
    run_replay_benchmarks(builds, runs=1 if args.quick else 3)
    sizes = args.engine_sizes or ("2000" if args.quick else "10000,100000,1000000")
    run_engine_benchmarks([int(size) for size in sizes.split(",")], args.policies.split(","), builds)
    run_cluster_benchmarks(500 if args.quick else 2_000)
    run_plan_benchmarks(builds, plan=not args.quick)  # the whole example plan: about 30 s


if __name__ == "__main__":
    main()
