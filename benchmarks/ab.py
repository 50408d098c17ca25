"""A/B timing of the engine against another git revision:
`python -m benchmarks.ab REV [--job azure-conv/paged ...] [--rounds 3]`.

On this project's machines two runs of the same code differ by about 10 %, and the SimPy reference
does not absorb all of it, so a speed change is measured by running the old and the new code
alternately, in fresh interpreters, on the same trace replay (the jobs of ``bench_traces``), and
comparing the best and the median engine wall time of each. Paired this way, changes of about 3 %
are resolved. Both sides run the Python sources (``KVSIM_NATIVE=0``). REV is checked out into a temporary git worktree that this command creates and
removes again; the working tree's code (committed or not) is the new side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.bench_traces import JOBS, experiment
from benchmarks.fresh import ROOT

# Runs in the revision's folder, first on sys.path, so the engine imported is that revision's.
_REPLAY = """
import json, os, sys, tempfile
sys.path.insert(0, os.getcwd())
from pathlib import Path
from sim.config import validate_experiment
from sim.runner import run_variant
config = validate_experiment(json.loads(sys.argv[1]))
with tempfile.TemporaryDirectory() as folder:
    result = run_variant(config, config.variants[0], Path.cwd(), out_dir=Path(folder))
print(result.summary["wall_s"])
"""


@contextmanager
def revision_worktree(revision: str) -> Iterator[Path]:
    """``revision`` checked out in a fresh temporary folder, removed afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="kvsim-ab-"))
    folder = parent / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(folder), revision],
        check=True,
    )
    try:
        yield folder
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)], check=False)
        shutil.rmtree(parent, ignore_errors=True)


def replay_wall_s(root: Path, trace: str, variant: str) -> float:
    """Engine wall seconds of one trace replay with the code in ``root``, in a fresh interpreter,
    under the Python sources: the revision's worktree has no compiled build, so a current one in the
    working tree would otherwise be timed against the other side's sources."""
    output = subprocess.run(
        [sys.executable, "-c", _REPLAY, json.dumps(experiment(trace, variant))],
        check=True,
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "KVSIM_NATIVE": "0"},
    ).stdout
    return float(output.strip().splitlines()[-1])


def compare(base: list[float], new: list[float]) -> str:
    best = min(new) / min(base) - 1
    median = statistics.median(new) / statistics.median(base) - 1
    return (
        f"base best {min(base):.2f} s, median {statistics.median(base):.2f} s; "
        f"new best {min(new):.2f} s, median {statistics.median(new):.2f} s; "
        f"change {best:+.1%} (best), {median:+.1%} (median)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("revision", help="the git revision to compare with (e.g. HEAD, main~3)")
    names = [f"{trace}/{variant}" for trace, variant in JOBS]
    parser.add_argument("--job", action="append", choices=names, help="trace/variant (default: all)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side, alternated (default 3)")
    args = parser.parse_args()
    jobs = [tuple(name.split("/")) for name in (args.job or names)]
    with revision_worktree(args.revision) as base_root:
        for trace, variant in jobs:
            walls: dict[str, list[float]] = {"base": [], "new": []}
            for _ in range(args.rounds):
                walls["base"].append(replay_wall_s(base_root, trace, variant))
                walls["new"].append(replay_wall_s(ROOT, trace, variant))
            print(f"{trace} {variant}: {compare(walls['base'], walls['new'])}", flush=True)


if __name__ == "__main__":
    main()
