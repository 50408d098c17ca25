"""What the test suite and the compiled build need is declared, pinned, in pyproject.toml's dev extra."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def dev_pins() -> dict[str, str]:
    """``{distribution name (normalised): version}`` of the dev extra's ``name==version`` entries."""
    pins = {}
    for requirement in PYPROJECT["project"]["optional-dependencies"]["dev"]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^]]*\])?==([^;\s]+)", requirement.strip())
        if match:
            pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(3)
    return pins


def test_what_the_native_build_imports_is_pinned_in_the_dev_extra():
    """``make native`` runs sim/native/build.py: every third-party module it imports comes from a pinned
    dev requirement (setuptools was there only because torch happened to install it)."""
    tree = ast.parse((ROOT / "sim" / "native" / "build.py").read_text())
    modules = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    modules |= {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    third_party = sorted(modules - set(sys.stdlib_module_names) - {"sim", "__future__"})
    assert third_party == ["mypyc", "setuptools"]
    providers = packages_distributions()
    pins = dev_pins()
    for module in third_party:
        names = {re.sub(r"[-_.]+", "-", name).lower() for name in providers[module]}
        assert names & set(pins), f"{module} (from {sorted(names)}) is not pinned in the dev extra"


def test_every_test_has_a_timeout(request):
    assert "pytest-timeout" in dev_pins()
    assert request.config.pluginmanager.hasplugin("timeout")
    # Above the slowest test (35 s, the validation fixture), far below "blocking for minutes".
    assert 60 <= float(request.config.getini("timeout")) <= 300


def test_a_hanging_test_fails_at_its_timeout(tmp_path):
    (tmp_path / "test_hang.py").write_text("import time\n\ndef test_hang():\n    time.sleep(600)\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-o",
            "timeout=1",
            str(tmp_path / "test_hang.py"),
        ],
        cwd=ROOT,
        env=os.environ | {"PYTEST_ADDOPTS": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Failed: Timeout (>1.0s) from pytest-timeout" in result.stdout


@pytest.mark.timeout(300)
def test_a_marker_raises_a_tests_timeout(request):
    assert request.node.get_closest_marker("timeout").args == (300,)


def test_mutation_prepare_removes_only_mutmuts_own_stale_copies(tmp_path):
    """``make mutation``'s first step deletes a stale unmutated copy and mutmut's test map inside
    ``mutants/`` and nothing else: not a copy that has its mutants (``.meta``), not a file a link in
    ``mutants/`` points to, not the source."""
    from tools import mutation_prepare

    (tmp_path / "pyproject.toml").write_text(
        '[tool.mutmut]\nsource_paths = ["pkg/"]\nonly_mutate = ["pkg/*.py"]\n'
    )
    (tmp_path / "pkg").mkdir()
    (tmp_path / "tests").mkdir()
    for name in ("stale.py", "mutated.py", "linked.py"):
        (tmp_path / "pkg" / name).write_text("x = 1\n")
    copies = tmp_path / "mutants" / "pkg"
    copies.mkdir(parents=True)
    (copies / "stale.py").write_text("x = 1\n")
    (copies / "mutated.py").write_text("x = 2\n")
    (copies / "mutated.py.meta").write_text("{}")
    users_file = tmp_path / "users_file.py"
    users_file.write_text("keep me\n")
    (copies / "linked.py").symlink_to(users_file)
    (tmp_path / "mutants" / "mutmut-stats.json").write_text("{}")
    assert mutation_prepare.main(tmp_path) == 0
    assert not (copies / "stale.py").exists()
    assert (copies / "mutated.py").exists() and (copies / "linked.py").is_symlink()
    assert users_file.read_text() == "keep me\n" and (tmp_path / "pkg" / "stale.py").exists()
    assert not (tmp_path / "mutants" / "mutmut-stats.json").exists()  # rebuilt for the changed inputs
    assert (tmp_path / "mutants" / mutation_prepare.STAMP).read_text() == mutation_prepare.inputs_hash(
        tmp_path
    )


def test_mutation_fast_picks_each_mutants_covering_tests_by_their_time():
    """``tools/mutation_fast.py`` runs a mutant's covering tests from mutmut's map, fastest first,
    within a window of unmutated run times, and never a test that no longer exists (pytest would
    fail on it, counting the mutant killed)."""
    from tools import mutation_fast

    stats = {
        "tests_by_mangled_function_name": {"m.x_f": ["t::slow", "t::gone", "t::fast", "t::mid"]},
        "duration_by_test": {"t::slow": 2.0, "t::gone": 0.1, "t::fast": 0.2, "t::mid": 0.5},
    }
    existing = {"t::slow", "t::fast", "t::mid"}
    assert mutation_fast.function_of("m.x_f__mutmut_12") == "m.x_f"
    assert mutation_fast.covering_tests(stats, "m.x_f", None, existing) == ["t::fast", "t::mid", "t::slow"]
    assert mutation_fast.covering_tests(stats, "m.x_f", (0.0, 0.5), existing) == ["t::fast"]
    assert mutation_fast.covering_tests(stats, "m.x_f", (0.5, 3.0), existing) == ["t::mid", "t::slow"]
    assert mutation_fast.covering_tests(stats, "m.x_g", None, existing) == []
    names = ["m.x_f__mutmut_10", "m.x_f__mutmut_9", "m.x_e__mutmut_2"]
    assert sorted(names, key=mutation_fast._natural) == [
        "m.x_e__mutmut_2",
        "m.x_f__mutmut_9",
        "m.x_f__mutmut_10",
    ]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="mutation_fast forks")
def test_mutation_fast_verdicts_from_a_forked_child(monkeypatch):
    """A child that passes survives, one that fails kills, one that hangs past the limit is stopped
    and counts as killed (a loop): the three exits ``run_mutant`` maps."""
    from tools import mutation_fast

    outcomes = {"passes": 0, "fails": 1}

    def child(mutant, tests):
        if mutant == "hangs":
            import time

            time.sleep(30)
        return outcomes[mutant]

    monkeypatch.setattr(mutation_fast, "_run_child", child)
    assert mutation_fast.run_mutant("passes", ["t"], 10.0) == "survived"
    assert mutation_fast.run_mutant("fails", ["t"], 10.0) == "killed"
    assert mutation_fast.run_mutant("hangs", ["t"], 0.5) == "timeout"


@pytest.mark.parametrize(
    ("exit_code", "stops"),
    [
        (pytest.ExitCode.OK, False),
        (pytest.ExitCode.NO_TESTS_COLLECTED, False),
        (pytest.ExitCode.INTERRUPTED, True),  # a test module that cannot be imported
        (pytest.ExitCode.USAGE_ERROR, True),
    ],
)
def test_mutation_fast_stops_when_the_named_tests_cannot_be_collected(monkeypatch, exit_code, stops):
    """A test module that fails to import fails every mutant's run, which would count each one as
    killed: the collection's exit code is checked before any mutant runs."""
    from tools import mutation_fast

    monkeypatch.setattr(pytest, "main", lambda args, plugins=(): exit_code)
    if stops:
        with pytest.raises(
            SystemExit, match=r"^mutation_fast: collecting tests/test_x\.py failed \(exit \d\): see above$"
        ):
            mutation_fast._collect(["tests/test_x.py"])
    else:
        assert mutation_fast._collect(["tests/test_x.py"]) == set()


def test_mutation_prepare_refreshes_stale_data_copies_and_never_writes_through_a_link(tmp_path):
    """mutmut copies data files once: a refitted calibration stays stale in ``mutants/``. A differing
    copy is refreshed, a missing one added, an equal one and the sources left alone, and a link in
    ``mutants/`` to a user's file is never written through."""
    from tools import mutation_prepare

    (tmp_path / "pyproject.toml").write_text(
        '[tool.mutmut]\nsource_paths = ["pkg/"]\nonly_mutate = ["pkg/*.py"]\nalso_copy = ["configs/"]\n'
    )
    for folder in ("pkg", "tests", "configs", "mutants/pkg", "mutants/configs", "mutants/tests"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "pkg" / "fit.yaml").write_text("scale: 2\n")
    (tmp_path / "mutants" / "pkg" / "fit.yaml").write_text("scale: 1\n")  # stale
    (tmp_path / "configs" / "same.yaml").write_text("a: 1\n")
    (tmp_path / "mutants" / "configs" / "same.yaml").write_text("a: 1\n")
    (tmp_path / "tests" / "golden.json").write_text("{}\n")  # not copied yet
    users_file = tmp_path / "users_file.yaml"
    users_file.write_text("keep me\n")
    (tmp_path / "configs" / "linked.yaml").write_text("new\n")
    (tmp_path / "mutants" / "configs" / "linked.yaml").symlink_to(users_file)
    assert mutation_prepare.main(tmp_path) == 0
    assert (tmp_path / "mutants" / "pkg" / "fit.yaml").read_text() == "scale: 2\n"
    assert (tmp_path / "mutants" / "tests" / "golden.json").read_text() == "{}\n"
    assert (tmp_path / "mutants" / "configs" / "same.yaml").read_text() == "a: 1\n"
    assert users_file.read_text() == "keep me\n"
    assert (tmp_path / "pkg" / "fit.yaml").read_text() == "scale: 2\n"
    assert mutation_prepare.outdated_data_copies(tmp_path) == []


def _planted_bugs_tool():
    """``tools/planted_bugs.py`` as a module (tools/ is not a package)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import planted_bugs
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return planted_bugs


def test_every_planted_bug_still_has_its_site_and_its_tests():
    # tools/planted_bugs.toml names a unique piece of source per bug: an edit that moves or removes
    # one must update the catalogue, or the planted set would quietly plant nothing there.
    planted_bugs = _planted_bugs_tool()
    catalogue = planted_bugs.load_catalogue()
    assert len(catalogue.bugs) >= 40
    assert planted_bugs.check_sites(catalogue) == []
    planted = {bug.bug_id: bug.module for bug in catalogue.bugs}
    assert all(planted[bug_id] in catalogue.tests for bug_id in planted)


def test_planted_bug_sites_must_be_unique(tmp_path):
    planted_bugs = _planted_bugs_tool()
    (tmp_path / "module.py").write_text("x = 1\nx = 1\ny = 2\n")
    (tmp_path / "test_module.py").write_text("")
    bug = planted_bugs.PlantedBug("twice", "module.py", "x = 1", "x = 2", "why")
    once = planted_bugs.PlantedBug("once", "module.py", "y = 2", "y = 3", "why")
    gone = planted_bugs.PlantedBug("gone", "module.py", "z = 0", "z = 1", "why")
    catalogue = planted_bugs.Catalogue([bug, once, gone], {"module.py": ["test_module.py", "missing.py"]})
    problems = planted_bugs.check_sites(catalogue, tmp_path)
    assert problems == [
        "twice: module.py holds its `find` 2 times (must be once)",
        "gone: module.py holds its `find` 0 times (must be once)",
        "[tests] module.py: missing.py not found",
    ]


def test_planted_bug_scores_by_hand():
    # Two modules: a.py 2 of 3 caught (67 %), b.py 1 of 1; in all 3 of 4 (75 %).
    planted_bugs = _planted_bugs_tool()
    bugs = [
        planted_bugs.PlantedBug(f"bug{i}", f"{module}.py", "x", "y", "why") for i, module in enumerate("aaab")
    ]
    caught = {"bug0": True, "bug1": False, "bug2": True, "bug3": True}
    assert planted_bugs.score_table(bugs, caught).splitlines()[2:] == [
        "| `a.py` | 3 | 2 | 67 % |",
        "| `b.py` | 1 | 1 | 100 % |",
        "| all | 4 | 3 | 75 % |",
    ]
