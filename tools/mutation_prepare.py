"""Clear mutmut's stale copies before a run (``make mutation`` calls it first).

mutmut copies every source file into ``mutants/``: the ones it mutates with their mutants (and a
``.meta`` file beside them), the others as they are. On a later run it regenerates a mutated file
only when the source is newer than its copy. A file that joins ``only_mutate`` after a run copied it
unmutated therefore has a copy newer than its source and no ``.meta``: mutmut takes it as mutated
already, with no mutants, and the module silently has no score (``mutmut run 'module*'`` then says
"nothing matches"). This removes such copies, so mutmut mutates them on its next run.

    python tools/mutation_prepare.py        # before ``mutmut run``
"""

from __future__ import annotations

import fnmatch
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
            if copy.exists() and not copy.with_name(copy.name + ".meta").exists():
                stale.append(copy)
    return stale


def main() -> int:
    for copy in stale_copies():
        print(f"mutation: {copy.relative_to(ROOT)} was copied unmutated; removed so that mutmut mutates it")
        copy.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
