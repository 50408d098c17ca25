"""The cost model's error band, carried into the answer: every candidate searched again with its GPU
times scaled to the band's edges (``cost_model: {time_scale: ...}``, ``sim/costs/scaled.py``).

The band is ``search.cost_band``: ``fitted`` (the default) takes it from the serving calibration's
leave-one-run-out TPOT errors (``ServingCalibration.time_scale_band``: the GPU-time scales that would
have matched the measured runs kvsim was not fitted to), an explicit ``[fast, slow]`` pair of scales
applies to every candidate, and ``none`` skips it. The edge searches start from each candidate's
nominal maximum rate scaled by the edge (a warm start: a few probes each) and are not confirmed by
long runs, so an edge's rate is a short-probe estimate: the report says so. A candidate's edges are
searched as soon as it has its nominal answer, alongside the other candidates' searches; a
block-size sibling's edge starts from its neighbour's at the same edge (``RateSearch.following``).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sim.planning.plans.analysis import candidate_results
from sim.planning.plans.search import RateSearch
from sim.planning.plans.spec import Candidate, Plan, SearchSpec

if TYPE_CHECKING:
    from sim.planning.plans.run import Probe


def band_scales(plan: Plan) -> tuple[float, float] | None:
    """The band's GPU-time scales, fastest first, or None (no band to search)."""
    band = plan.spec.search.cost_band
    if band == "none":
        return None
    if isinstance(band, list):
        return float(band[0]), float(band[1])
    scales = {_fitted_scales(candidate.template.get("cost_model")) for candidate in plan.candidates}
    scales.discard(None)
    if len(scales) != 1:  # no fit behind the cost models, or candidates with different fits
        return None
    return scales.pop()


def _fitted_scales(cost_model: Any) -> tuple[float, float] | None:
    from sim.costs.core import CostModelConfig, serving_calibration

    try:
        config = CostModelConfig.model_validate(cost_model)
    except ValueError:
        return None
    if config.kind != "derated" or config.calibration == "none":
        return None
    try:
        return serving_calibration(config.calibration).time_scale_band()
    except ValueError:
        return None


def with_time_scale(cost_model: Any, time_scale: float) -> dict[str, Any]:
    """An experiment's ``cost_model`` value in its mapping form, with ``time_scale`` set."""
    from sim.costs.core import CostModelConfig

    data = CostModelConfig.model_validate(cost_model).model_dump(mode="json", exclude_defaults=True)
    return data | {"time_scale": time_scale}


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
        self.scales = band_scales(plan) or ()
        search = plan.spec.search.model_copy(update={"confirm_factor": 0.0, "cost_band": "none"})
        # The edges' probes: the plan's, at an edge's cost model, short and unconfirmed.
        self.plan = Plan(plan.spec.model_copy(update={"search": search}), plan.path, [])
        self._order = {candidate.key: index for index, candidate in enumerate(plan.candidates)}
        self.origin: dict[str, tuple[float, str]] = {}  # edge key -> (scale, nominal key)
        self.edges: dict[str, Candidate] = {}
        self.searches: dict[str, RateSearch] = {}

    def edge(
        self,
        candidate: Candidate,
        scale: float,
        nominal: RateSearch,
        answer: float,
        neighbour: RateSearch | None = None,
    ) -> tuple[Candidate, RateSearch]:
        """``candidate``'s search at the edge ``scale``: from its ``nominal`` search's ``answer`` scaled
        by the edge (first probes as long as a rate needed there to pass), or from a block-size
        ``neighbour``'s finished search at the same edge."""
        edge = edge_candidate(candidate, scale)
        spec = self.plan.spec.search
        if neighbour is not None:
            search = neighbour.following(spec)
        else:
            search = RateSearch(_warm_start(spec, answer, scale), steady_requests=nominal.steady_requests)
        self.origin[edge.key] = (scale, candidate.key)
        self.edges[edge.key] = edge
        self.searches[edge.key] = search
        return edge, search

    def summary(self, plan: Plan, probes: list[Probe]) -> dict[str, Any] | None:
        """The band: its scales and, at each edge, the ranking and each candidate's rate and GPUs."""
        if not self.edges:
            return None
        edges = []
        for scale in self.scales:
            members = sorted(
                (edge for key, edge in self.edges.items() if self.origin[key][0] == scale),
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
                    "time_scale": scale,
                    "ranking": [self.origin[r["key"]][1] for r in ranked if r.get("rank")],
                    "candidates": {
                        self.origin[r["key"]][1]: {
                            "max_rate_per_s": r.get("max_rate_per_s"),
                            "gpus_for_target": r.get("gpus_for_target"),
                            "probe": r.get("max_probe"),
                        }
                        for r in ranked
                    },
                }
            )
        return {"time_scales": list(self.scales), "source": _band_source(plan), "edges": edges}


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
        "the serving calibration's leave-one-run-out TPOT errors: the GPU-time scales that would have "
        "matched each measured run kvsim was not fitted to, fastest and slowest"
    )
