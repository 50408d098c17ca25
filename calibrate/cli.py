"""``kvsim calibrate``: the argparse subcommand (wired into ``sim/cli.py`` with :func:`register`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from calibrate import TORCH_HINT
from calibrate.grids import GRID_NAMES


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``calibrate`` subcommand; it sets ``func`` to :func:`run`."""
    parser = subparsers.add_parser(
        "calibrate",
        help="time a real torch paged-attention layer and write a cost profile, or (--from-runs) fit "
        "the derated model's serving terms to measured runs",
        description=(
            "Build one decoder layer of the model's shapes in torch (random weights, paged KV pool), time "
            "decode, prefill, block copy (and swap on CUDA) over a grid, fit per-phase cost models and write "
            "PROFILE.yaml plus the raw samples as PROFILE.csv. Needs: pip install 'kvsim[calibrate]'."
        ),
    )
    parser.add_argument(
        "--model", help="model preset name or path to an HF config.json (required unless --from-runs)"
    )
    parser.add_argument(
        "--from-runs",
        nargs="+",
        metavar="REPLAY.yaml",
        type=Path,
        help="instead of timing a layer: fit the derated model's serving terms (per-iteration overhead, "
        "client overhead, attention and bandwidth scales, all-reduce latency) to measured runs (replay "
        "files, as kvsim replay-run reads), print in-sample and held-out errors (--folds), and write the "
        "calibration to -o (use it with cost_model: {kind: derated, calibration: FILE})",
    )
    parser.add_argument(
        "--folds",
        default="run,gpu",
        help="--from-runs: held-out refits, comma-separated: run (leave one run out), gpu (leave one GPU "
        "out), model (one model family), tp (one tensor-parallel size); default run,gpu",
    )
    parser.add_argument(
        "--folds-of",
        metavar="CALIBRATION.yaml",
        type=Path,
        default=None,
        help="--from-runs: do not fit again; take the terms of this calibration (fitted to the same "
        "replay files) as the full fit and run only the --folds, adding them to its record",
    )
    parser.add_argument("--jobs", type=int, default=None, help="--from-runs: replays at once (default: CPUs)")
    parser.add_argument(
        "--max-evaluations", type=int, default=60, help="--from-runs: candidate sets the full fit may try"
    )
    parser.add_argument(
        "--leave-one-out-evaluations",
        type=int,
        default=None,
        help="--from-runs: candidates each held-out refit may try (default: as many as the full "
        "fit, so that a fold's error is not that of a search stopped short; 0: skip the folds)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        default=None,
        help="default: float32 on cpu, bfloat16 on cuda",
    )
    parser.add_argument("--grid", choices=GRID_NAMES, default="quick")
    parser.add_argument("--block-size", type=int, default=16, help="block size of the main grid (default 16)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="time decode, LM head and prefill as CUDA-graph replays, as vLLM runs them (cuda only)",
    )
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        type=Path,
        help="PROFILE.yaml to write (with PROFILE.csv beside it); an existing file is replaced only if it "
        "is a kvsim profile (or samples CSV)",
    )
    parser.set_defaults(func=run)


def _fail(message: str) -> int:
    print(f"kvsim calibrate: error: {message}", file=sys.stderr)
    return 2


def check_targets(output: Path) -> str:
    """Why ``output`` (and the CSV beside it) may not be written, or "": kvsim replaces a file only if it
    wrote it, i.e. a kvsim profile YAML or a kvsim samples CSV."""
    from calibrate.runner import is_profile_yaml, is_samples_csv
    from sim.storage import OutputTargetError, check_output_file

    if output.suffix not in (".yaml", ".yml"):
        return f"-o {output}: the profile is a YAML file; give a name ending in .yaml"
    try:
        check_output_file(output, is_profile_yaml, "kvsim profile")
        check_output_file(output.with_suffix(".csv"), is_samples_csv, "kvsim samples CSV")
    except OutputTargetError as error:
        return str(error)
    return ""


def run(args: argparse.Namespace) -> int:
    # Everything that can be wrong with the command line is checked before torch builds anything.
    from sim.hardware.models import resolve_model

    if args.from_runs:
        return run_from_runs(args)
    if not args.model:
        return _fail("--model is required (or --from-runs to fit serving terms to measured runs)")
    if args.block_size <= 0:
        return _fail("--block-size must be positive")
    try:
        model = resolve_model(args.model)
    except ValueError as error:
        return _fail(f"--model: {error}")
    problem = check_targets(args.output)
    if problem:
        return _fail(problem)
    try:
        import torch
    except ImportError:
        return _fail(TORCH_HINT)
    if args.device == "cuda" and not torch.cuda.is_available():
        return _fail("--device cuda, but torch sees no CUDA device on this machine (use --device cpu)")
    from calibrate import CalibrationError
    from calibrate.runner import run_calibration

    reporter = PointReporter()
    try:
        profile = run_calibration(
            model,
            args.output,
            device=args.device,
            dtype=args.dtype,
            grid=args.grid,
            block_size=args.block_size,
            seed=args.seed,
            cuda_graphs=args.cuda_graphs,
            progress=reporter.message,
            on_point=reporter,
        )
    except (CalibrationError, ValueError) as error:
        return _fail(str(error))
    print(f"wrote {args.output} ({profile.label})")
    for phase in ("decode", "head", "prefill", "copy"):
        fit = profile.fit_quality.get(phase, {})
        held = fit.get("holdout", {})
        line = (
            f"  {phase:8s} R2 {fit.get('r2', float('nan')):.4f}  rel err mean {fit.get('mean_rel_err', 0):.1%} "
            f"max {fit.get('max_rel_err', 0):.1%}"
        )
        if held:
            line += f"  held out ({held['n_points']}): mean {held['mean_rel_err']:.1%} max {held['max_rel_err']:.1%}"
        print(line)
    timing = profile.fit_quality.get("timing", {})
    if timing.get("noisy"):
        print(f"  noisy run: median spread across rounds {timing['median_spread_across_rounds']:.1%}")
    return 0


def run_from_runs(args: argparse.Namespace) -> int:
    """``--from-runs``: every replay file is read and checked before the first replay."""
    from calibrate.from_runs import calibrate_from_runs, default_jobs, format_errors
    from sim.config import ConfigError
    from sim.costs.serving import CALIBRATION_KIND, CalibrationError, write_calibration
    from sim.replay.spec import load_replay_spec, read_run
    from sim.storage import OutputTargetError, check_output_file

    output: Path = args.output
    if output.suffix not in (".yaml", ".yml"):
        return _fail(f"-o {output}: the calibration is a YAML file; give a name ending in .yaml")
    if args.leave_one_out_evaluations is None:
        args.leave_one_out_evaluations = args.max_evaluations
    if args.max_evaluations < 1 or args.leave_one_out_evaluations < 0:
        return _fail("--max-evaluations must be >= 1 and --leave-one-out-evaluations >= 0")
    from calibrate.from_runs import FOLDS

    folds = [fold.strip() for fold in args.folds.split(",") if fold.strip()]
    unknown = [fold for fold in folds if fold not in FOLDS]
    if unknown:
        return _fail(
            f"--folds {args.folds}: unknown fold kind(s) {', '.join(unknown)}; known: {', '.join(FOLDS)}"
        )

    def is_calibration(path: Path) -> bool:
        return CALIBRATION_KIND in path.read_text(encoding="utf-8", errors="replace")[:200]

    try:
        check_output_file(output, is_calibration, "kvsim serving calibration")
        for path in args.from_runs:
            read_run(load_replay_spec(path), path.parent)
        fitted_before = _fitted_before(args.folds_of, args.from_runs)
    except (ConfigError, OutputTargetError, CalibrationError) as error:
        return _fail(str(error))
    calibration = calibrate_from_runs(
        args.from_runs,
        jobs=args.jobs or default_jobs(),
        max_evaluations=args.max_evaluations,
        folds=folds,
        fold_evaluations=args.leave_one_out_evaluations,
        log=lambda message: print(message, file=sys.stderr),
        # the full fit and each fold kind as they end: a fit of hours cut short keeps what it found
        checkpoint=lambda partial: write_calibration(partial, output),
        fitted_before=fitted_before,
    )
    write_calibration(calibration, output)
    print(
        f"wrote {output}: "
        + ", ".join(
            f"{key}={value:.4g}" for key, value in calibration.parameters().items() if value is not None
        )
    )
    print("in-sample errors (simulated / measured - 1):")
    print("\n".join(format_errors(calibration.fit["in_sample"]["runs"])))
    for fold, key in FOLDS.items():
        if key in calibration.fit:
            others = "the other runs" if fold == "run" else f"the other {fold}s' runs"
            print(f"leave-one-{fold}-out errors (each run replayed with terms fitted to {others}):")
            print("\n".join(format_errors(calibration.fit[key]["runs"])))
    return 0


def _fitted_before(path: Path | None, spec_paths: list[Path]) -> Any:
    """``--folds-of``: the earlier fit, refused here (before any replay) unless it was fitted to
    the same replay files."""
    from calibrate.from_runs import check_same_runs
    from sim.costs.serving import load_calibration

    if path is None:
        return None
    calibration = load_calibration(path)
    check_same_runs(calibration, spec_paths, f"--folds-of {path}")
    return calibration


class PointReporter:
    """Progress after every point with an ETA: one line redrawn in place on a terminal; in a log, a
    line at most every ``interval_s`` seconds (and the last one), so logs stay short."""

    def __init__(self, interval_s: float = 10.0, stream: Any = None):
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = interval_s
        self._last_s = float("-inf")

    def message(self, text: str) -> None:
        """A line of its own (the start, each round), never glued to the redrawn progress line."""
        print(("\r\033[K" if self.terminal else "") + text, file=self.stream)

    def __call__(self, done: int, total: int, point: Any, elapsed_s: float) -> None:
        from calibrate.memory import describe_point

        eta = elapsed_s / done * (total - done)
        line = (
            f"point {done}/{total} ({done / total:.0%}), {elapsed_s:.0f} s elapsed, ETA {eta:.0f} s: "
            f"{describe_point(point)}"
        )
        if self.terminal:
            end = "\n" if done == total else ""
            self.stream.write(f"\r\033[K{line}{end}")
            self.stream.flush()
        elif done == total or elapsed_s - self._last_s >= self.interval_s:
            self._last_s = elapsed_s
            print(line, file=self.stream)


def main(argv: list[str] | None = None) -> int:
    """``python -m calibrate ...`` (the same as ``kvsim calibrate ...``)."""
    parser = argparse.ArgumentParser(prog="kvsim")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["calibrate", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))
