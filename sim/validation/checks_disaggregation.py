"""Checks of published prefill/decode disaggregation results (configs ``distserve-*.yaml``).

DistServe's goodput: the highest request rate at which at least a share (90 %) of the requests meet
the latency SLOs, per GPU provisioned. Its Fig. 1 draws the two SLO lines without printing their
values; what it prints is where the single-phase curves cross them (a prefill-only GPU up to 5.6
req/s, a decode-only GPU up to 10 req/s). :func:`check_distserve_goodput` reads the SLOs off kvsim's
own single-phase runs at those rates, then bisects the rate of each setup against them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from sim.config import ConfigError
from sim.costs.least_squares import least_squares
from sim.outputs.canvas import subplots
from sim.validation.claims import Claim, _Strict
from sim.validation.registry import CheckOutput, Measured, RunContext, register_check
from sim.validation.runs import run_config, steady_window

FirstToken = Literal["client", "prefill"]


class SloReading(_Strict):
    """One SLO read off a single-phase run: its latency percentile at the published rate."""

    variant: str = Field(description="The single-phase variant.")
    case: str | None = Field(None, description="The case it runs in (default: the experiment itself).")
    rate_per_s: PositiveFloat = Field(description="The published goodput of that single-phase GPU.")
    duration_s: PositiveFloat | None = Field(
        None,
        description="Its runs' arrival span (default: the check's duration_s; not under --fast): a tail "
        "percentile read once sets an SLO for every setup, so a cheap reading may run longer.",
    )


class GoodputSetup(_Strict):
    """One serving setup whose goodput per GPU is searched."""

    variant: str = Field(description="The variant that runs it.")
    gpus: PositiveInt = Field(description="GPUs it occupies (goodput per GPU = its rate / gpus).")
    first_token: FirstToken = Field(
        "client",
        description="When a disaggregated request's first token counts: client (when the decode replica "
        "emits it, as vLLM's connectors do) or prefill (when the prefill replica samples it, as "
        "DistServe returns it); TPOT then runs from that instant.",
    )


class Search(_Strict):
    low_per_gpu: PositiveFloat = Field(description="Rate per GPU (req/s) every setup must meet.")
    high_per_gpu: PositiveFloat = Field(description="Rate per GPU (req/s) every setup must miss.")
    resolution_per_gpu: PositiveFloat = Field(description="Bisection stops at this bracket width (req/s).")
    fast_resolution_per_gpu: PositiveFloat = Field(description="The same under --fast.")

    @model_validator(mode="after")
    def _ordered(self) -> Search:
        if self.low_per_gpu >= self.high_per_gpu:
            raise ValueError("low_per_gpu must be below high_per_gpu")
        return self


class DistServeParams(_Strict):
    attainment: float = Field(0.9, gt=0, lt=1, description="Share of requests that must meet each SLO.")
    warmup_frac: float = Field(0.2, ge=0, lt=1, description="Arrivals dropped as warm-up.")
    duration_s: PositiveFloat = Field(
        description="Each run's arrivals span about this long (its num_requests = rate x duration_s): "
        "a latency percentile's noise depends on how many residence times a run spans, so a run at "
        "10 req/s needs as many seconds as one at 2 req/s, not as many requests."
    )
    min_requests: PositiveInt = Field(
        description="The fewest requests a run has, however low its rate (a P90 needs enough of them)."
    )
    fast_duration_s: PositiveFloat = Field(description="duration_s under --fast.")
    fast_min_requests: PositiveInt = Field(description="min_requests under --fast.")
    ttft_slo: SloReading = Field(description="The TTFT SLO: a prefill-only GPU's TTFT percentile.")
    tpot_slo: SloReading = Field(description="The TPOT SLO: a decode-only GPU's TPOT percentile.")
    setups: dict[str, GoodputSetup] = Field(
        min_length=1, description="Setup id -> setup; reported as goodput_per_gpu@<id>."
    )
    ratios: dict[str, tuple[str, str]] = Field(
        default_factory=dict, description="Target id -> (setup, baseline setup): goodput per GPU ratio."
    )
    search: Search

    @model_validator(mode="after")
    def _known_setups(self) -> DistServeParams:
        for name, pair in self.ratios.items():
            unknown = [setup for setup in pair if setup not in self.setups]
            if unknown:
                raise ValueError(
                    f"ratios.{name}: unknown setup(s) {', '.join(unknown)} (setups: {', '.join(self.setups)})"
                )
        return self


# --------------------------------------------------------------------------------------------------
# Latencies and attainment (pure functions of a requests table)
# --------------------------------------------------------------------------------------------------


def request_latencies(requests: pd.DataFrame, first_token: FirstToken) -> tuple[np.ndarray, np.ndarray]:
    """Each request's (TTFT, TPOT) in s; inf for a request that did not finish (it misses both).

    ``first_token="prefill"``: a disaggregated request's first token counts when its prompt is done on
    the prefill replica (DistServe sends it to the client from there), so its TTFT ends at
    ``prefill_done_s`` and its TPOT spreads the rest (transfer, the wait for a decode iteration and
    the decode steps) over the output tokens after the first, keeping TTFT + TPOT x (n - 1) the
    request's latency. Requests prefilled where they decode keep ``ttft_s`` and ``tpot_s``."""
    finished = (requests["outcome"] == "finished").to_numpy()
    ttft = requests["ttft_s"].to_numpy(dtype=float).copy()
    tpot = requests["tpot_s"].to_numpy(dtype=float).copy()
    if first_token == "prefill" and "prefill_done_s" in requests:
        done = requests["prefill_done_s"].to_numpy(dtype=float)
        split = ~np.isnan(done)
        arrival = requests["arrival_s"].to_numpy(dtype=float)
        finish = requests["finish_s"].to_numpy(dtype=float)
        steps = requests["output_tokens"].to_numpy(dtype=float) - 1
        overhead = requests["ttft_s"].to_numpy(dtype=float) - (requests["first_token_s"] - arrival).to_numpy()
        ttft[split] = (done - arrival + overhead)[split]
        with np.errstate(divide="ignore", invalid="ignore"):
            tpot[split] = np.where(steps > 0, (finish - done) / steps, np.nan)[split]
    ttft[~finished] = math.inf
    tpot[~finished] = math.inf
    return ttft, tpot


def share_within(values: np.ndarray, slo_s: float) -> float:
    """Share of ``values`` at most ``slo_s``; NaN (a one-token output has no TPOT) meets it."""
    if not len(values):
        return math.nan
    return float(np.mean(np.isnan(values) | (values <= slo_s)))


def slo_at(values: np.ndarray, attainment: float) -> float:
    """The smallest latency that ``attainment`` of ``values`` meet (the inverted-CDF percentile: at
    the rate it is read at, exactly that share is within it)."""
    clean = values[~np.isnan(values)]
    return float(np.percentile(clean, attainment * 100, method="inverted_cdf"))


READING_SPREAD = 0.1
"""An SLO reading also runs its single-phase GPU at this fraction below and above the published rate,
to say how sharply the published rate fixes the SLO (a flat curve fixes it loosely)."""

SLOPE_HALF_WIDTH = 0.75
"""req/s per GPU either side of a goodput over which the binding latency's slope is fitted: wide enough
that probe noise (P90 of a few hundred requests) does not dominate, narrow enough to stay local."""


def local_slope(points: list[tuple[float, float]], center: float, half_width: float) -> float | None:
    """Least-squares slope of ``(x, y)`` points with ``|x - center| <= half_width`` (None with fewer
    than two distinct x)."""
    near = [(x, y) for x, y in points if abs(x - center) <= half_width and math.isfinite(y)]
    if len({x for x, _ in near}) < 2:
        return None
    xs, ys = np.array([x for x, _ in near]), np.array([y for _, y in near])
    # (least_squares, not polyfit: the same bits on every machine.)
    return float(least_squares(np.column_stack([xs, np.ones_like(xs)]), ys)[0])


@dataclass
class Probe:
    rate_per_gpu: float
    ttft_share: float
    tpot_share: float
    ttft_p_s: float
    tpot_p_s: float

    def meets(self, attainment: float) -> bool:
        return self.ttft_share >= attainment and self.tpot_share >= attainment


def bisect_goodput(
    meets: Callable[[float], bool], low: float, high: float, resolution: float
) -> tuple[float | None, float | None, str]:
    """``(highest rate found to meet the SLOs, lowest found to miss them, "")``, or, when the goodput
    is outside ``[low, high]``, ``(None, None, why)``. Assumes one crossing (the probes share one
    seed, so a higher rate is the same arrivals closer together)."""
    if not meets(low):
        return None, None, f"misses its SLOs already at {low:g} req/s per GPU (the search's low end)"
    if meets(high):
        return None, None, f"meets its SLOs still at {high:g} req/s per GPU (the search's high end)"
    while high - low > resolution:
        middle = (low + high) / 2
        if meets(middle):
            low = middle
        else:
            high = middle
    return low, high, ""


# --------------------------------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------------------------------


def _window(requests: pd.DataFrame, warmup_frac: float) -> pd.DataFrame:
    start, end = steady_window(requests, warmup_frac)
    return requests[(requests["arrival_s"] >= start) & (requests["arrival_s"] <= end)]


class _Runs:
    """Runs of the claim's variants at given rates, kept: setups that share a variant (the same
    cluster judged with either first token) share the bisection's probes."""

    def __init__(self, claim: Claim, context: RunContext, params: DistServeParams):
        self.claim, self.context, self.warmup_frac = claim, context, params.warmup_frac
        self.duration_s = params.fast_duration_s if context.fast else params.duration_s
        self.min_requests = params.fast_min_requests if context.fast else params.min_requests
        self._done: dict[tuple[str, str | None, float, float], pd.DataFrame] = {}

    def window(
        self, variant: str, case: str | None, rate: float, duration_s: float | None = None
    ) -> pd.DataFrame:
        """The steady-state window's requests of ``variant`` at Poisson ``rate`` (req/s in all), its
        arrivals spanning ``duration_s`` (default: the check's)."""
        duration = self.duration_s if duration_s is None or self.context.fast else duration_s
        key = (variant, case, rate, duration)
        if key not in self._done:
            requests = max(self.min_requests, math.ceil(rate * duration))
            overrides = {
                "workload": {"num_requests": requests, "arrival": {"kind": "poisson", "rate_per_s": rate}}
            }
            config = self.claim.config(case, overrides, fast=self.context.fast)
            requests = run_config(config, self.claim.path.parent, [variant])[variant].requests
            self._done[key] = _window(requests, self.warmup_frac)
        return self._done[key]


def _check_variants(claim: Claim, params: DistServeParams) -> None:
    """Every variant the params name is one of the experiment's (an error naming the key otherwise)."""
    known = [variant.name for variant in claim.config().variants]
    named = {"ttft_slo.variant": params.ttft_slo.variant, "tpot_slo.variant": params.tpot_slo.variant}
    named |= {f"setups.{name}.variant": setup.variant for name, setup in params.setups.items()}
    for key, variant in named.items():
        if variant not in known:
            raise ConfigError(
                f"{claim.path}: claim.params.{key}: no variant {variant!r} in the experiment "
                f"(variants: {', '.join(known)})"
            )


def _cases(params: DistServeParams) -> list[str]:
    return sorted({reading.case for reading in (params.ttft_slo, params.tpot_slo) if reading.case})


@register_check("distserve_goodput", DistServeParams, needs_experiment=True, cases=_cases)
def check_distserve_goodput(claim: Claim, context: RunContext) -> CheckOutput:
    """Reports ``goodput_per_gpu@<setup>`` (req/s per GPU), ``ttft_slo_s``, ``tpot_slo_s`` (s) and each
    of ``ratios``. A rate meets the SLOs when at least ``attainment`` of the steady-state window's requests
    meet the TTFT SLO and at least as many the TPOT SLO (Fig. 1's reading: "constrained by the more
    stringent one of TTFT and TPOT")."""
    params: DistServeParams = claim.params
    _check_variants(claim, params)
    output = CheckOutput()
    share = params.attainment
    runs = _Runs(claim, context, params)
    readings = {}
    for metric, reading in (("ttft", params.ttft_slo), ("tpot", params.tpot_slo)):
        at = {}
        for factor in (1 - READING_SPREAD, 1.0, 1 + READING_SPREAD):
            requests = runs.window(
                reading.variant, reading.case, reading.rate_per_s * factor, reading.duration_s
            )
            latencies = request_latencies(requests, "client")[0 if metric == "ttft" else 1]
            at[factor] = slo_at(latencies, share)
        measured_on = len(runs.window(reading.variant, reading.case, reading.rate_per_s, reading.duration_s))
        readings[metric] = at[1.0]
        slope = (at[1 + READING_SPREAD] - at[1 - READING_SPREAD]) / (2 * READING_SPREAD * reading.rate_per_s)
        output.values[f"{metric}_slo_s"] = Measured(
            readings[metric],
            f"P{share * 100:g} {metric.upper()} of {reading.variant} at {reading.rate_per_s:g} req/s "
            f"({measured_on} requests in the steady window); it rises {slope * 1000:.2g} ms per req/s "
            f"there (runs at ±{READING_SPREAD:.0%} of the rate), so ±1 req/s of the published rate is "
            f"±{slope * 1000:.2g} ms of SLO.",
            f"{readings[metric] * 1000:.1f} ms",
        )
    resolution = params.search.fast_resolution_per_gpu if context.fast else params.search.resolution_per_gpu
    rows = []
    goodputs: dict[str, float | None] = {}
    for name, setup in params.setups.items():
        probes: dict[float, Probe] = {}

        def meets(
            rate_per_gpu: float, setup: GoodputSetup = setup, probes: dict[float, Probe] = probes
        ) -> bool:
            requests = runs.window(setup.variant, None, rate_per_gpu * setup.gpus)
            ttft, tpot = request_latencies(requests, setup.first_token)
            probe = Probe(
                rate_per_gpu,
                share_within(ttft, readings["ttft"]),
                share_within(tpot, readings["tpot"]),
                slo_at(ttft, share),
                slo_at(tpot, share),
            )
            probes[rate_per_gpu] = probe
            return probe.meets(share)

        low, high, why = bisect_goodput(
            meets, params.search.low_per_gpu, params.search.high_per_gpu, resolution
        )
        goodputs[name] = low
        for probe in sorted(probes.values(), key=lambda p: p.rate_per_gpu):
            rows.append({"setup": name, **probe.__dict__, "meets": probe.meets(share)})
        detail = _goodput_detail(name, setup, low, high, why, probes, share)
        output.values[f"goodput_per_gpu@{name}"] = Measured(goodputs[name], detail)
    for target, (over, baseline) in params.ratios.items():
        top, bottom = goodputs[over], goodputs[baseline]
        ratio = top / bottom if top is not None and bottom else None
        output.values[target] = Measured(
            ratio,
            f"goodput per GPU of {over} / {baseline} = "
            + (f"{top:.3g} / {bottom:.3g} req/s" if ratio is not None else "n/a (a goodput is missing)"),
        )
    table = pd.DataFrame(rows)
    output.tables["probes"] = table
    output.figures.append(_figure(claim, context, table, readings, share))
    output.notes.append(
        "SLOs read off kvsim's single-phase runs: "
        + " ".join(
            f"{metric.upper()} {value * 1000:.2f} ms, the {output.values[f'{metric}_slo_s'].detail}"
            for metric, value in readings.items()
        )
        + f" Goodput per GPU by bisection to {resolution:g} req/s: "
        + ", ".join(
            f"{name} {value:.3g}" if value is not None else f"{name} n/a" for name, value in goodputs.items()
        )
        + " req/s per GPU."
    )
    return output


def _goodput_detail(
    name: str,
    setup: GoodputSetup,
    low: float | None,
    high: float | None,
    why: str,
    probes: dict[float, Probe],
    share: float,
) -> str:
    if why:
        return f"{name} ({setup.variant}, {setup.gpus} GPU(s)) {why}."
    assert low is not None and high is not None
    met, missed = probes[low], probes[high]
    binding = [
        metric
        for metric, value in (("TTFT", missed.ttft_share), ("TPOT", missed.tpot_share))
        if value < share
    ]
    text = (
        f"{name} ({setup.variant}, {setup.gpus} GPU(s), first token: {setup.first_token}): meets at "
        f"{low:.3g} req/s per GPU ({low * setup.gpus:.3g} in all; P{share * 100:g} TTFT "
        f"{met.ttft_p_s * 1000:.1f} ms, TPOT {met.tpot_p_s * 1000:.2f} ms), misses at {high:.3g} "
        f"({' and '.join(binding)} below {share:.0%}: TTFT {missed.ttft_share:.2%}, TPOT {missed.tpot_share:.2%} within)."
    )
    metric = binding[0] if binding else "TPOT"
    slope = local_slope(
        [(p.rate_per_gpu, (p.ttft_p_s if metric == "TTFT" else p.tpot_p_s) * 1000) for p in probes.values()],
        low,
        SLOPE_HALF_WIDTH,
    )
    if slope is not None and slope > 0:
        text += (
            f" Near the crossing its P{share * 100:g} {metric} rises {slope:.2g} ms per req/s per GPU: "
            f"1 ms more or less of {metric} SLO moves this goodput by {1 / slope:.2g} req/s per GPU."
        )
    return text


def _figure(
    claim: Claim, context: RunContext, table: pd.DataFrame, readings: dict[str, float], share: float
) -> str:
    fig, axes = subplots(2, 1, figsize=(6.5, 6.0), sharex=True)
    for name, rows in table.groupby("setup", sort=False):
        axes[0].plot(rows.rate_per_gpu, rows.ttft_p_s, "o-", ms=3, label=name)
        axes[1].plot(rows.rate_per_gpu, rows.tpot_p_s * 1000, "o-", ms=3, label=name)
    axes[0].axhline(readings["ttft"], color="k", ls="--", lw=0.8)
    axes[1].axhline(readings["tpot"] * 1000, color="k", ls="--", lw=0.8)
    percentile = f"P{share * 100:g}"
    axes[0].set_ylabel(f"{percentile} TTFT (s)")
    axes[1].set_ylabel(f"{percentile} TPOT (ms)")
    axes[1].set_xlabel("request rate per GPU (req/s, Poisson; the bisection's probes)")
    axes[0].set_ylim(0, readings["ttft"] * 3)
    axes[1].set_ylim(0, readings["tpot"] * 1000 * 2)
    axes[0].set_title("DistServe Fig. 1 setups in kvsim (dashed: the SLOs)", fontsize=10)
    axes[0].legend(fontsize=8)
    return context.save_figure(fig, f"{claim.name}.png")
