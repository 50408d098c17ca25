"""A cost model whose GPU work takes ``time_scale`` times as long: the edges of an error band.

``cost_model: {time_scale: 1.13}`` asks "what if every iteration took 13 % longer than the model
says?", which is how a plan propagates the cost model's error band into its answer (it searches
again at the band's edges). Every term of an iteration scales: decode intercept, per-sequence and
per-context-token costs, prefill chunks, the all-reduces inside them, an expert-parallel group's
shared part (its experts and all-to-all), and device-side block copies.
What does not run on the GPU keeps its time: swaps over the host link (a PCIe transfer, not a
kernel) and the client-side request overhead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, is_dataclass, replace
from typing import TypeVar

from sim.costs.core import CostModel, WrappedCostModel
from sim.costs.terms import DecodeCost, LinearIterationCost

Cost = TypeVar("Cost")


def scaled_times(cost: Cost, factor: float) -> Cost:
    """``cost`` (a frozen dataclass of time terms) with every time (``*_s`` floats, tuples of them,
    and the same inside nested cost terms; not the rates, ``*_per_s``) multiplied by ``factor``."""
    changes: dict[str, object] = {}
    for item in fields(cost):  # type: ignore[arg-type]
        value = getattr(cost, item.name)
        if is_dataclass(value) and not isinstance(value, type):
            changes[item.name] = scaled_times(value, factor)
        elif item.name.endswith("_per_s"):
            continue  # a rate (a link's bytes per second), not a time
        elif item.name.endswith("_s") and isinstance(value, float):
            changes[item.name] = value * factor
        elif item.name.endswith("_s") and isinstance(value, tuple):
            changes[item.name] = tuple(float(part) * factor for part in value)
    return replace(cost, **changes)  # type: ignore[type-var]


class ScaledCostModel(WrappedCostModel):
    """``inner`` with every GPU-side time multiplied by ``time_scale`` (see the module docstring)."""

    def __init__(self, inner: CostModel, time_scale: float):
        if time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        super().__init__(inner)
        self.time_scale = time_scale
        self.label = f"{inner.label}; GPU times x{time_scale:g}"
        linear = inner.linear_iteration
        self._linear = scaled_times(linear, time_scale) if linear is not None else None
        self._scaled_decode: DecodeCost = scaled_times(inner.decode, time_scale)
        if inner.expert_parallel is not None:
            self.expert_parallel = scaled_times(inner.expert_parallel, time_scale)

    @property
    def decode(self) -> DecodeCost:
        return self._scaled_decode

    @property
    def linear_iteration(self) -> LinearIterationCost | None:
        return self._linear

    def prefill_s(self, num_tokens: int, start_pos: int) -> float:
        if self._linear is not None:
            return self._linear.prefill.chunk_s(num_tokens, start_pos)
        return self.time_scale * self.inner.prefill_s(num_tokens, start_pos)

    @property
    def prefill_fixed_s(self) -> float:
        return self.time_scale * self.inner.prefill_fixed_s

    def iteration_s(
        self, batch_size: int, sum_context: float, prefill_chunks: Sequence[tuple[int, int]] = ()
    ) -> float:
        if self._linear is not None:
            return self._linear.iteration_s(batch_size, sum_context, prefill_chunks)
        return self.time_scale * self.inner.iteration_s(batch_size, sum_context, prefill_chunks)

    def uniform_prefill_s(self, count: int, num_tokens: int, start_pos: int) -> float:
        if self._linear is not None:
            return self._linear.uniform_prefill_s(count, num_tokens, start_pos)
        return self.time_scale * self.inner.uniform_prefill_s(count, num_tokens, start_pos)

    def copy_blocks_s(self, num_blocks: int) -> float:
        return self.time_scale * self.inner.copy_blocks_s(num_blocks)

    def swap_blocks_s(self, num_blocks: float) -> float:
        return self.inner.swap_blocks_s(num_blocks)
