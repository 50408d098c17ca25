"""Checks of the vLLM paper's claims (Kwon et al., SOSP 2023) and of vLLM's start-up capacity log
(configs ``vllm-*.yaml``).
"""

from __future__ import annotations

import textwrap

import matplotlib
import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from sim.config import ConfigError
from sim.hardware.capacity import size_kv_pool
from sim.hardware.models import resolve_model
from sim.outputs.canvas import subplots
from sim.runner import VariantResult
from sim.validation.claims import Claim, Target, _Strict
from sim.validation.registry import CheckOutput, Measured, RunContext, register_check
from sim.validation.runs import (
    GB,
    GiB,
    block_waste,
    contiguous_internal_split,
    describe_lengths,
    run_config,
    saturated_means,
    steady_window,
    window_means,
)

# -- claim 1: vLLM Table 1 --------------------------------------------------------------------------


class Table1Row(_Strict):
    target: str = Field(description="Target id prefix: <target>@GiB and <target>@GB are reported.")
    model: str
    gpu: str
    num_gpus: int = Field(gt=0, description="Tensor-parallel GPUs; the KV memory is split across them.")
    kv_memory: float = Field(gt=0, description="'Memory for KV' of Table 1, in GB or GiB (both read).")


class Table1Params(_Strict):
    block_size: int = Field(16, gt=0)
    bytes_per_token_model: str = Field("OPT-13B", description="Model whose per-token KV bytes are checked.")
    rows: list[Table1Row] = Field(min_length=1)


@register_check("table1_capacity", Table1Params)
def check_table1(claim: Claim, context: RunContext) -> CheckOutput:
    params: Table1Params = claim.params
    output = CheckOutput()
    model = resolve_model(params.bytes_per_token_model)
    per_token = model.kv_bytes_per_token()
    output.values["kv_bytes_per_token"] = Measured(
        per_token,
        f"2 (K,V) x {model.num_layers} layers x {model.num_kv_heads} heads x {model.head_dim} x 2 B = "
        f"{per_token:,} B = {per_token / 1024:g} KiB = {per_token / 1000:g} kB.",
    )
    rows = []
    for row in params.rows:
        spec = resolve_model(row.model)
        for unit_name, unit in (("GiB", GiB), ("GB", GB)):
            per_gpu = int(row.kv_memory * unit) // row.num_gpus
            capacity = size_kv_pool(
                spec,
                row.gpu,
                block_size=params.block_size,
                kv_cache_memory_bytes=per_gpu,
                tensor_parallel_size=row.num_gpus,
            )
            exact = per_gpu / capacity.kv_bytes_per_token
            output.values[f"{row.target}@{unit_name}"] = Measured(
                capacity.kv_pool_tokens,
                f"{row.kv_memory:g} {unit_name} over {row.num_gpus} GPU(s) / "
                f"{spec.kv_bytes_per_token():,} B per token = {exact:,.1f} slots, "
                f"{capacity.num_gpu_blocks:,} blocks of {params.block_size}.",
            )
            rows.append(
                {
                    "model": row.model,
                    "unit": unit_name,
                    "kv_memory": row.kv_memory,
                    "kv_bytes_per_token": spec.kv_bytes_per_token(),
                    "slots_exact": exact,
                    "kv_pool_tokens": capacity.kv_pool_tokens,
                }
            )
    output.tables["slots"] = pd.DataFrame(rows)
    output.notes.append(
        "Slots = KV memory / bytes per token, rounded down to whole blocks of 16 (vLLM's pool is "
        "num_blocks x block_size). Reading the paper's 'GB' as GiB (2^30 B) reproduces Table 1; "
        "reading it as 10^9 B gives 6.9-8.2 % fewer slots than printed."
    )
    return output


# -- capacity line: vLLM start-up log ----------------------------------------------------------------


class CapacityLineParams(_Strict):
    model: str
    gpu: str
    block_size: int = Field(16, gt=0)
    max_model_len: int = Field(gt=0)
    utilizations: dict[str, float] = Field(
        min_length=1, description="Target id prefix -> gpu_memory_utilization."
    )


@register_check("capacity_line", CapacityLineParams)
def check_capacity_line(claim: Claim, context: RunContext) -> CheckOutput:
    params: CapacityLineParams = claim.params
    output = CheckOutput()
    for prefix, utilization in params.utilizations.items():
        capacity = size_kv_pool(
            params.model, params.gpu, block_size=params.block_size, gpu_memory_utilization=utilization
        )
        lines = capacity.capacity_lines(params.max_model_len)
        detail = (
            f"weights {capacity.weight_bytes:,} B, activation reserve {capacity.activation_reserve_bytes:,} B, "
            f"KV {capacity.available_kv_bytes:,} B / {capacity.block_bytes:,} B per block = "
            f"{capacity.num_gpu_blocks:,} blocks. Log: {' | '.join(lines)}"
        )
        output.values[f"{prefix}_tokens"] = Measured(capacity.kv_pool_tokens, detail)
        output.values[f"{prefix}_concurrency"] = Measured(
            capacity.max_concurrency(params.max_model_len), detail
        )
        output.notes.append(f"gpu_memory_utilization {utilization}: `{lines[0]}`, `{lines[1]}`")
    return output


# -- capacity line of a hybrid model: vLLM start-up log ---------------------------------------------


class HybridCapacityLineParams(_Strict):
    model: str
    available_kv_gib: float = Field(
        gt=0, description="vLLM's logged 'Available KV cache memory' (GiB, per GPU)."
    )
    max_model_len: int = Field(gt=0)
    tensor_parallel_size: int = Field(1, gt=0)
    max_num_batched_tokens: int = Field(8192, gt=0)
    max_concurrent_batches: int = Field(
        1, gt=0, description="2 with async scheduling (vLLM >= 0.14 by default)."
    )
    tokens_line: str = Field("concurrency", description="'blocks' for vLLM before the 2026 tokens line.")


@register_check("hybrid_capacity_line", HybridCapacityLineParams)
def check_hybrid_capacity_line(claim: Claim, context: RunContext) -> CheckOutput:
    """vLLM's hybrid sizing (``sim/hardware/hybrid_capacity.py``) from the memory a log reports."""
    from sim.hardware.hybrid_capacity import vllm_hybrid_kv_capacity

    params: HybridCapacityLineParams = claim.params
    capacity = vllm_hybrid_kv_capacity(
        params.model,
        int(params.available_kv_gib * GiB),
        max_model_len=params.max_model_len,
        tensor_parallel_size=params.tensor_parallel_size,
        max_num_batched_tokens=params.max_num_batched_tokens,
        max_concurrent_batches=params.max_concurrent_batches,
        tokens_line=params.tokens_line,  # type: ignore[arg-type]
    )
    lines = capacity.capacity_lines()
    detail = (
        f"block {capacity.block_size} tokens, page {capacity.page_bytes:,} B, {len(capacity.groups)} groups of "
        f"{capacity.group_size} layers, {capacity.num_blocks:,} blocks. Log: {' | '.join(lines)}"
    )
    output = CheckOutput()
    output.values["block_size"] = Measured(capacity.block_size, detail)
    output.values["tokens"] = Measured(capacity.kv_cache_tokens, detail)
    output.values["concurrency"] = Measured(capacity.max_concurrency, detail)
    output.notes.append(f"`{lines[0]}`, `{lines[1]}`")
    return output


# -- claim 2: Fig. 13 Orca(Max) cap ------------------------------------------------------------------


class Fig13Params(_Strict):
    cap_variant: str = Field(description="The contiguous max-reservation variant.")
    cap_cases: list[str] = Field(min_length=1, description="Cases at loads above saturation.")
    batch_case: str = Field(description="Case whose variants give the Fig. 13 mean batch sizes.")


@register_check(
    "fig13_max_cap",
    Fig13Params,
    needs_experiment=True,
    cases=lambda p: sorted({*p.cap_cases, p.batch_case}),
)
def check_fig13(claim: Claim, context: RunContext) -> CheckOutput:
    params: Fig13Params = claim.params
    output = CheckOutput()
    base_dir = claim.path.parent
    peaks = []
    rows = []
    for case in params.cap_cases:
        config = claim.config(case, fast=context.fast)
        variants = None if case == params.batch_case else [params.cap_variant]
        results = run_config(config, base_dir, variants)
        for name, result in results.items():
            saturated = saturated_means(result.timeseries, int(result.summary["kv_pool_tokens"]))
            rows.append(
                {
                    "case": case,
                    "variant": name,
                    "mean_running": result.summary["mean_running"],
                    "saturated_running": saturated["running"],
                    "saturated_s": saturated["saturated_s"],
                    "simulated_s": result.summary["simulated_s"],
                    "peak_running": result.summary["peak_running"],
                    "kv_pool_tokens": result.summary["kv_pool_tokens"],
                    "preemptions": result.summary["preemptions"],
                }
            )
            if name == params.cap_variant:
                peaks.append(int(result.summary["peak_running"]))
                pool = int(result.summary["kv_pool_tokens"])
                output.values[f"saturated_mean_batch@{case}"] = Measured(
                    saturated["running"],
                    f"{case}: mean running over the {saturated['saturated_s']:.0f} s (of "
                    f"{result.summary['simulated_s']:.0f} s) with a request waiting; whole-run mean "
                    f"{result.summary['mean_running']:.2f}; pool {pool:,} slots, floor({pool:,}/2048) = "
                    f"{pool // 2048}. {describe_lengths(result.requests)}.",
                )
            elif case == params.batch_case:
                output.values[f"mean_batch@{name}"] = Measured(
                    result.summary["mean_running"],
                    f"{name}: whole-run mean running {result.summary['mean_running']:.2f} "
                    f"(peak {result.summary['peak_running']}), decode at the analytic roofline's speed.",
                )
    output.values["peak_batch"] = Measured(max(peaks), f"peak running per case: {peaks}.")
    output.tables["batch_sizes"] = pd.DataFrame(rows)
    return output


# -- claim 3: Fig. 2 memory shares -------------------------------------------------------------------


class Fig2Params(_Strict):
    rates: list[float] = Field(min_length=1, description="Request rates swept (req/s).")
    fast_rates: list[float] = Field(min_length=1)
    reference_rate: float = Field(gt=0, description="The rate the verdicts are read at.")
    variants: dict[str, str] = Field(min_length=1, description="Variant name -> label in figures.")
    warmup_fraction: float = Field(
        0.2,
        ge=0,
        lt=1,
        description="Steady-state window: from this fraction of the arrivals to the last one.",
    )
    paper_mean_prompt: float = Field(161.31, gt=0, description="The paper's ShareGPT mean prompt (tokens).")
    paper_mean_output: float = Field(337.99, gt=0, description="The paper's ShareGPT mean output (tokens).")
    max_variant: str = Field("contiguous-max", description="The Max-reservation variant (closed form).")

    @model_validator(mode="after")
    def _reference_swept(self) -> Fig2Params:
        if self.reference_rate not in self.rates or self.reference_rate not in self.fast_rates:
            raise ValueError("reference_rate must be in rates and in fast_rates")
        return self


FIG2_METRICS = ("token_states", "reservation", "internal", "others", "token_states_busy")


def fig2_shares(result: VariantResult, warmup_fraction: float) -> dict[str, float]:
    """The paper's Fig. 2 columns from one run, time-averaged over its steady-state window (warm-up
    and drain dropped, :func:`steady_window`), as fractions of the pool.

    * token states = used; reservation = reserved (slots that will be filled later);
    * internal = the reservation rule's overshoot beyond the final length (the paper's definition;
      a buddy allocator's rounding to a power of two is not in it: the paper shows no internal
      fragmentation for Oracle although it runs on a buddy allocator);
    * others = everything else: external fragmentation, buddy rounding and idle free memory
      ("idle free memory counts as others");
    * token_states_busy = token states / (pool - idle free memory): the alternative reading in which
      free memory that the next request could use is left out.
    """
    summary = result.summary
    pool = int(summary["kv_pool_tokens"])
    window = steady_window(result.requests, warmup_fraction)
    means = window_means(result.timeseries, pool, *window)
    used, reserved = means["used"], means["reserved"]
    internal_total = means["internal_fragmentation"]
    free = means["free"] + means["cached"]
    options = summary["policy_options"]
    if summary["policy"] == "contiguous":
        rule, rounding = contiguous_internal_split(
            result, options["reservation"], options["placement"], window
        )
        # The split is exact; the series' average interpolates between rows: they agree closely.
        if abs(rule + rounding - internal_total) > 5e-3:
            raise AssertionError(
                f"{summary['variant']}: internal split {rule:.4f} + {rounding:.4f} != {internal_total:.4f}"
            )
    else:
        rule, rounding = internal_total, 0.0
    busy = 1.0 - free
    running = means["running"]
    return {
        "token_states": used,
        "reservation": reserved,
        "internal": rule,
        "buddy_rounding": rounding,
        "external": means["external_fragmentation"],
        "idle_free": free,
        "others": 1.0 - used - reserved - rule,
        "token_states_busy": used / busy if busy > 0 else float("nan"),
        "mean_running": running,
        "waiting_share": means["waiting_share"],
        "window_start_s": window[0],
        "window_end_s": window[1],
        "live_tokens_per_running_request": used * pool / running if running else float("nan"),
        "preemptions": summary["preemptions"],
    }


def max_closed_form(requests: pd.DataFrame, pool: int, max_model_len: int) -> dict[str, float]:
    """Max reservation at saturation, in closed form: every running request holds ``max_model_len``
    slots, so ``B = pool // max_model_len`` run at once, and a request holds its slot for a time
    proportional to its ``o`` decode steps (the batch steps together). Over its life its live
    tokens are ``p + k`` and its reservation ``o - k`` at step ``k``, which integrate to
    ``p o + o^2 / 2`` and ``o^2 / 2``; averaged over slot time:

    used = B / pool x (E[p o] + E[o^2] / 2) / E[o];  reservation = B / pool x E[o^2] / (2 E[o]).

    It leaves out the prefill iteration and the gap between a finish and the next admission."""
    done = requests[requests["outcome"] == "finished"]
    p = done["prompt_tokens"].to_numpy(dtype=float)
    o = done["output_tokens"].to_numpy(dtype=float)
    batch = pool // max_model_len
    mean_o = o.mean()
    return {
        "batch": float(batch),
        "used": batch / pool * (np.mean(p * o) + np.mean(o * o) / 2) / mean_o,
        "reservation": batch / pool * np.mean(o * o) / (2 * mean_o),
        "mean_p": float(p.mean()),
        "mean_o": float(mean_o),
        "cv_o": float(o.std() / mean_o),
    }


def invert_max_column(
    used: float, reservation: float, batch: int, pool: int, mean_o: float
) -> dict[str, float]:
    """The output moments the paper's Max column implies, by inverting :func:`max_closed_form`:
    ``E[o^2] / E[o] = 2 reservation pool / B``, ``E[p o] / E[o] = (used - reservation) pool / B``."""
    second_over_first = 2 * reservation * pool / batch
    return {
        "e_o2_over_e_o": second_over_first,
        "cv_o": float(np.sqrt(max(second_over_first / mean_o - 1, 0.0))),
        "e_po_over_e_o": (used - reservation) * pool / batch,
    }


@register_check("fig2_shares", Fig2Params, needs_experiment=True)
def check_fig2(claim: Claim, context: RunContext) -> CheckOutput:
    params: Fig2Params = claim.params
    output = CheckOutput()
    rates = params.fast_rates if context.fast else params.rates
    rows = []
    lengths = ""
    moments: dict[str, float] = {}
    for rate in rates:
        config = claim.config(overrides={"workload": {"arrival": {"rate_per_s": rate}}}, fast=context.fast)
        results = run_config(config, claim.path.parent, list(params.variants))
        context.log(f"  rate {rate:g} req/s done")
        for name, result in results.items():
            row = {"rate_per_s": rate, "variant": name} | fig2_shares(result, params.warmup_fraction)
            if name == params.max_variant:
                summary = result.summary
                closed = max_closed_form(
                    result.requests, int(summary["kv_pool_tokens"]), int(summary["max_model_len"])
                )
                row |= {"closed_form_used": closed["used"], "closed_form_reservation": closed["reservation"]}
                moments = moments or closed | {"pool": int(summary["kv_pool_tokens"])}
            rows.append(row)
            lengths = lengths or describe_lengths(result.requests)
    table = pd.DataFrame(rows)
    output.tables["shares_vs_rate"] = table
    targets = {t.id: t for t in claim.spec.targets}
    output.notes.extend(_fig2_closed_form_notes(params, targets, moments))

    def holds_at(target_id: str, rate: float) -> bool:
        target = targets[target_id]
        metric, variant = target_id.split("/", 1)
        value = float(table[(table.rate_per_s == rate) & (table.variant == variant)][metric].iloc[0])
        assert target.tolerance is not None and target.expected is not None
        return target.tolerance.accepts(target.expected, value)

    def rate_list(selected: list[float]) -> str:
        return ", ".join(f"{r:g}" for r in selected) + " req/s" if selected else "none of the swept rates"

    reference = table[table.rate_per_s == params.reference_rate]
    for target_id in targets:
        metric, variant = target_id.split("/", 1)
        if metric not in FIG2_METRICS or variant not in params.variants:
            raise ConfigError(
                f"{claim.path}: target {target_id!r} is not <metric>/<variant> of {FIG2_METRICS}"
            )
        row = reference[reference.variant == variant].iloc[0]
        matching = [rate for rate in rates if holds_at(target_id, rate)]
        by_rate = ", ".join(
            f"{r:g}: {table[(table.rate_per_s == r) & (table.variant == variant)][metric].iloc[0]:.1%}"
            for r in rates
        )
        closed_text = ""
        if variant == params.max_variant and metric in ("token_states", "reservation"):
            closed_text = (
                f"Closed form at saturation ({moments['batch']:.0f} running, this run's lengths): token "
                f"states {row.closed_form_used:.1%}, reservation {row.closed_form_reservation:.1%}. "
            )
        output.values[target_id] = Measured(
            float(row[metric]),
            f"{closed_text}Steady state at {params.reference_rate:g} req/s ({row.window_start_s:.0f}-"
            f"{row.window_end_s:.0f} s, a request waiting {row.waiting_share:.0%} of it): {variant} has "
            f"token states {row.token_states:.1%}, "
            f"reservation {row.reservation:.1%}, internal {row.internal:.1%}, buddy rounding "
            f"{row.buddy_rounding:.1%}, external {row.external:.1%}, idle free {row.idle_free:.1%}; "
            f"mean batch {row.mean_running:.1f}, {row.live_tokens_per_running_request:.0f} live tokens per running "
            f"request. By rate (req/s: value): {by_rate}. Within tolerance at: "
            f"{rate_list(matching)}.",
        )
    primary = [t.id for t in claim.spec.targets if not t.secondary and t.id.startswith("token_states/")]
    busy = [t.id for t in claim.spec.targets if t.id.startswith("token_states_busy/")]
    all_primary = [r for r in rates if all(holds_at(t, r) for t in primary)]
    all_busy = [r for r in rates if all(holds_at(t, r) for t in busy)]
    output.notes.append(f"Workload as generated: {lengths}.")
    saturated = [r for r in rates if (table[table.rate_per_s == r].waiting_share >= 0.99).all()]
    output.notes.append(
        "Rates at which every variant had a request waiting through at least 99 % of the steady-state "
        f"window (all saturated): {rate_list(saturated)}."
    )
    output.notes.append(
        "Rates at which all four token-state shares hold, idle free memory counted as 'others': "
        f"{rate_list(all_primary)}; with idle free memory left out: {rate_list(all_busy)}."
    )
    never = [t for t in primary if not any(holds_at(t, r) for r in rates)]
    if never and len(never) < len(primary):
        rest = [t for t in primary if t not in never]
        together = [r for r in rates if all(holds_at(t, r) for t in rest)]
        output.notes.append(
            f"Leaving out {', '.join(targets[t].label for t in never)} (within tolerance at no swept rate), "
            f"the other token-state shares hold together at {rate_list(together)}."
        )
    for target_id in primary:
        label = targets[target_id].label
        output.notes.append(
            f"{label}: within tolerance at {rate_list([r for r in rates if holds_at(target_id, r)])} "
            f"(idle free counted as others); at {rate_list([r for r in rates if holds_at(target_id.replace('token_states/', 'token_states_busy/'), r)])} "
            "with idle free memory left out."
            if target_id.replace("token_states/", "token_states_busy/") in targets
            else f"{label}: within tolerance at {rate_list([r for r in rates if holds_at(target_id, r)])}."
        )
    output.figures.extend(_fig2_figures(claim, context, table, params, targets))
    return output


def _fig2_closed_form_notes(
    params: Fig2Params, targets: dict[str, Target], moments: dict[str, float]
) -> list[str]:
    """What the paper's Max column says about its output lengths, and this workload's moments."""
    used = targets.get(f"token_states/{params.max_variant}")
    reservation = targets.get(f"reservation/{params.max_variant}")
    if (
        not moments
        or used is None
        or reservation is None
        or used.expected is None
        or reservation.expected is None
    ):
        return []
    batch, pool = int(moments["batch"]), int(moments["pool"])
    implied = invert_max_column(used.expected, reservation.expected, batch, pool, params.paper_mean_output)
    return [
        f"Max at saturation runs {batch} requests (pool {pool:,} // max_model_len), so its shares have a "
        "closed form: used = B/pool × (E[p·o] + E[o²]/2) / E[o], reservation = B/pool × E[o²] / (2 E[o]) "
        f"(sim/validation/checks_vllm.py max_closed_form). Inverting the paper's {used.expected:.1%} / "
        f"{reservation.expected:.1%}: E[o²]/E[o] = 2 × {reservation.expected} × {pool:,} / {batch} = "
        f"{implied['e_o2_over_e_o']:.1f} tokens, so with E[o] = {params.paper_mean_output:g} the output CV is "
        f"{implied['cv_o']:.3f}; E[p·o]/E[o] = ({used.expected} - {reservation.expected}) × {pool:,} / {batch} "
        f"= {implied['e_po_over_e_o']:.1f} ≈ E[p] = {params.paper_mean_prompt:g}: prompt and output "
        "lengths nearly uncorrelated. This workload (finished requests): mean prompt "
        f"{moments['mean_p']:.1f}, mean output {moments['mean_o']:.1f}, output CV {moments['cv_o']:.3f}."
    ]


def _fig2_figures(
    claim: Claim, context: RunContext, table: pd.DataFrame, params: Fig2Params, targets: dict[str, Target]
) -> list[str]:
    figures = []
    fig, ax = subplots(figsize=(7.5, 4.2))
    colours = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (variant, label) in enumerate(params.variants.items()):
        rows = table[table.variant == variant]
        colour = colours[i % len(colours)]
        ax.plot(rows.rate_per_s, rows.token_states * 100, "o-", color=colour, label=f"{label}")
        ax.plot(rows.rate_per_s, rows.token_states_busy * 100, "x:", color=colour, lw=1)
        target = targets.get(f"token_states/{variant}")
        if target is not None and target.expected is not None:
            ax.axhline(target.expected * 100, color=colour, ls="--", lw=0.8)
    ax.set_xlabel("request rate (req/s, Poisson)")
    ax.set_ylabel("token states (% of KV pool)")
    ax.set_title("Fig. 2 token-state share vs rate (dashed: paper; dotted x: idle free left out)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=8)
    figures.append(context.save_figure(fig, f"{claim.name}_vs_rate.png"))

    columns = ("token_states", "reservation", "internal", "others")
    colours_by_column = ("#2b8a3e", "#74b816", "#f08c00", "#adb5bd")
    panels = sorted({params.reference_rate, max(table.rate_per_s)})
    fig, axes = subplots(1, len(panels), figsize=(5.5 * len(panels), 4.4), squeeze=False)
    for ax, rate in zip(axes[0], panels, strict=True):
        at_rate = table[table.rate_per_s == rate]
        labels, stacks = [], []
        for variant, label in params.variants.items():
            short = textwrap.fill(label, 9)
            paper = [targets.get(f"{c}/{variant}") for c in columns]
            expected = [t.expected if t is not None else None for t in paper]
            if all(value is not None for value in expected):
                labels.append(f"{short}\npaper")
                stacks.append([float(value) for value in expected if value is not None])
            elif expected[0] is not None:
                labels.append(f"{short}\npaper")
                stacks.append([expected[0], 0.0, 0.0, 1 - expected[0]])
            row = at_rate[at_rate.variant == variant].iloc[0]
            labels.append(f"{short}\nsim")
            stacks.append([float(row[c]) for c in columns])
        bottoms = np.zeros(len(stacks))
        for j, column in enumerate(columns):
            heights = np.array([stack[j] for stack in stacks]) * 100
            ax.bar(range(len(stacks)), heights, bottom=bottoms, color=colours_by_column[j], label=column)
            bottoms += heights
        ax.set_xticks(range(len(stacks)), labels, fontsize=7)
        ax.set_ylabel("% of KV pool")
        ax.set_title(f"paper vs simulated at {rate:g} req/s", fontsize=10)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    fig.suptitle("Fig. 2 breakdown ('others' includes idle free memory)")
    figures.append(context.save_figure(fig, f"{claim.name}_breakdown.png"))
    return figures


# -- claim 4: block size sweep -----------------------------------------------------------------------


class BlockSizeParams(_Strict):
    block_sizes: list[int] = Field(min_length=2)
    fast_block_sizes: list[int] = Field(min_length=2)
    base_block: int = 16
    alike_blocks: list[int] = Field(description="Blocks whose batch must be alike (ShareGPT claim).")
    large_block: int = 128
    workloads: dict[str, str] = Field(min_length=1, description="Case -> label.")

    @model_validator(mode="after")
    def _blocks(self) -> BlockSizeParams:
        for sizes in (self.block_sizes, self.fast_block_sizes):
            missing = {self.base_block, self.large_block} - set(sizes)
            if missing:
                raise ValueError(f"block sizes {sizes} must include {sorted(missing)}")
        if not set(self.alike_blocks) <= set(self.block_sizes):
            raise ValueError("alike_blocks must be among block_sizes")
        return self


@register_check("block_size_sweep", BlockSizeParams, needs_experiment=True, cases=lambda p: list(p.workloads))
def check_block_size(claim: Claim, context: RunContext) -> CheckOutput:
    params: BlockSizeParams = claim.params
    output = CheckOutput()
    sizes = params.fast_block_sizes if context.fast else params.block_sizes
    rows = []
    for case in params.workloads:
        for block in sizes:
            config = claim.config(case, {"engine": {"block_size": block}}, fast=context.fast)
            (result,) = run_config(config, claim.path.parent).values()
            pool = int(result.summary["kv_pool_tokens"])
            saturated = saturated_means(result.timeseries, pool)
            rows.append(
                {
                    "case": case,
                    "block_size": block,
                    "kv_pool_tokens": pool,
                    "saturated_running": saturated["running"],
                    "saturated_waste": block_waste(saturated),
                    "saturated_used": saturated["used"],
                    "saturated_s": saturated["saturated_s"],
                    "preemptions": result.summary["preemptions"],
                    "lengths": describe_lengths(result.requests),
                }
            )
        context.log(f"  {case} done")
    table = pd.DataFrame(rows)
    output.tables["block_sweep"] = table.drop(columns=["lengths"])

    def value(case: str, block: int, column: str) -> float:
        return float(table[(table.case == case) & (table.block_size == block)][column].iloc[0])

    for case in params.workloads:
        base = value(case, params.base_block, "saturated_running")
        ratios = {b: value(case, b, "saturated_running") / base for b in sizes}
        summary = "; ".join(
            f"block {b}: batch {value(case, b, 'saturated_running'):.1f} ({ratios[b]:.2f}x), "
            f"waste {value(case, b, 'saturated_waste'):.1%}"
            for b in sizes
        )
        lengths = table[table.case == case].lengths.iloc[0]
        output.values[f"{case}/batch_ratio_{params.large_block}"] = Measured(
            ratios[params.large_block], f"{case}: {summary}. {lengths}."
        )
        alike = [b for b in params.alike_blocks if b in sizes]
        worst = min(alike, key=lambda b: ratios[b])
        output.values[f"{case}/min_batch_ratio"] = Measured(
            ratios[worst], f"{case}: lowest at block {worst}. {summary}."
        )
        waste_ratio = value(case, params.large_block, "saturated_waste") / value(
            case, params.base_block, "saturated_waste"
        )
        output.values[f"{case}/waste_{params.large_block}"] = Measured(
            value(case, params.large_block, "saturated_waste"), f"{case}: {summary}."
        )
        output.values[f"{case}/waste_ratio_{params.large_block}"] = Measured(
            waste_ratio, f"{case}: {summary}."
        )
    fig, (left, right) = subplots(1, 2, figsize=(9, 3.8))
    for case, label in params.workloads.items():
        rows_case = table[table.case == case]
        base = value(case, params.base_block, "saturated_running")
        left.plot(rows_case.block_size, rows_case.saturated_running / base, "o-", label=label)
        right.plot(rows_case.block_size, rows_case.saturated_waste * 100, "o-", label=label)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.set_xlabel("block size (tokens)")
        ax.legend(fontsize=8)
    left.set_ylabel(f"saturated batch / batch at block {params.base_block}")
    right.set_ylabel("unfilled share of allocated slots (%)")
    fig.suptitle("Block-size sweep (paged, saturated: offline batch)")
    output.figures.append(context.save_figure(fig, f"{claim.name}.png"))
    return output


# -- claim 10: Fig. 15 memory saved by sharing ---------------------------------------------------------


class Fig15Params(_Strict):
    widths: list[int] = Field(min_length=1, description="n and beam widths simulated (2, 4, 6).")
    reparent_probs: list[float] = Field(
        min_length=1, description="Beam re-parenting probabilities q swept; the verdict uses the best fit."
    )
    fast_reparent_probs: list[float] = Field(min_length=1)

    @model_validator(mode="after")
    def _probabilities(self) -> Fig15Params:
        if not all(0 < q <= 1 for q in [*self.reparent_probs, *self.fast_reparent_probs]):
            raise ValueError("reparent_probs must be in (0, 1]")
        return self


def _saving(claim: Claim, context: RunContext, workload: dict, engine: dict | None = None) -> float:
    overrides: dict = {"workload": workload}
    if engine:
        overrides["engine"] = engine
    config = claim.config(overrides=overrides, fast=context.fast)
    (result,) = run_config(config, claim.path.parent).values()
    return float(result.summary["memory_saved_by_sharing_frac"])


@register_check("fig15_sharing", Fig15Params, needs_experiment=True)
def check_fig15(claim: Claim, context: RunContext) -> CheckOutput:
    """Memory saved by sharing (time-averaged 1 - physical / logical blocks) for parallel sampling
    (n = width, samples stopping independently, and for comparison all stopping together) and beam
    search (beam_width = width) over a sweep of q; the single q that fits the paper's three beam
    numbers best (least squares) gives the verdicts, and each width's own best q is reported."""
    params: Fig15Params = claim.params
    output = CheckOutput()
    targets = {t.id: t for t in claim.spec.targets}
    qs = params.fast_reparent_probs if context.fast else params.reparent_probs
    rows = []
    for width in params.widths:
        for lengths in ("independent", "identical"):
            fraction = _saving(claim, context, {"n": width, "sample_lengths": lengths})
            rows.append(
                {"mode": f"sampling ({lengths} lengths)", "width": width, "q": None, "saved": fraction}
            )
        for q in qs:
            fraction = _saving(claim, context, {"beam_width": width}, {"beam_reparent_prob": q})
            rows.append({"mode": "beam", "width": width, "q": q, "saved": fraction})
        context.log(f"  width {width} done")
    table = pd.DataFrame(rows)
    output.tables["saving"] = table

    def saved(mode: str, width: int, q: float | None = None) -> float:
        rows = table[(table["mode"] == mode) & (table.width == width)]
        if q is not None:
            rows = rows[rows.q == q]
        return float(rows.saved.iloc[0])

    def paper(kind: str, width: int) -> float | None:
        target = targets.get(f"{kind}@{width}")
        return None if target is None else target.expected

    def misfit(q: float) -> float:
        claimed = {w: paper("beam", w) for w in params.widths}
        gaps = [saved("beam", w, q) - value for w, value in claimed.items() if value is not None]
        return float(np.sqrt(np.mean(np.square(gaps)))) if gaps else float("nan")

    def best_for(width: int) -> float:
        claimed = paper("beam", width) or 0.0
        return min(qs, key=lambda q: abs(saved("beam", width, q) - claimed))

    best_q = min(qs, key=misfit)
    by_width = {w: best_for(w) for w in params.widths}
    sweep = "; ".join(
        f"q {q:g}: "
        + " / ".join(f"{saved('beam', w, q):.1%}" for w in params.widths)
        + f" (rms gap {misfit(q):.1%})"
        for q in qs
    )
    for width in params.widths:
        independent = saved("sampling (independent lengths)", width)
        identical = saved("sampling (identical lengths)", width)
        output.values[f"sampling@{width}"] = Measured(
            independent,
            f"n = {width}, samples stopping independently: {independent:.1%} saved; all stopping "
            f"together ({identical:.1%}) shares the prompt for longer.",
        )
        output.values[f"beam@{width}"] = Measured(
            saved("beam", width, best_q),
            f"beam width {width} at the best single fit q = {best_q:g}: {saved('beam', width, best_q):.1%}; "
            f"this width alone is best fitted by q = {by_width[width]:g} "
            f"({saved('beam', width, by_width[width]):.1%}). Widths {params.widths} by q: {sweep}.",
        )
    output.notes.append(
        f"Beam search: one q for all widths, fitted by least squares over q in {list(qs)}: q = {best_q:g} "
        f"(rms gap {misfit(best_q):.1%}); per width: "
        + ", ".join(f"width {w}: q = {by_width[w]:g}" for w in params.widths)
        + f". Savings by q (widths {params.widths}): {sweep}."
    )
    output.figures.append(_fig15_figure(claim, context, params, table, best_q, paper))
    return output


def _fig15_figure(claim, context, params, table, best_q, paper) -> str:
    fig, axes = subplots(1, 2, figsize=(9, 3.6))
    widths = np.array(params.widths)
    for ax, kind, mode, title in (
        (axes[0], "sampling", "sampling (independent lengths)", "parallel sampling (n)"),
        (axes[1], "beam", "beam", f"beam search (q = {best_q:g})"),
    ):
        rows = table[(table["mode"] == mode) & ((table.q == best_q) if kind == "beam" else True)]
        ax.bar(widths - 0.35, [100 * (paper(kind, w) or 0) for w in widths], 0.7, label="paper")
        ax.bar(widths + 0.35, 100 * rows.sort_values("width").saved.to_numpy(), 0.7, label="simulated")
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.set_xlabel("width")
        ax.set_ylabel("memory saved by sharing (%)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle("vLLM Fig. 15: memory saved by sharing, OPT-13B, Alpaca-like lengths")
    return context.save_figure(fig, f"{claim.name}.png")
