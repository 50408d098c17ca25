"""``kvsim schema``: the JSON Schemas of experiment, plan and sweep files, generated from the config
models; docs/schema/ holds them (regenerate: `make docs`), and every shipped file, old ones included,
is valid under its schema (an editor must not mark a file kvsim runs as wrong)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sim.cli import main
from sim.commands.schema import KINDS, schema, schema_text

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "docs" / "schema"
REGENERATE = "regenerate with `make docs` (kvsim schema KIND -o docs/schema/KIND.schema.json)"
CORPUS = ROOT / "tests" / "compat"


@pytest.mark.parametrize("kind", KINDS)
def test_the_committed_schema_is_up_to_date(kind):
    path = SCHEMAS / f"{kind}.schema.json"
    assert path.read_text(encoding="utf-8") == schema_text(kind), f"{path} is out of date: {REGENERATE}"


def test_schema_prints_or_writes_the_schema(tmp_path, capsys):
    assert main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["title"] == "kvsim experiment file"
    assert printed["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert main(["schema", "sweep", "-o", str(tmp_path / "sweep.json")]) == 0
    written = json.loads((tmp_path / "sweep.json").read_text())
    # the YAML's spellings (aliases), not the Python names
    assert {"set", "zip", "axes"} <= set(written["properties"]) and "zip_groups" not in written["properties"]
    assert "name" not in written.get("required", [])  # named after the file when omitted
    assert main(["schema", "plan", "-o", str(tmp_path / "absent" / "plan.json")]) == 2
    assert "absent/plan.json: cannot write the schema" in capsys.readouterr().err


def shipped_files() -> list[tuple[str, Path]]:
    """(kind, file) of every experiment, plan and sweep file shipped now and in the corpus."""
    kind_of_entry = {
        entry["file"]: entry["kind"] for entry in json.loads((CORPUS / "manifest.json").read_text())
    }
    corpus = [(kind, CORPUS / name) for name, kind in kind_of_entry.items() if kind in KINDS]
    configs = [
        ("experiment", path) for path in [*ROOT.glob("configs/*.yaml"), *ROOT.glob("configs/traces/*.yaml")]
    ]
    configs += [("plan", path) for path in ROOT.glob("configs/plan/*.yaml")]
    configs += [("sweep", path) for path in ROOT.glob("configs/sweep/*.yaml")]
    return sorted(configs) + sorted(corpus)


@pytest.mark.parametrize(
    ("kind", "path"), shipped_files(), ids=lambda item: item if isinstance(item, str) else item.name
)
def test_every_shipped_file_is_valid_under_its_schema(kind, path):
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(schema(kind))
    problems = [
        f"{'.'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(yaml.safe_load(path.read_text()))
    ]
    assert problems == []


def test_the_schema_marks_what_kvsim_refuses():
    jsonschema = pytest.importorskip("jsonschema")
    data = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    data["engine"]["blok_size"] = 16
    data["engine"]["block_size"] = 0
    validator = jsonschema.Draft202012Validator(schema("experiment"))
    messages = sorted(error.message for error in validator.iter_errors(data))
    assert messages == [
        "0 is less than or equal to the minimum of 0",
        "Additional properties are not allowed ('blok_size' was unexpected)",
    ]
