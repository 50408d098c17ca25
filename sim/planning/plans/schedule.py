"""Which rate searches a plan runs, and when: a search starts as soon as what it starts from is known.

- Every candidate's own search starts at once, except a **block-size sibling**'s (the same model,
  GPU, policy and knobs at another block size): the candidate of its group with the largest block
  size searches first (fewer blocks: the cheapest to simulate), and each sibling then starts from
  its answer (:meth:`RateSearch.following`: that answer and the failing rate above it, probed in one
  round at the lengths that decided them). Block size rarely moves the maximum rate by a whole
  bisection step, so a sibling's search is usually that one round and its confirmation.
- A candidate's searches at the cost model's **band edges** (``sim.planning.plans.band``) start once
  its own search has an answer, alongside the searches still running; a sibling's edge starts from
  its neighbour's at the same edge.

The searches advance in lockstep rounds (``sim.planning.plans.run``), so a round holds the next
probes of every search under way, the band's included, and the cores stay busy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from sim.planning.plans.analysis import candidate_results
from sim.planning.plans.band import Band
from sim.planning.plans.search import RateSearch
from sim.planning.plans.spec import Candidate, Plan

if TYPE_CHECKING:
    from sim.planning.plans.probes import Probe

Wanted = tuple[Candidate, float, int, bool]  # candidate, rate, requests per seed, a confirmation?


@dataclass
class Job:
    """One candidate's rate search, nominal or at a band edge, and what it must run again longer."""

    candidate: Candidate
    search: RateSearch
    plan: Plan  # whose probe configs its probes run (a band edge's: short probes, no confirmation)
    time_scale: float = 1.0  # the cost model's GPU times were multiplied by this (1: nominal)
    side: str | None = None  # the band edge it searches ("fast" or "slow"); None: the nominal search
    longer: list[tuple[float, int]] = field(default_factory=list)  # rates to run again, and how long

    def wanted(self) -> list[Wanted]:
        """This round's probes: the rates that must run again longer (the search waits for them),
        else its next rates, else its confirmation; empty when the search is over."""
        if self.longer:
            again, self.longer = self.longer, []
            return [(self.candidate, rate, requests, False) for rate, requests in again]
        wanted = [
            (self.candidate, rate, max(self.plan.first_requests(self.candidate, rate), floor), False)
            for rate, floor in self.search.next_rates()
        ]
        if not wanted and (confirm := self.search.confirmation()) is not None:
            wanted.append((self.candidate, *confirm, True))
        return wanted


def sibling_key(candidate: Candidate) -> str:
    """What block-size siblings share: their experiment but for the block size."""
    template = json.loads(json.dumps(candidate.template))
    template.get("engine", {}).pop("block_size", None)
    return json.dumps(template, sort_keys=True)


class Schedule:
    """The searches of one plan: :meth:`first` to start, :meth:`after` each one that ends."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.band = Band(plan)
        self.nominal: dict[str, Job] = {}
        self.edge_jobs: dict[tuple[str, str], Job] = {}  # (nominal key, side) -> its edge's job
        self._leader: dict[str, Candidate] = {}  # a sibling's key -> the candidate that searches first
        self._followers: dict[str, list[Candidate]] = {}
        self._answers: dict[str, float] = {}  # nominal key -> its maximum rate (searches that have one)
        self._done: set[int] = set()
        groups: dict[str, list[Candidate]] = {}
        for candidate in plan.candidates:
            if not candidate.infeasible and candidate.uses_blocks:
                groups.setdefault(sibling_key(candidate), []).append(candidate)
        for members in groups.values():
            leader = max(members, key=lambda candidate: candidate.block_size)
            for member in members:
                if member is not leader:
                    self._leader[member.key] = leader
                    self._followers.setdefault(leader.key, []).append(member)

    @property
    def searches(self) -> dict[str, RateSearch]:
        """Every candidate's own search, by key (the band's are :attr:`band`'s)."""
        return {key: job.search for key, job in self.nominal.items()}

    def first(self) -> list[Job]:
        """The searches that need nothing first: every feasible candidate's but a sibling's."""
        return [
            self._nominal(candidate, RateSearch(self.plan.spec.search))
            for candidate in self.plan.candidates
            if not candidate.infeasible and candidate.key not in self._leader
        ]

    def after(self, job: Job, probes: list[Probe]) -> list[Job]:
        """The searches that can start now that ``job``'s is over."""
        if id(job) in self._done:
            return []
        self._done.add(id(job))
        if job.side is not None:
            nominal_key = self.band.origin[job.candidate.key][1]
            return [
                edge
                for follower in self._followers.get(nominal_key, [])
                if (edge := self._edge(follower, job.side)) is not None
            ]
        started = [
            self._nominal(follower, job.search.following(self.plan.spec.search))
            for follower in self._followers.get(job.candidate.key, [])
        ]
        answer = self._answer(job, probes)
        if answer is not None:
            self._answers[job.candidate.key] = answer
            started += [
                edge for side in self.band.sides(job.candidate) if (edge := self._edge(job.candidate, side))
            ]
        return started

    def rounds_left(self, active: list[Job]) -> int:
        """About how many rounds the plan still needs: the longest chain of an active search's own
        rounds and of what starts after it (a sibling's warm-started search, the band edges' ones).
        An estimate, for the progress lines: probes run again longer are not foreseen."""
        return max((job.search.rounds_left() + self._rounds_after(job) for job in active), default=0)

    def _rounds_after(self, job: Job) -> int:
        # A warm start probes the neighbour's answer and failing rate in one round, then bisects a
        # bracket of 2 rel_tolerance once; a nominal search also confirms.
        warm = 2
        if job.side is not None:  # the followers' searches at the same edge wait for this one
            nominal_key = self.band.origin[job.candidate.key][1]
            return warm if self._followers.get(nominal_key) else 0
        edges = warm if self.band.sides(job.candidate) else 0
        followers = (warm + 1 + edges) if self._followers.get(job.candidate.key) else 0
        return max(edges, followers)

    def _nominal(self, candidate: Candidate, search: RateSearch) -> Job:
        job = self.nominal[candidate.key] = Job(candidate, search, self.plan)
        return job

    def _answer(self, job: Job, probes: list[Probe]) -> float | None:
        """The maximum rate the finished search found (as the plan's results will say), if any."""
        result = candidate_results(
            replace(self.plan, candidates=[job.candidate]), {job.candidate.key: job.search}, probes
        )[0]
        return result.get("max_rate_per_s")

    def _edge(self, candidate: Candidate, side: str) -> Job | None:
        """``candidate``'s search at its band's ``side`` edge, if it can start: its own search has an
        answer, and a sibling's waits for its leader's at the same edge (unless the leader has none)."""
        if candidate.key not in self._answers or (candidate.key, side) in self.edge_jobs:
            return None
        neighbour = None
        leader = self._leader.get(candidate.key)
        if leader is not None and leader.key in self._answers:
            leading = self.edge_jobs.get((leader.key, side))
            if leading is None or id(leading) not in self._done:
                return None  # started when the leader's edge search ends
            neighbour = leading.search
        nominal = self.nominal[candidate.key].search
        edge, search = self.band.edge(candidate, side, nominal, self._answers[candidate.key], neighbour)
        scale = self.band.scale(candidate.key, side)
        job = self.edge_jobs[(candidate.key, side)] = Job(edge, search, self.band.plan, scale, side)
        return job
