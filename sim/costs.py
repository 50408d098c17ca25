"""Iteration cost models: how long one engine iteration takes.

The engine needs decode steps to be linear in the batch and in the summed context, so that many
decode iterations can be applied at once in closed form (event skipping):

    decode_step_s = intercept_s + per_seq_s * batch + per_context_token_s * sum_context

Prefill chunks, block copies (copy-on-write, fork) and swaps add their own time to the iteration they
happen in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeCost:
    intercept_s: float
    per_seq_s: float
    per_context_token_s: float

    def step_s(self, batch_size: int, sum_context: int) -> float:
        return self.intercept_s + self.per_seq_s * batch_size + self.per_context_token_s * sum_context


class CostModel(ABC):
    """Times for the pieces of an iteration. ``label`` says where the numbers come from."""

    label: str = ""
    measured: bool = False

    @property
    @abstractmethod
    def decode(self) -> DecodeCost: ...

    @abstractmethod
    def prefill_s(self, num_tokens: int, start_pos: int) -> float:
        """Extra iteration time for a prefill chunk of ``num_tokens`` starting at ``start_pos``."""

    @abstractmethod
    def copy_blocks_s(self, num_blocks: int) -> float:
        """Device-side copy of ``num_blocks`` KV blocks across all layers (copy-on-write)."""

    @abstractmethod
    def swap_blocks_s(self, num_blocks: int) -> float:
        """Moving ``num_blocks`` KV blocks between host and device memory, one direction."""
