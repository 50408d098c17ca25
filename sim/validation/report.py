"""Running a list of claims and writing their results.

Outputs (written under a temporary name and renamed, like :mod:`sim.results`)::

    DIR/validation.csv       one row per target
    DIR/validation.md        the table, then one section per claim (quote, setup, notes, figures)
    DIR/figures/*.png        the figures the claims need
    DIR/data/*.csv           sweep tables behind the figures
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from sim.storage import staged_output_dir
from sim.validation.claims import REPO_ROOT, Claim
from sim.validation.judging import (
    DOES_NOT_HOLD,
    VERDICTS,
    ClaimResult,
    run_claim,
    shown_value,
    tolerance_text,
)
from sim.validation.registry import RunContext


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def results_frame(results: list[ClaimResult]) -> pd.DataFrame:
    return pd.DataFrame([target.row() for result in results for target in result.targets])


def verdict_counts(results: list[ClaimResult]) -> dict[str, int]:
    counts = dict.fromkeys(VERDICTS, 0)
    for result in results:
        for target in result.targets:
            counts[target.verdict] += 1
    return counts


def markdown_table(results: list[ClaimResult], *, explanations: bool = True) -> str:
    header = ["#", "claim", "source", "setup", "expected", "simulated", "tolerance", "verdict"]
    if explanations:
        header.append("explanation")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for result in results:
        spec = result.claim.spec
        for i, target in enumerate(result.targets):
            label = target.target.label + (" (secondary)" if target.target.secondary else "")
            cells = [
                spec.number if i == 0 else "",
                label,
                spec.source if i == 0 else "〃",
                spec.setup if i == 0 else "〃",
                target.target.claimed,
                shown_value(target.target, target.measured),
                tolerance_text(target.target),
                f"**{target.verdict}**",
            ]
            if explanations:
                cells.append(target.explanation)
            lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines)


def markdown_report(results: list[ClaimResult], *, fast: bool, wall_s: float) -> str:
    counts = verdict_counts(results)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "# kvsim validation",
        "",
        f"Run {now}; mode: {'fast (reduced request counts and sweeps: indicative only)' if fast else 'full'}; "
        f"{len(results)} claim(s); {wall_s:.1f} s.",
        "",
        "Verdicts: " + ", ".join(f"{counts[v]} {v}" for v in VERDICTS) + ".",
        "",
        markdown_table(results),
        "",
        "## Claims",
    ]
    for result in results:
        spec = result.claim.spec
        parts += [
            "",
            f"### {spec.number}. {spec.title}",
            "",
            f"- Source: {spec.source}",
            f"- Quote: {spec.quote.strip()}",
            f"- Setup: {spec.setup}",
            f"- Config: `{result.claim.path.relative_to(REPO_ROOT) if result.claim.path.is_relative_to(REPO_ROOT) else result.claim.path}` "
            f"(check `{spec.check}`, {result.wall_s:.1f} s)",
        ]
        if spec.notes.strip():
            parts += ["", spec.notes.strip()]
        parts += [""]
        for target in result.targets:
            t = target.target
            parts.append(
                f"- **{t.label}**: claimed {t.claimed}; simulated {shown_value(t, target.measured)} "
                f"({t.compare}); tolerance {tolerance_text(t)}: **{target.verdict}**."
                + (f" {target.measured.detail}" if target.measured.detail else "")
                + (f" *Why:* {t.if_not_holds}" if target.verdict == DOES_NOT_HOLD and t.if_not_holds else "")
                + (f" *Why:* {t.not_reproducible}" if t.not_reproducible else "")
            )
        for note in result.output.notes:
            parts.append(f"- {note}")
        for figure in result.output.figures:
            parts += ["", f"![{spec.name}]({figure})"]
        for key in result.output.tables:
            parts.append(f"- Data: `data/{spec.name}__{key}.csv`")
    return "\n".join(parts) + "\n"


def run_validation(
    claims: list[Claim], out_dir: Path, *, fast: bool = False, log: Callable[[str], None] = lambda m: None
) -> tuple[Path, list[ClaimResult]]:
    """Run ``claims`` and write validation.csv, validation.md, figures/ and data/ to ``out_dir``
    (atomically: a temporary folder renamed at the end)."""
    out_dir = Path(out_dir)
    started = time.perf_counter()
    with staged_output_dir(out_dir, "validation", log=log) as staging:
        context = RunContext(staging, fast=fast, log=log)
        results = []
        for claim in claims:
            log(f"[{claim.spec.number}] {claim.name} ...")
            result = run_claim(claim, context)
            log(f"[{claim.spec.number}] {claim.name}: {result.wall_s:.1f} s")
            results.append(result)
            for key, table in result.output.tables.items():
                (staging / "data").mkdir(exist_ok=True)
                table.to_csv(staging / "data" / f"{claim.name}__{key}.csv", index=False)
        results_frame(results).to_csv(staging / "validation.csv", index=False)
        report = markdown_report(results, fast=fast, wall_s=time.perf_counter() - started)
        (staging / "validation.md").write_text(report)
    return out_dir, results
