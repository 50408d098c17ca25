"""``kvsim schema [experiment|plan|sweep]``: the JSON Schema of a file kind, from its pydantic model.

For editors: a YAML language server given the schema (``# yaml-language-server: $schema=...`` on a
file's first line) completes keys, shows their descriptions and marks unknown keys and wrong types
while the file is typed. The schema says what the model's fields say; checks that need more than
one key or a file (a policy's options, the model fitting the GPU, a trace's path) stay
``kvsim check``'s. ``docs/schema/`` holds the three, and a test fails when they are out of date.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

KINDS = ("experiment", "plan", "sweep")
DIALECT = "https://json-schema.org/draft/2020-12/schema"
DESCRIPTIONS = {
    "experiment": "A kvsim experiment file (kvsim run): a model, a GPU, a workload and the variants "
    "that replay it. Every key: docs/config-reference.md.",
    "plan": "A kvsim plan file (kvsim plan): candidates searched for their maximum rate under SLOs. "
    "Every key: docs/plan-reference.md.",
    "sweep": "A kvsim sweep file (kvsim sweep): a base experiment and axes over its keys. Every key: "
    "docs/plan-reference.md.",
}


def model_of(kind: str) -> type[BaseModel]:
    if kind == "experiment":
        from sim.config import ExperimentConfig

        return ExperimentConfig
    if kind == "plan":
        from sim.planning.plans.spec import PlanSpec

        return PlanSpec
    from sim.planning.sweeps.spec import SweepSpec

    return SweepSpec


def schema(kind: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a ``kind`` file, as the YAML's keys are spelled (aliases)."""
    generated = model_of(kind).model_json_schema(by_alias=True, mode="validation")
    heading = {"$schema": DIALECT, "title": f"kvsim {kind} file", "description": DESCRIPTIONS[kind]}
    return heading | {key: value for key, value in generated.items() if key not in heading}


def schema_text(kind: str) -> str:
    """The schema as ``docs/schema/<kind>.schema.json`` holds it."""
    return json.dumps(schema(kind), indent=2, ensure_ascii=False) + "\n"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "schema",
        help="print the JSON Schema of experiment, plan or sweep files (docs/schema/ holds them)",
        description="For an editor's YAML language server: `# yaml-language-server: "
        "$schema=PATH/experiment.schema.json` as a file's first line.",
    )
    parser.add_argument("kind", nargs="?", choices=KINDS, default="experiment", help="default: experiment")
    parser.add_argument("-o", "--output", metavar="FILE", help="write it to FILE instead of printing it")
    parser.set_defaults(func=cmd_schema)


def cmd_schema(args: argparse.Namespace) -> int:
    text = schema_text(args.kind)
    if args.output:
        from sim.config import ConfigError

        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as error:
            raise ConfigError(f"{args.output}: cannot write the schema: {error.strerror}") from None
    else:
        sys.stdout.write(text)
    return 0
