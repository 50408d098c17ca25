"""Command line: parse, call one function, print."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

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


def cmd_run(args: argparse.Namespace) -> int:
    from sim.config import load_experiment
    from sim.results import staged_output_dir, write_run_files
    from sim.runner import run_experiment

    config_path = Path(args.config)
    config = load_experiment(config_path, args.set)
    out_dir = Path(args.output) if args.output else Path("results") / config.name
    show_progress = not args.quiet and os.environ.get("TQDM_DISABLE") != "1"
    with staged_output_dir(out_dir) as staging:
        # Tables stream into the staging folder while each variant runs; the rest is written after.
        results = run_experiment(config, config_path, progress=show_progress, out_dir=staging)
        write_run_files(staging, config.model_dump(mode="json"), results, figures=config.output.figures)
    print(f"kvsim run {config.name}: cost model = {results[0].summary['cost_model']}")
    for result in results:
        print(f"  [{result.name}] " + " | ".join(result.capacity_lines))
    print(format_summary_table([result.summary for result in results]))
    print(f"results written to {out_dir}/ (summary.csv, per-variant folders, figures/)")
    return 0


def format_summary_table(summaries: list[dict]) -> str:
    header = [label for _, label, _ in SUMMARY_COLUMNS]
    rows = []
    for summary in summaries:
        row = []
        for key, _, fmt in SUMMARY_COLUMNS:
            value = summary.get(key)
            row.append("n/a" if value is None else fmt.format(value))
        rows.append(row)
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True))
        for line in [header, *rows]
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvsim", description="Simulate KV-cache allocation policies.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run an experiment YAML and write curves to results/")
    run.add_argument("config", help="experiment YAML")
    run.add_argument("-o", "--output", help="results folder (default: results/<config name>)")
    run.add_argument(
        "--set", action="append", default=[], metavar="KEY.PATH=VALUE", help="override a config key"
    )
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=cmd_run)
    _register_optional(commands)
    return parser


def _register_optional(commands) -> None:
    from workloads.cli import register as register_workloads

    register_workloads(commands)
    from calibrate.cli import register as register_calibrate

    register_calibrate(commands)
    from sim.validation import register as register_validate

    register_validate(commands)


def main(argv: list[str] | None = None) -> int:
    from policies.base import PolicyError
    from sim.config import ConfigError
    from sim.costs import CostModelError
    from workloads.base import WorkloadError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ConfigError, WorkloadError, PolicyError, CostModelError, FileNotFoundError) as error:
        print(f"kvsim: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
