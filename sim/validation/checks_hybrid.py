"""Checks of the hybrid allocators' published claims (issue 39; ``configs/validation/jenga-*.yaml``).

Claim j1 (Jenga, SOSP 2025, §1): PagedAttention's uniform allocation wastes most of a heterogeneous
model's KV memory (73.6 % for Gemma 3 on the Mooncake trace). *Waste* is read as the share of the
memory uniform paging allocates (every layer a block for every token) that a layer-aware allocator
does not need (a sliding-window layer keeps only its window). It is measured on the same requests
at the same instants: in a run of a hybrid allocator, the full-attention group holds what uniform
paging would hold in each of its layers, so uniform = that x (attention layers / full-attention
layers), needed = what every group holds (used + reserved + internal fragmentation), both time
averages (``kv_group_means``). A run of ``paged`` on the same stream gives a cross-check per running
request (its own schedule: fewer requests fit).

Claim j2 (Jenga's abstract): the memory it saves buys throughput, 1.80x vLLM's on average and up to
4.92x. *Throughput* is read as offline throughput: the same requests, all waiting at the start, and
the output tokens of the finished ones over the time until the last finishes (the summary's
``output_tokens_per_s``), against uniform paging's on the same requests.

Claim m1 (Marconi's abstract, MLSys 2025): its admission and eviction of SSM states reach up to 34.4x
the token hit rate of state-of-the-art prefix caching and up to 71.1 % lower (P95) TTFT. Measured as
the prefix-cache hit rate (prompt tokens served from cache over prompt tokens) of a Marconi run over
vLLM's own Mamba prefix caching (align mode) on the same requests, and ``1 - P95 TTFT`` ratio of the
finished requests.
"""

from __future__ import annotations

import pandas as pd
from pydantic import Field

from sim.config import ConfigError
from sim.hardware.layers import FullAttention, MlpOnly
from sim.hardware.models import resolve_model
from sim.validation.claims import Claim, _Strict
from sim.validation.registry import CheckOutput, Measured, RunContext, register_check
from sim.validation.runs import run_config

HELD = ("used", "reserved", "internal_fragmentation")


class UniformWasteParams(_Strict):
    variants: list[str] = Field(
        min_length=1, description="Hybrid-allocator variants measured (the first is the verdict's)."
    )
    uniform_variant: str = Field(
        description="The uniform-paging variant (policy paged), for the cross-check."
    )


def uniform_waste(
    group_means: dict[str, dict[str, float]], layers: int, full_layers: int
) -> tuple[float, float]:
    """``(waste, full-attention share of what is needed)`` from a hybrid run's ``kv_group_means``."""
    held = {name: sum(means[c] for c in HELD) for name, means in group_means.items()}
    full = held["full"]
    needed = sum(held.values())
    return 1 - needed / (full * layers / full_layers), full / needed


def _allocated_bytes_per_request(summary: dict) -> float:
    shares = summary["mean_used_frac"] + summary["mean_reserved_frac"] + summary["mean_internal_frag_frac"]
    return shares * summary["kv_pool_tokens"] * summary["kv_bytes_per_token"] / summary["mean_running"]


@register_check("uniform_waste", UniformWasteParams, needs_experiment=True)
def check_uniform_waste(claim: Claim, context: RunContext) -> CheckOutput:
    params: UniformWasteParams = claim.params
    config = claim.config(fast=context.fast)
    spec = resolve_model(config.model)
    kinds = [kind for kind in spec.layer_kinds or () if not isinstance(kind, MlpOnly)]
    full_layers = sum(1 for kind in kinds if isinstance(kind, FullAttention))
    if not full_layers or len(kinds) == full_layers:
        raise ConfigError(f"{claim.path}: {spec.name} needs full-attention and other attention layers")
    results = run_config(config, claim.path.parent, [*params.variants, params.uniform_variant])
    uniform = _allocated_bytes_per_request(results[params.uniform_variant].summary)
    details = []
    output = CheckOutput()
    for name in params.variants:
        summary = results[name].summary
        waste, full_share = uniform_waste(summary["kv_group_means"], len(kinds), full_layers)
        per_request = 1 - _allocated_bytes_per_request(summary) / uniform
        details.append(
            f"{name}: {waste:.1%} of uniform paging's memory not needed on the same requests (full attention "
            f"{full_share:.0%} of what is needed); per running request against {params.uniform_variant}'s own run "
            f"{per_request:.1%} ({summary['mean_running']:.1f} running on average, "
            f"{results[params.uniform_variant].summary['mean_running']:.1f} on {params.uniform_variant})"
        )
        output.values[f"waste/{name}"] = Measured(waste)
    detail = (
        f"{spec.name}: {len(kinds)} attention layers, {full_layers} full attention. "
        + "; ".join(details)
        + "."
    )
    for measured in output.values.values():
        measured.detail = detail
    for target in claim.spec.targets:
        output.values.setdefault(target.id, Measured(None, detail))
    return output


class ThroughputGainParams(_Strict):
    variants: list[str] = Field(
        min_length=1, description="Hybrid-allocator variants measured (the first is the verdict's)."
    )
    baseline_variant: str = Field(
        description="The uniform-paging variant (policy paged) they are compared with."
    )


def throughput_gain(summary: dict, baseline: dict) -> float:
    """Offline throughput of one run over the baseline's, on the same requests: both must have served
    the same requests to the end (a request left unfinished would make the faster run look slow)."""
    for name, run in (("variant", summary), ("baseline", baseline)):
        if run["requests_unfinished"]:
            raise ValueError(f"the {name} run left {run['requests_unfinished']} request(s) unfinished")
    if summary["requests_finished"] != baseline["requests_finished"]:
        raise ValueError(
            f"the runs finished different requests ({summary['requests_finished']} against "
            f"{baseline['requests_finished']}): their throughputs are not comparable"
        )
    return summary["output_tokens_per_s"] / baseline["output_tokens_per_s"]


@register_check("throughput_gain", ThroughputGainParams, needs_experiment=True)
def check_throughput_gain(claim: Claim, context: RunContext) -> CheckOutput:
    params: ThroughputGainParams = claim.params
    config = claim.config(fast=context.fast)
    results = run_config(config, claim.path.parent, [*params.variants, params.baseline_variant])
    baseline = results[params.baseline_variant].summary
    output = CheckOutput()
    details = [
        f"{params.baseline_variant}: {baseline['requests_finished']:,} requests, "
        f"{baseline['output_tokens_per_s']:,.0f} output tokens/s, {baseline['mean_running']:.1f} running on average"
    ]
    for name in params.variants:
        summary = results[name].summary
        try:
            gain = throughput_gain(summary, baseline)
        except ValueError as error:
            raise ConfigError(f"{claim.path}: {name} against {params.baseline_variant}: {error}") from None
        output.values[f"gain/{name}"] = Measured(gain)
        details.append(
            f"{name}: {summary['output_tokens_per_s']:,.0f} output tokens/s ({gain:.2f}x), "
            f"{summary['mean_running']:.1f} running on average"
        )
    return _detailed(output, details, claim)


class PrefixCacheGainParams(_Strict):
    variants: list[str] = Field(
        min_length=1,
        description="Variants with the prefix-caching policy measured (the first is the verdict's).",
    )
    baseline_variant: str = Field(description="The variant they are compared with (vLLM's own caching).")


def prefix_cache_gain(
    summary: dict, ttft: pd.Series, baseline: dict, baseline_ttft: pd.Series
) -> tuple[float, float]:
    """``(hit-rate ratio, P95 TTFT cut)`` of one run over the baseline's, on the same finished requests."""
    if summary["requests_finished"] != baseline["requests_finished"]:
        raise ValueError(
            f"the runs finished different requests ({summary['requests_finished']} against "
            f"{baseline['requests_finished']}): their latencies are not comparable"
        )
    if not baseline["prefix_cache_hit_rate"]:
        raise ValueError("the baseline hit no prompt token: a ratio of hit rates is undefined")
    ratio = summary["prefix_cache_hit_rate"] / baseline["prefix_cache_hit_rate"]
    return ratio, 1 - float(ttft.quantile(0.95)) / float(baseline_ttft.quantile(0.95))


def _finished_ttft(requests: pd.DataFrame) -> pd.Series:
    return requests.loc[requests["outcome"] == "finished", "ttft_s"]


@register_check("prefix_cache_gain", PrefixCacheGainParams, needs_experiment=True)
def check_prefix_cache_gain(claim: Claim, context: RunContext) -> CheckOutput:
    params: PrefixCacheGainParams = claim.params
    config = claim.config(fast=context.fast)
    results = run_config(config, claim.path.parent, [*params.variants, params.baseline_variant])
    base = results[params.baseline_variant]
    base_ttft = _finished_ttft(base.requests)
    output = CheckOutput()
    details = [
        f"{params.baseline_variant}: {base.summary['prefix_cache_hit_rate']:.1%} of prompt tokens hit, "
        f"P95 TTFT {base_ttft.quantile(0.95) * 1e3:,.0f} ms"
    ]
    for name in params.variants:
        result = results[name]
        ttft = _finished_ttft(result.requests)
        try:
            ratio, cut = prefix_cache_gain(result.summary, ttft, base.summary, base_ttft)
        except ValueError as error:
            raise ConfigError(f"{claim.path}: {name} against {params.baseline_variant}: {error}") from None
        output.values[f"hit_gain/{name}"] = Measured(ratio)
        output.values[f"p95_ttft_cut/{name}"] = Measured(cut)
        details.append(
            f"{name}: {result.summary['prefix_cache_hit_rate']:.1%} ({ratio:.2f}x), P95 TTFT "
            f"{ttft.quantile(0.95) * 1e3:,.0f} ms ({cut:.1%} lower)"
        )
    return _detailed(output, details, claim)


def _detailed(output: CheckOutput, details: list[str], claim: Claim) -> CheckOutput:
    """Every measured value carries the run's details; a target no value answers gets them alone."""
    detail = "; ".join(details) + "."
    for measured in output.values.values():
        measured.detail = detail
    for target in claim.spec.targets:
        output.values.setdefault(target.id, Measured(None, detail))
    return output
