"""Plant plausible bugs one at a time and count how many the tests catch (``make planted``).

mutmut changes one operator or constant at a time, mechanically; a reviewer's bugs are different:
an off-by-one at a block boundary, a tie broken the other way, a unit slipped, a branch that
forgets one case. ``tools/planted_bugs.toml`` lists such bugs, each a unique piece of a source file
(``find``) and what a plausible slip would make of it (``replace``), with why it is plausible.
For each module the TOML names the test files a developer changing it would run.

Every bug is planted in a private copy of the tracked files (never in the working tree: other work
may be running its tests there), the module's tests run under the Python sources (``-x``, so a
caught bug stops at its first failure), and the bug counts as caught when they fail. Before any
bug, each module's tests must pass unchanged, and each ``find`` must occur exactly once in its
file: a stale entry is an error, not a silent miss.

    python tools/planted_bugs.py                 # every bug; prints the table per module
    python tools/planted_bugs.py --only link-,swa-  # the bugs whose id starts with ``link-`` or ``swa-``
    python tools/planted_bugs.py --list          # the bugs, without running anything
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = ROOT / "tools" / "planted_bugs.toml"
TEST_TIMEOUT_S = 900


@dataclass(frozen=True)
class PlantedBug:
    bug_id: str
    module: str
    find: str
    replace: str
    why: str


@dataclass(frozen=True)
class Catalogue:
    bugs: list[PlantedBug]
    tests: dict[str, list[str]]  # per module path: the test files to run


def load_catalogue(path: Path = CATALOGUE) -> Catalogue:
    data = tomllib.loads(path.read_text())
    tests = {module: list(files) for module, files in data.get("tests", {}).items()}
    bugs = []
    seen: set[str] = set()
    for entry in data.get("bug", []):
        bug = PlantedBug(entry["id"], entry["module"], entry["find"], entry["replace"], entry["why"])
        if bug.bug_id in seen:
            raise SystemExit(f"{path}: bug id {bug.bug_id!r} appears twice")
        if bug.module not in tests:
            raise SystemExit(f"{path}: bug {bug.bug_id!r}: no [tests] entry for {bug.module!r}")
        if bug.find == bug.replace:
            raise SystemExit(f"{path}: bug {bug.bug_id!r}: replace equals find")
        seen.add(bug.bug_id)
        bugs.append(bug)
    return Catalogue(bugs, tests)


def check_sites(catalogue: Catalogue, root: Path = ROOT) -> list[str]:
    """A line per bug whose ``find`` does not occur exactly once in its module (stale entries)."""
    problems = []
    for bug in catalogue.bugs:
        source = (root / bug.module).read_text()
        count = source.count(bug.find)
        if count != 1:
            problems.append(f"{bug.bug_id}: {bug.module} holds its `find` {count} times (must be once)")
    for module, files in catalogue.tests.items():
        problems += [f"[tests] {module}: {name} not found" for name in files if not (root / name).is_file()]
    return problems


def copy_tracked_tree(destination: Path, root: Path = ROOT) -> None:
    """The tracked files (as they are in the working tree, edits included): no build outputs, no
    compiled modules, so the copy runs the Python sources."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        relative = raw.decode()
        source = root / relative
        if source.is_file() and not source.is_symlink():
            target = destination / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def tests_fail(tree: Path, test_files: list[str]) -> tuple[bool, str]:
    """Whether the tests fail in ``tree`` (a timeout counts as caught), and the last lines they print."""
    environment = {**os.environ, "KVSIM_NATIVE": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    # (hypothesis's seed fixed, as for mutmut: a bug caught only by a lucky random example would
    # otherwise be caught in one run and missed in the next)
    command = [
        sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-n", "0",
        "--hypothesis-seed=0", *test_files,
    ]  # fmt: skip
    try:
        run = subprocess.run(
            command, cwd=tree, env=environment, capture_output=True, text=True, timeout=TEST_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return True, "timed out"
    lines = (run.stdout + run.stderr).strip().splitlines()
    # What caught it: the first failing test (pytest's short summary), else the last line printed.
    failures = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
    return run.returncode != 0, (failures or lines or [""])[0 if failures else -1][:160]


def run_bugs(catalogue: Catalogue, bugs: list[PlantedBug]) -> dict[str, bool]:
    caught: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="kvsim-planted-") as folder:
        tree = Path(folder)
        copy_tracked_tree(tree)
        for module in sorted({bug.module for bug in bugs}):
            failed, last = tests_fail(tree, catalogue.tests[module])
            if failed:
                raise SystemExit(f"{module}: its tests fail before any bug is planted ({last})")
        for bug in bugs:
            path = tree / bug.module
            original = path.read_text()
            path.write_text(original.replace(bug.find, bug.replace, 1))
            started = time.perf_counter()
            try:
                failed, last = tests_fail(tree, catalogue.tests[bug.module])
            finally:
                path.write_text(original)
            caught[bug.bug_id] = failed
            verdict = "caught" if failed else "MISSED"
            print(
                f"  {bug.bug_id:<40} {verdict:<7} {time.perf_counter() - started:5.0f} s  {last}", flush=True
            )
    return caught


def score_table(bugs: list[PlantedBug], caught: dict[str, bool]) -> str:
    rows = ["| module | planted | caught | score |", "|---|---|---|---|"]
    for module in sorted({bug.module for bug in bugs}):
        ids = [bug.bug_id for bug in bugs if bug.module == module]
        hits = sum(caught[bug_id] for bug_id in ids)
        rows.append(f"| `{module}` | {len(ids)} | {hits} | {100.0 * hits / len(ids):.0f} % |")
    total = sum(caught.values())
    rows.append(f"| all | {len(bugs)} | {total} | {100.0 * total / len(bugs):.0f} % |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/planted_bugs.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--only", default="", help="run the bugs whose id starts with one of these (comma-separated)"
    )
    parser.add_argument("--list", action="store_true", help="list the bugs and exit")
    args = parser.parse_args(argv)
    catalogue = load_catalogue()
    problems = check_sites(catalogue)
    if problems:
        print("stale planted-bug entries:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    prefixes = tuple(args.only.split(","))
    bugs = [bug for bug in catalogue.bugs if bug.bug_id.startswith(prefixes)]
    if not bugs:
        print(f"no bug id starts with {args.only!r}", file=sys.stderr)
        return 2
    if args.list:
        for bug in bugs:
            print(f"{bug.bug_id:<40} {bug.module}: {bug.why}")
        return 0
    caught = run_bugs(catalogue, bugs)
    print(score_table(bugs, caught))
    missed = [bug_id for bug_id, hit in caught.items() if not hit]
    if missed:
        print("missed: " + ", ".join(missed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
