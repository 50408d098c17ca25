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
"""

from __future__ import annotations

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
