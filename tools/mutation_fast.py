"""Score a module's mutants the way mutmut runs them, but with each function's fast covering tests.

mutmut runs every test that reaches a mutated function. For the engine's modules that is up to 300
tests a mutant (a constructor or a hot path is reached by every engine test), 10 to 30 s each under
mutmut's trampolines: a module of 400 mutants takes hours at one process. A mutant that a test kills
is killed by the whole selection, so this runs, per mutant, only the covering tests from mutmut's own
map (``mutants/mutmut-stats.json``) that took under ``--fast`` seconds, fastest first, stopping at
the first failure. What they leave is not yet a survivor: ``--all-tests`` re-runs those with every
covering test, and the last ones are sorted by hand (equivalent, with the reason, in
``tools/mutation_equivalent.txt``; or a missing test, then written).

Each mutant runs in a child forked from one process that has already imported the code and the
test modules (as mutmut does), inside ``mutants/``, with the mutant's name set where mutmut's
trampolines read it; a child past ``--timeout`` seconds is stopped and counts as killed (a loop).
Results are kept in ``mutants/fast-results.json`` (name -> killed, survived, timeout or no tests),
so a rerun goes on where the last one stopped; ``--rerun`` checks the survivors again (after a new
test). Run ``make mutation`` (or at least mutmut's stats phase) first, so the map is current.

    python tools/mutation_fast.py sim.engine.growth sim.engine.ledger
    python tools/mutation_fast.py sim.engine.growth --all-tests --rerun
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "mutants"
RESULTS = MUTANTS / "fast-results.json"
EQUIVALENT = ROOT / "tools" / "mutation_equivalent.txt"
PYTEST_ARGS = ["-x", "-q", "-p", "no:cacheprovider", "--hypothesis-seed=0", "-o", "addopts="]


def mutant_names(module: str) -> list[str]:
    meta = MUTANTS / (module.replace(".", "/") + ".py.meta")
    if not meta.exists():
        raise SystemExit(f"mutation_fast: {meta} not found: run mutmut on {module} first")
    return sorted(json.loads(meta.read_text())["exit_code_by_key"], key=_natural)


def _natural(name: str) -> tuple[str, int]:
    function, _, number = name.rpartition("__mutmut_")
    return function, int(number)


def function_of(mutant: str) -> str:
    """mutmut's mangled function name: the mutant's name less its ``__mutmut_N``."""
    return mutant.rpartition("__mutmut_")[0]


def covering_tests(
    stats: dict, function: str, seconds: tuple[float, float] | None, existing: set[str]
) -> list[str]:
    """The function's covering tests that exist now, fastest first; with ``seconds`` only those whose
    unmutated run took from ``seconds[0]`` up to (not including) ``seconds[1]``."""
    durations = stats["duration_by_test"]
    tests = [t for t in stats["tests_by_mangled_function_name"].get(function, []) if t in existing]
    if seconds is not None:
        tests = [t for t in tests if seconds[0] <= durations.get(t, 0.0) < seconds[1]]
    return sorted(tests, key=lambda t: durations.get(t, 0.0))


def equivalent_names() -> set[str]:
    """The names in ``tools/mutation_equivalent.txt`` (one a line, then the reason)."""
    if not EQUIVALENT.exists():
        return set()
    lines = EQUIVALENT.read_text().splitlines()
    return {line.split()[0] for line in lines if line.strip() and not line.startswith("#")}


def _collect(test_files: list[str]) -> set[str]:
    """Import every test module once here (the children inherit them) and return the node ids
    that exist now: a test renamed since mutmut's map was built must not count as a kill."""
    import pytest

    class Collector:
        def __init__(self) -> None:
            self.ids: set[str] = set()

        def pytest_collection_modifyitems(self, items):  # noqa: ANN001 - pytest's hook signature
            self.ids.update(item.nodeid for item in items)

    collector = Collector()
    code = pytest.main(["--collect-only", "-q", *PYTEST_ARGS, *test_files], plugins=[collector])
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        # A test module that cannot be imported fails every mutant's run: all would count as killed.
        raise SystemExit(
            f"mutation_fast: collecting {' '.join(test_files)} failed (exit {int(code)}): see above"
        )
    return collector.ids


def _run_child(mutant: str, tests: list[str]) -> int:
    from mutmut.mutation.trampoline import set_mutant_under_test

    set_mutant_under_test(mutant)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    import pytest

    return int(pytest.main([*PYTEST_ARGS, *tests]))


def run_mutant(mutant: str, tests: list[str], timeout_s: float) -> str:
    pid = os.fork()
    if pid == 0:
        try:
            code = _run_child(mutant, tests)
        except BaseException:  # noqa: BLE001 - any crash of the child is a kill
            code = 3
        os._exit(code)
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return "survived" if os.waitstatus_to_exitcode(status) == 0 else "killed"
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout"
        time.sleep(0.02)


def _save(mutant: str, verdict: str) -> None:
    """Merge one verdict into the results file. Another run, on other modules, may write it too: the
    read-modify-write holds a lock, or two runs would each write back the file without the other's
    last verdict."""
    with open(RESULTS.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        saved[mutant] = verdict
        partial = RESULTS.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(saved, indent=1, sort_keys=True))
        partial.replace(RESULTS)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="+", help="dotted module names, e.g. sim.engine.growth")
    parser.add_argument("--fast", type=float, default=0.5, help="seconds: slower tests are left out")
    parser.add_argument("--max-tests", type=int, default=0, help="at most this many (the fastest)")
    parser.add_argument(
        "--slower",
        type=float,
        metavar="SECONDS",
        help="with --rerun --max-tests N: the covering tests under SECONDS but the N fastest (they ran)",
    )
    parser.add_argument("--all-tests", action="store_true", help="every covering test (no --fast)")
    parser.add_argument(
        "--tests", nargs="+", metavar="TEST", help="run these test files or ids instead of the map's"
    )
    parser.add_argument("--only", nargs="+", metavar="SUFFIX", help="the mutants whose names end so")
    parser.add_argument("--list", action="store_true", help="print the survivors so far, run nothing")
    parser.add_argument("--rerun", action="store_true", help="check the survivors again")
    parser.add_argument(
        "--rerun-timeouts",
        action="store_true",
        help="with --rerun, the mutants stopped by the timeout too (a slow test, not a loop, may have "
        "stopped them: run them again with a longer --timeout)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds a mutant may run")
    args = parser.parse_args(argv)

    results: dict[str, str] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    equivalent = equivalent_names()
    fast = None if args.all_tests else (0.0, args.slower or args.fast)
    mutants = [m for module in args.modules for m in mutant_names(module)]
    if args.list:
        for mutant in mutants:
            if mutant not in equivalent and results.get(mutant) in ("survived", "no tests"):
                print(mutant)
        return 0
    # (Read after --list: mutmut removes the map while it rebuilds it, and a listing needs none; nor
    # does a run with named tests.)
    stats_file = MUTANTS / "mutmut-stats.json"
    if not stats_file.exists() and not args.tests:
        raise SystemExit(
            f"mutation_fast: mutmut's map {stats_file} is missing (mutmut removes it while it rebuilds it): "
            "run `make mutation` first, or name the tests with --tests"
        )
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    rerun_verdicts = ("survived", "no tests") + (("timeout",) if args.rerun_timeouts else ())
    todo = [
        m
        for m in mutants
        if m not in equivalent and (m not in results or (args.rerun and results[m] in rerun_verdicts))
    ]
    if args.only:
        todo = [m for m in todo if m.endswith(tuple(args.only))]
    needed = (
        set(args.tests)
        if args.tests
        else {
            t.split("::", 1)[0]
            for m in todo
            for t in stats["tests_by_mangled_function_name"].get(function_of(m), [])
        }
    )
    os.chdir(MUTANTS)
    sys.path.insert(0, str(MUTANTS))
    os.environ.update(KVSIM_NATIVE="0", TQDM_DISABLE="1", MPLBACKEND="Agg", MUTANT_UNDER_TEST="")
    existing = _collect(sorted(needed)) if needed else set()
    missing = [
        test
        for test in args.tests or ()
        if "::" in test and not any(found == test or found.startswith(test + "[") for found in existing)
    ]
    if missing:  # pytest would fail on them, and every mutant would count as killed
        raise SystemExit(f"mutation_fast: no such test: {', '.join(missing)}")
    for index, mutant in enumerate(todo, 1):
        tests = args.tests or covering_tests(stats, function_of(mutant), fast, existing)
        if args.max_tests and args.slower:
            tests = tests[args.max_tests :]  # the fastest ones ran before (without --slower)
        elif args.max_tests and not args.all_tests:
            tests = tests[: args.max_tests]
        # A loop, not a slow test set: the limit grows with what the tests took unmutated.
        expected_s = sum(stats.get("duration_by_test", {}).get(test, 0.0) for test in tests)
        timeout_s = max(args.timeout, 3.0 * expected_s + 10.0)
        verdict = run_mutant(mutant, tests, timeout_s) if tests else "no tests"
        results[mutant] = verdict
        _save(mutant, verdict)
        if verdict in ("survived", "no tests"):
            print(f"[{index}/{len(todo)}] {mutant}: {verdict} ({len(tests)} tests)", flush=True)
    for module in args.modules:
        names = [m for m in mutant_names(module) if m not in equivalent]
        counts = {v: sum(results.get(m) == v for m in names) for v in ("killed", "timeout")}
        survived = [m for m in names if results.get(m) in ("survived", "no tests")]
        killed = counts["killed"] + counts["timeout"]
        score = 100.0 * killed / max(1, killed + len(survived))
        n_equivalent = sum(m in equivalent for m in mutant_names(module))
        print(
            f"{module}: {len(names) + n_equivalent} mutants, {killed} killed, {len(survived)} "
            f"survived, {n_equivalent} equivalent: {score:.1f} %"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
