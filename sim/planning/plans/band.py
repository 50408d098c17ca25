"""The cost model's error band, carried into the answer: every candidate searched again with its GPU
times scaled to the band's edges (``cost_model: {time_scale: ...}``, ``sim/costs/scaled.py``).

The band is ``search.cost_band``: ``fitted`` (the default) takes it from the serving calibration's
held-out TPOT errors for **each candidate's GPU** (``ServingCalibration.time_scale_band``: a GPU with
measured runs in the fit gets the leave-one-run-out errors, any other the leave-one-GPU-out ones,
widened by the range of each ceiling assumed rather than measured on it: its memory's achievable
bandwidth, its matrix products' achievable rate), so that a
plan comparing a measured H100 with a datasheet-only B200 shows how much less certain the B200's
row is. An explicit ``[fast, slow]`` pair of scales applies to every candidate, and ``none`` skips
it. Each candidate has two edges, ``fast`` and ``slow``, each at its own GPU's scale; the ranking
can flip within the band where another candidate's fast edge beats the recommendation's slow one.
The edge searches start from each candidate's nominal maximum rate scaled by the edge (a warm
start: a few probes each) and are not confirmed by long runs, so an edge's rate is a short-probe
estimate: the report says so. A candidate's edges are searched as soon as it has its nominal
answer, alongside the other candidates' searches; a block-size sibling's edge starts from its
neighbour's at the same edge (``RateSearch.following``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sim.planning.plans.analysis import candidate_results
from sim.planning.plans.search import RateSearch
from sim.planning.plans.spec import Candidate, Plan, SearchSpec

if TYPE_CHECKING:
    from sim.planning.plans.probes import Probe


SIDES = ("fast", "slow")


@dataclass(frozen=True)
class CandidateBand:
    """One candidate's band: its two GPU-time scales and what they rest on."""

    fast: float
    slow: float
    gpu: str = ""
    evidence: str = ""
    """``measured``, ``transferred`` or ``datasheet-only`` (``ServingCalibration.evidence``); "" when
    the plan gives the band."""

    def scale(self, side: str) -> float:
        return self.fast if side == "fast" else self.slow


def band_scales(plan: Plan) -> dict[str, CandidateBand]:
    """Each candidate's band, by key (none for a candidate without a fitted band: no edges)."""
    band = plan.spec.search.cost_band
    if band == "none":
        return {}
    if isinstance(band, list):
        given = CandidateBand(float(band[0]), float(band[1]))
        return {candidate.key: given for candidate in plan.candidates}
    fitted = {}
    for candidate in plan.candidates:
        found = _fitted_band(candidate.template.get("cost_model"), candidate.template.get("gpu"))
        if found is not None:
            fitted[candidate.key] = found
    return fitted


def _fitted_band(cost_model: Any, gpu_spec: Any) -> CandidateBand | None:
    from sim.costs.core import CostModelConfig
    from sim.costs.factory import serving_calibration
    from sim.hardware.gpus import resolve_gpu

    try:
        config = CostModelConfig.model_validate(cost_model)
        gpu = resolve_gpu(gpu_spec) if gpu_spec is not None else None
    except ValueError:
        return None
    if config.kind != "derated" or config.calibration == "none":
        return None
    try:
        calibration = serving_calibration(config.calibration)
    except ValueError:
        return None
    scales = calibration.time_scale_band(gpu)
    if scales is None:
        return None
    evidence = calibration.evidence(gpu) if gpu is not None else ""
    return CandidateBand(scales[0], scales[1], gpu.name if gpu is not None else "", evidence)


def with_time_scale(cost_model: Any, time_scale: float) -> dict[str, Any]:
    """An experiment's ``cost_model`` value in its mapping form, its GPU times scaled by ``time_scale``
    on top of any ``time_scale`` it has (a plan asking "10 % slower than modelled" keeps asking it at
    the band's edges)."""
    from sim.costs.core import CostModelConfig

    config = CostModelConfig.model_validate(cost_model)
    data = config.model_dump(mode="json", exclude_defaults=True)
    return data | {"time_scale": config.time_scale * time_scale}


def edge_candidate(candidate: Candidate, time_scale: float) -> Candidate:
    """``candidate`` with its cost model at ``time_scale``, keyed apart from the nominal one."""
    template = copy.deepcopy(candidate.template)
    template["cost_model"] = with_time_scale(template.get("cost_model"), time_scale)
    return replace(candidate, key=edge_key(candidate.key, time_scale), template=template)


def edge_key(key: str, time_scale: float) -> str:
    return f"{key} @ GPU times x{time_scale:.3g}"


class Band:
    """The band's edge searches of one plan, added as candidates get their nominal answers
    (``sim.planning.plans.schedule``), and their summary once all have run."""

    def __init__(self, plan: Plan):
        self.bands = band_scales(plan)
        search = plan.spec.search.model_copy(update={"confirm_factor": 0.0, "cost_band": "none"})
        # The edges' probes: the plan's, at an edge's cost model, short and unconfirmed.
        self.plan = Plan(plan.spec.model_copy(update={"search": search}), plan.path, [])
        self._order = {candidate.key: index for index, candidate in enumerate(plan.candidates)}
        self.origin: dict[str, tuple[str, str]] = {}  # edge key -> (side, nominal key)
        self.edges: dict[str, Candidate] = {}
        self.searches: dict[str, RateSearch] = {}

    def sides(self, candidate: Candidate) -> tuple[str, ...]:
        """The edges ``candidate`` is searched at (none without a band)."""
        return SIDES if candidate.key in self.bands else ()

    def scale(self, candidate_key: str, side: str) -> float:
        return self.bands[candidate_key].scale(side)

    def edge(
        self,
        candidate: Candidate,
        side: str,
        nominal: RateSearch,
        answer: float,
        neighbour: RateSearch | None = None,
    ) -> tuple[Candidate, RateSearch]:
        """``candidate``'s search at its band's ``side`` edge: from its ``nominal`` search's ``answer``
        scaled by the edge (first probes as long as a rate needed there to pass), or from a
        block-size ``neighbour``'s finished search at the same edge."""
        scale = self.scale(candidate.key, side)
        edge = edge_candidate(candidate, scale)
        spec = self.plan.spec.search
        if neighbour is not None:
            search = neighbour.following(spec)
        else:
            search = RateSearch(_warm_start(spec, answer, scale), steady_requests=nominal.steady_requests)
        self.origin[edge.key] = (side, candidate.key)
        self.edges[edge.key] = edge
        self.searches[edge.key] = search
        return edge, search

    def summary(self, plan: Plan, probes: list[Probe]) -> dict[str, Any] | None:
        """The band: each candidate's scales and evidence and, at each side, the ranking and each
        candidate's rate and GPUs there."""
        if not self.edges:
            return None
        edges = []
        for side in SIDES:
            members = sorted(
                (edge for key, edge in self.edges.items() if self.origin[key][0] == side),
                key=lambda edge: self._order[self.origin[edge.key][1]],
            )
            keys = {edge.key for edge in members}
            ranked = candidate_results(
                replace(self.plan, candidates=members),
                self.searches,
                [p for p in probes if p.candidate in keys],
            )
            edges.append(
                {
                    "side": side,
                    "ranking": [self.origin[r["key"]][1] for r in ranked if r.get("rank")],
                    "candidates": {
                        self.origin[r["key"]][1]: {
                            "time_scale": self.scale(self.origin[r["key"]][1], side),
                            "max_rate_per_s": r.get("max_rate_per_s"),
                            "gpus_for_target": r.get("gpus_for_target"),
                            "probe": r.get("max_probe"),
                        }
                        for r in ranked
                    },
                }
            )
        searched = {nominal for _, nominal in self.origin.values()}
        overtaken = {
            key: self._overtaken(key, probes) for key in sorted(searched, key=self._order.__getitem__)
        }
        bands = {key: band for key, band in self.bands.items() if key in searched}
        return {
            "time_scales": [min(b.fast for b in bands.values()), max(b.slow for b in bands.values())],
            "candidates": {
                key: {"fast": band.fast, "slow": band.slow, "gpu": band.gpu, "evidence": band.evidence}
                for key, band in bands.items()
            },
            "source": _band_source(plan),
            "edges": edges,
            "overtaken_within_band": {key: above for key, above in overtaken.items() if above},
        }

    def _overtaken(self, key: str, probes: list[Probe]) -> list[str]:
        """The candidates that rank above ``key`` when it is at its slow edge and each candidate on
        another GPU at its fast one: those its lead may not survive. Two GPUs' errors are independent,
        so each may sit at either end of its band; candidates on ``key``'s own GPU share its error and
        stay at the same edge as ``key``."""
        by_side = {(side, nominal): edge for edge, (side, nominal) in self.origin.items()}
        if ("slow", key) not in by_side:
            return []
        own_gpu = self.bands[key].gpu
        rivals = {nominal for _, nominal in by_side if nominal != key}
        members = [self.edges[by_side[("slow", key)]]]
        for nominal in rivals:
            side = "slow" if self.bands[nominal].gpu == own_gpu else "fast"
            if (side, nominal) in by_side:
                members.append(self.edges[by_side[(side, nominal)]])
        members.sort(key=lambda edge: self._order[self.origin[edge.key][1]])
        names = {edge.key for edge in members}
        ranked = candidate_results(
            replace(self.plan, candidates=members), self.searches, [p for p in probes if p.candidate in names]
        )
        order = [self.origin[r["key"]][1] for r in ranked if r.get("rank")]
        return order[: order.index(key)] if key in order else order


def _warm_start(search: SearchSpec, answer: float, scale: float) -> SearchSpec:
    """The search spec of one candidate's edge search: it starts where the nominal answer, scaled by
    the edge (GPU times x s: rates / s), is expected, within the search's range."""
    start = min(max(answer / scale, search.min_rate_per_s), search.max_rate_per_s)
    growth = min(search.growth, 1.0 + 2 * search.rel_tolerance)  # a near start needs small steps
    return search.model_copy(update={"start_rate_per_s": float(f"{start:.3g}"), "growth": growth})


def _band_source(plan: Plan) -> str:
    band = plan.spec.search.cost_band
    if isinstance(band, list):
        return "search.cost_band (given in the plan)"
    return (
        "the serving calibration's held-out TPOT errors for each candidate's GPU (leave one run out on a "
        "GPU with measured runs in the fit, leave one GPU out on any other, widened there by the range "
        "of each achievable bandwidth or matrix-product rate assumed rather than measured on it): the "
        "GPU-time scales that would have matched each measured run kvsim was not fitted to, fastest and "
        "slowest"
    )
