"""Stopping a probe as soon as its failure is certain: the verdict the full run would reach, sooner.

A probe fails when one seed's run breaks an SLO on its steady-state window (or the window's late
half). Whatever happens later, some failures are settled early: a request that has waited longer
than the TTFT limit without a first token has a TTFT over the limit, and once more of the window's
requests are over it than a p99 allows, the p99 is over it too. :class:`CertainFailureWatch` checks
this at regular instants of simulated time and ends the run when an SLO is certainly broken; the
probe then fails as the full run would have (its other seeds still run: they are not needed for the
verdict, but the report shows them).

**What is known during the run.** Every arrival is known up front (the watch is shown only such
runs, ``sim.runner.RunWatch``), so the window's end (the ``1 - drain_frac`` quantile of the arrival
times) is known, but not its start: :func:`~sim.planning.sweeps.steady.window_and_fill_deficit`
opens it at the ``warmup_frac`` quantile ``q_w`` or one mean residence time after the first arrival,
whichever is later, capped at the middle ``s_max`` of ``[q_w, end]``, and the mean residence is only
known at the end. So an SLO counts as certainly broken only when it is broken for *every* window
start in ``[q_w, s_max]`` (for the late half: every middle of such a window). Per request, at time T:

- latencies are bounded below: a request without its first token has TTFT >= T - arrival (plus the
  client overhead), one not finished has E2E >= the same, a decoding one TPOT >= (T - first token)
  / (output tokens - 1); a request yet to arrive has TTFT and E2E >= the overhead, TPOT >= 0;
- the set of finished requests is known: a request rejected on arrival is known before the run
  (``Engine.rejects_on_arrival``), and every other one finishes. The watch declines runs where this
  could fail (``on_oom: fail``, a ``watermark``, requests of several samples or beams) and gives up
  if a request leaves otherwise;
- a percentile over n values (numpy's linear interpolation) is above the limit once at least
  ``n - floor(q (n - 1)) + 1`` of them are (one more than the interpolation's lower neighbour needs,
  so that the rounding of its index cannot matter), and that count only grows with n: so the count
  is taken against the most requests the window can finish;
- a mean is at least the mean of the lower bounds (requests that can still arrive count at their
  smallest value); goodput's attainment at most the share of requests not yet certain to miss a
  target; preemptions per request at least those so far.

The SLOs without such a bound (queue growth) never stop a run; a run whose failure never becomes
certain runs to its end and is judged as before. Checks start at ``s_max``, when the first request
every window holds can arrive, and repeat every ``1 / checks_per_window`` of ``[q_w, end]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.planning.sweeps.steady import SteadyWindow

if TYPE_CHECKING:
    import simpy

    from sim.engine.core import Engine
    from sim.outputs.metrics import RequestRecord
    from workloads.request import Request

CHECKS_PER_WINDOW = 32
WINDOW, LATE_HALF = "window", "late half"

# SLO name -> (how it is bounded, the latency it reads, the percentile). Queue growth has no bound.
QUANTILES = {
    "ttft_p99_s": ("ttft", 99.0),
    "ttft_p50_s": ("ttft", 50.0),
    "tpot_p50_s": ("tpot", 50.0),
    "tpot_p99_s": ("tpot", 99.0),
    "e2e_p99_s": ("e2e", 99.0),
}
MEANS = {
    "ttft_mean_s": "ttft",
    "tpot_mean_s": "tpot",
    "e2e_mean_s": "e2e",
    "normalized_latency_mean_s": "normalized",
}
SHARES = {"max_preemptions_per_request": "preemptions", "max_rejected_frac": "rejected"}
STOPPABLE = (*QUANTILES, *MEANS, *SHARES, "goodput")


@dataclass(frozen=True)
class StopRules:
    """What a probe's worker needs to stop it early: the SLO limits and the steady window."""

    # (SLO name, limit, whether the window's late half is checked too), as the plan's SLOs say
    limits: tuple[tuple[str, float, bool], ...]
    window: SteadyWindow
    checks_per_window: int = CHECKS_PER_WINDOW

    @classmethod
    def of(
        cls, limits: dict[str, float], late_half: dict[str, bool], window: SteadyWindow
    ) -> StopRules | None:
        """The rules for these SLOs, or None when none of them can stop a run."""
        stoppable = tuple(
            (name, float(limit), late_half[name]) for name, limit in limits.items() if name in STOPPABLE
        )
        return cls(stoppable, window) if stoppable else None

    def limit(self, slo: str) -> float:
        return next(limit for name, limit, _ in self.limits if name == slo)

    def as_dict(self) -> dict[str, Any]:
        return {
            "limits": [list(item) for item in self.limits],
            "window": self.window.as_dict(),
            "checks_per_window": self.checks_per_window,
        }


def certain_count(values: int | np.ndarray, percentile: float) -> np.ndarray:
    """How many of ``values`` values must exceed a limit for their ``percentile`` to exceed it."""
    n = np.asarray(values, dtype=np.int64)
    return n - np.floor(percentile / 100.0 * (n - 1)).astype(np.int64) + 1


@dataclass(frozen=True)
class Ranges:
    """The request index ranges ``[start, end)`` the steady window (or its late half) can cover,
    over arrival times sorted ascending: every start in ``starts``, the same end."""

    starts: np.ndarray
    end: int

    @classmethod
    def of(cls, arrivals: np.ndarray, first: float, end: float) -> tuple[Ranges, Ranges]:
        """The window's ranges and its late half's, for a window that opens between ``first`` (the
        warm-up quantile) and the cap halfway to ``end`` (see the module docstring)."""
        last_start = first + (end - first) / 2  # the cap, computed as the window computes it
        stop = int(np.searchsorted(arrivals, end, side="right"))
        # Every start between two arrivals covers the same requests: the arrivals are the breakpoints.
        starts = np.arange(
            int(np.searchsorted(arrivals, first, side="left")),
            int(np.searchsorted(arrivals, last_start, side="left")) + 1,
        )
        middles = np.arange(
            int(np.searchsorted(arrivals, (first + end) / 2, side="left")),
            int(np.searchsorted(arrivals, (last_start + end) / 2, side="left")) + 1,
        )
        return cls(starts[starts <= stop], stop), cls(middles[middles <= stop], stop)

    def sums(self, values: np.ndarray) -> np.ndarray:
        """Sum of ``values`` over each range."""
        if not len(self.starts):
            return np.zeros(0)
        first = int(self.starts[0])
        # From the ranges' common end back: each sum is a suffix of their span (an empty one, 0).
        suffix = np.cumsum(values[first : self.end][::-1], dtype=float)[::-1]
        return np.append(suffix, 0.0)[self.starts - first]


class CertainFailureWatch:
    """A :class:`sim.runner.RunWatch`: ends the run once :class:`StopRules`' SLOs are certainly broken
    (see the module docstring); :meth:`outcome` says which, where and when."""

    def __init__(self, rules: StopRules):
        self.rules = rules
        self._records: dict[int, RequestRecord] = {}
        self._index: dict[int, int] = {}  # request id -> position in arrival order
        self._open: list[int] = []  # arrived positions not finished yet (as of the last check)
        self._outcome: dict[str, Any] | None = None
        self._given_up = ""

    # -- RunWatch --------------------------------------------------------------------------------
    def arrived(self, record: RequestRecord) -> None:
        position = self._index.get(record.request_id)
        if position is not None:
            self._records[position] = record
            self._open.append(position)

    def begin(self, engine: Engine, requests: list[Request]) -> simpy.Event | None:
        knobs = engine.knobs
        if knobs.on_oom != "queue" or knobs.watermark > 0 or len(requests) < 2:
            return None
        if any(request.width > 1 for request in requests):
            return None
        arrivals = np.array([request.arrival_s for request in requests], dtype=float)
        if np.any(np.diff(arrivals) < 0):
            return None
        self._env = engine.env
        self._index = {request.request_id: i for i, request in enumerate(requests)}
        if len(self._index) != len(requests):
            return None
        self._arrivals = arrivals
        self._overhead = float(knobs.client_overhead_s)
        self._outputs = np.array([request.longest_output_len for request in requests], dtype=float)
        self._admissible = ~np.array([engine.rejects_on_arrival(request) for request in requests])
        # The window's earliest start and its end, computed as the window computes them.
        first = float(np.quantile(arrivals, self.rules.window.warmup_frac))
        end = float(np.quantile(arrivals, 1.0 - self.rules.window.drain_frac))
        self._window_s = (first, end)
        self._window, self._late = Ranges.of(arrivals, first, end)
        self._bounds = self._initial_bounds()
        self._checks = self._make_checks()
        self._every_s = max((end - first) / self.rules.checks_per_window, 1e-9)
        self._from_s = first + (end - first) / 2
        self._stop = self._env.event()
        self._env.process(self._watch())
        return self._stop

    def outcome(self) -> dict[str, Any] | None:
        return self._outcome

    # -- the checks ------------------------------------------------------------------------------
    def _watch(self):
        env = self._env
        yield env.timeout(max(0.0, self._from_s - env.now))
        while True:
            broken = self._broken_now()
            if broken:
                self._outcome = self._describe(broken)
                self._stop.succeed()
                return
            if self._given_up or self._window_settled():
                return
            yield env.timeout(self._every_s)

    def _window_settled(self) -> bool:
        """Every request any window can hold has arrived and finished: nothing will change any more."""
        end = self._window.end
        if end and (end - 1) not in self._records:
            return False
        lowest = int(self._window.starts.min()) if len(self._window.starts) else end
        return all(position >= end or position < lowest for position in self._open)

    def _initial_bounds(self) -> dict[str, np.ndarray]:
        """Each request's latency lower bounds before it arrives (the overhead; TPOT 0)."""
        count = len(self._arrivals)
        overhead = np.full(count, self._overhead)
        return {
            "ttft": overhead.copy(),
            "e2e": overhead.copy(),
            "tpot": np.zeros(count),
            "normalized": overhead / np.maximum(self._outputs, 1.0),
            "preemptions": np.zeros(count),
        }

    def _refresh(self, now: float) -> None:
        """The bounds of the requests in flight, as of ``now`` (a finished one's are its values)."""
        bounds, arrivals, outputs, overhead = self._bounds, self._arrivals, self._outputs, self._overhead
        still_open = []
        for position in self._open:
            record = self._records[position]
            if record.outcome not in ("unfinished", "finished"):
                if self._admissible[position]:
                    self._given_up = f"request {record.request_id} left {record.outcome}"
                continue
            arrival, first, finish = arrivals[position], record.first_token_s, record.finish_s
            done = finish == finish  # not NaN
            started = first == first
            # The same float operations as the requests table's columns (sim.outputs.metrics).
            bounds["ttft"][position] = (first if started else now) - arrival + overhead
            e2e = (finish if done else now) - arrival + overhead
            bounds["e2e"][position] = e2e
            bounds["normalized"][position] = e2e / outputs[position] if outputs[position] > 0 else 0.0
            if started and outputs[position] > 1:
                bounds["tpot"][position] = ((finish if done else now) - first) / (outputs[position] - 1)
            bounds["preemptions"][position] = record.preemptions
            if not done:
                still_open.append(position)
        self._open = still_open

    def _broken_now(self) -> list[tuple[str, str, str]]:
        """The SLOs certainly broken now: (SLO, window part, evidence)."""
        self._refresh(self._env.now)
        if self._given_up:
            return []
        broken = []
        for name, parts in self._checks:
            for where, check in parts:
                evidence = check()
                if evidence:
                    broken.append((name, where, evidence))
                    break
        return broken

    def _make_checks(self) -> list[tuple[str, list[tuple[str, Callable[[], str]]]]]:
        """Per SLO, its check on each window part it applies to (what does not change, computed once)."""
        checks = []
        for name, limit, late_half in self.rules.limits:
            parts = [(WINDOW, self._window)] + ([(LATE_HALF, self._late)] if late_half else [])
            made = []
            for where, ranges in parts:
                if not len(ranges.starts) or np.any(ranges.end - ranges.starts < 1):
                    continue  # an empty window: nothing to bound
                if name in QUANTILES:
                    latency, percentile = QUANTILES[name]
                    check = self._quantile_check(ranges, latency, percentile, limit)
                elif name in MEANS:
                    check = self._mean_check(ranges, MEANS[name], limit)
                elif name in SHARES:
                    check = self._share_check(ranges, SHARES[name], limit)
                else:
                    check = self._attainment_check(ranges, limit)
                made.append((where, check))
            checks.append((name, made))
        return checks

    def _valid(self, latency: str) -> np.ndarray:
        """The requests whose ``latency`` the window's statistics will include (TPOT needs 2 tokens)."""
        return self._admissible & (self._outputs > 1) if latency == "tpot" else self._admissible

    def _quantile_check(
        self, ranges: Ranges, latency: str, percentile: float, limit: float
    ) -> Callable[[], str]:
        valid = self._valid(latency)
        values = ranges.sums(valid.astype(float)).astype(np.int64)
        needed = certain_count(values, percentile)
        bounds = self._bounds[latency]
        if np.any(values < 1):
            return lambda: ""

        def check() -> str:
            over = ranges.sums(valid & (bounds > limit)).astype(np.int64)
            if np.any(over < needed):
                return ""
            return f"{over[0]:,} of at most {values[0]:,} requests already over the limit"

        return check

    def _mean_check(self, ranges: Ranges, latency: str, limit: float) -> Callable[[], str]:
        valid = self._valid(latency)
        counts = ranges.sums(valid.astype(float))
        bounds = self._bounds[latency]
        if np.any(counts < 1):
            return lambda: ""

        def check() -> str:
            means = ranges.sums(np.where(valid, bounds, 0.0)) / counts
            if np.any(means <= limit):
                return ""
            return f"the mean is at least {means.min():.4g} s"

        return check

    def _share_check(self, ranges: Ranges, quantity: str, limit: float) -> Callable[[], str]:
        counts = (ranges.end - ranges.starts).astype(float)
        amount = (~self._admissible).astype(float) if quantity == "rejected" else self._bounds[quantity]

        def check() -> str:
            shares = ranges.sums(amount) / counts
            if np.any(shares <= limit):
                return ""
            return f"at least {shares.min():.4g} per request"

        return check

    def _attainment_check(self, ranges: Ranges, minimum: float) -> Callable[[], str]:
        window = self.rules.window
        counts = (ranges.end - ranges.starts).astype(float)
        bounds = self._bounds

        def check() -> str:
            missed = ~self._admissible
            if window.goodput_ttft_s is not None:
                missed = missed | (bounds["ttft"] > window.goodput_ttft_s)
            if window.goodput_tpot_s is not None:
                missed = missed | ((self._outputs > 1) & (bounds["tpot"] > window.goodput_tpot_s))
            attainable = 1.0 - ranges.sums(missed) / counts
            if np.any(attainable >= minimum):
                return ""
            return f"at most {attainable.max():.1%} can still meet their targets"

        return check

    def _describe(self, broken: list[tuple[str, str, str]]) -> dict[str, Any]:
        return {
            "at_s": float(self._env.now),
            "requests_arrived": len(self._records),
            "requests_planned": len(self._arrivals),
            "window_first_s": self._window_s[0],  # the window's earliest start and its end
            "window_end_s": self._window_s[1],
            "rules": self.rules.as_dict(),  # what it was stopped for: a stored run answers these alone
            "broken": [
                {"slo": name, "limit": self.rules.limit(name), "where": where, "evidence": evidence}
                for name, where, evidence in broken
            ],
        }


def watch_factory(rules: StopRules | None) -> Callable[[], CertainFailureWatch] | None:
    """What ``sim.runner.run_experiment``'s ``watch`` takes: a fresh watch per variant (None: none)."""
    return None if rules is None else (lambda: CertainFailureWatch(rules))
