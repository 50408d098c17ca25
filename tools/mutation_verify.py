"""Re-run each surviving mutant's covering tests by hand, each in a fresh interpreter.

mutmut runs every mutant in a child forked from a process that already imported the code and ran
the tests once; this checks that a survivor it reports also survives a plain ``pytest`` run of the
same tests (``MUTANT_UNDER_TEST=<name>`` inside ``mutants/``). A survivor whose tests fail here is
a misreport: the script lists it and exits 1. About 4 s per survivor on this machine class.

    python tools/mutation_verify.py                      # every survivor
    python tools/mutation_verify.py sim.engine.windows   # those whose names start so
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _mutmut(*args: str) -> str:
    return subprocess.run(
        [str(BIN / "mutmut"), *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def survivors(prefixes: list[str]) -> list[str]:
    names = []
    for line in _mutmut("results").splitlines():
        name, _, state = line.strip().rpartition(": ")
        if state == "survived" and (not prefixes or name.startswith(tuple(prefixes))):
            names.append(name)
    return names


def main(argv: list[str]) -> int:
    misreported = []
    names = survivors(argv)
    for name in names:
        tests = _mutmut("tests-for-mutant", name).split()
        env = dict(os.environ, MUTANT_UNDER_TEST=name, TQDM_DISABLE="1", MPLBACKEND="Agg")
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "--hypothesis-seed=0",
            *tests,
        ]
        run = subprocess.run(command, cwd=ROOT / "mutants", env=env, capture_output=True, text=True)
        verdict = "survives" if run.returncode == 0 else f"FAILS (pytest exit {run.returncode}): misreported"
        print(f"{name}: {verdict}", flush=True)
        if run.returncode != 0:
            misreported.append(name)
    print(f"\n{len(names)} survivors re-run by hand, {len(misreported)} misreported")
    return 1 if misreported else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
