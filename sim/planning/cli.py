"""``kvsim sweep`` and ``kvsim plan`` on the command line: :func:`register` adds both subcommands."""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sim.planning.sweeps.executors import (
    DEFAULT_DASK_TIMEOUT_S,
    Executor,
    ExecutorError,
    local_jobs,
    make_executor,
    start_fork_server,
)

Result = TypeVar("Result")


def cmd_sweep(args: argparse.Namespace) -> int:
    from sim.planning.sweeps.driver import describe_counts, progress_enabled
    from sim.planning.sweeps.run import SWEEP_KIND, run_sweep
    from sim.planning.sweeps.spec import load_sweep_spec
    from sim.storage import check_output_target

    _start_local_workers(args)
    sweep = load_sweep_spec(args.sweep, args.set)  # every point validated before anything runs
    out_dir = Path(args.output) if args.output else Path("results") / sweep.name
    check_output_target(out_dir, SWEEP_KIND)
    started = time.perf_counter()
    result = _on_executor(
        args,
        "sweep",
        out_dir,
        f"kvsim sweep {sweep.name}: {len(sweep.points)} points",
        lambda executor, log: run_sweep(
            sweep,
            out_dir,
            executor,
            retry_failed=args.retry_failed,
            progress=progress_enabled(args.quiet),
            log=log,
        ),
    )
    if isinstance(result, int):
        return result
    wall = time.perf_counter() - started
    print(
        f"kvsim sweep {sweep.name}: {len(sweep.points)} points: {describe_counts(result.counts)}; {wall:.1f} s"
    )
    failed = result.table[result.table["status"] == "failed"]
    for _, row in failed.drop_duplicates("point_id").iterrows():
        print(f"  failed: point {row['point_index']} ({row['point_id']}): {row['error']}")
    print(f"written to {result.out_dir}/ (sweep.parquet, sweep.csv, sweep.json, points/, figures/)")
    return 1 if len(failed) else 0


def cmd_plan(args: argparse.Namespace) -> int:
    from sim.planning.plans.run import PLAN_KIND, run_plan
    from sim.planning.plans.spec import load_plan_spec
    from sim.planning.sweeps.driver import describe_counts, progress_enabled
    from sim.storage import check_output_target

    _start_local_workers(args)
    # Every candidate's probe configs are validated before anything runs.
    plan = load_plan_spec(args.plan, args.set)
    out_dir = Path(args.output) if args.output else Path("results") / plan.spec.name
    check_output_target(out_dir, PLAN_KIND)
    started = time.perf_counter()
    result = _on_executor(
        args,
        "plan",
        out_dir,
        f"kvsim plan {plan.spec.name}: {len(plan.candidates)} candidates",
        lambda executor, log: run_plan(
            plan,
            out_dir,
            executor,
            retry_failed=args.retry_failed,
            progress=progress_enabled(args.quiet),
            log=log,
            wall_s=lambda: time.perf_counter() - started,
        ),
    )
    if isinstance(result, int):
        return result
    document = result.document
    print(
        f"kvsim plan {plan.spec.name}: {describe_counts(result.counts)}; {time.perf_counter() - started:.1f} s"
    )
    print(summary_lines(document))
    print(
        f"written to {result.out_dir}/ (report.md, report.html, plan.json, sweep.parquet, points/, figures/)"
    )
    return 0


REASON_WIDTH = 80


def summary_lines(document: dict[str, Any]) -> str:
    """The recommendation table, as text for the terminal."""
    from sim.planning.report.units import rate

    target = document["target_rate_per_s"]
    width = max([len(c["key"]) for c in document["candidates"]] + [9])
    count_header = "GPUs@" + format(target, "g") if target is not None else "per GPU"
    lines = [f"  {'candidate':<{width}} {'max rate':>14} {count_header:>9}  binding limit / reason"]
    for c in document["candidates"]:
        if c.get("rank"):
            prefix = "≥" if c["status"] == "at_max_rate" else ""
            count = c["gpus_for_target"] if target is not None else f"{c['rate_per_gpu_per_s']:.3g}"
            lines.append(
                f"  {c['key']:<{width}} {prefix + rate(c['max_rate_per_s']):>14} {count:>9}  {c['binding']['label']}"
            )
        else:
            # The whole reason, wrapped under its column (a cut one can stop mid-word, mid-number).
            reason = textwrap.wrap(c.get("reason", ""), REASON_WIDTH) or [""]
            lines.append(f"  {c['key']:<{width}} {c['status']:>14} {'-':>9}  {reason[0]}")
            indent = " " * (2 + width + 1 + 14 + 1 + 9 + 2)
            lines += [indent + more for more in reason[1:]]
    best = document["recommendation"]
    lines.append(f"  recommended: {best}" if best else "  no candidate meets the SLOs")
    return "\n".join(lines)


def _on_executor(
    args: argparse.Namespace,
    command: str,
    out_dir: Path,
    heading: str,
    run: Callable[[Executor, Callable[[str], None]], Result],
) -> Result | int:
    """``run(executor, log)`` on the executor the flags ask for (closed afterwards), after logging
    ``<heading> on <executor>``; an exit code instead when the executor cannot start (2) or the run
    is interrupted (130)."""
    log = _log(args.quiet)
    executor = _executor(args)
    if executor is None:
        return 2
    log(f"{heading} on {executor.description}")
    try:
        return run(executor, log)
    except KeyboardInterrupt:
        return _interrupted(command, out_dir)
    finally:
        executor.close()


def _start_local_workers(args: argparse.Namespace) -> None:
    """Local workers' fork server starts while the spec is read; a Dask cluster is reached only
    after the spec has been read (an error in it is never held up by a cluster)."""
    jobs = local_jobs(args.jobs, args.dask, args.dask_local)
    if jobs is not None and jobs > 1:
        start_fork_server()


def _executor(args: argparse.Namespace) -> Executor | None:
    """The executor the flags ask for, or None after printing why it cannot start (before any work)."""
    try:
        return make_executor(args.jobs, args.dask, args.dask_local, args.dask_timeout)
    except ExecutorError as error:
        print(f"\nkvsim: error: {error}", file=sys.stderr)
        return None


def _interrupted(command: str, out_dir: Path) -> int:
    """Ctrl-C or SIGTERM: finished points stay (they are complete); the run resumes from them."""
    points = out_dir / "points"
    done = len([p for p in points.iterdir() if not p.name.startswith(".")]) if points.is_dir() else 0
    print(
        f"\nkvsim {command}: interrupted; {done} finished point(s) kept in {points}/, the ones in flight "
        f"dropped. Run the same command again to resume.",
        file=sys.stderr,
    )
    return 130


def _log(quiet: bool):
    if quiet:
        return lambda message: None
    return lambda message: print(message, file=sys.stderr)


def _executor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-j", "--jobs", type=int, help="local worker processes (default: one per core)")
    parser.add_argument(
        "--dask", metavar="ADDRESS", help="run on an existing Dask scheduler (tcp://HOST:PORT)"
    )
    parser.add_argument("--dask-local", type=int, metavar="N", help="start a Dask LocalCluster of N workers")
    parser.add_argument(
        "--dask-timeout",
        type=float,
        default=DEFAULT_DASK_TIMEOUT_S,
        metavar="S",
        help=f"give up connecting to the scheduler after S seconds (default {DEFAULT_DASK_TIMEOUT_S:g})",
    )
    parser.add_argument("--retry-failed", action="store_true", help="rerun points that failed before")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar or log lines")


def register(subparsers: Any) -> None:
    """Add ``kvsim sweep`` and ``kvsim plan`` to the CLI's subcommands."""
    sweep = subparsers.add_parser(
        "sweep",
        help="run an experiment over axes of config values (resumable; local processes or Dask)",
        description="Expand a sweep file's axes into points (one experiment each), validate them all, run "
        "the ones not done yet and write sweep.parquet/.csv (one row per point x variant) and figures.",
    )
    sweep.add_argument("sweep", help="sweep YAML")
    sweep.add_argument(
        "-o", "--output", help="sweep folder (default: results/<sweep name>); resumed if it exists"
    )
    sweep.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a key of the base experiment",
    )
    _executor_arguments(sweep)
    sweep.set_defaults(func=cmd_sweep)

    plan = subparsers.add_parser(
        "plan",
        help="capacity plan: max sustainable rate per candidate under SLOs, GPUs for a target, report",
        description="Search each candidate's maximum request rate that meets every SLO in steady state, size "
        "the GPUs for the target rate, and write report.md, report.html and plan.json.",
    )
    plan.add_argument("plan", help="plan YAML")
    plan.add_argument(
        "-o", "--output", help="plan folder (default: results/<plan name>); resumed if it exists"
    )
    plan.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a key of the plan file (e.g. slos.ttft_p99_s=1.5, search.min_requests=2000)",
    )
    _executor_arguments(plan)
    plan.set_defaults(func=cmd_plan)
