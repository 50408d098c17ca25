"""The cost terms the engine evaluates at every iteration, apart from the cost models' configuration
(``sim/costs/core.py``, which re-exports each of them) so that the compiled build (``make native``)
compiles them: the decode step's linear form, the linear prefill chunk and iteration of the analytic
and fitted models, causal attention's (query, key) pairs, the experts a batch of tokens routes to
and the tensor-parallel all-reduces."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.costs.shape import ModelShape
    from sim.hardware.gpus import GpuSpec
    from sim.hardware.models import ModelSpec


@dataclass(frozen=True)
class DecodeCost:
    intercept_s: float
    per_seq_s: float
    per_context_token_s: float

    def step_s(self, batch_size: int, sum_context: float) -> float:
        return self.intercept_s + self.per_seq_s * batch_size + self.per_context_token_s * sum_context

    def with_prefill_s(
        self, batch_size: int, sum_context: float, prefill_fixed_s: float, chunks_s: float
    ) -> float:
        """An iteration that also carries prefill chunks costing ``chunks_s`` in all: one fixed cost,
        the larger of the decode intercept (when sequences decode) and ``prefill_fixed_s``."""
        intercept = self.intercept_s if batch_size > 0 else 0.0
        fixed = intercept if intercept > prefill_fixed_s else prefill_fixed_s
        return fixed + self.per_seq_s * batch_size + self.per_context_token_s * sum_context + chunks_s


@dataclass(frozen=True)
class RoutedDecodeCost(DecodeCost):
    """The decode step of a mixture of experts: the line of :class:`DecodeCost` plus ``batch_s[batch]``,
    the part of its weight read no line in the batch captures.

    Event skipping needs a step linear in the summed context while the batch stays fixed (it changes
    only at events), not linear in the batch. A mixture of experts reads the experts its batch
    routes to, a number that grows steeply and then saturates (Qwen3-30B-A3B: 8 of 128 per layer at
    one sequence, 126 at 64): the line covers the step with every expert read and ``batch_s``, by
    batch size, takes off what that batch leaves unread. It decays to nothing by its end, beyond
    which it counts as 0. :meth:`with_prefill_s` leaves it out: an iteration carrying prefill pays
    ``prefill_fixed_s``, which reads the weights already."""

    batch_s: tuple[float, ...] = ()

    def step_s(self, batch_size: int, sum_context: float) -> float:
        seconds = self.intercept_s + self.per_seq_s * batch_size + self.per_context_token_s * sum_context
        if 0 <= batch_size < len(self.batch_s):
            seconds += self.batch_s[batch_size]
        return seconds


@dataclass(frozen=True)
class PrefillCost:
    """A prefill chunk's time, linear in its tokens and its causal (query, key) pairs, on top of the
    fixed cost of an iteration that carries prefill (``fixed_s``, paid once however many chunks)."""

    fixed_s: float
    per_chunk_s: float
    per_token_s: float
    per_pair_s: float
    # Sliding-window and chunked-local layers (``CostModel.attention_windows``): their queries see at
    # most a window of keys.
    windows: tuple[tuple[int, float], ...] = ()

    def chunk_s(self, num_tokens: int, start_pos: int) -> float:
        if num_tokens <= 0:
            return 0.0
        pairs = attention_pairs(num_tokens, start_pos)
        if self.windows:
            pairs = attended_pairs(num_tokens, start_pos, self.windows)
        return self.per_chunk_s + self.per_token_s * num_tokens + self.per_pair_s * pairs


@dataclass(frozen=True)
class LinearIterationCost:
    """An iteration's time when both its decode step and its prefill chunks are linear (the analytic
    model and the fitted profiles): :meth:`sim.costs.core.CostModel.iteration_s`, compiled, since the
    engine evaluates it at every iteration that carries prefill."""

    decode: DecodeCost
    prefill: PrefillCost

    def iteration_s(
        self, batch_size: int, sum_context: float, prefill_chunks: Sequence[tuple[int, int]]
    ) -> float:
        decode = self.decode
        if not prefill_chunks:
            return decode.step_s(batch_size, sum_context)
        prefill = self.prefill
        chunks_s = 0.0  # (summed first, left to right, as sum() does)
        for num_tokens, start in prefill_chunks:
            chunks_s += prefill.chunk_s(num_tokens, start)
        return decode.with_prefill_s(batch_size, sum_context, prefill.fixed_s, chunks_s)

    def uniform_prefill_s(self, count: int, num_tokens: int, start_pos: int) -> float:
        """:meth:`iteration_s` of ``count`` identical chunks alone."""
        if count <= 0:
            return self.decode.step_s(0, 0.0)
        chunks_s = count * self.prefill.chunk_s(num_tokens, start_pos)
        return self.decode.with_prefill_s(0, 0.0, self.prefill.fixed_s, chunks_s)


def expected_distinct_experts(tokens: float, num_experts: int, experts_per_token: int) -> float:
    """Expected number of distinct experts ``tokens`` tokens route to in one MoE layer, each token
    choosing ``experts_per_token`` distinct experts of ``num_experts`` uniformly at random,
    independently of the others.

    A token misses a given expert with probability ``C(E - 1, k) / C(E, k) = (E - k) / E``, so all
    ``B`` tokens miss it with probability ``((E - k) / E) ** B`` and the expectation is
    ``E * (1 - ((E - k) / E) ** B)``: ``k`` at one token, tending to ``E`` as the batch grows.
    Real routers are not uniform (popular experts are shared more), so this is the most experts a
    batch reads on average: an upper estimate of the weight traffic."""
    if tokens <= 0:
        return 0.0
    missed = (num_experts - experts_per_token) / num_experts
    return num_experts * (1.0 - missed**tokens)


ROUTING_SATURATED = 1e-9
"""A :class:`RoutedDecodeCost` table ends at the batch whose unread experts save less than this share
of the step's weight read (Qwen3-30B-A3B: after about 320 sequences; Mixtral-8x7B: 72)."""
MAX_ROUTING_BATCHES = 1 << 16
"""Longest such table, for routings that saturate slowly (few experts per token of very many)."""


def unread_experts_s(
    expert_read_s: float, num_experts: int, experts_per_token: int, saturated_below_s: float
) -> tuple[float, ...]:
    """``RoutedDecodeCost.batch_s`` when a batch's expert read simply adds to the step (the analytic
    roofline): per batch size, minus the time of reading the experts it is expected not to route to,
    ``expert_read_s`` being one expert in every MoE layer; up to the batch where that is under
    ``saturated_below_s``."""
    table: list[float] = []
    for batch in range(MAX_ROUTING_BATCHES):
        unread = num_experts - expected_distinct_experts(batch, num_experts, experts_per_token)
        if batch > 0 and unread * expert_read_s <= saturated_below_s:
            break
        table.append(-unread * expert_read_s)
    return tuple(table)


def attention_pairs(num_tokens: int, start_pos: int) -> float:
    """(query, key) pairs of causal attention for a chunk of ``num_tokens`` at ``start_pos``.

    Query ``i`` of the chunk sees ``start_pos + i + 1`` keys; the sum is
    ``n * (start + (n + 1) / 2)``. The analytic model and the fitted profiles use ``n * (start + n / 2)``,
    which differs by ``n / 2`` pairs, a rounding at the chunk sizes that matter."""
    return num_tokens * (start_pos + num_tokens / 2)


def pairs_past_window(num_tokens: int, start_pos: int, window: int) -> float:
    """(query, key) pairs of a causal chunk that a ``window``-token sliding window leaves out: query
    ``i`` at position ``start + i`` would see ``start + i + 1`` keys and sees at most ``window``."""
    last = start_pos + num_tokens  # keys the chunk's last query would see
    if last <= window:
        return 0.0
    first_over = max(start_pos + 1, window + 1)
    return (first_over - window + last - window) * (last - first_over + 1) / 2


def attended_pairs(num_tokens: int, start_pos: int, windows: tuple[tuple[int, float], ...]) -> float:
    """:func:`attention_pairs` averaged over the attention layers, each window's share of them seeing
    at most its window of keys (``CostModel.attention_windows``)."""
    pairs = attention_pairs(num_tokens, start_pos)
    for window, share in windows:
        pairs -= share * pairs_past_window(num_tokens, start_pos, window)
    return pairs


def attended_context(tokens: int, windows: tuple[tuple[int, float], ...]) -> float:
    """``tokens`` of K/V read, averaged over the attention layers (a windowed layer reads at most its
    window of them)."""
    attended = float(tokens)
    for window, share in windows:
        if tokens > window:
            attended -= share * (tokens - window)
    return attended


# --------------------------------------------------------------------------------------------------
# Tensor parallelism: the all-reduces
# --------------------------------------------------------------------------------------------------

ALL_REDUCES_PER_LAYER = 2
"""Megatron-style tensor parallelism, as vLLM runs it: the attention output projection and the MLP
down projection are split by rows, and each ends in an all-reduce of the layer's ``hidden``-wide
output (``RowParallelLinear``)."""

ALL_REDUCE_LATENCY_S = 10e-6
"""Fixed time of one all-reduce call at TP 2, 10 us; at TP ``p`` it is ``10 us x log2(p)`` (20 us at
TP 4, 30 us at TP 8), the growth of NCCL's tree and low-latency protocols with the number of GPUs.
Source: Vidur's NCCL all-reduce timings on an H100 DGX under CUDA graphs (microsoft/vidur
``data/profiling/network/h100_dgx/all_reduce.csv``, commit e26eb8f, medians of 3 runs): 7-10 us for
messages up to 1 MiB on 2 GPUs; 31-34 us for 1-2 MiB on 8 GPUs, whose line through 1-5 MiB meets
zero bytes at about 28 us. With the ring term over 450 GB/s the model is +10..+19 % against the 8-GPU
medians at 1-5 MiB and 1.46-1.71x at 84-128 MiB (NVLS beats the ring there); docs/modelling.md,
"Tensor parallelism". The derated model's serving calibration replaces the latency over NVLink
(vLLM's custom all-reduce; sim/costs/serving.py)."""


def all_reduce_latency_s(tensor_parallel_size: int, at_tp2_s: float = ALL_REDUCE_LATENCY_S) -> float:
    """One all-reduce call's fixed time at this TP (0 at TP 1): ``at_tp2_s`` (by default
    :data:`ALL_REDUCE_LATENCY_S`) x log2(tp)."""
    return at_tp2_s * math.log2(tensor_parallel_size)


@dataclass(frozen=True)
class AllReduceCost:
    """Time tensor parallelism adds to an iteration of ``tokens`` tokens (decode rows plus prefill
    tokens): ``2 x layers`` all-reduces of ``tokens x hidden x activation bytes`` each, by the ring
    algorithm, which sends and receives ``2 (tp - 1) / tp`` times the message over each GPU's link:

        seconds = calls x latency(tp) + calls x 2 (tp - 1) / tp x tokens x hidden x bytes / link

    ``latency(tp)`` is :func:`all_reduce_latency_s`.
    with ``link`` one direction of the GPU's NVLink (PCIe without it), :attr:`GpuSpec.tensor_parallel_link_bytes_per_s`.
    All zero at ``tp = 1``. Communication is not overlapped with compute (vLLM does not overlap it)."""

    tensor_parallel_size: int = 1
    per_iteration_s: float = 0.0
    """``calls x latency``: paid once by every iteration that runs the model."""
    per_token_s: float = 0.0
    """The bandwidth term per token of the iteration."""
    link_bytes_per_s: float = 0.0
    link: str = ""

    @classmethod
    def of(
        cls,
        model: ModelShape | ModelSpec,
        gpu: GpuSpec,
        tensor_parallel_size: int,
        latency_s: float | None = None,
    ) -> AllReduceCost:
        """``latency_s``: one call's fixed time at TP 2 (None: :data:`ALL_REDUCE_LATENCY_S`)."""
        from sim.hardware.models import activation_dtype_bytes

        tp = tensor_parallel_size
        if tp == 1:
            return cls()
        calls = ALL_REDUCES_PER_LAYER * model.num_layers
        link = gpu.tensor_parallel_link_bytes_per_s
        ring = 2 * (tp - 1) / tp
        message_bytes_per_token = model.hidden_size * activation_dtype_bytes(model.weight_dtype_bytes)
        return cls(
            tensor_parallel_size=tp,
            per_iteration_s=calls
            * all_reduce_latency_s(tp, ALL_REDUCE_LATENCY_S if latency_s is None else latency_s),
            per_token_s=calls * ring * message_bytes_per_token / link,
            link_bytes_per_s=link,
            link=gpu.tensor_parallel_link_name,
        )

    def seconds(self, tokens: int) -> float:
        """All-reduce time of one iteration over ``tokens`` tokens (0 at tp = 1 or without tokens)."""
        return self.per_iteration_s + self.per_token_s * tokens if tokens > 0 else 0.0

    def describe(self) -> str:
        """A phrase for cost-model labels: the TP and the link its all-reduces use."""
        return (
            f"TP {self.tensor_parallel_size}: per-GPU shares + {ALL_REDUCES_PER_LAYER} all-reduces/layer over "
            f"{self.link} {self.link_bytes_per_s / 1e9:g} GB/s per direction"
        )


# --------------------------------------------------------------------------------------------------
# Expert parallelism: the routed experts a rank holds, and the all-to-all that feeds them
# --------------------------------------------------------------------------------------------------

ALL_TO_ALL_CALLS_PER_LAYER = 2
"""vLLM's default all2all backend (``allgather_reducescatter``, ``AgRsAll2AllManager``) runs each
expert-parallel MoE layer between two collectives over the data-parallel group: dispatch, an
``all_gatherv`` of every rank's hidden states and router logits (each rank then runs its own experts
on the tokens that chose them), and combine, a ``reduce_scatterv`` of the experts' outputs back to
the ranks the tokens came from."""


@dataclass(frozen=True)
class AllToAllCost:
    """Time the dispatch and combine of every MoE layer add to a lockstep step of ``tokens`` tokens
    over all ``data_parallel_size`` ranks (:data:`ALL_TO_ALL_CALLS_PER_LAYER`). A ring all-gather
    (and reduce-scatter) of ``tokens`` rows moves ``(dp - 1) / dp`` of them over each GPU's link; a
    dispatched row is the hidden state and the router logits, a combined row the hidden state:

        seconds = 2 x moe_layers x latency(dp)
                + moe_layers x (dp - 1) / dp x tokens x (2 x hidden + num_experts) x bytes / link

    ``latency(dp)`` is NCCL's fixed time per call as for the all-reduces
    (:func:`all_reduce_latency_s`: vLLM's custom all-reduce does not serve these collectives). All
    zero at ``dp = 1``: the tokens are already where the experts are (a TP group combines them by
    its own all-reduces). Not overlapped with compute."""

    data_parallel_size: int = 1
    per_iteration_s: float = 0.0
    """``calls x latency``: paid by every step that runs the model."""
    per_token_s: float = 0.0
    """The bandwidth term per token of the step (all ranks' tokens)."""
    link_bytes_per_s: float = 0.0
    link: str = ""

    @classmethod
    def of(cls, model: ModelSpec, gpu: GpuSpec, data_parallel_size: int) -> AllToAllCost:
        from sim.hardware.models import activation_dtype_bytes

        dp = data_parallel_size
        if dp == 1:
            return cls()
        layers = model.num_moe_layers
        link = gpu.tensor_parallel_link_bytes_per_s
        row_bytes = (2 * model.hidden_size + (model.num_experts or 0)) * activation_dtype_bytes(
            model.weight_dtype_bytes
        )
        return cls(
            data_parallel_size=dp,
            per_iteration_s=ALL_TO_ALL_CALLS_PER_LAYER * layers * all_reduce_latency_s(dp),
            per_token_s=layers * (dp - 1) / dp * row_bytes / link,
            link_bytes_per_s=link,
            link=gpu.tensor_parallel_link_name,
        )

    def seconds(self, tokens: int) -> float:
        return self.per_iteration_s + self.per_token_s * tokens if tokens > 0 else 0.0


@dataclass(frozen=True)
class ExpertParallelCost:
    """The part of a lockstep step (:mod:`sim.engine.lockstep`) that each rank of an expert-parallel
    group pays for the tokens of all ranks together: its own routed experts' matrix products and the
    all-to-all that brings it their tokens. What a rank does with its own tokens alone (attention,
    dense layers, routers, shared experts, LM head) is its cost model's iteration.

    ``tokens`` tokens each choose ``experts_per_token`` of the ``num_experts`` experts uniformly
    (as :func:`expected_distinct_experts`); a rank holds ``local_experts`` of them, so it reads
    ``local_experts x (1 - ((E - k) / E) ** tokens)`` of its experts per layer on average (the
    distinct-experts formula's share of them) and multiplies ``tokens x k x local / E`` (token,
    expert) pairs. Read and FLOPs combine as the derated model's matrix products do, in quadrature:

        seconds = hypot(expert_read_s x expected local experts, routed_flops_per_token_s x tokens)
                + all_to_all.seconds(tokens)

    ``expert_read_s``: one expert in every MoE layer; ``routed_flops_per_token_s``: one token's share
    of the rank's expert FLOPs (``2 x k x expert_params x moe_layers x local / E`` over the rank's
    FLOP/s). The uniform router makes the read an upper estimate, as for one GPU; every rank is
    charged the expected share (a rank whose experts draw more tokens than the average is slower)."""

    num_experts: int
    experts_per_token: int
    local_experts: int
    expert_read_s: float
    routed_flops_per_token_s: float
    all_to_all: AllToAllCost

    def step_s(self, tokens: int) -> float:
        """The shared part of a step over ``tokens`` tokens of all ranks (0 without tokens)."""
        if tokens <= 0:
            return 0.0
        touched = (
            expected_distinct_experts(tokens, self.num_experts, self.experts_per_token)
            * self.local_experts
            / self.num_experts
        )
        matmuls = math.hypot(self.expert_read_s * touched, self.routed_flops_per_token_s * tokens)
        return matmuls + self.all_to_all.seconds(tokens)
