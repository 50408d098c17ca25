"""``kvsim replay-run RUN -o DIR``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(commands) -> None:
    parser = commands.add_parser(
        "replay-run",
        help="replay a measured serving run (vLLM benchmark output) and compare it request by request",
        description="RUN is a replay file (YAML: the run's path plus what its files do not say, e.g. the "
        "GPU), or the run's own path (a BLIS per-request CSV, an LLMServingSim bench folder, a vllm bench "
        "serve JSON), with --set for what it lacks (e.g. --set gpu=H100-80GB).",
    )
    parser.add_argument("run", help="replay YAML, or a measured run's file or folder")
    parser.add_argument("-o", "--output", help="report folder (default: results/replays/<name>)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY.PATH=VALUE", help="override a replay-file key"
    )
    parser.set_defaults(func=cmd_replay_run)


def cmd_replay_run(args: argparse.Namespace) -> int:
    from sim.config import apply_overrides
    from sim.replay.compare import LATENCY_NAMES
    from sim.replay.pipeline import replay_run
    from sim.replay.report import not_compared_lines
    from sim.replay.spec import load_replay_spec, validate_replay_spec

    given = Path(args.run)
    if given.suffix in (".yaml", ".yml"):
        spec = load_replay_spec(given, args.set)
        base_dir = given.parent
    else:
        data: dict = {"name": _name_of(given), "run": {"path": str(given.resolve())}}
        apply_overrides(data, args.set)
        spec = validate_replay_spec(data, "command line")
        base_dir = Path.cwd()
    out_dir = Path(args.output) if args.output else Path("results") / "replays" / spec.name
    outcome = replay_run(spec, base_dir, out_dir, log=lambda message: print(message, file=sys.stderr))
    document = outcome.document
    print(
        f"kvsim replay-run {spec.name}: {document['run']['requests']:,} requests, cost model = "
        f"{document['simulation']['cost_model']}"
    )
    for scope in outcome.scopes:
        parts = []
        for latency, name in LATENCY_NAMES.items():
            statistic = "headline" if latency == "tpot_s" else "mean"
            measured = scope.metrics[latency]["measured"][statistic]
            simulated = scope.metrics[latency]["simulated"][statistic]
            error = scope.metrics[latency]["signed_error"][statistic]
            parts.append(f"{name} {_time(measured)} / {_time(simulated)} ({error:+.1%})")
        print(f"  {scope.name}: measured / kvsim: " + "; ".join(parts))
    whole = outcome.scopes[0]
    if whole.not_compared:
        print(
            f"  {whole.requests - whole.compared:,} of {whole.requests:,} measured requests not compared: "
            + "; ".join(not_compared_lines(whole.as_dict(), document["simulation"]))
        )
    print(f"report written to {out_dir}/ (report.md, report.html, comparison.json, figures/)")
    return 0


def _time(value: float) -> str:
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _name_of(path: Path) -> str:
    import re

    stem = path.stem if path.is_file() else f"{path.parent.name}-{path.name}"
    return re.sub(r"[^A-Za-z0-9_.-]", "-", stem).strip("-.")[:100] or "replay"
