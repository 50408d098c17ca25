"""Measured-run replay benchmark (issue 28's speed goal: under 1 s of engine time, compiled): the
9,000-request codegen run of BLIS's H100 Llama-2-7B server, prefix caching
(``configs/replays/h100-llama-2-7b-tp1-codegen.yaml``), simulated as ``kvsim replay-run`` simulates
it, without the comparison and the report. Each replay runs in a fresh subprocess; the figure is the engine's wall
time (``summary.json``'s ``wall_s``). The run's CSV is not redistributed (``reference_runs/README.md``
says where to get it): without it the benchmark is skipped and says so.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.fresh import ROOT, available_builds, peak_rss_mib, run_fresh

REPLAY = ROOT / "configs" / "replays" / "h100-llama-2-7b-tp1-codegen.yaml"
GOAL_S = 1.0  # issue 28: engine seconds of this replay with the compiled build


def replay_once() -> dict[str, Any]:
    from sim.replay.simulate import prepare_replay, simulate
    from sim.replay.spec import load_replay_spec, read_run

    spec = load_replay_spec(REPLAY)
    run = read_run(spec, REPLAY.parent)
    with tempfile.TemporaryDirectory() as folder:
        prepared = prepare_replay(run, spec, Path(folder) / "simulation")
        summary = simulate(prepared, Path(folder) / "simulation" / "results").result.summary
    return {
        "requests": summary["requests_total"],
        "iterations": summary["iterations"],
        "wakeups": summary["engine_wakeups"],
        "wall_s": summary["wall_s"],
        "peak_rss_mib": peak_rss_mib(),
    }


def missing_run() -> str | None:
    """Why the replay cannot run here (its measured run's file is absent), or None."""
    from sim.replay.spec import load_replay_spec

    path = REPLAY.parent / load_replay_spec(REPLAY).run.path
    return None if path.is_file() else f"{path.resolve().relative_to(ROOT)} is not here"


def run_replay_benchmarks(builds: Sequence[str] = ("python",), runs: int = 3) -> list[dict[str, Any]]:
    print(f"measured-run replay: {REPLAY.relative_to(ROOT)}, {runs} fresh runs per build")
    problem = missing_run()
    if problem is not None:
        print(f"  (skipped: {problem}; reference_runs/README.md says where to get it)")
        return []
    rows = []
    for build in builds:
        walls = []
        for _ in range(runs):
            row = run_fresh("benchmarks.bench_replay", "once", build=build)
            rows.append(row)
            walls.append(row["wall_s"])
        goal = f" (goal: under {GOAL_S:.0f} s)" if build == "native" else ""
        print(
            f"  {build:<6} {row['requests']:,} requests, {row['iterations']:,} iterations in "
            f"{row['wakeups']:,} wake-ups: engine {min(walls):.2f}-{max(walls):.2f} s, "
            f"median {statistics.median(walls):.2f} s{goal}; peak RSS {row['peak_rss_mib']:,.0f} MiB"
        )
    return rows


if __name__ == "__main__":
    if sys.argv[1:] == ["once"]:
        print(json.dumps(replay_once()))
    else:
        run_replay_benchmarks(available_builds())
