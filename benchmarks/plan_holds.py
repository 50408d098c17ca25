"""Does a plan's answer hold? Every candidate's maximum rate, run again ten times longer than the
probe that passed it, with seeds the plan never used, judged by the plan's own SLOs.

    python -m benchmarks.plan_holds configs/plan/small-chat-l4.yaml [--out DIR] [--factor 10] [--jobs 2]

It runs the plan first (into ``--out``, default a temporary folder; a finished plan folder is
reused). Not a unit test: the check simulates about as much as the plan's confirmations again
(minutes for the shipped A100-vs-H100 plan). Exits 1 when a candidate's rate breaks an SLO.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from sim.planning.plans.run import run_plan
from sim.planning.plans.search import describe, violations
from sim.planning.plans.spec import Plan, load_plan_spec
from sim.planning.sweeps.executors import LocalExecutor
from sim.planning.sweeps.tasks import PointTask, run_point


def long_runs(plan: Plan, document: dict[str, Any], factor: float) -> list[tuple[str, int, PointTask]]:
    """A run ``factor`` times its shortest passing probe for every candidate with a maximum rate,
    with two seeds neither the search nor its confirmations used."""
    probes = {probe["number"]: probe for probe in document["probes"]}
    used = plan.spec.search.seeds_for(False) + plan.spec.search.seeds_for(True)
    fresh = [max(used) + 1, max(used) + 2]
    tasks = []
    for result in document["candidates"]:
        rate = result.get("max_rate_per_s")
        if rate is None:
            continue
        candidate = next(c for c in plan.candidates if c.key == result["key"])
        passing = [
            probes[n]
            for n in result["probes"]
            if probes[n]["rate_per_s"] == rate and probes[n]["passed"] and not probes[n].get("confirmation")
        ]
        requests = int(factor * min(p["requests"] for p in passing)) if passing else None
        for seed in fresh:
            tasks.append((result["key"], seed, plan.probe_task(candidate, rate, seed, requests)))
    return tasks


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plan_holds")
    parser.add_argument("plan")
    parser.add_argument("--out", default=None, help="the plan's folder (default: a temporary one)")
    parser.add_argument("--factor", type=float, default=10.0)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    plan = load_plan_spec(args.plan)
    with tempfile.TemporaryDirectory(prefix="kvsim-plan-holds-") as tmp:
        out = Path(args.out) if args.out else Path(tmp) / plan.spec.name
        document = run_plan(plan, out, LocalExecutor(args.jobs)).document
        tasks = long_runs(plan, document, args.factor)
        with ProcessPoolExecutor(args.jobs) as pool:
            outcomes = list(pool.map(run_point, [task for *_, task in tasks]))
    broken = 0
    for (key, seed, task), outcome in zip(tasks, outcomes, strict=True):
        if not outcome.ok:
            print(f"{key}  seed {seed}: failed to run: {outcome.error}")
            broken += 1
            continue
        steady = outcome.summaries[0]["steady"]
        found = violations(steady, plan.spec.slos)
        broken += bool(found)
        requests = task.config["workload"]["num_requests"]
        verdict = "holds" if not found else "BREAKS: " + "; ".join(describe(found))
        print(
            f"{key}  seed {seed}  {requests:,} requests  p99 TTFT {steady.get('ttft_p99_s') or float('nan'):.2f} s  "
            f"queue growth {steady.get('queue_growth_frac') or 0:.3f}  {verdict}"
        )
    print(f"{len(tasks) - broken} of {len(tasks)} long runs hold")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
