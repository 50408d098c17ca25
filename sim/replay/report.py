"""The replay's report: ``comparison.json`` (every number), ``report.md`` and a self-contained
``report.html`` (the same text, figures inlined), rendered from the comparison alone."""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any

from sim.replay.compare import LATENCY_NAMES, NOT_COMPARED, ScopeComparison, headline_errors
from sim.replay.measured import MeasuredRun

ANCHOR_TEXT = {
    "client": "client-side: from the benchmark client's send to its receipt of the first / last token "
    "(HTTP, the API server, tokenization and streaming included)",
    "engine": "engine-side: from the engine's queue time stamp (queued_ts) to its first / last token",
}
TPOT_TEXT = {
    "ratio_of_means": "(mean E2E - mean TTFT) / (mean output tokens - 1), as the run's publisher defines it",
    "per_request": "the mean over requests of (E2E - TTFT) / (output tokens - 1), as the run's publisher defines it",
}


def comparison_document(
    run: MeasuredRun,
    scopes: list[ScopeComparison],
    simulation: dict[str, Any],
) -> dict[str, Any]:
    """Everything the report prints, as JSON-able data."""
    settings = run.settings
    return {
        "run": {
            "name": run.name,
            "format": run.source_format,
            "path": str(run.path),
            "requests": len(run.requests),
            "anchor": run.anchor,
            "anchor_definition": ANCHOR_TEXT[run.anchor],
            "tpot_definition": run.tpot_definition,
            "tpot_definition_text": TPOT_TEXT[run.tpot_definition],
            "settings": {key: getattr(settings, key) for key in settings.__dataclass_fields__},
            "stages": [
                {"start_s": s.start_s, "end_s": s.end_s, "rate_per_s": s.rate_per_s} for s in run.stages
            ],
            "prompt_identity": run.prompt_hashes is not None,
            "notes": run.notes,
        },
        "simulation": simulation,
        "headline": headline_errors(scopes[0]),
        "scopes": [scope.as_dict() for scope in scopes],
    }


def _number(value: float, latency: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if latency == "tpot_s" or value < 1:
        return f"{value * 1000:.1f} ms"
    return f"{value:.2f} s"


def _percent(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:+.1%}"


def _scope_rows(scope: dict[str, Any]) -> list[list[str]]:
    rows = []
    for latency, name in LATENCY_NAMES.items():
        metric = scope["metrics"][latency]
        stats = (
            ["headline", "mean", "p50", "p90", "p99"]
            if latency == "tpot_s"
            else ["mean", "p50", "p90", "p99"]
        )
        for stat in stats:
            label = f"{name} ({'publisher' if stat == 'headline' else stat})"
            rows.append(
                [
                    label,
                    _number(metric["measured"][stat], latency),
                    _number(metric["simulated"][stat], latency),
                    _percent(metric["signed_error"][stat]),
                ]
            )
    flows = scope["throughput"]
    rows.append(
        [
            "output throughput",
            f"{flows['measured']['output_tokens_per_s']:,.0f} tokens/s",
            f"{flows['simulated']['output_tokens_per_s']:,.0f} tokens/s",
            _percent(flows["signed_error"]["output_tokens_per_s"]),
        ]
    )
    return rows


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _sections(
    document: dict[str, Any],
) -> list[tuple[str, str | list[str] | tuple[list[str], list[list[str]]]]]:
    """The report as (heading, body) pairs: a paragraph, a list, or a table."""
    run, sim, head = document["run"], document["simulation"], document["headline"]
    summary = (
        f"kvsim replayed {run['requests']:,} measured requests of {run['name']} ({run['format']}) with "
        f"cost model {sim['cost_model']}. Mean TTFT {_percent(head['ttft_mean'])}, TPOT "
        f"{_percent(head['tpot'])}, mean E2E {_percent(head['e2e_mean'])} (simulated / measured - 1: "
        "positive means kvsim is slow)."
    )
    sections: list[tuple[str, Any]] = [("Summary", summary)]
    definitions = [
        f"Latencies are {run['anchor_definition']}.",
        f"TPOT (publisher) = {run['tpot_definition_text']}; the other TPOT rows are per-request statistics.",
        "Statistics are over the requests both sides finished; errors are simulated / measured - 1.",
    ]
    if sim.get("client_overhead_s"):
        definitions.append(
            f"The simulated TTFT and E2E include {sim['client_overhead_s'] * 1000:.1f} ms of client-side "
            "overhead per request (engine.client_overhead_s: the cost model's fitted request_overhead_s), since the data is client-side."
        )
    sections.append(("Definitions", definitions))
    for scope in document["scopes"]:
        heading = f"{scope['name']}: {scope['compared']:,} of {scope['requests']:,} requests compared"
        sections.append((heading, (["metric", "measured", "kvsim", "error"], _scope_rows(scope))))
        if scope is document["scopes"][0] and scope["not_compared"]:
            sections.append(("Requests not compared", not_compared_lines(scope, sim)))
    settings = run["settings"]
    sections.append(
        (
            "Replayed with",
            [
                f"model {sim['model']}, GPU {sim['gpu']}, TP {settings['tensor_parallel_size']}, DP "
                f"{settings['data_parallel_size']}{_expert_parallel(sim)}, policy {sim['policy']}",
                f"KV pool {sim['kv_pool_tokens']:,} tokens{' per DP rank' if sim['data_parallel_size'] > 1 else ''} "
                f"({sim['kv_pool_source']})",
                f"max_num_seqs {sim['max_num_seqs']}, max_num_batched_tokens {sim['max_num_batched_tokens']}, "
                f"block size {sim['block_size']}, chunked prefill {sim['enable_chunked_prefill']}, "
                f"async scheduling {sim['async_scheduling']}{_async_source(settings)}",
                f"cost model: {sim['cost_model']}; its error band: {sim['cost_model_error_band']}",
                f"simulated: {sim['preemptions']:,} preemptions, prefix cache hit rate "
                f"{_percent_plain(sim['prefix_cache_hit_rate'])}, {sim['unfinished']:,} requests unfinished",
                f"rerun the simulation alone: kvsim run {sim['experiment']}",
            ],
        )
    )
    sections.append(("About the data", run["notes"]))
    return sections


def not_compared_lines(scope: dict[str, Any], simulation: dict[str, Any]) -> list[str]:
    """One line per reason a measured request was left out of the statistics, with kvsim's own
    words for the first rejections."""
    lines = [f"{count:,} {NOT_COMPARED[reason]}" for reason, count in scope["not_compared"].items()]
    examples = simulation.get("rejection_examples") or []
    if examples:
        lines.append("kvsim's reasons, e.g.: " + "; ".join(examples))
    return lines


def _async_source(settings: dict[str, Any]) -> str:
    """Where the async-scheduling switch came from: the run's files, or kvsim's default."""
    recorded = settings.get("async_scheduling")
    if recorded is None:
        return " (not recorded: kvsim's default)"
    return f" ({settings.get('engine_version') or 'the run'}'s setting)"


def _expert_parallel(sim: dict[str, Any]) -> str:
    size = sim["expert_parallel_size"]
    return f", expert parallel (the routed experts dealt over {size} GPUs)" if size > 1 else ""


def _percent_plain(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def markdown(document: dict[str, Any], figures: list[Path]) -> str:
    parts = [f"# Replay of {document['run']['name']}", ""]
    for heading, body in _sections(document):
        parts += [f"## {heading}", ""]
        if isinstance(body, str):
            parts.append(body)
        elif isinstance(body, tuple):
            parts.append(_markdown_table(*body))
        else:
            parts += [f"- {item}" for item in body]
        parts.append("")
    parts += ["## Figures", ""]
    parts += [f"![{path.stem}](figures/{path.name})" for path in figures]
    return "\n".join(parts) + "\n"


def html_page(document: dict[str, Any], figures: list[Path]) -> str:
    """The report as one HTML file with its figures inlined (it can be mailed or attached alone)."""
    title = html.escape(f"Replay of {document['run']['name']}")
    body = [f"<h1>{title}</h1>"]
    for heading, content in _sections(document):
        body.append(f"<h2>{html.escape(heading)}</h2>")
        if isinstance(content, str):
            body.append(f"<p>{html.escape(content)}</p>")
        elif isinstance(content, tuple):
            header, rows = content
            cells = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
            lines = "".join(
                "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
            )
            body.append(f"<table><thead><tr>{cells}</tr></thead><tbody>{lines}</tbody></table>")
        else:
            body.append("<ul>" + "".join(f"<li>{html.escape(item)}</li>" for item in content) + "</ul>")
    body.append("<h2>Figures</h2>")
    for path in figures:
        encoded = base64.b64encode(path.read_bytes()).decode("ascii")
        body.append(f'<p><img alt="{html.escape(path.stem)}" src="data:image/png;base64,{encoded}"></p>')
    style = (
        "body{font-family:sans-serif;max-width:70em;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}"
        "td:first-child,th:first-child{text-align:left}img{max-width:100%}"
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def write_report(folder: Path, document: dict[str, Any], figures: list[Path]) -> None:
    (folder / "comparison.json").write_text(json.dumps(_finite(document), indent=2, default=_json_default))
    (folder / "report.md").write_text(markdown(document, figures))
    (folder / "report.html").write_text(html_page(document, figures))


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as null (JSON has neither)."""
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")
