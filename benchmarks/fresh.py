"""Running one benchmark in a fresh interpreter, so the peak memory it reports is its own."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


BUILDS = ("python", "native")  # the sources, or the compiled build (sim/native): KVSIM_NATIVE=0 / 1


def available_builds() -> list[str]:
    """The builds this checkout can run: the compiled one only when it is current."""
    from sim.native import read_build, why_not_current

    problem = why_not_current(read_build())
    if problem is not None:
        print(f"(compiled build not measured: {problem})")
        return ["python"]
    return list(BUILDS)


def run_fresh(module: str, *args: str, build: str = "python") -> dict[str, Any]:
    """``python -m module args`` from the repository root, under ``build``; the row its last line
    prints as JSON, with the build that ran it."""
    env = {**os.environ, "KVSIM_NATIVE": "1" if build == "native" else "0"}
    output = subprocess.run(
        [sys.executable, "-m", module, *args], check=True, capture_output=True, text=True, cwd=ROOT, env=env
    ).stdout
    return {**json.loads(output.strip().splitlines()[-1]), "build": build}


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, MiB (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
