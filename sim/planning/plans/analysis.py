"""From probes to answers: each candidate's maximum rate, binding limit, GPUs and cost; the ranking.

Every number here comes from a probe's steady-state metrics and carries the ids of the points
(seeds) it came from. The binding limit is read from what the simulation recorded at the first
failing rate: which SLO broke and, when requests broke it waiting for admission, what held
admissions back (the engine's ``admission_blocker`` series: KV memory, ``max_num_seqs`` or the token
budget). A broken TPOT SLO, or slow prefills rather than waits, mean the GPU is too slow (compute).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.outputs.metrics import ADMISSION_BLOCKERS
from sim.planning.plans.search import STEADY_STATE, describe
from sim.planning.plans.spec import Candidate, Plan
from sim.planning.report.units import AT_MAX_METRICS, LIMIT_LABELS, seconds
from sim.planning.sweeps.pools import POOL_METRICS

if TYPE_CHECKING:
    from sim.planning.plans.probes import Probe
    from sim.planning.plans.search import RateSearch

# When the p99 wait for admission is at least this share of p99 TTFT, queueing broke the SLOs and
# whatever held admissions back is the binding limit; below it the iterations themselves are slow.
QUEUEING_SHARE = 0.5


def spread(values: list[float | None]) -> dict[str, float | None]:
    clean = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not clean:
        return {"mean": None, "min": None, "max": None}
    return {"mean": sum(clean) / len(clean), "min": min(clean), "max": max(clean)}


def probe_metrics(probe: Probe) -> dict[str, dict[str, float | None]]:
    return {name: spread([run.steady.get(name) for run in probe.runs]) for name in AT_MAX_METRICS}


def binding_limit(failing: Probe | None) -> dict[str, Any]:
    """Which limit broke the SLOs at the first failing rate, with the evidence (of a run stopped
    early, once an SLO was certainly broken: what it measured up to the stop, and the SLOs broken by
    then)."""
    if failing is None:
        return {"limit": None, "label": "none reached", "why": "no probed rate broke an SLO"}
    limit = _binding_limit(failing)
    stops = [run.steady["stopped_early"]["at_s"] for run in failing.runs if run.steady.get("stopped_early")]
    if stops:
        limit["why"] += (
            f" (read from {len(stops)} run(s) stopped early, at {seconds(min(stops))}"
            + (f"–{seconds(max(stops))}" if max(stops) != min(stops) else "")
            + " of simulated time, once an SLO was certainly broken: the window up to the stop)"
        )
        limit["evidence"]["stopped_early_s"] = stops
    return limit


def _binding_limit(failing: Probe) -> dict[str, Any]:
    broken = {violation.slo for run in failing.runs for violation in run.violations}
    blocked = {
        name: spread([run.steady.get(f"blocked_by_{name}_frac") for run in failing.runs])["mean"] or 0.0
        for name in ADMISSION_BLOCKERS[1:]
    }
    evidence = {"rate_per_s": failing.rate, "probe": failing.number, "points": failing.point_ids}
    evidence |= {"broken_slos": sorted(broken), "admission_blocked_frac": blocked}
    if broken & {"tpot_p50_s", "tpot_p99_s"}:
        return _limit(
            "compute", "per-token latency broke its SLO: the batch's decode iterations are too slow", evidence
        )
    if broken == {STEADY_STATE}:
        return _limit(
            "probe_length",
            "the probe reached no steady state within search.max_requests requests (the KV pool or the "
            "batch still filling), so this rate was not shown sustainable and the maximum rate is a lower "
            "bound; raise search.max_requests",
            evidence,
        )
    if broken == {"max_rejected_frac"}:
        return _limit(
            "request_length", "requests longer than max_model_len are rejected at any rate", evidence
        )
    if "max_preemptions_per_request" in broken:
        return _limit(
            "kv_memory", "preemptions broke their SLO: running requests outgrow the KV cache", evidence
        )
    # The seed that broke the SLOs is the evidence, not a mean with one that met them.
    queue = spread([run.steady.get("queue_p99_s") for run in failing.runs])["max"] or 0.0
    ttft = spread([run.steady.get("ttft_p99_s") for run in failing.runs])["max"] or 0.0
    evidence |= {"queue_p99_s": queue, "ttft_p99_s": ttft}
    pool = binding_pool([run.steady for run in failing.runs], ttft)
    if pool is not None:
        return _pool_limit(pool, evidence)
    top = max(blocked, key=lambda name: blocked[name])
    queued = "max_queue_growth_frac" in broken or (ttft > 0 and queue >= QUEUEING_SHARE * ttft)
    if queued and blocked[top] > 0:
        why = (
            f"requests broke the SLOs waiting for admission (p99 wait {seconds(queue)} of p99 TTFT "
            f"{seconds(ttft)}); the queue's head was held back by {LIMIT_LABELS[top]} {blocked[top]:.1%} of "
            "the steady window"
        )
        return _limit(top, why, evidence)
    why = (
        f"waiting for admission is not what broke the SLOs (p99 wait {seconds(queue)} of p99 TTFT "
        f"{seconds(ttft)}; admissions held back {sum(blocked.values()):.1%} of the window): prefill and "
        "decode iterations are too slow for the offered work"
    )
    return _limit("compute", why, evidence)


def binding_pool(steady_runs: list[dict[str, Any]], ttft_p99_s: float) -> dict[str, Any] | None:
    """Which pool held the failing probe's requests back, from the worst seed's waits: the decode pool
    when the wait for its blocks is most of p99 TTFT, the prefill pool when its queue is; None when
    neither (then the iterations themselves are slow) or the probe was not disaggregated."""
    if not steady_runs or "transfer_wait_p99_s" not in steady_runs[0]:
        return None
    wait = max((run.get("transfer_wait_p99_s") or 0.0) for run in steady_runs)
    queue = max((run.get("prefill_queue_p99_s") or 0.0) for run in steady_runs)
    if ttft_p99_s <= 0 or max(wait, queue) < 0.5 * ttft_p99_s:
        return None
    role = "decode" if wait >= queue else "prefill"
    blocked = {
        name: float(np.mean([run.get(f"{role}_{name}") or 0.0 for run in steady_runs]))
        for name in POOL_METRICS
    }
    usage = float(np.mean([run.get(f"{role}_kv_usage_frac") or 0.0 for run in steady_runs]))
    return {
        "pool": role,
        "wait_p99_s": wait if role == "decode" else queue,
        "kv_usage_frac": usage,
        "admission_blocked_frac": blocked,
    }


def _pool_limit(pool: dict[str, Any], evidence: dict[str, Any]) -> dict[str, Any]:
    """A disaggregated deployment's binding limit: the pool its requests waited for."""
    evidence = evidence | {"pool": pool}
    blocked = pool["admission_blocked_frac"]
    if pool["pool"] == "decode":
        why = (
            f"prompts done on the prefill pool waited for the decode pool to allocate their blocks (p99 "
            f"{seconds(pool['wait_p99_s'])} of p99 TTFT {seconds(evidence['ttft_p99_s'])}; decode KV usage "
            f"{pool['kv_usage_frac']:.0%}), holding their prefill blocks: add decode replicas"
        )
        return {"limit": "kv_memory", "label": "decode pool: KV memory", "why": why, "evidence": evidence}
    top = max(blocked, key=lambda name: blocked[name])
    name = top.removeprefix("blocked_by_").removesuffix("_frac")
    held = (
        f"; its queue's head held back by {LIMIT_LABELS[name]} {blocked[top]:.1%} of the window"
        if blocked[top]
        else ""
    )
    why = (
        f"requests waited for a prefill replica (p99 {seconds(pool['wait_p99_s'])} of p99 TTFT "
        f"{seconds(evidence['ttft_p99_s'])}{held}): add prefill replicas"
    )
    limit = name if blocked[top] else "compute"
    return {"limit": limit, "label": f"prefill pool: {LIMIT_LABELS[limit]}", "why": why, "evidence": evidence}


def _limit(name: str, why: str, evidence: dict[str, Any]) -> dict[str, Any]:
    return {"limit": name, "label": LIMIT_LABELS[name], "why": why, "evidence": evidence}


def candidate_results(
    plan: Plan,
    searches: dict[str, RateSearch],
    probes: list[Probe],
    checks: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Each candidate's answer; ``checks``: the cluster checks of single-engine candidates
    (``sim/planning/plans/cluster_check.py``), which replace the divided GPU count."""
    checks = checks or {}
    results = [
        _result(plan, c, searches.get(c.key), [p for p in probes if p.candidate == c.key], checks.get(c.key))
        for c in plan.candidates
    ]
    return rank(results, plan.spec.target_rate_per_s)


def _identity(candidate: Candidate) -> dict[str, Any]:
    return {
        "key": candidate.key,
        "group": candidate.group,
        "model": candidate.model,
        "gpu": candidate.gpu,
        "policy": candidate.policy,
        "block_size": candidate.block_size,
        "uses_blocks": candidate.uses_blocks,
        "knobs": candidate.knobs,
        "price_per_hour": candidate.price_per_hour,
        "tensor_parallel_size": candidate.tensor_parallel_size,
        "replicas": candidate.replicas,
        "router": candidate.router,
        "memory": candidate.memory,
        "gpus_per_deployment": candidate.gpus_per_deployment,
        "deployment_price_per_hour": candidate.deployment_price_per_hour,
    }


def _result(
    plan: Plan,
    candidate: Candidate,
    search: RateSearch | None,
    probes: list[Probe],
    check: dict[str, Any] | None = None,
) -> dict[str, Any]:
    result = _identity(candidate) | {"probes": [p.number for p in probes]}
    if candidate.infeasible or search is None:
        return result | {"status": "infeasible", "reason": candidate.infeasible or "not searched"}
    errored = next((p for p in probes if p.error), None)
    if errored is not None:
        return result | {"status": "error", "reason": errored.error}
    judged = [p for p in probes if not p.extended]  # a probe run again longer was not judged
    # A confirmation run is the better evidence at its rate (it is ten times longer): it goes first.
    judged.sort(key=lambda p: not p.confirmation)
    passing = next((p for p in judged if p.rate == search.lo and p.passed), None)
    failing = next((p for p in judged if p.rate == search.hi and not p.passed), None)
    result |= {"binding": binding_limit(failing), "provenance": _provenance(passing or failing)}
    if failing is not None:
        result["fail_rate_per_s"] = failing.rate
        result["fail_probe"] = failing.number
        result["fail_reasons"] = describe([v for run in failing.runs for v in run.violations])
    if passing is None:
        lowest = min(judged, key=lambda p: p.rate)
        reasons = "; ".join(describe([v for run in lowest.runs for v in run.violations]))
        why = f"no rate down to {lowest.rate:g} req/s meets the SLOs (there: {reasons})"
        return result | {"status": "infeasible", "reason": why}
    result |= {
        "status": search.status(),
        "reason": search.stopped
        or (f"no SLO broken up to max_rate_per_s={search.spec.max_rate_per_s:g}" if failing is None else ""),
        "max_rate_per_s": passing.rate,
        "max_probe": passing.number,
        "max_points": passing.point_ids,
        "confirmed": _confirmation(search, passing),
        "seeds": seed_spread([p for p in judged if not p.confirmation]),
        "at_max": probe_metrics(passing),
    }
    if check is not None:
        result["cluster_check"] = check
    target = plan.spec.target_rate_per_s
    return result | (_sizing(result, target) if target is not None else _per_gpu(result))


def seed_spread(probes: list[Probe]) -> dict[str, Any]:
    """The search's seeds as replicates (confirmation runs, on fresh seeds, are not among ``probes``):
    the highest probed rate each seed alone passed below the lowest it
    failed, their spread and, with three seeds or more, a 95 % Student-t interval of their mean. The
    plan's own answer needs every seed to pass (their minimum, at the probed rates): a lower bound."""
    verdicts: dict[int, list[tuple[float, bool]]] = {}
    for probe in probes:
        for run in probe.runs:
            ok = not run.violations and not run.unsteady
            verdicts.setdefault(run.seed, []).append((probe.rate, ok))
    per_seed: dict[int, float | None] = {}
    for seed, rates in sorted(verdicts.items()):
        lowest_fail = min((rate for rate, ok in rates if not ok), default=math.inf)
        passed = [rate for rate, ok in rates if ok and rate < lowest_fail]
        per_seed[seed] = max(passed) if passed else None
    known = [rate for rate in per_seed.values() if rate is not None]
    spread_of: dict[str, Any] = {"max_rate_per_seed": {str(seed): rate for seed, rate in per_seed.items()}}
    if known:
        spread_of |= {"min": min(known), "max": max(known)}
    if len(known) >= 3:
        from scipy import stats

        mean = sum(known) / len(known)
        half = stats.t.ppf(0.975, len(known) - 1) * stats.tstd(known) / math.sqrt(len(known))
        spread_of["mean_ci95"] = [float(mean - half), float(mean + half)]
    return spread_of


def _confirmation(search: RateSearch, passing: Probe) -> dict[str, Any]:
    """Whether a run ``confirm_factor`` times longer held at the maximum rate, and how long it was."""
    spec = search.spec
    if not spec.confirm_factor:
        return {"held": None, "why": "search.confirm_factor is 0: the maximum rate rests on the short probes"}
    if passing.confirmation or search.confirmed == passing.rate:
        return {
            "held": True,
            "requests": passing.requests,
            "why": f"a run of {passing.requests:,} requests per seed (at least {spec.confirm_factor:g}x its first "
            "passing probe) met every SLO",
        }
    return {
        "held": False,
        "why": f"not confirmed: {search.confirmations} confirmation run(s) (max_confirmations="
        f"{spec.max_confirmations}) broke the SLOs at higher rates, none was left for this one",
    }


def _provenance(probe: Probe | None) -> dict[str, str]:
    summary = probe.runs[0].summary if probe and probe.runs else {}
    return {
        "cost_model": str(summary.get("cost_model", "unknown")),
        "cost_model_error_band": str(summary.get("cost_model_error_band", "not stated")),
    }


def _sizing(result: dict[str, Any], target: float) -> dict[str, Any]:
    """GPUs for the target rate. A cluster candidate was simulated whole at the full rate: it serves
    the target with its own replicas x TP GPUs if its maximum rate reaches it, and is not sized
    otherwise (a bigger cluster is another candidate). A single-engine candidate is sized by dividing
    the target evenly over identical, independent replicas (no router, no imbalance)."""
    rate = result["max_rate_per_s"]
    if result.get("router") is not None:
        if rate < target - 1e-9:
            return {
                "status": "below_target",
                "reason": f"{result['replicas']} replica(s) behind {result['router']} sustain {rate:g} req/s "
                f"< the target {target:g} req/s (simulated as a cluster; add replicas as another candidate)",
            }
        replicas, sizing_method = result["replicas"], "simulated cluster"
        headroom = rate / target - 1
    else:
        replicas, sizing_method = math.ceil(target / rate - 1e-9), "divided over independent replicas"
        check = result.get("cluster_check")
        if check is not None and check["replicas"] is None:
            tried = check["tried"][-1]
            return {
                "status": "below_target",
                "reason": f"{tried['replicas']} replicas behind {check['router']} do not meet the SLOs at the "
                f"target {target:g} req/s ({'; '.join(tried['violations']) or tried['error']}); dividing "
                f"the rate asked for {check['divided_replicas']}",
            }
        if check is not None:
            replicas = check["replicas"]
            sizing_method = (
                f"checked: {replicas} replicas behind {check['router']} simulated at the target rate"
            )
        headroom = replicas * rate / target - 1
    # A simulated cluster is one deployment; a single engine is one per replica.
    deployments = 1 if result.get("router") is not None else replicas
    gpus = deployments * _gpus_per_deployment(result)
    sizing: dict[str, Any] = {"replicas_for_target": replicas, "gpus_for_target": gpus}
    sizing["sizing_method"] = sizing_method
    sizing["headroom_frac"] = headroom
    tokens = result["at_max"]["output_tokens_per_request"]["mean"]
    price = _deployment_price(result)
    if price is not None:
        sizing["cost_per_hour_for_target"] = deployments * price
        if tokens:
            tokens_per_hour = target * tokens * 3600
            sizing["cost_per_million_output_tokens"] = deployments * price / tokens_per_hour * 1e6
    return sizing


def _gpus_per_deployment(result: dict[str, Any]) -> int:
    """GPUs of what one probe simulated (results written before the field: TP x replicas)."""
    return result.get("gpus_per_deployment") or result["tensor_parallel_size"] * result.get("replicas", 1)


def _deployment_price(result: dict[str, Any]) -> float | None:
    if result.get("deployment_price_per_hour") is not None:
        return result["deployment_price_per_hour"]
    price = result["price_per_hour"]
    return _gpus_per_deployment(result) * price if price is not None else None


def _per_gpu(result: dict[str, Any]) -> dict[str, Any]:
    """A max-rate study (no target rate): what one deployment of the candidate sustains, per GPU and,
    with a price, per output token at its maximum rate."""
    gpus = _gpus_per_deployment(result)
    rate = result["max_rate_per_s"]
    found: dict[str, Any] = {"gpus_per_deployment": gpus, "rate_per_gpu_per_s": rate / gpus}
    tokens = result["at_max"]["output_tokens_per_request"]["mean"]
    price = _deployment_price(result)
    if price is not None and tokens:
        found["cost_per_million_output_tokens"] = price / (rate * tokens * 3600) * 1e6
    return found


def _usable(result: dict[str, Any]) -> bool:
    return "gpus_for_target" in result or "rate_per_gpu_per_s" in result


def rank(results: list[dict[str, Any]], target: float | None) -> list[dict[str, Any]]:
    """Candidates that can serve the target first: by the hourly price of their GPUs when every one
    has a price, else by GPUs; then by rate per GPU. Infeasible ones last, in plan order. Without a
    target (a max-rate study): by cost per output token at the maximum rate when every one has a
    price, else by rate per GPU.

    With a target, not by cost per output token: its tokens per request vary a little with each
    probe's window (sampling noise), which must not reorder candidates that need the same GPUs."""
    usable = [r for r in results if _usable(r)]
    priced_key = "cost_per_hour_for_target" if target is not None else "cost_per_million_output_tokens"
    priced = bool(usable) and all(priced_key in r for r in usable)

    def key(result: dict[str, Any]) -> tuple[float, float, float]:
        cost = result[priced_key] if priced else 0.0
        per_gpu = result["max_rate_per_s"] / _gpus_per_deployment(result)
        return (cost, result.get("gpus_for_target", 0), -per_gpu)

    ordered = sorted(usable, key=key) + [r for r in results if not _usable(r)]
    for position, result in enumerate(ordered, start=1):
        result["rank"] = position if _usable(result) else None
    return ordered


def ranking_rule(results: list[dict[str, Any]]) -> str:
    usable = [r for r in results if _usable(r)]
    if usable and all("rate_per_gpu_per_s" in r for r in usable):
        if all("cost_per_million_output_tokens" in r for r in usable):
            return "lowest GPU cost per million output tokens at the maximum rate, then highest rate per GPU"
        return "highest rate per GPU (no target rate: a max-rate study)"
    if usable and all("cost_per_hour_for_target" in r for r in usable):
        return "lowest GPU cost per hour for the target rate, then fewest GPUs, then highest rate per GPU"
    return "fewest GPUs for the target rate, then highest rate per GPU"
