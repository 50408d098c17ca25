"""Bad input against the up-front checks: random mutations of the shipped files.

Every experiment, plan, sweep and replay file kvsim ships passes ``kvsim check``. A user's file is
one of them with a slip: a value of the wrong type or out of range, a key misspelt or unknown, a key
left out. Whatever the slip, ``kvsim check`` (what every command does before its first simulation)
must either accept the file or refuse it with one of the errors the CLI reports as bad input
(``sim.commands.bad_input.input_errors``: one message, exit code 2), never with a traceback; and a
refusal must name the file. This draws such slips and reports every other outcome, each written out
as the file that raised it.

    .venv/bin/python -m tests.fuzz_bad_input --cases 500 --seed 1 [--out DIR]   # make fuzz-bad-input
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import yaml

from sim.commands.bad_input import input_errors
from sim.commands.check import check_file
from sim.config import ConfigWarning

ROOT = Path(__file__).resolve().parents[1]
# (Replays read measured runs that a clone may not hold: they are checked by their own tests.)
SHIPPED = sorted(
    path
    for pattern in (
        "configs/*.yaml",
        "configs/plan/*.yaml",
        "configs/sweep/*.yaml",
        "configs/notebooks/*.yaml",
    )
    for path in ROOT.glob(pattern)
)
WRONG_VALUES: tuple[Any, ...] = (
    *("abc", "", "16", "1e3", "H100"),
    *(-1, 0, -0.5, 1e-12, 1e30, 2**63, float("inf"), float("-inf"), float("nan")),
    *([], {}, None, True, [1, "x"], {"kind": "nope"}, [{"name": "x"}]),
)

Place = tuple[Any, ...]  # where in a YAML document: its keys and list indices from the top


def _places(node: Any, here: Place = ()) -> list[tuple[Place, Any]]:
    """Every place in a YAML document (mappings' values and lists' items), with what is there."""
    found: list[tuple[Place, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            found.append(((*here, key), value))
            found += _places(value, (*here, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found.append(((*here, index), value))
            found += _places(value, (*here, index))
    return found


def _parent(document: Any, place: Place) -> Any:
    for step in place[:-1]:
        document = document[step]
    return document


class Slip:
    """One slip made in a document: what it was, and the names a message about it could use (the
    keys on its way from the top, the key added, misspelt or left out)."""

    def __init__(self, text: str, names: list[str]):
        self.text = text
        self.names = [name for name in names if isinstance(name, str)]

    def named_by(self, message: str) -> bool:
        return any(name in message for name in self.names)


def mutate(document: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], Slip]:
    """One slip in a copy of ``document``, and what it was."""
    slipped = copy.deepcopy(document)
    places = _places(slipped)
    mappings = [((), slipped)] + [(place, value) for place, value in places if isinstance(value, dict)]
    kind = rng.choice(["value", "value", "value", "unknown key", "misspelt key", "missing key"])
    if kind == "value" and places:
        place, _ = rng.choice(places)
        wrong = copy.deepcopy(rng.choice(WRONG_VALUES))
        _parent(slipped, place)[place[-1]] = wrong
        return slipped, Slip(f"{'.'.join(map(str, place))} = {wrong!r}", list(place))
    where, mapping = rng.choice(mappings)
    label = ".".join(map(str, where)) or "(top level)"
    if kind == "unknown key" or not mapping:
        mapping["bogus_key"] = 1
        return slipped, Slip(f"{label}: added bogus_key", [*where, "bogus_key"])
    key = rng.choice(list(mapping))
    if kind == "misspelt key" and isinstance(key, str) and len(key) > 2:
        cut = rng.randrange(len(key))
        misspelt = key[:cut] + key[cut + 1 :]
        mapping[misspelt] = mapping.pop(key)
        return slipped, Slip(f"{label}: {key} misspelt {misspelt}", [*where, key, misspelt])
    del mapping[key]
    return slipped, Slip(f"{label}: {key} left out", [*where, key])


TEXT_SLIPS = ("colon left out", "indented", "tab", "bracket", "repeated line", "cut short")


def mutate_text(text: str, rng: random.Random) -> tuple[str, Slip]:
    """One slip in a YAML file's text, as a hand editing it makes one: a key's colon left out, a line
    indented or tabbed, a stray bracket, a line repeated (a repeated key: warned of, then accepted),
    the file cut short. Whatever the YAML then says, the file is named by any refusal."""
    lines = text.split("\n")
    keyed = [index for index, line in enumerate(lines) if ": " in line or line.rstrip().endswith(":")]
    index = rng.choice(keyed) if keyed else 0
    kind = rng.choice(TEXT_SLIPS)
    line = lines[index]
    if kind == "colon left out":
        lines[index] = line.replace(":", "", 1)
    elif kind == "indented":
        lines[index] = "  " + line
    elif kind == "tab":
        lines[index] = "\t" + line.lstrip(" ")
    elif kind == "bracket":
        cut = rng.randrange(len(line) + 1)
        lines[index] = line[:cut] + rng.choice("{[]}") + line[cut:]
    elif kind == "repeated line":
        lines.insert(index + 1, line)
    else:
        return text[: rng.randrange(len(text))], Slip("cut short", [])
    return "\n".join(lines), Slip(f"line {index + 1}: {kind}", [])


def _absolute_paths(document: Any, folder: Path) -> Any:
    """``document`` with every string that names a file relative to ``folder`` made absolute, so that
    the slipped copy, checked from elsewhere, reads the same files."""
    if isinstance(document, dict):
        return {key: _absolute_paths(value, folder) for key, value in document.items()}
    if isinstance(document, list):
        return [_absolute_paths(value, folder) for value in document]
    if isinstance(document, str) and "/" in document and (folder / document).is_file():
        return str((folder / document).resolve())
    return document


def check_case(source: Path, document: dict[str, Any] | str, slip: Slip, folder: Path) -> tuple[str, str]:
    """("accepted" | "refused" | "bug", detail) for ``document`` (or the text of one), written as
    ``source``'s name in ``folder``. A refusal must name the file or the slip's keys."""
    path = folder / source.name
    path.write_text(document if isinstance(document, str) else yaml.safe_dump(document, sort_keys=False))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConfigWarning)  # (a repeated key: the file still runs)
            check_file(path)
    except input_errors() as error:
        message = str(error)
        if source.name not in message and not slip.named_by(message):
            return "bug", f"refused naming neither the file nor the key: {message.splitlines()[0][:200]}"
        return "refused", message.splitlines()[0][:200]
    except Exception as error:  # a traceback where a message was due
        frames = traceback.extract_tb(error.__traceback__)
        where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
        return "bug", f"{type(error).__name__} at {where}: {error}"
    return "accepted", ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("fuzz-bad-input"), help="where the files of bugs go")
    args = parser.parse_args(argv)
    documents = {path: _absolute_paths(yaml.safe_load(path.read_text()), path.parent) for path in SHIPPED}
    counts = {"accepted": 0, "refused": 0, "bug": 0}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(args.cases):
            rng = random.Random(f"{args.seed}-{index}")
            source = rng.choice(SHIPPED)
            document, slip = mutate(documents[source], rng)
            if rng.random() < 0.25:  # (two slips at once: the second must not hide the first's message)
                document, second = mutate(document, rng)
                slip = Slip(f"{slip.text}; {second.text}", slip.names + second.names)
            written: dict[str, Any] | str = document
            if rng.random() < 0.2:  # (a slip in the text itself: its YAML, not its values)
                written, in_text = mutate_text(yaml.safe_dump(document, sort_keys=False), rng)
                slip = Slip(f"{slip.text}; {in_text.text}", slip.names)
            outcome, detail = check_case(source, written, slip, Path(scratch))
            counts[outcome] += 1
            if outcome == "bug":
                args.out.mkdir(parents=True, exist_ok=True)
                kept = args.out / f"case-{args.seed}-{index}-{source.name}"
                kept.write_text(
                    written if isinstance(written, str) else yaml.safe_dump(written, sort_keys=False)
                )
                print(f"case {index}: {source.relative_to(ROOT)}, {slip.text}: {detail} ({kept})", flush=True)
    print(f"{counts} in {time.perf_counter() - started:.0f} s")
    return 1 if counts["bug"] else 0


if __name__ == "__main__":
    sys.exit(main())
