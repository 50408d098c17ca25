"""``kvsim check FILE [FILE...]``: validate experiment, plan, sweep and replay files without running them.

Each file goes through what its own command does before its first simulation (``kvsim run``'s
config validation and every variant's preparation, ``kvsim sweep``'s and ``kvsim plan``'s expansion
and preflight of every point or candidate, ``kvsim replay-run``'s reading of the measured run and
building of its experiment), so a file that passes here starts under its command, and a file that
fails gets the words its command would print. The kind comes from the file's keys (``--kind``
forces it). Exit 0 when every file passes, 2 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

KINDS = ("experiment", "plan", "sweep", "replay")

# The keys only one kind has at its top level, in the order they are tried: a replay names a
# measured `run`; a plan has `candidates` and `slos`; a sweep `axes`, `zip`, `base` or an inline
# `experiment`; an experiment `variants`. (A plan and an experiment both have `workload`, and a sweep's
# `set` is a key everywhere in spirit, so neither decides.)
KIND_KEYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("replay", ("run",)),
    ("plan", ("candidates", "slos", "models", "gpus")),
    ("sweep", ("axes", "zip", "base", "experiment")),
    ("experiment", ("variants",)),
)


def detect_kind(data: dict[str, Any], path: Path) -> str:
    """The kind of file ``data`` (a YAML file's top-level mapping) is, from the keys it has."""
    from sim.config import ConfigError

    if "claim" in data:
        raise ConfigError(
            f"{path}: a claim file of `kvsim validate` (it has `claim:`), not an experiment, plan, sweep "
            "or replay file; `kvsim validate NAME` runs it"
        )
    for kind, keys in KIND_KEYS:
        if any(key in data for key in keys):
            return kind
    clues = "; ".join(f"{kind}: {', '.join(keys)}" for kind, keys in KIND_KEYS)
    raise ConfigError(
        f"{path}: cannot tell which kind of file this is from its keys ({', '.join(map(str, data)) or 'none'}); "
        f"each kind has one of ({clues}); give --kind {{{','.join(KINDS)}}}"
    )


def check_file(path: Path, kind: str | None = None, warn: Callable[[str], None] = lambda text: None) -> str:
    """Validate ``path`` as ``kind`` (default: detected) as its command would before running it;
    return the kind. Problems raise the command's own errors (:class:`sim.config.ConfigError` and
    the others :func:`sim.cli.main` reports with exit code 2); notes of a valid file go to ``warn``."""
    from sim.config import yaml_mapping

    if kind is None:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        kind = detect_kind(yaml_mapping(path), path)
    CHECKS[kind](path, warn)
    return kind


def _check_experiment(path: Path, warn: Callable[[str], None]) -> None:
    from sim.config import load_experiment
    from sim.runner import prepare_experiment

    prepared = prepare_experiment(load_experiment(path), path)
    for note in prepared.warnings:
        warn(f"{path}: {note}")


def _check_sweep(path: Path, warn: Callable[[str], None]) -> None:
    from sim.planning.sweeps.spec import load_sweep_spec

    load_sweep_spec(path)


def _check_plan(path: Path, warn: Callable[[str], None]) -> None:
    from sim.planning.plans.spec import load_plan_spec

    load_plan_spec(path)


def _check_replay(path: Path, warn: Callable[[str], None]) -> None:
    from sim.replay.simulate import prepare_replay
    from sim.replay.spec import load_replay_spec, read_run

    spec = load_replay_spec(path)
    run = read_run(spec, path.parent)
    # The replay's experiment and trace are written and built as replay-run does, in a folder
    # thrown away afterwards (replay-run writes them into its report folder).
    with tempfile.TemporaryDirectory(prefix="kvsim-check-") as folder:
        prepare_replay(run, spec, Path(folder))


CHECKS: dict[str, Callable[[Path, Callable[[str], None]], None]] = {
    "experiment": _check_experiment,
    "plan": _check_plan,
    "sweep": _check_sweep,
    "replay": _check_replay,
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "check",
        help="validate experiment, plan, sweep or replay files without running them",
        description="Each file is checked as its command (run, plan, sweep, replay-run) checks it before "
        "the first simulation; one line per file. Exit 0 when every file passes, 2 otherwise.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML files to check")
    parser.add_argument(
        "--kind", choices=KINDS, help="check every file as this kind (default: told by each file's keys)"
    )
    parser.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    failed = sum(not _report(Path(name), args.kind) for name in args.files)
    if failed:
        print(f"kvsim check: {failed} of {len(args.files)} file(s) failed", file=sys.stderr)
    return 2 if failed else 0


def _report(path: Path, kind: str | None) -> bool:
    """Check one file and print its line (``ok: PATH (KIND)``, or the command's error); True when it passed."""
    from sim.commands.bad_input import input_errors

    try:
        checked = check_file(path, kind, warn=_warn)
    except input_errors() as error:
        sys.stdout.flush()  # the lines of earlier files first, when both streams go to one terminal
        print(f"kvsim: error: {naming_the_file(str(error), path)}", file=sys.stderr)
        sys.stderr.flush()
        return False
    print(f"ok: {path} ({checked})", flush=True)
    return True


def naming_the_file(message: str, path: Path) -> str:
    """``message`` as it names ``path``: among several files, a message that names only a key
    (``run.path: ... not found``, as replay-run words it) would not say which file it is about."""
    return message if message.startswith(str(path)) else f"{path}: {message}"


def _warn(message: str) -> None:
    print(f"kvsim: warning: {message}", file=sys.stderr)
