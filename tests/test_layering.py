"""Which package may import which: checked on the sources' import statements (parsed, not run).

* Workloads know nothing about memory: no module under ``workloads/`` imports ``policies``.
* Token content is the vocabulary both sides share, so it imports neither of them (nor the engine).
* The results API (``sim/results.py``) does not draw: figures are the CLI's (``sim.figures``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(source: str, package: tuple[str, ...]) -> set[str]:
    """Every module (and ``module.name``) the code ``source`` of a module in ``package`` imports, as
    absolute names (relative imports resolved), wherever the statement is: functions and
    ``if TYPE_CHECKING:`` blocks included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join((*base, node.module) if node.module else base)
            if module:
                found.add(module)
            found.update(f"{module}.{alias.name}" if module else alias.name for alias in node.names)
    return found


def forbidden_imports(folder: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    """``{file: [what it imports of forbidden]}`` over every ``.py`` file under ``folder`` (or the
    file ``folder``)."""
    offending = {}
    top = ROOT / folder
    for path in [top] if top.is_file() else sorted(top.rglob("*.py")):
        relative = path.relative_to(ROOT)
        names = imported_modules(path.read_text(), relative.parent.parts)
        bad = sorted(name for name in names if any(name == f or name.startswith(f + ".") for f in forbidden))
        if bad:
            offending[str(relative)] = bad
    return offending


def test_workloads_import_nothing_from_policies():
    assert forbidden_imports("workloads", ("policies",)) == {}


def test_token_content_imports_neither_workloads_nor_policies_nor_the_engine():
    # Importing ``sim`` itself is allowed: it activates the compiled build, first thing.
    assert forbidden_imports("token_content", ("policies", "workloads", "sim.engine", "sim.runner")) == {}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from policies.base import TokenContent\n", {"policies.base", "policies.base.TokenContent"}),
        ("def f():\n    import policies.paged\n", {"policies.paged"}),
        ("from . import base\n", {"workloads", "workloads.base"}),
        ("from .. import policies\n", {"policies"}),
        ("from ..policies import base\n", {"policies", "policies.base"}),
    ],
)
def test_imports_are_found_wherever_they_are_and_resolved(source, expected):
    assert imported_modules(source, ("workloads",)) == expected


DRAWING = ("matplotlib", "sim.figures", "sim.outputs.canvas")


def test_the_results_api_does_not_draw():
    """``sim.results`` reads and writes results folders; drawing them is the CLI's business."""
    assert forbidden_imports("sim/results.py", DRAWING) == {}


def test_importing_the_results_api_loads_no_drawing_code():
    import subprocess
    import sys

    code = (
        "import sys, sim.results\n"
        f"drawing = sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib' or m in {DRAWING[1:]!r})\n"
        "assert not drawing, drawing\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def import_cycles(folder: str) -> list[list[str]]:
    """Groups of modules under ``folder`` that import each other, directly or round a loop (any
    import counts, ``if TYPE_CHECKING:`` ones too: a cycle of types is a cycle of design)."""
    modules: dict[str, Path] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        package = tuple(name.split(".")) if path.name == "__init__.py" else tuple(name.split(".")[:-1])
        graph[name] = {other for other in imported_modules(path.read_text(), package) if other in modules}
        graph[name].discard(name)
    reach = {name: _reachable(graph, name) for name in graph}
    cycles = {frozenset(o for o in reach[name] if name in reach[o]) | {name} for name in graph}
    return sorted(sorted(cycle) for cycle in cycles if len(cycle) > 1)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    stack = list(graph[start])
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(graph[name])
    return seen


@pytest.mark.parametrize("package", ["sim", "policies", "workloads", "token_content", "calibrate"])
def test_no_module_imports_round_a_loop(package):
    """No two modules import each other, directly or round a loop: the engine's core imports its
    schedulers, the transfer hooks and the lockstep group, none of them the core (each sees it through
    a protocol of its own); the cost models' factory stands above the models; a plan's probes, a
    calibration's operating points and the validation registry's check type live where both sides
    can read them."""
    assert import_cycles(package) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import x\n"
    )
    (package / "c.py").write_text("import pkg.a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert import_cycles("pkg") == [["pkg.a", "pkg.b"]]
