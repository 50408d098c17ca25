"""``kvsim plan`` from Python: search every candidate's maximum sustainable rate, then report.

The searches (which ones, and when each starts: ``sim.planning.plans.schedule``) run in lockstep
rounds: each round takes the next rate of every search under way, the band edges' included, runs
all of them with every seed as one batch of points, longest first (so a local pool or a Dask cluster
is kept busy), judges them, and moves each search on. A probe that met the SLOs without reaching a steady
state is not judged: the next round runs the same rate with twice the requests. Probes are points of
a point store, so a plan resumes like a sweep; the driver keeps only summaries.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sim.outputs.progress import duration
from sim.planning.plans.analysis import candidate_results
from sim.planning.plans.cluster_check import run_cluster_checks
from sim.planning.plans.plan_json import plan_document
from sim.planning.plans.probes import Probe, SeedRun
from sim.planning.plans.schedule import Job, Schedule, Wanted
from sim.planning.plans.search import STEADY_STATE, Violation, describe, unsteady_reasons, violations
from sim.planning.plans.spec import Plan
from sim.planning.report.document import Figure, to_html, to_markdown
from sim.planning.report.plan_report import Draw, report_blocks
from sim.planning.sweeps.driver import PointRecord, RunCounts, make_bar, run_points
from sim.planning.sweeps.executors import Executor, InlineExecutor
from sim.planning.sweeps.run import flatten_summary
from sim.planning.sweeps.store import FAILED, PointStore, replace_dir_atomic, write_atomic
from sim.planning.sweeps.tasks import PointOutcome, PointTask, run_point
from sim.results import PLAN_FILE

PLAN_KIND = "plan"


@dataclass
class PlanRun:
    out_dir: Path
    document: dict[str, Any]  # what plan.json holds
    counts: RunCounts


def run_plan(
    plan: Plan,
    out_dir: str | Path,
    executor: Executor | None = None,
    *,
    retry_failed: bool = False,
    progress: bool = False,
    log: Callable[[str], None] = lambda message: None,
    fn: Callable[[PointTask], PointOutcome] = run_point,
    wall_s: Callable[[], float] | None = None,
) -> PlanRun:
    store = PointStore.open(out_dir, PLAN_KIND, plan.digest(), log)
    store.clean_stale()
    bar = make_bar(plan.spec.name, progress)
    run = Rounds(store, executor or InlineExecutor(), retry_failed, bar, fn, log)
    schedule = Schedule(plan)
    try:
        probes = run.search(schedule)
        searches = schedule.searches
        results = candidate_results(plan, searches, probes)
        checks, check_counts = run_cluster_checks(
            plan, results, store, run.executor, retry_failed=retry_failed, bar=bar, fn=fn
        )
        run.counts.add(check_counts)
        if checks:
            log(f"kvsim plan: cluster checks of {len(checks)} candidate(s); {check_counts.ran} simulated")
        results = candidate_results(plan, searches, probes, checks)
        band = schedule.band.summary(plan, probes)
    finally:
        bar.close()
    document = plan_document(plan, results, probes, run.counts, wall_s() if wall_s else None, band)
    write_atomic(store.root / PLAN_FILE, lambda path: path.write_text(json.dumps(document, indent=2)))
    store.write_table(probe_table(probes))
    write_report(store.root, document, run.executor.run)
    return PlanRun(store.root, document, run.counts)


def write_report(root: Path, document: dict[str, Any], run: Draw | None = None) -> None:
    """``report.md`` (figures in ``figures/``) and ``report.html`` (figures embedded). ``run`` draws
    the figures (an executor's ``run``: the plan's worker processes draw them side by side). Written
    here, not in the report, which only renders: the atomic writes are the point store's, and the
    sweeps stand above the report."""
    blocks = report_blocks(document, root, run)
    figures = [block for block in blocks if isinstance(block, Figure)]

    def fill(folder: Path) -> None:
        for figure in figures:
            (folder / figure.name).write_bytes(figure.png)

    replace_dir_atomic(root / "figures", fill)
    title = f"kvsim plan: {document['name']}"
    write_atomic(root / "report.md", lambda path: path.write_text(to_markdown(blocks)))
    write_atomic(root / "report.html", lambda path: path.write_text(to_html(blocks, title)))


@dataclass
class Rounds:
    """Runs searches in lockstep rounds into one store, counting what it simulated."""

    store: PointStore
    executor: Executor
    retry_failed: bool
    bar: Any
    fn: Callable[[PointTask], PointOutcome]
    log: Callable[[str], None]
    counts: RunCounts = field(default_factory=RunCounts)
    rounds: int = 0
    started_s: float = field(default_factory=time.monotonic)

    def search(self, schedule: Schedule) -> list[Probe]:
        """Every search of ``schedule`` to its end (confirmations included, and the searches each
        one's end starts); the probes run, numbered in the order they ran, each marked with the
        GPU-time scale its cost model ran at."""
        probes: list[Probe] = []
        active = schedule.first()
        while True:
            wanted: list[tuple[Job, Wanted]] = []
            pending, active = active, []
            while pending:  # a search that ends now may start others in this very round
                job = pending.pop(0)
                if job_wants := job.wanted():
                    wanted += [(job, item) for item in job_wants]
                    active.append(job)
                else:
                    pending += schedule.after(job, probes)
            if not wanted:
                return probes
            round_probes, round_counts = _run_round(
                self.store, self.executor, wanted, len(probes), self.retry_failed, self.bar, self.fn
            )
            self.counts.add(round_counts)
            for job, probe in round_probes:
                probe.time_scale = job.time_scale
                _judge(probe, job)
                probes.append(probe)
            self.rounds += 1
            self.log(self._round_line(schedule, active, round_probes, round_counts))

    def _round_line(
        self, schedule: Schedule, active: list[Job], round_probes: list[tuple[Job, Probe]], counts: RunCounts
    ) -> str:
        """``round 3 of about 8: ...; 12 simulated; 40 s so far, about 1.5 min left`` (the estimate
        from the searches' brackets, the time from the rounds so far)."""
        edges = sum(job.side is not None for job, _ in round_probes)
        seeds = len(schedule.plan.spec.search.seeds)
        left = schedule.rounds_left(active)
        elapsed_s = time.monotonic() - self.started_s
        timing = f"; {duration(elapsed_s)} so far"
        if left:
            timing += f", about {duration(elapsed_s / self.rounds * left)} left"
        total = f" of about {self.rounds + left}" if left else " (the last, unless a search must run again)"
        return (
            f"kvsim plan: round {self.rounds}{total}: {len(round_probes)} candidate rate(s) x {seeds} seed(s)"
            + (f" ({edges} at the cost model's band edges)" if edges else "")
            + f"; {counts.ran} simulated{timing}"
        )


def _judge(probe: Probe, job: Job) -> None:
    """Move the job's search on with the probe's verdict, or have it run the same rate, longer."""
    search, max_requests = job.search, job.plan.spec.search.max_requests
    if probe.error:
        search.stop(f"a probe at {probe.rate:g} req/s failed to run: {probe.error}", broken=True)
        return
    if probe.confirmation:
        search.record_confirmation(probe.rate, probe.passed, probe.requests)
        return
    if probe.needs_longer and probe.requests < max_requests:
        probe.extended = True
        job.longer.append((probe.rate, min(max_requests, 2 * probe.requests)))
        return
    if probe.needs_longer:  # at the longest probe allowed and still not steady: not sustainable
        for run in probe.runs:
            if run.unsteady:
                why = f"no steady state after {probe.requests:,} requests: {'; '.join(run.unsteady)}"
                run.violations.append(Violation(STEADY_STATE, why, None, float(max_requests), "window"))
    search.record(probe.rate, probe.passed, probe.requests)


def _run_round(
    store: PointStore,
    executor: Executor,
    wanted: list[tuple[Job, Wanted]],
    first_number: int,
    retry_failed: bool,
    bar: Any,
    fn: Callable[[PointTask], PointOutcome],
) -> tuple[list[tuple[Job, Probe]], RunCounts]:
    tasks = {
        (c.key, rate, seed): job.plan.probe_task(c, rate, seed, requests)
        for job, (c, rate, requests, confirmation) in wanted
        for seed in job.plan.spec.search.seeds_for(confirmation)
    }
    # The longest first: the short ones fill the cores while the long ones run, and no round ends on
    # a long probe that started last.
    length = {(c.key, rate): requests for _, (c, rate, requests, _) in wanted}
    ordered = [tasks[key] for key in sorted(tasks, key=lambda key: -length[key[:2]])]
    records, counts = run_points(store, ordered, executor, retry_failed=retry_failed, bar=bar, fn=fn)
    probes = []
    for offset, (job, (candidate, rate, requests, confirmation)) in enumerate(wanted):
        probe = Probe(first_number + offset, candidate.key, rate, requests, confirmation=confirmation)
        for seed in job.plan.spec.search.seeds_for(confirmation):
            record = records[tasks[(candidate.key, rate, seed)].point_id]
            _add_seed_run(probe, seed, record, job.plan)
        probes.append((job, probe))
    return probes, counts


def _add_seed_run(probe: Probe, seed: int, record: PointRecord, plan: Plan) -> None:
    if record.status == FAILED or not record.summaries:
        probe.error = probe.error or f"point {record.point_id} (seed {seed}): {record.error or 'no summary'}"
        return
    summary = dict(record.summaries[0])
    steady = summary.pop("steady", {})
    broken = violations(steady, plan.spec.slos)
    unsteady = unsteady_reasons(steady, plan.spec.search)
    probe.runs.append(SeedRun(seed, record.point_id, summary, steady, broken, unsteady))


def probe_table(probes: list[Probe]) -> pd.DataFrame:
    """One row per probe point (candidate x rate x seed): the plan's sweep table."""
    rows = []
    for probe in probes:
        for run in probe.runs:
            head = {
                "probe": probe.number,
                "candidate": probe.candidate,
                "rate_per_s": probe.rate,
                "seed": run.seed,
                "point_id": run.point_id,
                "status": "ok",
                "requests": probe.requests,
                "passed": not run.violations and not run.unsteady,
                "violations": "; ".join(describe(run.violations)),
                "not_steady": "; ".join(run.unsteady),
                # When the run was stopped, an SLO certainly broken (simulated seconds; NaN: ran to its end).
                "stopped_early_s": (run.steady.get("stopped_early") or {}).get("at_s"),
                "run_again_longer": probe.extended,
                "confirmation": probe.confirmation,
                "time_scale": probe.time_scale,
            }
            rows.append(head | flatten_summary(run.summary | {"steady": run.steady}))
    return pd.DataFrame(rows)
