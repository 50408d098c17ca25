"""``kvsim trace-stats FILE|CONFIG``: the statistics of a trace file or a workload config."""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from workloads.base import SkippedRowsWarning, TraceError, TraceWarning, WorkloadError
from workloads.stats import DEFAULT_BLOCK_SIZES, trace_stats

# The flags that set, for a raw trace file, what a config's workload settings set.
FLAGS = {"on_bad_row": "--skip-bad-rows", "on_unsorted": "--sort"}


def register(subparsers: Any) -> None:
    """Add the ``trace-stats`` subcommand to an argparse ``add_subparsers()`` object."""
    parser = subparsers.add_parser(
        "trace-stats",
        help="counts, rates, burstiness, length percentiles and prefix reuse of a trace or workload",
        description=(
            "Statistics of a trace file (Azure CSV, Mooncake JSONL or a length table; format detected "
            "from its header) or of the workload of a YAML config (its `workload:` section, with the "
            "config's transformations applied)."
        ),
    )
    parser.add_argument(
        "target",
        metavar="FILE|CONFIG",
        help="trace file, or YAML config (.yaml/.yml); relative to the current folder",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        action="append",
        dest="block_sizes",
        metavar="TOKENS",
        help=f"block size for the block-granular prefix-reuse bound (repeatable; default {DEFAULT_BLOCK_SIZES[0]})",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for configs without one (default 0)")
    parser.add_argument("--max-requests", type=int, default=None, help="stop after this many requests")
    parser.add_argument(
        "--skip-bad-rows", action="store_true", help="raw files: skip malformed rows (counted)"
    )
    parser.add_argument(
        "--sort", action="store_true", help="raw files: sort rows whose timestamps go backwards"
    )
    parser.add_argument("--json", action="store_true", help="print the statistics as JSON")
    parser.set_defaults(func=run_trace_stats)


def run_trace_stats(args: argparse.Namespace) -> int:
    if args.seed < 0:
        print(f"kvsim trace-stats: error: --seed must be non-negative (got {args.seed})", file=sys.stderr)
        return 2
    raw_file = Path(args.target).suffix.lower() not in (".yaml", ".yml")  # else a config's settings apply
    stats: dict[str, Any] | None = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TraceWarning)
        try:
            stats = trace_stats(
                args.target,
                seed=args.seed,
                block_sizes=tuple(args.block_sizes or DEFAULT_BLOCK_SIZES),
                on_bad_row="skip" if args.skip_bad_rows else "error",
                on_unsorted="sort" if args.sort else "error",
                max_requests=args.max_requests,
            )
        except TraceError as error:
            failure = error_message(error, raw_file)
        except (WorkloadError, ValidationError, OSError) as error:
            failure = str(error)
    trace_warnings = [item.message for item in caught if isinstance(item.message, TraceWarning)]
    for item in caught:  # anything else is shown as Python would have shown it
        if not isinstance(item.message, TraceWarning):
            warnings.showwarning(item.message, item.category, item.filename, item.lineno)
    for line in warning_lines(trace_warnings, stats):
        print(f"kvsim trace-stats: warning: {line}", file=sys.stderr)
    if stats is None:
        print(f"kvsim trace-stats: error: {failure}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(stats, indent=2, default=str))
    else:
        print(format_stats(stats, args.target))
    return 0


def error_message(error: TraceError, raw_file: bool) -> str:
    """The error as the command line says it: for a raw file, the flag that accepts what was refused
    (``--skip-bad-rows``), not the config setting (``on_bad_row: skip``) the file has none of."""
    flag = FLAGS.get(error.remedy.setting) if error.remedy is not None and raw_file else None
    if flag is None or error.remedy is None:
        return str(error)
    return f"{error.where}{error.reason} (rerun with {flag} to {error.remedy.effect})"


def warning_lines(caught: Sequence[Warning], stats: dict[str, Any] | None) -> list[str]:
    """One line per trace warning; the skipped rows of each file in one line: how many (when the
    statistics are complete) and the first of them."""
    lines = []
    skipped: dict[str, list[SkippedRowsWarning]] = {}
    for warning in caught:
        if isinstance(warning, SkippedRowsWarning):
            skipped.setdefault(warning.path, []).append(warning)
        else:
            lines.append(str(warning))
    for path, found in skipped.items():
        first = min(found, key=lambda warning: warning.line)
        total = (stats or {}).get("counts", {}).get("rows_skipped") if len(skipped) == 1 else None
        how_many = f"{total:,} malformed row{'s' if total != 1 else ''}" if total else "malformed rows"
        lines.insert(0, f"{path}: skipped {how_many}; the first, line {first.line}: {first.problem}")
    return lines


def _num(value: float, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.{digits}f}"


def format_stats(stats: dict[str, Any], title: str) -> str:
    """A readable table of :func:`workloads.stats.trace_stats`' result."""
    lines = [f"{title}" + (f"  ({stats['format']})" if "format" in stats else "")]

    def row(label: str, text: str) -> None:
        lines.append(f"  {label:<32}{text}")

    row("requests", _num(stats["requests"]))
    if "span_s" in stats:
        row("span", f"{_num(stats['span_s'])} s ({stats['span_s'] / 60:.1f} min)")
        row("rate", f"{stats['rate_per_s']:.2f} req/s")
        row("inter-arrival CV", f"{stats['interarrival_cv']:.2f}  (1 = Poisson)")
        row("peak", f"{stats['peak_per_s']} req/s, {stats['peak_per_min']} req/min")
        empty = f"{stats['empty_minutes']} of {stats['minutes']} minutes empty (from the first arrival)"
        if "empty_wallclock_minutes" in stats:
            empty += (
                f"; {stats['empty_wallclock_minutes']} of {stats['wallclock_minutes']} wall-clock minutes"
            )
        row("longest gap", f"{stats['longest_gap_s']:.1f} s; {empty}")
        row(
            "distinct arrival times",
            f"{_num(stats['distinct_arrival_times'])} ({100 * stats['tied_consecutive_frac']:.1f} % of "
            "consecutive requests share a timestamp)",
        )
    else:
        row("arrivals", "none in the file (lengths only)")
    header = f"  {'':<32}" + "".join(f"{name:>11}" for name in ("mean", "p50", "p90", "p99", "min", "max"))
    lines.append("")
    lines.append(header)
    tables = [("prompt tokens", stats.get("prompt_tokens")), ("output tokens", stats.get("output_tokens"))]
    hashes = stats.get("hash_blocks")
    if hashes:
        tables.append((f"hash ids ({hashes['hash_block_len']}-token blocks)", hashes["per_request"]))
    for label, values in tables:
        if values:
            cells = "".join(f"{_num(values[key]):>11}" for key in ("mean", "p50", "p90", "p99", "min", "max"))
            lines.append(f"  {label:<32}{cells}")
    reuse = stats.get("prefix_reuse")
    if reuse and not reuse["cached_prompt_tokens"] and not hashes:
        lines.append("")
        row("prefix reuse", "none: no two prompts share content")
    elif reuse:
        lines.append("")
        lines.append("  prefix reuse upper bound (unlimited cache, arrival order), % of prompt tokens:")
        row("  token-exact", f"{100 * reuse['cached_prompt_tokens_frac']:.2f} %")
        row(
            "  last token recomputed",
            f"{100 * reuse['cached_prompt_tokens_frac_last_token_recomputed']:.2f} %",
        )
        for size, frac in reuse["cached_prompt_tokens_frac_by_block_size"].items():
            row(f"  full {size}-token blocks", f"{100 * frac:.2f} %  (vLLM-style block cache)")
        row("  requests with a hit", f"{100 * reuse['requests_with_cached_prefix_frac']:.1f} %")
    if hashes:
        lines.append("")
        lines.append("  from hash ids:")
        row(
            "  block references",
            f"{_num(hashes['block_references'])} ({_num(hashes['distinct_blocks'])} distinct)",
        )
        row("  references seen before", f"{100 * hashes['block_reuse_frac']:.1f} %")
        row("  prompt tokens in seen prefix", f"{100 * hashes['cached_prompt_tokens_frac']:.1f} %")
        row(
            "  reuse past the first block",
            f"{100 * hashes['requests_reusing_beyond_first_block_frac']:.1f} % of requests",
        )
        row("  length/hash mismatches", f"{hashes['length_mismatches']}")
        row("  non-prefix-shaped requests", f"{hashes['non_prefix_shaped_requests']}")
    counts = stats.get("counts", {})
    notes = {
        key: value
        for key, value in counts.items()
        if isinstance(value, int) and value and key not in ("rows_read", "requests")
    }
    if notes:
        lines.append("")
        row("adjustments", ", ".join(f"{key}={value}" for key, value in notes.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (``python -m workloads.cli trace-stats FILE``)."""
    parser = argparse.ArgumentParser(prog="kvsim")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
