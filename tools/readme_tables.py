"""Tables of simulated figures in the README, generated from the shipped configs so they cannot drift.

Each table sits between ``<!-- kvsim:generated NAME -->`` and ``<!-- /kvsim:generated -->`` in
README.md. ``python -m tools.readme_tables`` rewrites them; ``--check`` only compares and exits 1 when
one is out of date (the test suite runs the comparison: a change to the engine, a policy or a config
that moves a figure fails there until the table is regenerated).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
START = "<!-- kvsim:generated {name} -->"
END = "<!-- /kvsim:generated -->"


@dataclass(frozen=True)
class Row:
    """One row: a shipped config, the ``--set`` overrides it runs with, and how its label reads
    (``label`` gets the run's figures: requests, prompt tokens in millions, the variants'
    preemptions)."""

    config: str
    overrides: tuple[str, ...]
    label: Callable[[dict[str, Any]], str]


def _preempted(word: str) -> Callable[[dict[str, Any]], str]:
    def text(run: dict[str, Any]) -> str:
        counts = run["preemptions"]
        return f"no {word}" if not any(counts) else " / ".join(f"{count:,}" for count in counts) + f" {word}"

    return text


RADIX_VS_PREFIX = [
    Row(
        "configs/chat-radix-vs-prefix.yaml",
        (),
        lambda run: f"multi-turn chat, {run['requests']:,} turns, A100-80GB",
    ),
    Row(
        "configs/chat-radix-vs-prefix.yaml",
        ("gpu=L4-24GB",),
        lambda run: f"same, `--set gpu=L4-24GB` (overloaded, {_preempted('preemptions')(run)})",
    ),
    Row(
        "configs/chat-radix-vs-prefix.yaml",
        ("gpu=L4-24GB", "engine.scheduler=sglang"),
        lambda run: f"same, also `--set engine.scheduler=sglang` ({_preempted('retractions')(run)})",
    ),
    Row(
        "configs/traces/mooncake-radix-vs-prefix.yaml",
        (),
        lambda run: (
            f"Mooncake, first 10 min ({run['requests']:,} requests, {run['prompt_tokens'] / 1e6:.1f} M prompt "
            f"tokens), H200 ({_preempted('preemptions')(run)})"
        ),
    ),
    Row(
        "configs/traces/mooncake-radix-vs-prefix.yaml",
        ("engine.num_gpu_blocks_override=250000",),
        lambda run: f"same, `--set engine.num_gpu_blocks_override=250000` ({_preempted('preemptions')(run)})",
    ),
]
"""README's "`radix` against `prefix`": prefix-cache hit rates of prefix (block 16), radix (page 1)
and radix (page 16)."""


def simulate(row: Row) -> dict[str, Any]:
    """The figures of one row's run (every variant of its config, in the config's order)."""
    from sim.config import load_experiment
    from sim.runner import prepare_experiment, run_experiment

    path = ROOT / row.config
    config = load_experiment(path, list(row.overrides))
    results = run_experiment(config, path, prepared=prepare_experiment(config, path))
    prompts = results[0].sink.requests(columns=["prompt_tokens"])["prompt_tokens"]
    return {
        "requests": int(results[0].summary["requests_total"]),
        "prompt_tokens": int(prompts.sum()),
        "kv_pool_tokens": int(results[0].summary["kv_pool_tokens"]),
        "hit_rates": [float(result.summary["prefix_cache_hit_rate"]) for result in results],
        "preemptions": [int(result.summary["preemptions"]) for result in results],
    }


def radix_vs_prefix_table(runs: list[dict[str, Any]] | None = None) -> str:
    runs = runs if runs is not None else [simulate(row) for row in RADIX_VS_PREFIX]
    lines = [
        "| workload | pool | `prefix` (block 16) | `radix` (page 1) | `radix` (page 16) |",
        "|---|---|---|---|---|",
    ]
    for row, run in zip(RADIX_VS_PREFIX, runs, strict=True):
        rates = " | ".join(_percent(rate) for rate in run["hit_rates"])
        lines.append(f"| {row.label(run)} | {run['kv_pool_tokens']:,} tokens | {rates} |")
    return "\n".join(lines)


def _percent(share: float) -> str:
    """Four significant digits, trailing zeros kept (``90.40 %``, ``7.096 %``)."""
    return f"{100 * share:.2f} %" if share >= 0.1 else f"{100 * share:.3f} %"


TABLES: dict[str, Callable[[], str]] = {"radix-vs-prefix": radix_vs_prefix_table}


def block(text: str, name: str) -> tuple[int, int]:
    """The span of table ``name``'s body (between its markers) in ``text``."""
    match = re.search(re.escape(START.format(name=name)) + r"\n(.*?)" + re.escape(END), text, re.DOTALL)
    if match is None:
        raise ValueError(f"README.md has no {START.format(name=name)} ... {END} block")
    return match.start(1), match.end(1)


def with_tables(text: str, tables: dict[str, str]) -> str:
    for name, table in tables.items():
        start, end = block(text, name)
        text = text[:start] + table + "\n" + text[end:]
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="compare only; exit 1 when a table is out of date"
    )
    args = parser.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    updated = with_tables(text, {name: make() for name, make in TABLES.items()})
    if updated == text:
        print("README.md tables are up to date")
        return 0
    if args.check:
        print("README.md tables are out of date: run python -m tools.readme_tables", file=sys.stderr)
        return 1
    README.write_text(updated, encoding="utf-8")
    print("README.md tables rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
