"""Command line: parse, call one function, print."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Any, Literal

from sim.commands.bad_input import input_errors

SUMMARY_COLUMNS = [
    ("variant", "variant", "{}"),
    ("requests_finished", "finished", "{:d}"),
    ("requests_rejected", "rejected", "{:d}"),
    ("admission_waits", "waited KV", "{:d}"),
    ("preemptions", "preempt.", "{:d}"),
    ("oom_failures", "OOM fail", "{:d}"),
    ("peak_running", "peak run", "{:d}"),
    ("mean_running", "mean run", "{:.1f}"),
    ("mean_used_frac", "used %", "{:.1%}"),
    ("mean_reserved_frac", "reserv. %", "{:.1%}"),
    ("mean_internal_frag_frac", "int.frag %", "{:.1%}"),
    ("mean_external_frag_frac", "ext.frag %", "{:.1%}"),
    ("mean_cached_frac", "cached %", "{:.1%}"),
    ("memory_saved_by_sharing_frac", "shared %", "{:.1%}"),
    ("output_tokens_per_s", "out tok/s", "{:.0f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.3f}"),
    ("e2e_p99_s", "e2e p99 s", "{:.2f}"),
]

# Printed for variants with a cluster section: the router's effect and the load imbalance.
CLUSTER_COLUMNS = [
    ("variant", "variant", "{}"),
    ("replicas", "replicas", "{:d}"),
    ("router", "router", "{}"),
    ("prefix_cache_hit_rate", "hit %", "{:.1%}"),
    ("prefix_cache_hit_rate_min", "hit % min", "{:.1%}"),
    ("prefix_cache_hit_rate_max", "hit % max", "{:.1%}"),
    ("requests_max_over_mean", "req max/mean", "{:.2f}"),
    ("requests_cv", "req CV", "{:.2f}"),
    ("kv_usage_max_over_mean", "KV max/mean", "{:.2f}"),
    ("kv_usage_cv", "KV CV", "{:.2f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.3f}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.3f}"),
]


class StrictRunFailed(Exception):
    """``--strict``: the run left requests unserved; nothing was written."""


def progress_enabled(quiet: bool = False) -> bool:
    """Progress bars only on a terminal: in logs (CI, Slurm, ``| tee``) their escape sequences are noise."""
    if quiet or os.environ.get("TQDM_DISABLE") == "1" or os.environ.get("CI"):
        return False
    return sys.stderr.isatty()


def run_progress(quiet: bool = False) -> Literal["bar", "log"] | None:
    """``kvsim run``'s progress: the bar on a terminal, plain lines at an interval in a log (a long
    run is not silent there), nothing with ``-q``."""
    if quiet:
        return None
    return "bar" if progress_enabled() else "log"


def _warn(message: str) -> None:
    print(f"kvsim: warning: {message}", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from sim.config import load_experiment
    from sim.outputs.outcomes import format_outcomes, summarize_outcomes
    from sim.results import write_run_files
    from sim.runner import prepare_experiment, run_experiment
    from sim.storage import check_output_target, config_hash, staged_output_dir

    config_path = Path(args.config)
    config = load_experiment(config_path, args.set)
    out_dir = Path(args.output) if args.output else Path("results") / config.name
    check_output_target(out_dir, "run")  # before any simulation: never replace what kvsim did not write
    prepared = prepare_experiment(config, config_path)  # every variant checked before the first runs
    for warning in prepared.warnings:
        _warn(warning)
    resolved = config.model_dump(mode="json")
    with staged_output_dir(out_dir, "run", config_hash(resolved), log=_log) as staging:
        # Tables stream into the staging folder while each variant runs; the rest is written after.
        results = run_experiment(
            config, config_path, progress=run_progress(args.quiet), out_dir=staging, prepared=prepared
        )
        outcomes = {
            result.name: summarize_outcomes(result.sink.requests(columns=["outcome", "reason"]))
            for result in results
        }
        report = format_outcomes(outcomes)
        if args.strict and report:
            # The staging folder is removed on the way out: a strict failure leaves no results folder
            # (and an earlier result in the same place is kept as it was).
            print(report, file=sys.stderr)
            unserved = sum(item.unserved for item in outcomes.values())
            variants = sum(1 for item in outcomes.values() if item.unserved)
            where = f"over {variants} variants together" if variants > 1 else "in one variant"
            raise StrictRunFailed(
                f"--strict: {unserved:,} request(s) were not served {where} (each variant's count above; "
                f"every variant replays the same requests); no results written to "
                f"{out_dir}/. Rerun without --strict to inspect them in requests.parquet (outcome, reason)."
            )
        write_run_files(staging, resolved, results)
        if config.output.figures:
            from sim.figures import write_figures
            from sim.results import load_results

            # Drawn from the folder just written, as any reader of the results would see it.
            write_figures(load_results(staging), staging / "figures")
    first = results[0].summary
    print(
        f"kvsim run {config.name}: cost model = {first['cost_model']}; error band: {first['cost_model_error_band']}"
    )
    for line in capacity_report(results):
        print(line)
    print(format_summary_table([result.summary for result in results]))
    clusters = [result.summary for result in results if result.replica_summaries is not None]
    if clusters:
        print("clusters (pool columns above are per replica; shares over the replicas' pools together):")
        print(format_summary_table(clusters, CLUSTER_COLUMNS))
    print(f"results written to {out_dir}/ (summary.csv, per-variant folders, figures/)")
    if report:
        print(report, file=sys.stderr)
    return 0


def capacity_report(results: list) -> list[str]:
    """vLLM's capacity lines, once per distinct pool (variants usually share it)."""
    from sim.results import group_capacity_lines

    return [f"  [{', '.join(names)}] " + " | ".join(lines) for names, lines in group_capacity_lines(results)]


def _log(message: str) -> None:
    print(message, file=sys.stderr)


def _no_negative_zero(cell: str) -> str:
    """``-0.0%`` (a tiny negative rounded away) printed as ``0.0%``."""
    return cell[1:] if cell.startswith("-") and not any(digit in cell for digit in "123456789") else cell


def format_summary_table(summaries: list[dict], columns: list[tuple[str, str, str]] = SUMMARY_COLUMNS) -> str:
    header = [label for _, label, _ in columns]
    rows = []
    for summary in summaries:
        row = []
        for key, _, fmt in columns:
            value = summary.get(key)
            row.append("n/a" if value is None else _no_negative_zero(fmt.format(value)))
        rows.append(row)
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True))
        for line in [header, *rows]
    ]
    return "\n".join(lines)


class _Version(argparse.Action):
    """``--version``: the installed version and which engine build runs, worked out only when asked
    (telling a stale compiled build from a current one hashes every source file)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_line())
        parser.exit()


def version_line() -> str:
    """``kvsim 0.1.0, engine_build python (the compiled build is not in use: ...)``: the package's
    version (its installed metadata) and ``engine_build`` as summary.json records it."""
    from sim.native import build_status, engine_build
    from sim.storage.folders import kvsim_version

    return f"kvsim {kvsim_version()}, engine_build {engine_build()} ({build_status()})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvsim", description="Simulate KV-cache allocation policies.")
    parser.add_argument(
        "--version", action=_Version, help="print the version and whether the compiled build is in use"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run an experiment YAML and write curves to results/")
    run.add_argument("config", help="experiment YAML")
    run.add_argument("-o", "--output", help="results folder (default: results/<config name>)")
    run.add_argument(
        "--set", action="append", default=[], metavar="KEY.PATH=VALUE", help="override a config key"
    )
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    run.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 1, no results folder) if any request is rejected or fails for lack of KV memory",
    )
    run.set_defaults(func=cmd_run)
    _register_optional(commands)
    return parser


def _register_optional(commands) -> None:
    from workloads.cli import register as register_workloads

    register_workloads(commands)
    from calibrate.cli import register as register_calibrate

    register_calibrate(commands)
    from sim.validation.cli import register as register_validate

    register_validate(commands)
    from sim.planning.cli import register as register_planning

    register_planning(commands)
    from sim.replay.cli import register as register_replay

    register_replay(commands)
    from sim.listing import register as register_listings

    register_listings(commands)
    _register_config_reference(commands)
    from sim.outputs.columns import register as register_columns

    register_columns(commands)
    from sim.commands.check import register as register_check

    register_check(commands)
    from sim.commands.schema import register as register_schema

    register_schema(commands)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _interrupt)  # `timeout` and Slurm stop jobs with SIGTERM
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return int(args.func(args) or 0)
    except input_errors() as error:
        print(f"{_fresh_line()}kvsim: error: {error}", file=sys.stderr)
        return 2
    except StrictRunFailed as error:
        print(f"{_fresh_line()}kvsim: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            f"{_fresh_line()}kvsim: interrupted; unfinished output removed, nothing written", file=sys.stderr
        )
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A trace warning (a row skipped or repaired, as the config asked) or a config warning (a key
    repeated, a policy SGLang's scheduler was not built for) is news about the user's file: one line,
    as kvsim's other warnings, without the Python source line that raised it."""
    from sim.config import ConfigWarning
    from workloads.base import TraceWarning

    if issubclass(category, (TraceWarning, ConfigWarning)):
        _warn(str(message))
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


_python_showwarning = warnings.showwarning


def _fresh_line() -> str:
    # A progress bar may hold the terminal's current line; in a log there are no bars, so no blank line.
    return "\n" if sys.stderr.isatty() else ""


def _interrupt(signum: int, frame: object) -> None:
    # Unwinding as for Ctrl-C lets the staged output folders remove themselves.
    raise KeyboardInterrupt


def _register_config_reference(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "config-reference",
        help="print the configuration reference (Markdown; docs/config-reference.md is this output)",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="the reference of plan and sweep files instead (docs/plan-reference.md is this output)",
    )
    parser.set_defaults(func=cmd_config_reference)


def cmd_config_reference(args: argparse.Namespace) -> int:
    """(Here, not in sim/reference.py: the plan reference reuses that module's tables, so the command
    that prints either stands above both.)"""
    if args.plan:
        from sim.planning import reference as plan_reference

        sys.stdout.write(plan_reference.markdown())
    else:
        from sim.reference import markdown

        sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
