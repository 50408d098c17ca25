"""The search for a candidate's maximum sustainable rate, and the verdict of one probe.

A rate is **sustainable** when every seed's run reached a steady state and meets every SLO on its
steady-state window, on the window's late half as well for latencies (a queue still building up
would pass on the whole window and fail later), and its waiting queue does not keep growing
(``max_queue_growth_frac``).

A run has reached a steady state (:func:`unsteady_reasons` is empty) when its arrivals spanned
``min_fill_multiple`` times the time they take to fill the KV pool, the window opened after the
system filled, and KV usage, the running batch and the waiting queue did not rise from the window's
first segment to its last.
A probe that meets every SLO but has not reached one is run again with twice the requests (up to
``max_requests``, where it fails); a probe that breaks an SLO fails at once (a longer run of an
overloaded system only gets worse).

The search brackets then bisects: from the start rate it multiplies by ``growth`` while probes pass
(or divides while they fail) until one passes and one fails, then probes the midpoint until the
failing rate is within ``rel_tolerance`` of the passing one. It assumes, as capacity planning does,
that a rate above a failing one fails too; the report shows every probe, so a non-monotone curve is
visible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sim.planning.plans.spec import SLO_METRICS, SearchSpec, SLOs
from sim.planning.report.units import bound, seconds

LATE_PREFIX = "late_"  # steady-state metrics of the window's second half


@dataclass(frozen=True)
class Violation:
    slo: str  # an SLO name, e.g. ``ttft_p99_s``
    metric: str  # the steady-state metric compared
    value: float | None
    limit: float
    where: str  # "window" or "late half"
    # The run was stopped once this was certain (sim.planning.sweeps.early_stop): when, in simulated time.
    stopped_at_s: float | None = None


def describe(violations: list[Violation]) -> list[str]:
    """``p99 TTFT 2.74–3.20 s > 2.00 s``: one line per SLO and window part, values over seeds."""
    groups: dict[tuple[str, str], list[Violation]] = {}
    for violation in violations:
        groups.setdefault((violation.slo, violation.where), []).append(violation)
    lines = []
    for (slo, where), members in groups.items():
        if slo == STEADY_STATE:
            lines.append(members[0].metric)
            continue
        metric = SLO_METRICS[slo]
        late = " (late half of the window)" if where == "late half" else ""
        sign = "<" if metric.at_least else ">"
        limit = bound(members[0].limit, metric.unit)
        measured = [v for v in members if v.stopped_at_s is None]
        if measured:
            values = sorted(v.value for v in measured if v.value is not None)
            shown = "none finished" if not values else _range(values, metric.unit)
            lines.append(f"{metric.label} {shown} {sign} {limit}{late}")
        stops = sorted(v.stopped_at_s for v in members if v.stopped_at_s is not None)
        if stops:
            when = _range(stops, "s")
            lines.append(
                f"{metric.label} {sign} {limit}{late}: certain after {when} of simulated time (stopped early)"
            )
    return lines


def _range(values: list[float], unit: str) -> str:
    low, high = bound(values[0], unit), bound(values[-1], unit)
    return low if low == high else f"{low}–{high}"


def violations(steady: dict[str, Any], slos: SLOs) -> list[Violation]:
    """The SLOs one seed's steady-state metrics break (empty: it meets them all); for a run stopped
    early, those that were certainly broken when it stopped."""
    stopped = steady.get("stopped_early")
    if stopped:
        return [_certain(item, stopped, steady) for item in stopped["broken"]]
    found = []
    for name, limit in slos.limits().items():
        metric = SLO_METRICS[name]
        checks = [(metric.metric, "window")]
        if metric.late_half:
            checks.append((LATE_PREFIX + metric.metric, "late half"))
        for key, where in checks:
            value = steady.get(key)
            broken = value is None or (value < limit if metric.at_least else value > limit)
            if broken:
                found.append(Violation(name, key, value, limit, where))
                break
    return found


def _certain(broken: dict[str, Any], stopped: dict[str, Any], steady: dict[str, Any]) -> Violation:
    """A violation a stopped run was certain of; its value is the bound measured at the stop."""
    metric = SLO_METRICS[broken["slo"]].metric
    key = (LATE_PREFIX if broken["where"] == "late half" else "") + metric
    limit = float(broken["limit"])
    return Violation(broken["slo"], key, steady.get(key), limit, broken["where"], float(stopped["at_s"]))


STEADY_STATE = "steady_state"
MIN_WAITING_RISE = 2.0  # requests: a queue that grew by less is noise at any window length  # the pseudo-SLO of a probe that never reached a steady state


def unsteady_reasons(steady: dict[str, Any], spec: SearchSpec) -> list[str]:
    """Why one seed's run has not (yet) reached a steady state; empty when it has. A run measured
    before kvsim checked a quantity (the metric is missing) is not held back by it, nor is one stopped
    early (it fails whatever its trends: the stop measured none)."""
    if steady.get("stopped_early"):
        return []
    reasons = []
    multiple = steady.get("fill_multiple")
    if multiple is not None and multiple < spec.min_fill_multiple:
        reasons.append(
            f"arrivals spanned {multiple:.2f} KV-pool fill times (< {spec.min_fill_multiple:g}; one fill "
            f"{seconds(steady['pool_fill_s'])})"
        )
    deficit = steady.get("fill_deficit_s")
    if deficit is not None and deficit > spec.max_fill_deficit_s:
        reasons.append(f"the window opened {seconds(deficit)} before the system filled")
    kv_rise = steady.get("kv_usage_rise")
    if kv_rise is not None and kv_rise > spec.max_kv_usage_rise:
        reasons.append(
            f"KV usage rose {kv_rise:.1%} of the pool across the window (> {spec.max_kv_usage_rise:.0%})"
        )
    running_rise = steady.get("running_rise_frac")
    if running_rise is not None and running_rise > spec.max_running_rise_frac:
        reasons.append(
            f"the running batch grew {running_rise:.0%} across the window (> {spec.max_running_rise_frac:.0%})"
        )
    waiting_rise, waiting_frac = steady.get("waiting_rise"), steady.get("waiting_rise_frac")
    if (
        waiting_rise is not None
        and waiting_frac is not None
        and waiting_rise > MIN_WAITING_RISE
        and waiting_frac > spec.max_waiting_rise_frac
    ):
        reasons.append(
            f"the waiting queue grew by {waiting_rise:.1f} requests across the window ({waiting_frac:.1%} of its "
            f"arrivals, > {spec.max_waiting_rise_frac:.0%})"
        )
    return reasons


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
    broken: bool = False  # a probe failed to run: nothing more is probed, not even a confirmation
    confirmed: float | None = None  # the rate a confirmation run held at
    confirmations: int = 0  # confirmation runs made
    passed_requests: dict[float, int] = field(default_factory=dict)  # requests of each passing probe
    failed_requests: dict[float, int] = field(default_factory=dict)  # ... and of each failing one
    # After a confirmation broke, the short probes near this candidate's knee proved lucky: every later
    # probe runs as long as that confirmation (or the longest that passed since), and one that passes
    # so long needs no other.
    long_probe_requests: int = 0
    # The longest probe a rate needed to pass short of that length: any other rate's first probe runs
    # at least this long. Near the knee a higher rate settles no sooner, so a shorter first probe
    # would mostly run again longer (a band edge's search starts with its nominal search's).
    steady_requests: int = 0
    # Rates to probe first, all in one round, each at least this long (a warm start: :meth:`following`).
    queued: list[tuple[float, int]] = field(default_factory=list)

    @property
    def lo(self) -> float | None:
        """The highest rate that passed."""
        return max(self.passed) if self.passed else None

    @property
    def hi(self) -> float | None:
        """The lowest rate above :attr:`lo` that failed."""
        above = [rate for rate in self.failed if self.lo is None or rate > self.lo]
        return min(above) if above else None

    def record(self, rate: float, passed: bool, requests: int = 0) -> None:
        (self.passed if passed else self.failed).append(rate)
        if passed:
            self.passed_requests[rate] = requests
            if self.long_probe_requests and requests >= self.long_probe_requests:
                self.confirmed = max(rate, self.confirmed or 0.0)
                # It had to run longer still to settle: so will the next long probes.
                self.long_probe_requests = requests
            else:
                self.steady_requests = max(self.steady_requests, requests)
        else:
            self.failed_requests[rate] = requests

    def following(self, spec: SearchSpec) -> RateSearch:
        """A search of a neighbouring candidate (another block size of the same configuration) that
        starts from this finished one: it probes this answer and the failing rate above it first, in
        one round, each as long as the probe that decided it here, and keeps this search's long-probe
        length (short probes near this knee proved lucky: so may the neighbour's). If both verdicts
        hold, the bracket is this one's and the search is over (but for its own confirmation); if
        not, it goes on from there in steps of 2 ``rel_tolerance``. Without an answer here, the
        neighbour searches from scratch."""
        lo, hi = self.lo, self.hi
        if lo is None or self.broken:
            return RateSearch(spec)
        near = spec.model_copy(update={"growth": min(spec.growth, 1.0 + 2 * spec.rel_tolerance)})
        search = RateSearch(
            near, long_probe_requests=self.long_probe_requests, steady_requests=self.steady_requests
        )
        # The answer at least as long as a pass had to be here to count as confirmed; the failure as
        # long as it was (a longer one is no more needed to break an SLO).
        search.queued.append((lo, max(self.passed_requests.get(lo, 0), self.long_probe_requests)))
        if hi is not None:
            search.queued.append((hi, self.failed_requests.get(hi, 0)))
        return search

    def next_rates(self) -> list[tuple[float, int]]:
        """The rates to probe next, with the fewest requests each must have (0: no floor beyond the
        plan's own); empty when the search is over (but for its confirmation)."""
        if self.queued:  # as long as what decided them in the neighbour's search: the same evidence
            queued, self.queued = self.queued, []
            return queued
        rate = self.next_rate()
        return [] if rate is None else [(rate, max(self.long_probe_requests, self.steady_requests))]

    def stop(self, reason: str, broken: bool = False) -> None:
        self.stopped = reason
        self.broken = self.broken or broken

    def confirmation(self) -> tuple[float, int] | None:
        """The rate to confirm with a run ``confirm_factor`` times longer than its passing probe, and
        that run's requests; None while the search goes on, once :attr:`lo` is confirmed, or when no
        confirmation is wanted or left."""
        spec = self.spec
        lo = self.lo
        if not spec.confirm_factor or self.broken or lo is None or self.confirmed == lo:
            return None
        if self.confirmations >= spec.max_confirmations:
            return None
        longer = math.ceil(spec.confirm_factor * self.passed_requests.get(lo, spec.min_requests))
        return lo, max(longer, self.long_probe_requests)

    def record_confirmation(self, rate: float, held: bool, requests: int) -> None:
        """A long run at ``rate`` held (every SLO met): it is the answer. It broke: the rate fails
        after all, and the search bisects again below it with probes as long as this run (the short
        probe was lucky, and so may its neighbours be)."""
        self.confirmations += 1
        if held:
            self.confirmed = rate
            return
        self.passed.remove(rate)
        self.failed.append(rate)
        self.failed_requests[rate] = requests
        self.long_probe_requests = max(self.long_probe_requests, requests)

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

    def rounds_left(self) -> int:
        """About how many more rounds this search needs, from what it knows now: one more growth
        step to a bracket where it has none (the knee is as likely near as far: the estimate grows
        while the rates keep passing), the halvings of the bracket down to ``rel_tolerance``, and
        its confirmation. Probes run again longer are not foreseen."""
        spec = self.spec
        if self.stopped:
            return 0
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None:
            bracket, width = 0, hi / lo - 1
        else:
            at_limit = (lo is not None and lo >= spec.max_rate_per_s) or (
                hi is not None and hi <= spec.min_rate_per_s
            )
            bracket = 0 if at_limit else (1 if self.passed or self.failed else 2)
            width = 0.0 if at_limit else spec.growth - 1
        halvings = math.ceil(math.log2(width / spec.rel_tolerance)) if width > spec.rel_tolerance else 0
        probes = min(bracket + halvings, spec.max_probes - len(self.passed) - len(self.failed))
        confirming = bool(spec.confirm_factor) and self.confirmations < spec.max_confirmations
        return (1 if self.queued else 0) + max(0, probes) + int(confirming and self.confirmed is None)

    def status(self) -> str:
        """feasible | at_max_rate (never failed up to max_rate_per_s) | infeasible."""
        if self.lo is None:
            return "infeasible"
        return "at_max_rate" if self.hi is None else "feasible"
