"""Clear mutmut's stale copies before a run (``make mutation`` calls it first).

mutmut copies every source file into ``mutants/``: the ones it mutates with their mutants (and a
``.meta`` file beside them), the others as they are. On a later run it regenerates a mutated file
only when the source is newer than its copy. A file that joins ``only_mutate`` after a run copied it
unmutated therefore has a copy newer than its source and no ``.meta``: mutmut takes it as mutated
already, with no mutants, and the module silently has no score (``mutmut run 'module*'`` then says
"nothing matches"). This removes such copies, so mutmut mutates them on its next run.

mutmut also keeps which tests call which function (``mutants/mutmut-stats.json``) and re-collects
it only for tests with new names: a function that has just been mutated maps to no test ("no tests"),
and an edited test that now reaches more functions is not run against their mutants (a false
survivor, which the same test file run by hand kills). So the map is removed whenever a test or a
source file or the config changed since it was built, or a stale copy was removed: mutmut then rebuilds it (a few minutes).

mutmut copies the data files beside the code (``source_paths``' non-Python files, ``also_copy``, the
tests' fixtures) once and never again: a refitted ``sim/costs/serving_calibration.yaml`` or a
regenerated golden file stays stale in ``mutants/``, and the unmutated test run fails before any
mutant runs. So every such copy that differs from its source is refreshed, and a missing one added.

    python tools/mutation_prepare.py        # before ``mutmut run``
"""

from __future__ import annotations

import fnmatch
import hashlib
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stale_copies(root: Path = ROOT) -> list[Path]:
    """Copies in ``mutants/`` of files ``only_mutate`` selects that hold no mutants (no ``.meta``)."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]
    patterns = config.get("only_mutate", [])
    stale = []
    for source_path in config.get("source_paths", []):
        for path in sorted((root / source_path).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if not any(fnmatch.fnmatch(relative, pattern) for pattern in patterns):
                continue
            copy = root / "mutants" / relative
            if _mutmuts_own(copy, root) and not copy.with_name(copy.name + ".meta").exists():
                stale.append(copy)
    return stale


def _mutmuts_own(path: Path, root: Path) -> bool:
    """A plain file inside ``root/mutants`` (mutmut's working copy), not a link out of it: the only
    kind of file this tool removes."""
    mutants = (root / "mutants").resolve()
    return path.is_file() and not path.is_symlink() and path.resolve().is_relative_to(mutants)


def outdated_data_copies(root: Path = ROOT) -> list[Path]:
    """Data files (not ``.py``) under the copied folders whose copy in ``mutants/`` is missing or
    differs from the source, as source paths. Only a ``mutants/`` mutmut has made is looked at."""
    mutants = root / "mutants"
    if not mutants.is_dir() or mutants.is_symlink():
        return []
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]
    folders = ["tests", *config.get("source_paths", []), *config.get("also_copy", [])]
    outdated = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*")):
            if not path.is_file() or path.is_symlink() or path.suffix in (".py", ".pyc", ".meta"):
                continue
            if "__pycache__" in path.parts:
                continue
            copy = mutants / path.relative_to(root)
            if copy.exists() and not _mutmuts_own(copy, root):
                continue  # a link out of mutants/: never written through
            if not copy.exists() or copy.read_bytes() != path.read_bytes():
                outdated.append(path)
    return outdated


STAMP = "mutation-inputs.sha256"  # in mutants/: the inputs the map was last rebuilt for


def inputs_hash(root: Path = ROOT) -> str:
    """SHA-256 over the tests, the sources and the mutmut config (mutmut rewrites its map file on every
    run, so its age says nothing)."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]
    digest = hashlib.sha256(repr(sorted(config.items())).encode())
    for folder in ["tests", *config.get("source_paths", [])]:
        for path in sorted((root / folder).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def main(root: Path = ROOT) -> int:
    stale = stale_copies(root)
    for copy in stale:
        print(f"mutation: {copy.relative_to(root)} was copied unmutated; removed so that mutmut mutates it")
        copy.unlink()
    for source in outdated_data_copies(root):
        copy = root / "mutants" / source.relative_to(root)
        print(f"mutation: {copy.relative_to(root)} refreshed from its source")
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(source.read_bytes())
    stats, stamp = root / "mutants" / "mutmut-stats.json", root / "mutants" / STAMP
    current = inputs_hash(root)
    if _mutmuts_own(stats, root) and (stale or not stamp.exists() or stamp.read_text() != current):
        print("mutation: tests or sources changed since mutmut mapped tests to functions; the map is rebuilt")
        stats.unlink()
    if (root / "mutants").is_dir() and not (root / "mutants").is_symlink():
        stamp.write_text(current)
    return 0


if __name__ == "__main__":
    sys.exit(main())
