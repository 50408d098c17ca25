"""Running one benchmark in a fresh interpreter, so the peak memory it reports is its own."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_fresh(module: str, *args: str) -> dict[str, Any]:
    """``python -m module args`` from the repository root; the row its last line prints as JSON."""
    output = subprocess.run(
        [sys.executable, "-m", module, *args], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, MiB (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
