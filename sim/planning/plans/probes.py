"""A plan's probes: one rate of one candidate, run with every seed, and each seed's verdict. (Apart
from the search that runs them, so that the analysis, the schedule, the band and the report read
them without importing the runner.)"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sim.planning.plans.search import Violation


@dataclass
class SeedRun:
    seed: int
    point_id: str
    summary: dict[str, Any]  # the run summary, without the steady-state metrics
    steady: dict[str, Any]
    violations: list[Violation]
    unsteady: list[str] = field(default_factory=list)  # why it has not reached a steady state


@dataclass
class Probe:
    """One rate of one candidate, run with every seed."""

    number: int  # order in which the plan ran it (the report's anchor)
    candidate: str
    rate: float
    requests: int = 0  # per seed
    runs: list[SeedRun] = field(default_factory=list)
    error: str = ""  # a seed's run failed: the candidate's search stops
    extended: bool = False  # met the SLOs short of a steady state: run again longer, not judged
    confirmation: bool = False  # the long run that confirms (or refutes) a candidate's maximum rate
    time_scale: float = 1.0  # the cost model's GPU times were multiplied by this (an error-band edge)

    @property
    def passed(self) -> bool:
        """Every seed met every SLO in a steady state. A confirmation run is judged by the SLOs alone:
        it is the long run that the steady-state checks stand in for."""
        if self.confirmation:
            return not self.error and all(not run.violations for run in self.runs)
        return not self.error and all(not run.violations and not run.unsteady for run in self.runs)

    @property
    def needs_longer(self) -> bool:
        """Every seed meets the SLOs, but some seed has not reached a steady state."""
        runs = self.runs
        return not self.error and all(not r.violations for r in runs) and any(r.unsteady for r in runs)

    @property
    def point_ids(self) -> list[str]:
        return [run.point_id for run in self.runs]
