"""Verdicts: one claim's check run and each target judged against its tolerance.

A verdict is ``holds`` (within tolerance), ``does not hold`` (outside; the table then carries the
explanation: the claim's own assumption that explains the difference, plus the numbers), or
``not reproducible`` (the simulator has no model of what the claim is about; the table says what it
can say instead). Disagreeing with a claim is a valid result: nothing here is tuned to a number.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from sim.config import ConfigError
from sim.validation.claims import Claim, Target
from sim.validation.registry import CheckOutput, Measured, RunContext, checks

HOLDS, DOES_NOT_HOLD, NOT_REPRODUCIBLE = "holds", "does not hold", "not reproducible"
VERDICTS = (HOLDS, DOES_NOT_HOLD, NOT_REPRODUCIBLE)


@dataclass
class TargetResult:
    claim: Claim
    target: Target
    measured: Measured
    verdict: str
    explanation: str

    def row(self) -> dict[str, Any]:
        spec, target = self.claim.spec, self.target
        expected = "" if target.expected is None else target.fmt.format(target.expected)
        return {
            "claim": spec.name,
            "number": spec.number,
            "target": target.id,
            "label": target.label,
            "secondary": target.secondary,
            "source": spec.source,
            "setup": spec.setup,
            "claimed": target.claimed,
            "expected": expected,
            "expected_value": target.expected,
            "simulated": shown_value(target, self.measured),
            "simulated_value": self.measured.value,
            "units": target.units,
            "tolerance": tolerance_text(target),
            "compare": target.compare,
            "verdict": self.verdict,
            "explanation": self.explanation,
            "detail": self.measured.detail,
        }


@dataclass
class ClaimResult:
    claim: Claim
    targets: list[TargetResult]
    output: CheckOutput
    wall_s: float


def shown_value(target: Target, measured: Measured) -> str:
    if measured.shown is not None:
        return measured.shown
    if measured.value is None or (isinstance(measured.value, float) and math.isnan(measured.value)):
        return "n/a"
    return target.fmt.format(measured.value)


def tolerance_text(target: Target) -> str:
    if target.tolerance is None or target.expected is None:
        return "n/a"
    return target.tolerance.describe(target.expected, target.fmt)


def judge(target: Target, measured: Measured) -> tuple[str, str]:
    """Verdict and explanation (the explanation is empty when the claim holds)."""
    if target.not_reproducible is not None:
        return NOT_REPRODUCIBLE, _join(target.not_reproducible, measured.detail)
    value = measured.value
    if value is None or math.isnan(value):
        return NOT_REPRODUCIBLE, _join("the simulation produced no value", measured.detail)
    assert target.tolerance is not None and target.expected is not None
    if target.tolerance.accepts(target.expected, value):
        return HOLDS, ""
    return DOES_NOT_HOLD, _join(target.if_not_holds or "", measured.detail)


def _join(*parts: str) -> str:
    return " ".join(part.strip() for part in parts if part and part.strip())


def run_claim(claim: Claim, context: RunContext) -> ClaimResult:
    started = time.perf_counter()
    output = checks()[claim.spec.check].func(claim, context)
    results = []
    for target in claim.spec.targets:
        if target.id not in output.values:
            raise ConfigError(
                f"{claim.path}: check {claim.spec.check!r} reports no value for target {target.id!r} "
                f"(it reports: {', '.join(sorted(output.values))})"
            )
        measured = output.values[target.id]
        verdict, explanation = judge(target, measured)
        results.append(TargetResult(claim, target, measured, verdict, explanation))
    return ClaimResult(claim, results, output, time.perf_counter() - started)
