"""The plan report: ``plan.json`` (the answers, machine-readable: ``sim.planning.plans.plan_json``)
rendered as ``report.md`` and a self-contained ``report.html``. The recommendation comes first, then
the evidence, then the assumptions; every number links to the probe (and through it the points) it
came from. It reads the document only, never the plan's objects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from sim.planning.report.document import (
    Block,
    Bullets,
    Code,
    Figure,
    Heading,
    Link,
    Paragraph,
    Table,
    Text,
)
from sim.planning.report.units import (
    AT_MAX_METRICS,
    LIMIT_LABELS,
    bound,
    metric_label,
    metric_value,
    rate,
    seconds,
    share,
)


# -------------------------------------------------------------------------------------- numbers
def with_spread(name: str, stats: dict[str, float | None]) -> str:
    text = metric_value(name, stats.get("mean"))
    low, high = stats.get("min"), stats.get("max")
    if low is not None and high is not None and low != high:
        text += f" ({metric_value(name, low)}–{metric_value(name, high)})"
    return text


def probe_link(text: str, probe: int | None) -> Link | str:
    return text if probe is None else Link(text, f"#probe-{probe}")


def point_link(point_id: str, text: str | None = None) -> Link:
    return Link(text or point_id, f"points/{point_id}/")


# --------------------------------------------------------------------------------------- report
Draw = Callable[[Callable[[Any], Any], list[Any]], Iterable[Any]]  # like Executor.run: fn, tasks -> results


def report_blocks(document: dict[str, Any], root: Path | None = None, run: Draw | None = None) -> list[Block]:
    """The report's blocks; ``root`` (the plan folder) lets it draw from the points' time series."""
    from sim.planning.report.figures import draw_plan_figure, plan_figure_jobs

    jobs = plan_figure_jobs(document, root)
    drawn = (run or _one_by_one)(draw_plan_figure, jobs)
    pngs = {name: png for name, png in drawn if png is not None}
    blocks: list[Block] = [Heading(1, f"Capacity plan: {document['name']}")]
    if document["description"]:
        blocks.append(Paragraph([document["description"]]))
    blocks += recommendation_blocks(document)
    blocks += evidence_blocks(document, pngs)
    blocks += assumption_blocks(document)
    blocks += probe_blocks(document)
    return blocks


def _one_by_one(fn: Callable[[Any], Any], tasks: list[Any]) -> Iterable[Any]:
    return map(fn, tasks)


def _slo_text(document: dict[str, Any]) -> str:
    parts = []
    for slo in document["slos"].values():
        text = f"{slo['label']} {'≥' if slo.get('at_least') else '≤'} {bound(slo['limit'], slo['unit'])}"
        targets = slo.get("targets")
        if targets:
            each = [
                f"{name} ≤ {seconds(value)}"
                for name, value in (("TTFT", targets["ttft_s"]), ("TPOT", targets["tpot_s"]))
                if value is not None
            ]
            text += f" of requests with {' and '.join(each)}"
        parts.append(text)
    return ", ".join(parts)


def _is_disaggregated(candidate: dict[str, Any]) -> bool:
    return " disaggregated " in f" {candidate['key']} "


def _disaggregation_sentence(candidates: list[dict[str, Any]], best: dict[str, Any]) -> str:
    """With disaggregated and colocated candidates both in the plan: the best of the other kind, so
    the recommendation reads against it."""
    ranked = [c for c in candidates if c.get("rank") is not None]
    if not any(map(_is_disaggregated, candidates)) or all(map(_is_disaggregated, candidates)):
        return ""
    other = next((c for c in ranked if _is_disaggregated(c) != _is_disaggregated(best)), None)
    kind = "colocated" if _is_disaggregated(best) else "disaggregated"
    if other is None:
        return f"No {kind} candidate meets the SLOs at the target."
    gpus = (
        f"{other['gpus_for_target']} GPUs"
        if "gpus_for_target" in other
        else f"{other['rate_per_gpu_per_s']:.3g} req/s per GPU"
    )
    cost = (
        f", ${other['cost_per_hour_for_target']:,.2f} per hour" if "cost_per_hour_for_target" in other else ""
    )
    return (
        f"Best {kind} candidate: {other['key']} (#{other['rank']}): {gpus}{cost}, maximum rate "
        f"{rate(other['max_rate_per_s'])}, binding limit {other['binding']['label']}."
    )


def recommendation_blocks(document: dict[str, Any]) -> list[Block]:
    target = document["target_rate_per_s"]
    candidates = document["candidates"]
    best = next((c for c in candidates if c["key"] == document["recommendation"]), None)
    blocks: list[Block] = [Heading(2, "Recommendation")]
    if best is None:
        blocks.append(
            Paragraph([f"No candidate meets the SLOs ({_slo_text(document)}); see the reasons below."])
        )
    else:
        provenance = best["provenance"]
        if target is None:
            opening = (
                f"Recommended (a max-rate study, no target rate): {best['key']}, "
                f"{best['rate_per_gpu_per_s']:.3g} req/s per GPU; "
                + ("the simulated cluster sustains " if best.get("router") else "one deployment sustains ")
            )
        else:
            opening = (
                f"Recommended: {best['key']}. {best['gpus_for_target']} × {best['gpu']} "
                f"{'serves' if best['gpus_for_target'] == 1 else 'serve'} {target:g} req/s; "
                + ("the simulated cluster sustains " if best.get("router") else "each sustains ")
            )
        text: Text = [
            opening,
            probe_link(
                ("at least " if best["status"] == "at_max_rate" else "") + rate(best["max_rate_per_s"]),
                best["max_probe"],
            ),
            f" under the SLOs ({_slo_text(document)}; {_confirmed_text(best)}); binding limit: "
            f"{best['binding']['label']}",
        ]
        band_text = _band_sentence(document, best)
        if band_text:
            text += [f"; {band_text}"]
        if "cost_per_hour_for_target" in best:
            text += [f"; ${best['cost_per_hour_for_target']:,.2f} per hour"]
        if "cost_per_million_output_tokens" in best:
            text += [f", ${best['cost_per_million_output_tokens']:.2f} per million output tokens"]
        text += [
            f". Ranked by {document['ranking_rule']}. These numbers rest on the cost model "
            f"“{provenance['cost_model']}” (error band: {provenance['cost_model_error_band']}).",
        ]
        blocks.append(Paragraph(text))
        beside = _disaggregation_sentence(candidates, best)
        if beside:
            blocks.append(Paragraph([beside]))
    blocks.append(recommendation_table(document))
    blocks.append(
        Paragraph(
            [
                "GPUs: a cluster candidate (`candidates.cluster`) is simulated whole at the full rate, so it needs its "
                "replicas × tensor-parallel size GPUs when its max rate reaches the target (headroom = max rate ÷ target − 1) "
                "and is marked below_target otherwise; a single-engine candidate needs ⌈target ÷ max rate⌉ × "
                "tensor-parallel size, the target divided evenly over identical, independent replicas (headroom = their "
                "combined max rate ÷ target − 1), or, with search.cluster_check, the first count of replicas that met the "
                "SLOs when simulated as one cluster at the target rate (plan.json: sizing_method, cluster_check). "
                "Max rate = the highest probed rate at which every seed met every SLO; the first failing rate and its "
                "reasons are in the table. Each number links to its probe below, which links to the simulation folders."
            ]
        )
    )
    return blocks


def _target_text(target: float | None) -> str:
    return f"target {target:g} req/s" if target is not None else "no target rate (a max-rate study)"


def _gpu_range(candidate: dict[str, Any]) -> str:
    """``7–10``: the GPUs for the target over the band (empty without a band): its edges' and the
    nominal answer's, which lies inside the band (scale 1). The edges are short-probe estimates, the
    nominal answer confirmed by long runs: where an edge's short probes passed a rate the long runs
    broke, the edge alone would put the nominal count outside its own band."""
    counts = [e.get("gpus_for_target") for e in (candidate.get("band") or {}).get("edges", [])]
    if not counts:
        return ""
    if candidate.get("gpus_for_target") is not None:
        counts.append(candidate["gpus_for_target"])
    if any(count is None for count in counts):
        known = [count for count in counts if count is not None]
        return f"{min(known)}–?" if known else "?"
    return f"{min(counts)}–{max(counts)}" if min(counts) != max(counts) else str(counts[0])


def _band_sentence(document: dict[str, Any], best: dict[str, Any]) -> str:
    """Where the cost model's error band moves the answer, what the best candidate's band rests on,
    whether the recommendation holds across the bands, and which rows rest on datasheet-only GPUs."""
    band = document.get("cost_band")
    own = best.get("band") or {}
    if not band or "fast" not in own:
        return ""
    evidence = f"; {own['gpu']} is {own['evidence']}" if own.get("evidence") else ""
    text = (
        f"{_gpu_range(best)} GPUs over its cost band (GPU times ×{own['fast']:.3g} to ×{own['slow']:.3g}"
        f"{evidence}; short probes, not confirmed)"
    )
    overtaken = own.get("overtaken_by") or []
    if overtaken:
        text += (
            f"; the ranking can flip within the bands: at its slow edge {', '.join(overtaken)} "
            "(at their own fast edges, or at the slow edge on the same GPU) rank above it"
        )
    else:
        text += "; it ranks first across the bands"
    datasheet_only = sorted(
        {
            str(c["band"]["gpu"])
            for c in document["candidates"]
            if (c.get("band") or {}).get("evidence") == "datasheet-only"
        }
    )
    if datasheet_only:
        text += (
            f"; rows on {', '.join(datasheet_only)} rest on the datasheet alone (no measurement of that GPU: "
            "their band is the widest)"
        )
    return text


def _confirmed_text(candidate: dict[str, Any]) -> str:
    confirmed = candidate.get("confirmed") or {}
    if confirmed.get("held"):
        return f"confirmed by {confirmed['requests']:,} requests per seed"
    return str(confirmed.get("why", "not confirmed"))


def recommendation_table(document: dict[str, Any]) -> Table:
    target = document["target_rate_per_s"]
    header = [
        "#",
        "candidate",
        "max rate under SLO",
        f"GPUs for {target:g} req/s" if target is not None else "rate per GPU",
        "binding limit",
        "headroom" if target is not None else "GPUs per deployment",
        "GPU cost for the target" if target is not None else "GPU cost per output token",
        "first failing rate: why",
    ]
    rows: list[list[Text]] = []
    for c in document["candidates"]:
        rows.append(_recommendation_row(c, sized=target is not None))
    return Table(header, rows, css_class="recommendation")


def _recommendation_row(c: dict[str, Any], sized: bool = True) -> list[Text]:
    if not c.get("rank"):
        return [
            ["—"],
            [c["key"]],
            [c["status"]],
            ["—"],
            [c.get("binding", {}).get("label", "—")],
            ["—"],
            ["—"],
            [c.get("reason", "")],
        ]
    probe = c["max_probe"]
    at_least = "≥ " if c["status"] == "at_max_rate" else ""
    cost = c.get("cost_per_million_output_tokens")
    failing = c.get("fail_probe")
    why = [probe_link(rate(c.get("fail_rate_per_s")), failing), ": " + "; ".join(c.get("fail_reasons", []))]
    if failing is None:
        why = [c.get("reason", "")]
    return [
        [str(c["rank"])],
        [c["key"]],
        [
            probe_link(at_least + rate(c["max_rate_per_s"]), probe),
            "" if (c.get("confirmed") or {}).get("held") is not False else " (not confirmed)",
        ],
        _count_cell(c, probe, sized),
        [probe_link(c["binding"]["label"], c["binding"].get("evidence", {}).get("probe"))],
        [probe_link(f"{c['headroom_frac']:+.0%}" if sized else str(c["gpus_per_deployment"]), probe)],
        [probe_link(_cost_text(c), probe) if cost is not None else "no price given"],
        why,
    ]


def _count_cell(c: dict[str, Any], probe: int, sized: bool) -> Text:
    if not sized:
        return [probe_link(f"{c['rate_per_gpu_per_s']:.3g} req/s", probe)]
    return [
        probe_link(str(c["gpus_for_target"]), probe),
        f" ({_gpu_range(c)} over {_band_label(c)})" if _gpu_range(c) else "",
    ]


def _band_label(c: dict[str, Any]) -> str:
    """ "its band" and what the band rests on: ``its band, datasheet-only``."""
    evidence = (c.get("band") or {}).get("evidence")
    return f"its band, {evidence}" if evidence else "the band"


def _cost_text(c: dict[str, Any]) -> str:
    if "cost_per_hour_for_target" not in c:
        return f"${c['cost_per_million_output_tokens']:.2f}/M tokens at the maximum rate"
    return f"${c['cost_per_hour_for_target']:,.2f}/h, ${c['cost_per_million_output_tokens']:.2f}/M tokens"


def evidence_blocks(document: dict[str, Any], pngs: dict[str, bytes]) -> list[Block]:
    """The evidence: knee curves, series over time, memory, block sizes, binding limits (``pngs``:
    the figures drawn, by file name)."""
    from sim.planning.report.figures import knee_metrics, safe_name

    blocks: list[Block] = [Heading(2, "Evidence")]
    blocks.append(Heading(3, "Knee curves"))
    blocks.append(
        Paragraph(
            [
                "Each curve is one candidate: the metric on the steady-state window against the offered rate "
                "(mean over seeds; bars: min–max). Dashed: the SLO. Star: the maximum rate under every SLO. "
                "Caret: a probe stopped once its failure was certain, where no probe ran to its end; its value "
                "is a bound (the full run's lies beyond it, in the caret's direction)."
            ]
        )
    )
    for metric in knee_metrics(document):
        name = f"knee_{safe_name(metric)}.png"
        blocks.append(Figure(name, f"{metric_label(metric)} against request rate", pngs[name]))
    best = next((c for c in document["candidates"] if c["key"] == document["recommendation"]), None)
    if "over_time.png" in pngs:
        blocks += _over_time_blocks(pngs["over_time.png"])
    if best is not None:
        blocks += _recommended_point_blocks(best)
    blocks.append(Heading(3, "Memory at each candidate's maximum rate"))
    blocks.append(
        Figure(
            "memory.png",
            "GPU memory split at the maximum rate (steady-state time averages; ★ = recommended)",
            pngs["memory.png"],
        )
    )
    if "block_size.png" in pngs:
        blocks.append(Heading(3, "Block-size trade-off"))
        blocks.append(
            Paragraph(
                [
                    "Larger blocks waste more of each sequence's last block (internal fragmentation) and so fit fewer "
                    "requests; the cost model decides whether they buy faster iterations."
                ]
            )
        )
        blocks.append(
            Figure(
                "block_size.png",
                "maximum rate and internal fragmentation against block size",
                pngs["block_size.png"],
            )
        )
    blocks += _binding_blocks(document)
    return blocks


def _seed_text(candidate: dict[str, Any]) -> str:
    """The seeds as replicates, in words."""
    seeds = candidate.get("seeds") or {}
    per_seed = seeds.get("max_rate_per_seed") or {}
    if not per_seed:
        return ""
    each = ", ".join(
        f"seed {seed}: {rate(value) if value is not None else 'none'}" for seed, value in per_seed.items()
    )
    text = f"Seeds as replicates, the highest probed rate each alone passed: {each}"
    interval = seeds.get("mean_ci95")
    if interval:
        text += f" (mean, 95 % interval: {rate(interval[0])}–{rate(interval[1])})"
    return text + "; the plan's maximum needs every seed to pass (a lower bound)."


def _over_time_blocks(png: bytes) -> list[Block]:
    return [
        Heading(3, "Queue and KV usage over time at the maximum rates"),
        Paragraph(
            [
                "For each GPU's best candidate, the run that stands behind its maximum rate (its confirmation "
                "run when there is one; the first seed): waiting and running requests and KV usage over time, "
                "the steady-state window shaded. A rate holds when none of them trends across the window."
            ]
        ),
        Figure(
            "over_time.png",
            "queue, running batch and KV usage over time at each GPU's maximum rate",
            png,
        ),
    ]


def _recommended_point_blocks(best: dict[str, Any]) -> list[Block]:
    probe = best["max_probe"]
    rows: list[list[Text]] = []
    for name in AT_MAX_METRICS:
        stats = best["at_max"].get(name)
        if stats and stats.get("mean") is not None:
            rows.append([[metric_label(name)], [name], [probe_link(with_spread(name, stats), probe)]])
    memory = best["memory"]
    return [
        Heading(3, f"At the recommended point: {best['key']} at {rate(best['max_rate_per_s'])}"),
        Paragraph([_seed_text(best)]),
        Paragraph(
            [
                "Steady-state window, mean over seeds (min–max in brackets). GPU memory: ",
                f"{memory['gpu_memory_bytes'] / 2**30:.1f} GiB, weights {memory['weight_bytes'] / 2**30:.1f} GiB, "
                f"activation reserve {memory['activation_reserve_bytes'] / 2**30:.1f} GiB, KV pool "
                f"{memory['kv_pool_bytes'] / 2**30:.1f} GiB (kvsim's sizing of this GPU). Points: ",
                *_point_links(best["max_points"]),
            ]
        ),
        Table(["metric", "key in plan.json", "value (mean over seeds, min–max)"], rows),
    ]


def _point_links(point_ids: list[str]) -> Text:
    links: Text = []
    for index, point_id in enumerate(point_ids):
        if index:
            links.append(", ")
        links.append(point_link(point_id))
    return links


def _binding_blocks(document: dict[str, Any]) -> list[Block]:
    rows: list[list[Text]] = []
    for c in document["candidates"]:
        binding = c.get("binding")
        if not binding or not binding.get("evidence"):
            continue
        evidence = binding["evidence"]
        blocked = evidence["admission_blocked_frac"]
        rows.append(
            [
                [c["key"]],
                [probe_link(rate(evidence["rate_per_s"]), evidence["probe"])],
                [binding["label"]],
                *[
                    [probe_link(share(blocked[name]), evidence["probe"])]
                    for name in ("kv_memory", "max_num_seqs", "token_budget")
                ],
                [binding["why"]],
            ]
        )
    if not rows:
        return []
    header = [
        "candidate",
        "at rate",
        "binding limit",
        "held back: KV memory",
        "max_num_seqs",
        "token budget",
        "why",
    ]
    return [
        Heading(3, "Binding limits"),
        Paragraph(
            [
                "At each candidate's first failing rate: the share of the steady window during which the waiting "
                "queue's head was held back, and by what (recorded by the engine at every iteration). A broken TPOT "
                f"SLO means compute. Limits: {', '.join(LIMIT_LABELS.values())}."
            ]
        ),
        Table(header, rows),
    ]


def assumption_blocks(document: dict[str, Any]) -> list[Block]:
    assumptions = document["assumptions"]
    cost_lines: list[Text] = [
        [f"{group}: cost model “{p['cost_model']}”, error band: {p['cost_model_error_band']}"]
        for group, p in assumptions["cost_models"].items()
    ]
    gpus = ", ".join(
        g["name"] + (f" (${g['price_per_hour']:g}/GPU-hour)" if g["price_per_hour"] else "")
        for g in assumptions["gpus"]
    )
    return [
        Heading(2, "Assumptions"),
        Bullets(
            [
                [f"model(s): {', '.join(assumptions['models'])}; GPU(s): {gpus}"],
                *cost_lines,
                [assumptions["probe"]],
                [assumptions["search"]],
                [f"SLOs: {_slo_text(document)}; " + _target_text(document["target_rate_per_s"])],
            ]
        ),
        Paragraph(["Workload (the search sets its rate and request count) and engine settings:"]),
        Code(
            yaml.safe_dump(
                {"workload": assumptions["workload"], "engine": assumptions["engine"]}, sort_keys=False
            )
        ),
        Paragraph(["Not modelled:"]),
        Bullets([[item] for item in assumptions["not_modelled"]]),
    ]


def _verdict(probe: dict[str, Any]) -> str:
    if probe["error"]:
        return "error"
    edge = f"band edge, GPU times ×{probe['time_scale']:.3g}: " if probe.get("time_scale", 1.0) != 1.0 else ""
    stopped = sum(seed.get("stopped_early_s") is not None for seed in probe["seeds"])
    breaks = "breaks SLOs" + (f" ({stopped} seed(s) stopped early: failure certain)" if stopped else "")
    if probe.get("confirmation"):
        return "confirmation run: holds" if probe["passed"] else f"confirmation run: {breaks}"
    if edge:
        return edge + ("meets SLOs" if probe["passed"] else breaks)
    if probe.get("run_again_longer"):
        return "met SLOs short of a steady state: run again longer"
    return "meets SLOs" if probe["passed"] else breaks


def probe_blocks(document: dict[str, Any]) -> list[Block]:
    slo_metrics = [slo["metric"] for slo in document["slos"].values()]
    header = [
        "probe",
        "candidate",
        "rate",
        "requests",
        "verdict",
        *(metric_label(metric) for metric in slo_metrics),
        "KV-pool fills spanned",
        "points (seeds)",
        "violations / not steady",
    ]
    rows: list[list[Text]] = []
    anchors = []
    for probe in sorted(document["probes"], key=lambda p: (p["candidate"], p["rate_per_s"])):
        verdict = _verdict(probe)
        seeds = probe["seeds"]
        links: Text = []
        for index, seed in enumerate(seeds):
            links += ([", "] if index else []) + [point_link(seed["point_id"], f"seed {seed['seed']}")]
        violations = sorted({v for seed in seeds for v in seed["violations"]}) or (
            [probe["error"]] if probe["error"] else []
        )
        unsteady = sorted({f"not steady: {r}" for seed in seeds for r in seed.get("not_steady", [])})
        # A run stopped early bounds each SLO metric on the side of its failure.
        signs = {slo["metric"]: "≤ " if slo["at_least"] else "≥ " for slo in document["slos"].values()}
        slo_cells: list[Text] = []
        for metric in slo_metrics:
            stats = probe["metrics"].get(metric, {})
            bounded = probe.get("stopped_early") and stats.get("mean") is not None
            slo_cells.append([(signs[metric] if bounded else "") + with_spread(metric, stats)])
        rows.append(
            [
                [str(probe["number"])],
                [probe["candidate"]],
                [rate(probe["rate_per_s"])],
                [f"{probe.get('requests', 0):,}"],
                [verdict],
                *slo_cells,
                [with_spread("fill_multiple", probe["metrics"].get("fill_multiple", {}))],
                links,
                ["; ".join(violations + unsteady)],
            ]
        )
        anchors.append(f"probe-{probe['number']}")
    run = document["run"]
    wall = f" in {run['wall_s']:.0f} s of wall time" if run.get("wall_s") else ""
    return [
        Heading(2, "Probes"),
        Paragraph(
            [
                f"{run['probes']} probes; {run['simulations']} simulations run{wall}, {run['reused']} reused from an "
                "earlier run of this plan. Metrics: steady-state window, mean over seeds (min–max)."
            ]
        ),
        Table(header, rows, anchors),
    ]
