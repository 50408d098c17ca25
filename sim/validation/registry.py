"""The check interface and registry.

A check is a function ``(claim, context) -> CheckOutput`` that reports one :class:`Measured` per
target id; :func:`register_check` files it in :data:`CHECKS` under the name claim files give in
``claim.check``, with the pydantic model of its ``claim.params``. The check modules register on
import (:func:`checks` imports them).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel

# A check function takes the claim (sim.validation.claims.Claim, which reads this registry to know
# the checks: named Any here so that the imports run one way) and the run context.
CheckFunction = Callable[[Any, "RunContext"], "CheckOutput"]


@dataclass
class Measured:
    """What a check found for one target: a number (or None), how to show it, and the context."""

    value: float | None
    detail: str = ""
    shown: str | None = None


@dataclass
class CheckOutput:
    values: dict[str, Measured] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)  # paths relative to the output folder
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # written to data/<claim>__<key>.csv


@dataclass
class RunContext:
    out_dir: Path  # the staging output folder (figures/ and data/ go under it)
    fast: bool = False
    log: Callable[[str], None] = lambda message: None

    def save_figure(self, fig: Any, name: str) -> str:
        """Write a matplotlib figure under figures/ and return its path in the report."""
        relative = f"figures/{name}"
        path = self.out_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        return relative


@dataclass(frozen=True)
class Check:
    func: CheckFunction
    params: type[BaseModel]
    needs_experiment: bool = False
    cases: Callable[[Any], list[str]] | None = None

    def required_cases(self, params: Any) -> list[str]:
        return self.cases(params) if self.cases else []


CHECKS: dict[str, Check] = {}

CHECK_MODULES = (
    "checks_costs",
    "checks_disaggregation",
    "checks_hybrid",
    "checks_replays",
    "checks_seeds",
    "checks_transfer",
    "checks_vllm",
)
"""The modules whose import registers their checks in :data:`CHECKS`."""


def checks() -> dict[str, Check]:
    """:data:`CHECKS`, once every check module has been imported (the first call imports them)."""
    for module in CHECK_MODULES:
        importlib.import_module(f"sim.validation.{module}")
    return CHECKS


def register_check(
    name: str,
    params: type[BaseModel],
    *,
    needs_experiment: bool = False,
    cases: Callable[[Any], list[str]] | None = None,
) -> Callable[[CheckFunction], CheckFunction]:
    def decorate(
        func: CheckFunction,
    ) -> CheckFunction:
        CHECKS[name] = Check(func, params, needs_experiment, cases)
        return func

    return decorate
