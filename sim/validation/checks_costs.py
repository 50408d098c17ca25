"""Checks of the cost models (configs ``costs-*.yaml``): per-iteration error against measured GPU
iterations they were not fitted on, and what a cost model implies for the vLLM paper's Fig. 13.
"""

from __future__ import annotations

import pandas as pd
from pydantic import Field

from sim.costs.core import CostModel
from sim.validation.claims import Claim, _Strict
from sim.validation.registry import CheckOutput, Measured, RunContext, register_check
from sim.validation.runs import run_config

# -- per-iteration error against Vidur's measured operations ------------------------------------------


class VidurHoldoutParams(_Strict):
    pass


@register_check("vidur_holdout", VidurHoldoutParams)
def check_vidur_holdout(claim: Claim, context: RunContext) -> CheckOutput:
    """Targets ``<model>/<dataset>/<phase>/{mean,worst}``: the mean absolute and the largest relative
    error of a cost model's iteration time over Vidur's points (held-out ones where the model was fitted
    to the dataset, all of them otherwise); ``calibrate.vidur.error_bands`` computes them."""
    from calibrate import vidur

    output = CheckOutput()
    bands = vidur.error_bands()
    rows = []
    for dataset, by_model in bands.items():
        for key, band in by_model.items():
            model, phase = key.split("/")
            worst = max(abs(band.low), abs(band.high))
            shown = f"{band.low * 100:+.1f}..{band.high * 100:+.1f} % (mean |e| {band.mean_abs:.1%})"
            detail = (
                f"{band.n_points} {phase} points of Vidur's {dataset} data; relative error of the predicted "
                f"iteration time (negative: predicted too fast) from {band.low:+.1%} to {band.high:+.1%}, "
                f"mean |error| {band.mean_abs:.1%}."
            )
            output.values[f"{model}/{dataset}/{phase}/mean"] = Measured(band.mean_abs, detail, shown)
            output.values[f"{model}/{dataset}/{phase}/worst"] = Measured(worst, detail, shown)
            rows.append(
                {
                    "dataset": dataset,
                    "cost_model": model,
                    "phase": phase,
                    "n_points": band.n_points,
                    "min_rel_err": band.low,
                    "max_rel_err": band.high,
                    "mean_abs_rel_err": band.mean_abs,
                }
            )
    output.tables["errors"] = pd.DataFrame(rows)
    output.notes.append(
        "A point is one decoder layer summed from Vidur's per-operation medians times the layer count, "
        "plus the LM head and embedding rows from the derated model (Vidur does not time them); both sides "
        "of each comparison share that addition. Held out: every fourth point sorted by phase, context "
        "and tokens, never used by the fits (`calibrate/vidur.py`)."
    )
    return output


# -- vLLM Fig. 13: the mean batch at 2 req/s with a cost model ---------------------------------------


class Fig13CostParams(_Strict):
    variant: str = Field(description="The vLLM (paged) variant.")
    cost_models: list[str] = Field(min_length=1, description="Cost models to run (cost_model: values).")
    paper_mean_batch: float = Field(
        gt=0, description="The paper's mean batched requests (Little's law input)."
    )
    rate_per_s: float = Field(gt=0)
    mean_output_tokens: float = Field(gt=0, description="The paper's mean ShareGPT output length.")


@register_check("fig13_cost", Fig13CostParams, needs_experiment=True)
def check_fig13_cost(claim: Claim, context: RunContext) -> CheckOutput:
    params: Fig13CostParams = claim.params
    output = CheckOutput()
    # Little's law: L = lambda x W, so each request spends W = L / lambda in the system; spread over its
    # output tokens that is the time per generated token the paper's system ran at.
    latency_s = params.paper_mean_batch / params.rate_per_s
    implied_step_s = latency_s / params.mean_output_tokens
    rows = []
    for cost_model in params.cost_models:
        config = claim.config(overrides={"cost_model": cost_model}, fast=context.fast)
        (result,) = run_config(config, claim.path.parent, [params.variant]).values()
        summary = result.summary
        step_s = summary["simulated_s"] / summary["iterations"] if summary["iterations"] else float("nan")
        detail = (
            f"cost model {summary['cost_model']} (error band: {summary['cost_model_error_band']}); mean "
            f"running {summary['mean_running']:.2f} (peak {summary['peak_running']}); mean iteration "
            f"{step_s * 1e3:.1f} ms over {summary['iterations']:,} iterations; TPOT p50 "
            f"{(summary['tpot_p50_s'] or float('nan')) * 1e3:.1f} ms. The paper's {params.paper_mean_batch} "
            f"batched requests at {params.rate_per_s:g} req/s imply {latency_s:.2f} s per request (Little's "
            f"law), i.e. {implied_step_s * 1e3:.1f} ms per output token over {params.mean_output_tokens:g} "
            f"tokens: this cost model's iteration is {implied_step_s / step_s:.2f}x faster than that."
        )
        output.values[f"mean_batch@{cost_model}"] = Measured(summary["mean_running"], detail)
        output.values[f"tpot_p50_ms@{cost_model}"] = Measured(
            (summary["tpot_p50_s"] or float("nan")) * 1e3, detail
        )
        rows.append(
            {
                "cost_model": cost_model,
                "label": summary["cost_model"],
                "error_band": summary["cost_model_error_band"],
                "mean_running": summary["mean_running"],
                "peak_running": summary["peak_running"],
                "mean_iteration_s": step_s,
                "tpot_p50_s": summary["tpot_p50_s"],
                "implied_step_s": implied_step_s,
            }
        )
        context.log(f"  {cost_model}: mean batch {summary['mean_running']:.2f}")
    output.tables["batch_by_cost_model"] = pd.DataFrame(rows)
    return output


# -- speculative decoding: the speedup of a step at a batch ----------------------------------------


class SpeculativeSpeedupParams(_Strict):
    model: str
    gpu: str
    speculative: dict = Field(description="engine.speculative, as an experiment gives it.")
    batches: list[int] = Field(min_length=1, description="Batch sizes the source measured.")
    tokens_per_request: int = Field(gt=0, description="Context each request holds (prompt + output so far).")


@register_check("speculative_speedup", SpeculativeSpeedupParams)
def check_speculative_speedup(claim: Claim, context: RunContext) -> CheckOutput:
    """Targets ``batch_<B>``: the throughput speedup of a speculative step over a plain decode step at
    a batch of ``B`` requests, ``mean acceptance length x plain step / speculative step``, both
    steps priced by kvsim's default cost model (``sim/costs/speculative.py``)."""
    import tempfile
    from pathlib import Path

    import yaml

    from sim.config import load_experiment
    from sim.runner import prepare_experiment, speculative_knobs

    params: SpeculativeSpeedupParams = claim.params
    experiment = {
        "name": "speculative-speedup",
        "model": params.model,
        "gpu": params.gpu,
        "engine": {"max_model_len": 8192, "max_num_seqs": max(*params.batches, BREAK_EVEN_SCAN)},
        "workload": {
            "num_requests": 1,
            "arrival": {"kind": "poisson", "rate_per_s": 1},
            "prompt_len": 8,
            "output_len": 8,
        },
        "variants": [
            {"name": "plain", "policy": "paged"},
            {"name": "speculative", "policy": "paged", "engine": {"speculative": params.speculative}},
        ],
    }
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "speculative-speedup.yaml"
        path.write_text(yaml.safe_dump(experiment))
        prepared = prepare_experiment(load_experiment(path), Path(folder))
    plain, speculative = prepared.variants
    knobs = speculative_knobs(speculative.engine)
    assert knobs is not None
    tau = knobs.acceptance.mean_acceptance_length
    output = CheckOutput()
    rows = []
    for batch in params.batches:
        tokens = batch * params.tokens_per_request
        plain_s = plain.costs.decode.step_s(batch, tokens)
        speculative_s = speculative.costs.decode.step_s(batch, tokens)
        speedup = tau * plain_s / speculative_s
        detail = (
            f"batch {batch}, {tokens:,} tokens held: plain step {plain_s * 1e3:.2f} ms, speculative step "
            f"{speculative_s * 1e3:.2f} ms giving {tau:.2f} tokens per request"
        )
        output.values[f"batch_{batch}"] = Measured(speedup, detail)
        rows.append(
            {
                "batch": batch,
                "plain_step_ms": plain_s * 1e3,
                "speculative_step_ms": speculative_s * 1e3,
                "speedup": speedup,
            }
        )
    output.tables["steps"] = pd.DataFrame(rows)
    output.notes.append(f"cost model: {speculative.costs.label}")
    break_even = _break_even_batch(plain.costs, speculative.costs, tau, params.tokens_per_request)
    output.notes.append(
        f"speculation stops paying (speedup below 1) at batch {break_even}"
        if break_even is not None
        else f"speculation pays at every batch up to {BREAK_EVEN_SCAN}"
    )
    return output


BREAK_EVEN_SCAN = 1024  # batches scanned for where speculation stops paying


def _break_even_batch(
    plain: CostModel, speculative: CostModel, tau: float, tokens_per_request: int
) -> int | None:
    """The smallest batch at which ``tau`` tokens per speculative step come slower than plain steps:
    the high-load crossover, where the verification's extra tokens cost more than the drafts save."""
    for batch in range(1, BREAK_EVEN_SCAN + 1):
        tokens = batch * tokens_per_request
        if tau * plain.decode.step_s(batch, tokens) < speculative.decode.step_s(batch, tokens):
            return batch
    return None
