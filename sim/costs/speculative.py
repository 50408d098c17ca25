"""What a speculative decode step costs: the draft's proposals, then one verification forward.

A step of a decode batch of ``B`` requests holding ``C`` tokens in all:

- **draft**: ``k`` draft steps of the draft head or model (one forward each, proposing one token per
  request; n-gram lookup: none on the GPU), each priced as the draft's own decode step over the same
  requests and context, its serving overhead per iteration included: every draft forward is a
  model-runner call of its own (inputs, attention metadata, the graph's launch), which the overhead
  fitted on plain runs prices (SpecDecode-Bench measures vLLM's EAGLE drafts at about 0.7 ms a step
  on an H100, where their bytes take 0.27 ms: docs/speculative.md);
- **verification**: the target runs ``k + 1`` tokens per request in one forward pass: its decode step
  (weights read once, each request's context read once: all ``k + 1`` queries of a request attend
  over the same K/V), plus what ``k`` more tokens per request add, priced as the target's model
  prices prefill chunks of ``k + 1`` tokens against single tokens at the same batch
  (``CostModel.iteration_s``, as the issue suggests: "like a chunked-prefill slice"). Below the GEMM
  ridge that is little, past it about a prompt token's compute each. A mixture of experts' batch
  routes ``B (k + 1)`` tokens.

Both are linear in ``C`` for a fixed batch, so the step is a :class:`RoutedDecodeCost` of its own
(a line plus a per-batch term)
and event skipping's closed forms hold; the drafts' acceptance only changes how far the context
grows per step (``sim/engine/speculation.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from sim.costs.core import CostModel, WrappedCostModel
from sim.costs.terms import DecodeCost, LinearIterationCost, RoutedDecodeCost


def speculative_step(
    target: CostModel,
    num_speculative_tokens: int,
    draft_decode: DecodeCost | None,
    max_batch: int,
) -> RoutedDecodeCost:
    """The whole step (drafts and verification) as one decode cost of the batch and its context: the
    target's decode line plus, per batch size up to ``max_batch``, what the drafts' ``k`` more tokens
    per request add to that batch's forward pass, as the target's own model prices a batch of
    ``B`` chunks of ``k + 1`` tokens against one of ``B`` single tokens (its matrix products, at the
    batch's real operating point: below the ridge they cost little, past it a token each)."""
    k = num_speculative_tokens
    decode = target.decode
    intercept = decode.intercept_s
    per_seq = decode.per_seq_s
    per_context = decode.per_context_token_s
    if draft_decode is not None:
        intercept += k * draft_decode.intercept_s
        per_seq += k * draft_decode.per_seq_s
        per_context += k * draft_decode.per_context_token_s
    routed = decode.batch_s if isinstance(decode, RoutedDecodeCost) else ()
    table = []
    for batch in range(max_batch + 1):
        drafts_s = _drafts_s(target, batch, k)
        table.append(drafts_s + (routed[batch] if batch < len(routed) else 0.0))
    return RoutedDecodeCost(intercept, per_seq, per_context, batch_s=tuple(table))


def _drafts_s(costs: CostModel, batch: int, num_speculative_tokens: int) -> float:
    """What verifying ``k`` drafts per request adds to a forward pass over ``batch`` requests."""
    if batch <= 0:
        return 0.0
    # (Constant time per batch size: the table runs to max_num_seqs, which a file may set high.)
    verified = costs.uniform_prefill_s(batch, num_speculative_tokens + 1, 0)
    single = costs.uniform_prefill_s(batch, 1, 0)
    return max(0.0, verified - single)


class SpeculativeCostModel(WrappedCostModel):
    """The target's cost model with its decode step replaced by the speculative step; prefill, copies
    and swaps are the target's."""

    def __init__(self, target: CostModel, step: DecodeCost, describe: str):
        super().__init__(target)
        self._decode = step
        self.label = f"{target.label} + speculative decoding ({describe})"
        linear = target.linear_iteration
        self._linear = None if linear is None else LinearIterationCost(step, linear.prefill)

    @property
    def decode(self) -> DecodeCost:
        return self._decode

    def prefill_s(self, num_tokens: int, start_pos: int) -> float:
        return self.inner.prefill_s(num_tokens, start_pos)

    @property
    def prefill_fixed_s(self) -> float:
        return self.inner.prefill_fixed_s

    def iteration_s(
        self, batch_size: int, sum_context: float, prefill_chunks: Sequence[tuple[int, int]] = ()
    ) -> float:
        if self._linear is not None:
            return self._linear.iteration_s(batch_size, sum_context, prefill_chunks)
        if not prefill_chunks:
            return self._decode.step_s(batch_size, sum_context)
        chunks_s = sum(self.prefill_s(num_tokens, start) for num_tokens, start in prefill_chunks)
        return self._decode.with_prefill_s(batch_size, sum_context, self.prefill_fixed_s, chunks_s)

    def copy_blocks_s(self, num_blocks: int) -> float:
        return self.inner.copy_blocks_s(num_blocks)

    def swap_blocks_s(self, num_blocks: float) -> float:
        return self.inner.swap_blocks_s(num_blocks)
