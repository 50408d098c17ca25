"""``kvsim validate`` on the command line: :func:`register` adds the subcommand to ``kvsim``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_OUTPUT_DIR = Path("results") / "validation"


def cmd_validate(args: argparse.Namespace) -> int:
    from sim.validation.claims import DEFAULT_CONFIG_DIR, load_claims
    from sim.validation.judging import VERDICTS, shown_value
    from sim.validation.report import run_validation, verdict_counts

    config_dir = Path(args.configs) if args.configs else DEFAULT_CONFIG_DIR
    claims = load_claims(config_dir, args.names)
    if args.list:
        for claim in claims:
            print(
                f"{claim.spec.number:>4}  {claim.name:<40} {'fast' if claim.spec.fast else '    '}  {claim.spec.title}"
            )
        return 0
    out_dir = Path(args.output) if args.output else DEFAULT_OUTPUT_DIR
    log = (lambda message: None) if args.quiet else (lambda message: print(message, file=sys.stderr))
    started = time.perf_counter()
    out_dir, results = run_validation(claims, out_dir, fast=args.fast, log=log)
    wall = time.perf_counter() - started
    for result in results:
        for target in result.targets:
            spec, t = result.claim.spec, target.target
            print(
                f"{spec.number:>4}  {t.label[:58]:<58}  claimed {t.claimed[:18]:<18}  simulated "
                f"{shown_value(t, target.measured)[:30]:<30}  {target.verdict}"
            )
    counts = verdict_counts(results)
    print(
        f"kvsim validate: {len(results)} claim(s) in {wall:.1f} s: "
        + ", ".join(f"{counts[v]} {v}" for v in VERDICTS)
        + f"; written to {out_dir}/ (validation.md, validation.csv, figures/, data/)"
    )
    return 0


def register(subparsers: Any) -> None:
    """Add ``kvsim validate`` to the CLI's subcommands."""
    parser = subparsers.add_parser(
        "validate",
        help="reproduce published KV-cache numbers and say where they hold",
        description="Run the claims in configs/validation/ and write validation.md, validation.csv "
        "and figures. Verdicts: holds / does not hold / not reproducible.",
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="claims to run: file names without .yaml, or claim numbers (default: all)",
    )
    parser.add_argument("-o", "--output", help=f"results folder (default: {DEFAULT_OUTPUT_DIR}/)")
    parser.add_argument("--fast", action="store_true", help="smaller request counts and sweeps (smoke run)")
    parser.add_argument(
        "--configs", help="folder of claim YAMLs (default: the project's configs/validation/)"
    )
    parser.add_argument("--list", action="store_true", help="list the claims and exit")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    parser.set_defaults(func=cmd_validate)
