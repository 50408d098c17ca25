"""The calibration grids: which operating points are timed, how often, and which are held out.

* ``smoke``: a CI check (seconds with a small model); enough points to fit, nothing more.
* ``quick``: the default. On CPU it follows the prototype that fitted well (B 1..16 x ctx 128..2048),
  about a minute for a 0.5B model on one core. On CUDA it reaches larger batches and contexts,
  where a GPU is memory-bound rather than launch-bound.
* ``full``: a longer, denser grid for a device run.

Held-out points are never used by the fits; the profile reports the fits' errors on them. Decode
holds out uniform interior points and ragged batches (mixed context lengths).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Point:
    """One operating point. ``phase`` is decode, head, prefill, copy, swap_out, swap_in, sweep_attn,
    sweep_copy, sweep_swap_out or sweep_swap_in."""

    phase: str
    block_size: int
    contexts: tuple[int, ...] = ()
    num_tokens: int = 0
    start: int = 0
    num_blocks: int = 0
    holdout: bool = False

    @property
    def batch(self) -> int:
        return len(self.contexts) if self.contexts else self.num_tokens

    @property
    def ctx_sum(self) -> int:
        return sum(self.contexts)

    @property
    def ctx_max(self) -> int:
        return max(self.contexts, default=0)

    @property
    def ctx_padded(self) -> int:
        return len(self.contexts) * self.ctx_max

    @property
    def ragged(self) -> bool:
        return len(set(self.contexts)) > 1


GRID_NAMES = ("smoke", "quick", "full")


@dataclass(frozen=True)
class Grid:
    name: str
    rounds: int
    """Rounds over all points, each in a new shuffled order; a point's time is the minimum over
    rounds of the per-round median."""
    min_samples: int
    max_samples: int
    min_time_s: float
    """Samples per point per round: enough to fill ``min_time_s``, within the two bounds."""
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    decode_holdout: tuple[tuple[int, ...], ...]
    """Each entry is one batch: the context length of every sequence."""
    head_batches: tuple[int, ...]
    prefill_chunks: tuple[int, ...]
    prefill_starts: tuple[int, ...]
    prefill_holdout: tuple[tuple[int, int], ...]
    """``(chunk tokens, start position)``."""
    block_counts: tuple[int, ...]
    """Copy (and swap, on CUDA) of this many blocks."""
    block_holdout: tuple[int, ...]
    sweep_block_sizes: tuple[int, ...]
    sweep_decode: tuple[tuple[int, int], ...]
    """``(batch, context)`` points of the attention-only block-size sweep."""
    sweep_block_counts: tuple[int, ...]
    max_sum_context: int = 1 << 20
    """Decode points with a larger summed context are dropped (memory: the gather copies K and V)."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def decode_points(self) -> list[tuple[int, int]]:
        return [
            (batch, context)
            for batch in self.decode_batches
            for context in self.decode_contexts
            if batch * context <= self.max_sum_context
        ]

    def describe(self) -> dict[str, Any]:
        data = asdict(self)
        data["decode_holdout"] = [list(batch) for batch in self.decode_holdout]
        return {key: list(value) if isinstance(value, tuple) else value for key, value in data.items()}


def _ragged(*batches: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    return batches


def make_grid(name: str, device: str) -> Grid:
    """The grid called ``name`` for ``device`` (``cpu`` or ``cuda``)."""
    cuda = device == "cuda"
    if name == "smoke":
        return Grid(
            name="smoke",
            rounds=2,
            min_samples=3,
            max_samples=20,
            min_time_s=0.005,
            decode_batches=(1, 4, 8),
            decode_contexts=(64, 256),
            decode_holdout=_ragged((128, 128), (32, 200, 96, 256)),
            head_batches=(1, 8),
            prefill_chunks=(16, 64),
            prefill_starts=(0, 128),
            prefill_holdout=((32, 64),),
            block_counts=(1, 4, 16),
            block_holdout=(8,),
            sweep_block_sizes=(8, 16, 32),
            sweep_decode=((2, 64), (8, 256)),
            sweep_block_counts=(2, 16),
        )
    if name == "quick" and not cuda:
        return Grid(
            name="quick",
            rounds=4,
            min_samples=5,
            max_samples=50,
            min_time_s=0.05,
            decode_batches=(1, 2, 4, 8, 16),
            decode_contexts=(128, 512, 1024, 2048),
            decode_holdout=_ragged(
                (768,) * 3,  # uniform, between grid points
                (1536,) * 12,
                (128, 2048),
                (512, 512, 512, 2048),
                (64, 256, 1024, 1536, 2048, 128, 512, 896),
                (2048,) + (128,) * 7,
                (100, 300, 700, 1100, 1500, 1900),
                tuple(range(128, 2049, 128)),
            ),
            head_batches=(1, 4, 16),
            prefill_chunks=(32, 128, 512),
            prefill_starts=(0, 512, 2048),
            prefill_holdout=((256, 1024), (64, 1536)),
            block_counts=(1, 2, 4, 8, 16, 32, 64),
            block_holdout=(24, 48),
            sweep_block_sizes=(8, 16, 32, 64),
            sweep_decode=((4, 512), (16, 2048)),
            sweep_block_counts=(4, 64),
        )
    if name == "quick":  # cuda
        return Grid(
            name="quick",
            rounds=3,
            min_samples=10,
            max_samples=200,
            min_time_s=0.02,
            decode_batches=(1, 4, 16, 64, 256),
            decode_contexts=(256, 1024, 4096),
            decode_holdout=_ragged(
                (2048,) * 32,
                (8192,) * 8,
                (256, 4096) * 8,
                tuple(range(256, 4097, 256)) * 2,
                (4096,) + (256,) * 63,
            ),
            head_batches=(1, 16, 256),
            prefill_chunks=(128, 512, 2048),
            prefill_starts=(0, 2048, 8192),
            prefill_holdout=((1024, 4096),),
            block_counts=(1, 2, 4, 8, 16, 32, 64),
            block_holdout=(24,),
            sweep_block_sizes=(8, 16, 32, 64, 128),
            sweep_decode=((16, 1024), (64, 4096)),
            sweep_block_counts=(4, 64),
            max_sum_context=1 << 19,
        )
    if name == "full":
        return Grid(
            name="full",
            rounds=5,
            min_samples=10 if cuda else 5,
            max_samples=200 if cuda else 50,
            min_time_s=0.05,
            decode_batches=(1, 2, 4, 8, 16, 32, 64, 128, 256) if cuda else (1, 2, 4, 8, 16, 32),
            decode_contexts=(128, 512, 1024, 2048, 4096, 8192, 16384)
            if cuda
            else (128, 512, 1024, 2048, 4096),
            decode_holdout=_ragged(
                (768,) * 3,
                (1536,) * 12,
                (128, 2048),
                (64, 256, 1024, 1536, 2048, 128, 512, 896),
                (2048,) + (128,) * 7,
                tuple(range(128, 4097, 128)),
            ),
            head_batches=(1, 4, 16, 64, 256) if cuda else (1, 4, 16, 32),
            prefill_chunks=(16, 64, 256, 1024, 2048) if cuda else (16, 64, 256, 512),
            prefill_starts=(0, 1024, 4096, 16384) if cuda else (0, 1024, 4096),
            prefill_holdout=((512, 2048), (128, 8192)) if cuda else ((128, 2048),),
            block_counts=(1, 2, 4, 8, 16, 32, 64, 128),
            block_holdout=(12, 48),
            sweep_block_sizes=(8, 16, 32, 64, 128),
            sweep_decode=((4, 512), (16, 2048), (64, 4096)) if cuda else ((4, 512), (16, 2048), (8, 4096)),
            sweep_block_counts=(4, 16, 64),
            max_sum_context=(1 << 20) if cuda else (1 << 16),
        )
    raise ValueError(f"grid must be one of {', '.join(GRID_NAMES)}, got {name!r}")
