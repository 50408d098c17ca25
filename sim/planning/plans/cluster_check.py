"""Counting a single-engine candidate's GPUs with the cluster model (``search.cluster_check``).

Dividing the target rate over identical replicas assumes a perfect balancer and no interaction. The
check simulates the replicas that division asks for as one cluster behind a router, at the target
rate with every seed, and adds replicas until every seed meets the SLOs (at most
``max_extra_replicas`` more). Candidates that are clusters already (``candidates.cluster``) need no
check: they were simulated whole at the full rate.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sim.planning.plans.search import describe, violations
from sim.planning.plans.spec import Candidate, Plan
from sim.planning.sweeps.driver import RunCounts, run_points
from sim.planning.sweeps.executors import Executor
from sim.planning.sweeps.store import FAILED, PointStore
from sim.planning.sweeps.tasks import PointOutcome, PointTask, run_point


@dataclass
class ClusterCheck:
    """The check of one candidate: the replica counts tried, in order, and what each gave."""

    candidate: str
    router: str
    first: int  # the divided count
    last: int  # the most replicas it may try
    tried: list[dict[str, Any]] = field(default_factory=list)

    @property
    def next_replicas(self) -> int | None:
        if self.tried and (self.tried[-1]["passed"] or self.tried[-1]["error"]):
            return None
        replicas = self.first + len(self.tried)
        return replicas if replicas <= self.last else None

    def outcome(self) -> dict[str, Any]:
        passed = [entry for entry in self.tried if entry["passed"]]
        return {
            "router": self.router,
            "replicas": passed[0]["replicas"] if passed else None,
            "divided_replicas": self.first,
            "tried": self.tried,
        }


def run_cluster_checks(
    plan: Plan,
    results: list[dict[str, Any]],
    store: PointStore,
    executor: Executor,
    *,
    retry_failed: bool = False,
    bar: Any = None,
    fn: Callable[[PointTask], PointOutcome] = run_point,
) -> tuple[dict[str, dict[str, Any]], RunCounts]:
    """Check every single-engine candidate that serves the target by division: candidate key ->
    :meth:`ClusterCheck.outcome`. Rounds run every pending check's next count together."""
    spec = plan.spec.search.cluster_check
    counts = RunCounts()
    target = plan.spec.target_rate_per_s
    if spec is None or target is None:  # (a plan with a cluster check needs a target: spec.py)
        return {}, counts
    by_key = {candidate.key: candidate for candidate in plan.candidates}
    checks = [
        ClusterCheck(
            r["key"],
            spec.router,
            r["replicas_for_target"],
            r["replicas_for_target"] + spec.max_extra_replicas,
        )
        for r in results
        if "replicas_for_target" in r and by_key[r["key"]].router is None
    ]
    while wanted := [(check, n) for check in checks if (n := check.next_replicas) is not None]:
        tasks = {
            (check.candidate, seed): plan.probe_task(
                _as_cluster(by_key[check.candidate], n, check.router), target, seed
            )
            for check, n in wanted
            for seed in plan.spec.search.seeds
        }
        records, round_counts = run_points(
            store, list(tasks.values()), executor, retry_failed=retry_failed, bar=bar, fn=fn
        )
        counts.add(round_counts)
        for check, n in wanted:
            entry: dict[str, Any] = {
                "replicas": n,
                "passed": True,
                "error": "",
                "points": [],
                "violations": [],
            }
            for seed in plan.spec.search.seeds:
                record = records[tasks[(check.candidate, seed)].point_id]
                entry["points"].append(record.point_id)
                if record.status == FAILED or not record.summaries:
                    entry |= {"passed": False, "error": record.error or "no summary"}
                    continue
                broken = violations(record.summaries[0].get("steady", {}), plan.spec.slos)
                entry["violations"] += describe(broken)
                entry["passed"] = entry["passed"] and not broken
            check.tried.append(entry)
    return {check.candidate: check.outcome() for check in checks}, counts


def _as_cluster(candidate: Candidate, replicas: int, router: str) -> Candidate:
    template = copy.deepcopy(candidate.template)
    template["cluster"] = {"replicas": replicas, "router": router}
    return replace(candidate, template=template)
