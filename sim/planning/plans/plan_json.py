"""``plan.json``: a plan's answers, machine-readable (its SLOs, search settings, candidates' results,
probes, assumptions and run counts).

Built here, beside the plan's objects it reads (``Plan``, ``Probe``); the report
(``sim.planning.report.plan_report``) renders the document and stands below the plans.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sim.native import engine_build
from sim.planning.plans.analysis import probe_metrics, ranking_rule
from sim.planning.plans.search import describe
from sim.planning.plans.spec import SLO_METRICS, Plan
from sim.storage.folders import kvsim_version

if TYPE_CHECKING:
    from sim.planning.plans.probes import Probe
    from sim.planning.sweeps.driver import RunCounts

NOT_MODELLED = [
    "replicas of a candidate without `candidates.cluster` (and without `search.cluster_check`): the target rate "
    "is divided evenly over identical, independent GPUs (no router, no load imbalance); clusters (candidates or "
    "checks) are simulated whole at the full rate, router and imbalance included; no failover headroom",
    "tokenizer, detokenizer, HTTP and scheduler CPU time; network latency between client and server",
    "CUDA graph and allocator overheads beyond the activation reserve (a real server logs 1-4 % less KV memory)",
    "speculative decoding, quantised weights other than the configured sizes, LoRA adapters",
    "output lengths known in advance to the simulator only for memory accounting; the scheduler does not use them",
]


def plan_document(
    plan: Plan,
    results: list[dict[str, Any]],
    probes: list[Probe],
    counts: RunCounts,
    wall_s: float | None,
    band: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec = plan.spec
    usable = [r for r in results if r.get("rank")]
    if band is not None:
        for result in results:
            result["band"] = _candidate_band(band, result["key"])
    return {
        "kind": "plan",
        "kvsim_version": kvsim_version(),
        "name": spec.name,
        "description": spec.description,
        "plan_file": str(plan.path),
        "target_rate_per_s": spec.target_rate_per_s,
        "slos": _slos(plan),
        "search": spec.search.model_dump(mode="json"),
        "ranking_rule": ranking_rule(results),
        "recommendation": usable[0]["key"] if usable else None,
        "candidates": results,
        "cost_band": band,
        "probes": [_probe_entry(probe) for probe in probes],
        "assumptions": _assumptions(plan, results),
        "run": {
            "simulations": counts.ran,
            "failed": counts.failed,
            "reused": counts.skipped_done,
            "probes": len(probes),
            "wall_s": wall_s,
            "cpu_s": counts.cpu_s,
            "engine_build": engine_build(),
        },
    }


def _candidate_band(band: dict[str, Any], key: str) -> dict[str, Any]:
    """One candidate's band (its GPU's scales and what they rest on), its rate and GPUs at each edge
    and its rank there, and who may overtake it within the bands."""
    edges = []
    for edge in band["edges"]:
        found = edge["candidates"].get(key, {})
        rank = edge["ranking"].index(key) + 1 if key in edge["ranking"] else None
        edges.append({"side": edge["side"], "rank": rank} | found)
    own = (band.get("candidates") or {}).get(key, {})
    overtaken = (band.get("overtaken_within_band") or {}).get(key, [])
    return own | {"edges": edges, "overtaken_by": overtaken}


def _slos(plan: Plan) -> dict[str, dict[str, Any]]:
    slos = {}
    goodput = plan.spec.slos.goodput
    for name, limit in plan.spec.slos.limits().items():
        metric = SLO_METRICS[name]
        slos[name] = {
            "limit": limit,
            "metric": metric.metric,
            "unit": metric.unit,
            "label": metric.label,
            "at_least": metric.at_least,
        }
        if name == "goodput" and goodput is not None:
            slos[name]["targets"] = {"ttft_s": goodput.ttft_s, "tpot_s": goodput.tpot_s}
    return slos


def _probe_entry(probe: Probe) -> dict[str, Any]:
    return {
        "number": probe.number,
        "candidate": probe.candidate,
        "rate_per_s": probe.rate,
        "requests": probe.requests,
        "time_scale": probe.time_scale,
        "passed": probe.passed,
        "run_again_longer": probe.extended,
        "confirmation": probe.confirmation,
        "stopped_early": any(run.steady.get("stopped_early") for run in probe.runs),
        "error": probe.error,
        "metrics": probe_metrics(probe),
        "seeds": [
            {
                "seed": run.seed,
                "point_id": run.point_id,
                "violations": describe(run.violations),
                "not_steady": run.unsteady,
                "window_requests": run.steady.get("window_requests"),
                "window_s": run.steady.get("window_s"),
                "stopped_early_s": (run.steady.get("stopped_early") or {}).get("at_s"),
            }
            for run in probe.runs
        ],
    }


def _assumptions(plan: Plan, results: list[dict[str, Any]]) -> dict[str, Any]:
    spec = plan.spec
    cost_models = {}
    for result in results:
        provenance = result.get("provenance")
        if provenance:
            cost_models[result["group"]] = provenance
    search = spec.search
    return {
        "models": spec.models,
        "gpus": [
            {"name": c.label(), "gpu": c.gpu, "price_per_hour": c.price_per_hour} for c in spec.gpu_choices()
        ],
        "cost_models": cost_models,
        "workload": spec.workload,
        "engine": spec.engine.model_dump(mode="json", exclude_unset=True),
        "probe": (
            f"each probe: at least {search.min_requests:,} requests"
            + (f" and {search.min_duration_s:g} s of arrivals" if search.min_duration_s else "")
            + f", and arrivals spanning at least {search.min_fill_multiple:g} times the time they take to fill the "
            f"KV pool; seeds {search.seeds}; measured on the arrivals between the first {search.warmup_frac:.0%} "
            "(warm-up, lasting at least one mean end-to-end latency and at most half the window) and the last "
            f"{search.drain_frac:.0%} (drain). A probe must reach a steady state: over the last two of "
            f"{search.trend_segments} segments of its window KV usage may rise at most {search.max_kv_usage_rise:.0%} "
            f"of the pool and the running batch at most {search.max_running_rise_frac:.0%}; one that meets the SLOs "
            f"short of it is run again with twice the requests (up to {search.max_requests:,}, where it fails). A rate "
            "passes when every seed meets every SLO on the window (latencies on its late half too) and its waiting "
            f"queue grows by at most {spec.slos.max_queue_growth_frac:.0%} of the window's arrivals"
        ),
        "search": (
            f"bracket from {search.start_rate_per_s:g} req/s by x{search.growth:g}, then bisect until the failing "
            f"rate is within {search.rel_tolerance:.0%} of the passing one (range {search.min_rate_per_s:g}-"
            f"{search.max_rate_per_s:g} req/s, at most {search.max_probes} rates per candidate)"
        ),
        "not_modelled": NOT_MODELLED,
    }
