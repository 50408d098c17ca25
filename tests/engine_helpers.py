"""Shared helpers for engine tests: a cost model with round numbers and request builders."""

from __future__ import annotations

from sim.costs.core import CostModel
from sim.costs.terms import DecodeCost
from workloads.request import Request


class RoundCostModel(CostModel):
    """Decode step = 1 s + 0 per sequence + 0 per context token; prefill = 0.01 s per token; copies
    free; a swap 0.5 s per block (one direction)."""

    label = "test: round numbers"

    def __init__(
        self,
        intercept_s=1.0,
        per_seq_s=0.0,
        per_context_token_s=0.0,
        prefill_per_token_s=0.01,
        swap_block_s=0.5,
    ):
        self._decode = DecodeCost(intercept_s, per_seq_s, per_context_token_s)
        self.prefill_per_token_s = prefill_per_token_s
        self.swap_block_s = swap_block_s

    @property
    def decode(self) -> DecodeCost:
        return self._decode

    def prefill_s(self, num_tokens: int, start_pos: int) -> float:
        return self.prefill_per_token_s * num_tokens

    def copy_blocks_s(self, num_blocks: int) -> float:
        return 0.0

    def swap_blocks_s(self, num_blocks: int) -> float:
        return self.swap_block_s * num_blocks


class ConstantCost(RoundCostModel):
    """Every iteration costs ``iteration_s``: the decode intercept is the only fixed cost, prefill
    chunks and copies are free, a swap costs ``swap_block_s`` per block (one direction)."""

    label = "test: constant iteration time"

    def __init__(self, iteration_s: float = 1.0, swap_block_s: float = 0.0):
        super().__init__(iteration_s, 0.0, 0.0, prefill_per_token_s=0.0, swap_block_s=swap_block_s)


def request(request_id: int, arrival_s: float, prompt_len: int, output_len: int, **extra) -> Request:
    prompt = extra.pop("prompt", ((10_000 + request_id, prompt_len),))
    return Request(request_id, arrival_s, prompt, output_len, output_content_id=20_000 + request_id, **extra)
