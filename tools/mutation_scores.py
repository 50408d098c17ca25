"""Mutation score per module, from mutmut's results (run after ``mutmut run``; see ``make mutation``).

Killed = killed by a test, or stopped by the timeout (an infinite loop the tests ran into).
Mutants listed in ``tools/mutation_equivalent.txt`` (name, then why it cannot change behaviour) are
left out of the score; names that no longer exist there are reported as stale.

    python tools/mutation_scores.py            # table of every module with results
    python tools/mutation_scores.py --survivors  # and the surviving mutants' names
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT = ROOT / "tools" / "mutation_equivalent.txt"
DETECTED = {"killed", "timeout", "caught by type check"}


def module_of(mutant: str) -> str:
    """``sim.engine.core.xǁEngineǁ_loop__mutmut_3`` -> ``sim.engine.core``; ``sim.engine.event_skip.x_f__mutmut_1`` -> ``sim.engine.event_skip``."""
    return re.split(r"\.x[_ǁ]", mutant, maxsplit=1)[0]


def equivalent_names() -> dict[str, str]:
    names = {}
    if EQUIVALENT.exists():
        for line in EQUIVALENT.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                name, _, why = line.partition(" ")
                names[name] = why.strip()
    return names


def main(argv: list[str]) -> int:
    mutmut = Path(sys.executable).with_name("mutmut")
    out = subprocess.run(
        [str(mutmut), "results", "--all", "true"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    status: dict[str, str] = {}
    for line in out.splitlines():
        name, sep, state = line.strip().rpartition(": ")
        if sep:
            status[name] = state
    equivalent = equivalent_names()
    by_module: dict[str, Counter] = defaultdict(Counter)
    survivors: dict[str, list[str]] = defaultdict(list)
    for name, state in status.items():
        module = module_of(name)
        if state == "not checked":
            by_module[module]["not checked"] += 1
        elif name in equivalent:
            by_module[module]["equivalent"] += 1
        elif state in DETECTED:
            by_module[module]["killed"] += 1
        else:
            by_module[module]["survived"] += 1
            survivors[module].append(f"{name} ({state})")
    print(
        f"{'module':24} {'mutants':>7} {'killed':>7} {'survived':>8} {'equiv.':>6} {'unrun':>6} {'score':>7}"
    )
    for module in sorted(by_module):
        c = by_module[module]
        total = sum(c.values())
        scored = c["killed"] + c["survived"]
        score = f"{100 * c['killed'] / scored:6.1f}%" if scored else "     -"
        print(
            f"{module:24} {total:7} {c['killed']:7} {c['survived']:8} {c['equivalent']:6} "
            f"{c['not checked']:6} {score:>7}"
        )
    stale = sorted(set(equivalent) - set(status))
    if stale:
        print(f"\n{len(stale)} stale names in {EQUIVALENT.name} (the code changed): {', '.join(stale[:10])}")
    if "--survivors" in argv:
        for module in sorted(survivors):
            print(f"\n{module}:")
            for line in sorted(survivors[module]):
                print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
