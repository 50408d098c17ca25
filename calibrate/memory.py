"""How much memory a calibration needs, before it starts: the layer's and LM head's weights plus the
largest single point (points are built, timed and dropped one at a time, and the runner hands freed
memory back to the system between points, so they do not add up).

The per-point terms follow what :mod:`calibrate.kernels` allocates: the point's paged K/V pools (sized
to exactly the blocks its sequences hold), the gathered K/V copies and attention scores of the plain-
torch attention, the MLP activations, and for block copies and swaps a cache of ``2n + 1`` blocks in
every layer plus the gathered blocks. It is an estimate (allocator overheads aside); the README's
calibration example states a measured peak next to it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from calibrate.grids import Point

GiB = 2**30

ALLOCATOR_SLACK = 1.3
"""Measured peak RSS over the estimate, one CPU run each: Qwen2.5-0.5B quick grid 1.55 / 1.2 GiB,
Llama-3.1-8B quick grid (one round) 9.1 / 7.0 GiB. The heap keeps freed blocks for reuse within a point
(:func:`calibrate.runner.heap_only_malloc`), and repeated large allocations leave some of them unused."""


@dataclass(frozen=True)
class MemoryEstimate:
    weights_bytes: int
    largest_point_bytes: int
    largest_point: str
    runtime_bytes: int = 0
    """What the process holds before building anything (Python, torch): measured, not estimated."""

    @property
    def total_bytes(self) -> int:
        return self.runtime_bytes + self.weights_bytes + self.largest_point_bytes

    @property
    def peak_bytes(self) -> int:
        """What to have free: the estimate with the allocator slack measured on real runs."""
        return int(self.total_bytes * ALLOCATOR_SLACK)

    def describe(self) -> str:
        return (
            f"peak about {self.peak_bytes / GiB:.1f} GiB: runtime {self.runtime_bytes / GiB:.1f} GiB + weights "
            f"{self.weights_bytes / GiB:.1f} GiB + largest point {self.largest_point_bytes / GiB:.1f} GiB "
            f"({self.largest_point}), x {ALLOCATOR_SLACK} allocator slack"
        )


def weight_bytes(model: Any, dtype_bytes: int) -> int:
    """One decoder layer (fused QKV, output projection, MLP) and the LM head, as kernels builds them."""
    q_width = model.num_attention_heads * model.head_dim
    kv_width = model.num_kv_heads * model.head_dim
    mlp_in = (2 if getattr(model, "gated_mlp", True) else 1) * model.intermediate_size
    layer = (q_width + 2 * kv_width) * model.hidden_size + model.hidden_size * q_width
    layer += mlp_in * model.hidden_size + model.hidden_size * model.intermediate_size
    return (layer + model.vocab_size * model.hidden_size) * dtype_bytes


def point_bytes(point: Point, model: Any, dtype_bytes: int) -> int:
    """Peak bytes a point allocates on top of the weights."""
    kv = model.num_kv_heads * model.head_dim * dtype_bytes  # bytes of one token's K (or V), one layer
    size = point.block_size
    if point.phase in ("decode", "sweep_attn"):
        blocks = sum(-(-ctx // size) for ctx in point.contexts)
        longest = -(-point.ctx_max // size) * size  # the gather pads every sequence to the longest
        padded = len(point.contexts) * longest
        scores = len(point.contexts) * model.num_attention_heads * longest * dtype_bytes
        return 2 * blocks * size * kv + 2 * padded * kv + 2 * scores
    if point.phase == "prefill":
        total = point.start + point.num_tokens
        pooled = -(-total // size) * size
        scores = point.num_tokens * model.num_attention_heads * total * dtype_bytes
        activations = point.num_tokens * (3 * model.intermediate_size + 4 * model.hidden_size) * dtype_bytes
        return 4 * pooled * kv + 2 * scores + activations
    if point.phase == "head":
        return point.num_tokens * (model.vocab_size + model.hidden_size) * dtype_bytes
    block = model.num_layers * 2 * size * kv  # one block in every layer, K and V
    cache = (2 * point.num_blocks + 1) * block
    # index_select's copy of the source blocks, and one more of that size inside index_copy_ (measured:
    # Llama-3.1-8B, 64 blocks of 64 in fp32: 2.0 GiB of cache, 4.0 GiB at the peak of a call)
    gathered = 2 * point.num_blocks * block
    host = point.num_blocks * block if "swap" in point.phase else 0
    return cache + gathered + host


def describe_point(point: Point) -> str:
    if point.phase in ("decode", "sweep_attn"):
        shape = f"{len(point.contexts)} x {point.ctx_max} tokens" + (" (ragged)" if point.ragged else "")
        return f"{point.phase} {shape}, block {point.block_size}"
    if point.phase == "prefill":
        return f"prefill {point.num_tokens} tokens after {point.start}"
    if point.phase == "head":
        return f"LM head, batch {point.num_tokens}"
    return f"{point.phase} {point.num_blocks} blocks of {point.block_size}"


def estimate(points: list[Point], model: Any, dtype_bytes: int, runtime_bytes: int = 0) -> MemoryEstimate:
    largest = max(points, key=lambda point: point_bytes(point, model, dtype_bytes))
    return MemoryEstimate(
        weight_bytes(model, dtype_bytes),
        point_bytes(largest, model, dtype_bytes),
        describe_point(largest),
        runtime_bytes,
    )


def resident_bytes() -> int:
    """This process's resident memory now (Linux ``VmRSS``; 0 where unknown)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def available_bytes() -> int | None:
    """Memory the system can give without swapping (Linux ``MemAvailable``), or None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
