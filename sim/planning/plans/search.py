"""The search for a candidate's maximum sustainable rate, and the verdict of one probe.

A rate is **sustainable** when every seed's run meets every SLO on its steady-state window, on the
window's late half as well for latencies (a queue still building up would pass on the whole window
and fail later), its waiting queue does not keep growing (``max_queue_growth_frac``), and the probe
lasted long enough for the system to fill before its window opened (``max_fill_deficit_s``).

The search brackets then bisects: from the start rate it multiplies by ``growth`` while probes pass
(or divides while they fail) until one passes and one fails, then probes the midpoint until the
failing rate is within ``rel_tolerance`` of the passing one. It assumes, as capacity planning does,
that a rate above a failing one fails too; the report shows every probe, so a non-monotone curve is
visible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sim.planning.plans.spec import ALWAYS_CHECKED, SLO_METRICS, SearchSpec, SLOs
from sim.planning.report.units import seconds, share

LATE_PREFIX = "late_"  # steady-state metrics of the window's second half


@dataclass(frozen=True)
class Violation:
    slo: str  # an SLO name, e.g. ``ttft_p99_s``
    metric: str  # the steady-state metric compared
    value: float | None
    limit: float
    where: str  # "window" or "late half"


def describe(violations: list[Violation]) -> list[str]:
    """``p99 TTFT 2.74–3.20 s > 2.00 s``: one line per SLO and window part, values over seeds."""
    groups: dict[tuple[str, str], list[Violation]] = {}
    for violation in violations:
        groups.setdefault((violation.slo, violation.where), []).append(violation)
    lines = []
    for (slo, where), members in groups.items():
        _, unit, label = SLO_METRICS[slo]
        values = sorted(v.value for v in members if v.value is not None)
        shown = "none finished" if not values else _range(values, unit)
        late = " (late half of the window)" if where == "late half" else ""
        lines.append(f"{label} {shown} > {_format(members[0].limit, unit)}{late}")
    return lines


def _range(values: list[float], unit: str) -> str:
    low, high = _format(values[0], unit), _format(values[-1], unit)
    return low if low == high else f"{low}–{high}"


def _format(value: float, unit: str) -> str:
    if unit == "s":
        return seconds(value)
    if unit == "share":
        return share(value)
    return f"{value:.3g} {unit}"


def violations(steady: dict[str, Any], slos: SLOs) -> list[Violation]:
    """The SLOs one seed's steady-state metrics break (empty: it meets them all)."""
    found = []
    for name, limit in slos.limits().items():
        metric = SLO_METRICS[name][0]
        checks = [(metric, "window")]
        if metric.endswith("_s") and name not in ALWAYS_CHECKED:  # latencies: the late half too
            checks.append((LATE_PREFIX + metric, "late half"))
        for key, where in checks:
            value = steady.get(key)
            if value is None and name == "max_fill_deficit_s":
                continue  # a point measured before kvsim checked it: unknown, not broken
            if value is None or value > limit:
                found.append(Violation(name, key, value, limit, where))
                break
    return found


def nice_rate(value: float, low: float, high: float) -> float:
    """``value`` with as few significant digits as keep it strictly between ``low`` and ``high``."""
    for digits in range(2, 10):
        rounded = float(f"{value:.{digits}g}")
        if low < rounded < high:
            return rounded
    return value


@dataclass
class RateSearch:
    """Bracket-then-bisect over the request rate; feed it verdicts with :meth:`record`."""

    spec: SearchSpec
    passed: list[float] = field(default_factory=list)
    failed: list[float] = field(default_factory=list)
    stopped: str = ""  # why the search ended early ("" while running or after converging)

    @property
    def lo(self) -> float | None:
        """The highest rate that passed."""
        return max(self.passed) if self.passed else None

    @property
    def hi(self) -> float | None:
        """The lowest rate above :attr:`lo` that failed."""
        above = [rate for rate in self.failed if self.lo is None or rate > self.lo]
        return min(above) if above else None

    def record(self, rate: float, passed: bool) -> None:
        (self.passed if passed else self.failed).append(rate)

    def stop(self, reason: str) -> None:
        self.stopped = reason

    def next_rate(self) -> float | None:
        """The next rate to probe, or None when the search is over."""
        spec = self.spec
        if self.stopped:
            return None
        if len(self.passed) + len(self.failed) >= spec.max_probes:
            self.stopped = f"stopped after max_probes={spec.max_probes} rates"
            return None
        if not self.passed and not self.failed:
            return spec.start_rate_per_s
        lo, hi = self.lo, self.hi
        if lo is None:
            assert hi is not None
            if hi <= spec.min_rate_per_s:
                return None
            return max(spec.min_rate_per_s, nice_rate(hi / spec.growth, 0, hi))
        if hi is None:
            if lo >= spec.max_rate_per_s:
                return None
            return min(spec.max_rate_per_s, nice_rate(lo * spec.growth, lo, float("inf")))
        if hi / lo - 1 <= spec.rel_tolerance:
            return None
        return nice_rate((lo + hi) / 2, lo, hi)

    def status(self) -> str:
        """feasible | at_max_rate (never failed up to max_rate_per_s) | infeasible."""
        if self.lo is None:
            return "infeasible"
        return "at_max_rate" if self.hi is None else "feasible"
