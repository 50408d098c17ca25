"""``kvsim calibrate``: the argparse subcommand (wired into ``sim/cli.py`` with :func:`register`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from calibrate import TORCH_HINT
from calibrate.grids import GRID_NAMES


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``calibrate`` subcommand; it sets ``func`` to :func:`run`."""
    parser = subparsers.add_parser(
        "calibrate",
        help="time a real torch paged-attention layer and write a cost profile",
        description=(
            "Build one decoder layer of the model's shapes in torch (random weights, paged KV pool), time "
            "decode, prefill, block copy (and swap on CUDA) over a grid, fit per-phase cost models and write "
            "PROFILE.yaml plus the raw samples as PROFILE.csv. Needs: pip install 'kvsim[calibrate]'."
        ),
    )
    parser.add_argument("--model", required=True, help="model preset name or path to an HF config.json")
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
    parser.add_argument("-o", "--output", required=True, type=Path, help="PROFILE.yaml to write")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        print(f"kvsim calibrate: {TORCH_HINT}", file=sys.stderr)
        return 2
    from calibrate.runner import run_calibration
    from sim.models import resolve_model

    if args.block_size <= 0:
        print("kvsim calibrate: --block-size must be positive", file=sys.stderr)
        return 2
    model = resolve_model(args.model)
    profile = run_calibration(
        model,
        args.output,
        device=args.device,
        dtype=args.dtype,
        grid=args.grid,
        block_size=args.block_size,
        seed=args.seed,
        cuda_graphs=args.cuda_graphs,
        progress=lambda message: print(message, file=sys.stderr),
    )
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


def main(argv: list[str] | None = None) -> int:
    """``python -m calibrate ...`` (the same as ``kvsim calibrate ...``)."""
    parser = argparse.ArgumentParser(prog="kvsim")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["calibrate", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))
