"""The derated analytic cost model: the roofline with measured efficiency factors and fixed costs.

The analytic roofline (:class:`sim.costs.core.AnalyticCostModel`) assumes datasheet peaks and nothing
else, and lands 3-65 % too fast against measured GPU iterations. This model keeps the roofline's
structure but takes from :class:`sim.hardware.gpus.Efficiency` (fitted to Vidur's measured operations, see
``calibrate/vidur.py``) how fast real kernels run, and adds what the roofline leaves out. Per
iteration of ``T`` tokens (``B`` decoding sequences holding ``C`` tokens, plus prefill chunks):

* **Matrix products** of the decoder layers: reading the weights once, ``W / (BW x weight_bandwidth)``,
  combined with their FLOPs, ``2 x active params x T / (FLOP/s x gemm_flops)``, as a quadrature sum
  ``sqrt(read^2 + flops^2)``: never faster than either bound, and within 4 % (mean) of Vidur's GEMM
  timings from 1 to 4096 tokens, where a plain sum is up to 50 % slow around the ridge point and a
  max up to 50 % fast.
  A mixture of experts keeps every expert in memory but reads only those the iteration's ``T`` tokens
  route to: attention, dense layers, shared experts and routers are read whole, and each MoE layer's
  routed experts as far as the expected number of distinct experts ``T`` tokens touch,
  ``E (1 - ((E - k) / E) ** T)`` for ``k`` of ``E`` chosen uniformly
  (:func:`sim.costs.terms.expected_distinct_experts`; a real router's skew makes this an upper
  estimate); the FLOPs are those of the active parameters (shared and ``k`` routed experts).
* **LM head**, the same quadrature sum, with FLOPs only for the rows that need logits: one per
  decoding sequence and one per prefill chunk (the chunk's last token; a prompt's other tokens need
  none).
* **Embedding**: only the rows used are read (one per token); the table itself is not read each step.
* **Elementwise kernels** (norms, rotary embedding, activation, residual add): a fixed floor per
  layer plus their bytes per token over ``BW x elementwise_bandwidth``.
* **Decode attention**: a floor per layer, a cost per sequence, and the cached K/V read over
  ``BW x kv_bandwidth``.
* **Prefill attention**, per chunk: a floor per layer, the causal pairs' FLOPs over
  ``FLOP/s x prefill_attention_flops``, and reading the cached prefix's K/V (``start_pos`` tokens)
  over ``BW x kv_bandwidth``.

Tensor parallelism (``tensor_parallel_size`` > 1): each GPU holds ``1 / tp`` of every matrix (the
vocabulary of the embedding and LM head too), ``1 / tp`` of the attention heads and MLP width, and
``max(1, kv_heads // tp)`` KV heads; the GPUs run at once, so the weight reads, FLOPs, split
elementwise kernels (rotary, activation) and K/V reads divide, while the norms and residual adds
(replicated on every GPU) and the fixed per-layer floors do not. :class:`sim.costs.terms.AllReduceCost`
adds two all-reduces per layer. Decode attention's per-sequence cost divides too: its kernels run
one thread block per (sequence, head), and each GPU has ``1 / tp`` of the heads (replaying the measured
TP 2 and TP 4 runs, keeping it whole made their decode steps 21-53 % too slow).

The serving terms fitted to measured runs (:mod:`sim.costs.serving`: a per-iteration overhead, scales
of the kernel factors, the all-reduce latency) are applied on top; ``serving=NEUTRAL`` leaves the
kernel-level model alone.

Event skipping (:mod:`sim.engine.event_skip`) needs a decode step linear in the summed context while
the batch stays fixed (the batch changes only at events), not linear in the batch. So a decode step
is a line in the batch, the least-squares line (relative error) of the quadrature sum over batches
1..256 at geometric spacing, plus, per batch size up to :data:`DECODE_TABLE_BATCHES`, that line's
error at that batch (``RoutedDecodeCost.batch_s``): each such step costs exactly the quadrature sum.
Without the table the line was within 6 % of it from 1 to 128 sequences and 12 % at 256 (Vidur's
A100 factors), 5-6 % fast at batch 1 on every GPU.

A mixture of experts reads the experts its batch routes to, a number that grows steeply and then
saturates (Qwen3-30B-A3B: 8 to 126 experts of 128 per layer from 1 to 64 sequences), which a line
misses by -54..+134 %: its line stands in for the matrix products with every expert read, fitted
relative to the real ones, and the same table adds back, per batch, what that batch leaves unread
and the line's own error. Beyond the table, where every expert is read, the line alone (of the
presets, Qwen3-Next's 10 of 512 experts saturate slowest: a batch of 2,049 leaves 2.8e-18 of them
unread; a test holds every MoE preset to that).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from sim.costs.core import (
    DEFAULT_HOST_BANDWIDTH_BYTES_PER_S,
    DatasheetCostModel,
    StateLayerCost,
    attention_layer_count,
    attention_width,
    expert_parallel_label,
    layer_matmul_params,
    tensor_parallel_label,
)
from sim.costs.least_squares import least_squares
from sim.costs.serving import NEUTRAL, ServingCalibration
from sim.costs.terms import (
    AllToAllCost,
    ExpertParallelCost,
    RoutedDecodeCost,
    attended_context,
    attended_pairs,
    attention_pairs,
    expected_distinct_experts,
)
from sim.hardware.gpus import effective_efficiency

if TYPE_CHECKING:
    from sim.hardware.gpus import Efficiency, GpuSpec
    from sim.hardware.models import ModelSpec

DECODE_TABLE_BATCHES = 2048
"""Decode steps of up to this many sequences are priced exactly (the line plus its error at that batch,
``RoutedDecodeCost.batch_s``); larger ones by the line alone."""
DECODE_LINEARIZATION_BATCHES = tuple(sorted({round(2 ** (8 * i / 63)) for i in range(64)}))
"""Batch sizes the decode line is fitted over: 64 geometrically spaced points from 1 to 256 (after
rounding, the distinct ones); 256 is vLLM's default ``max_num_seqs``."""


def decoder_layer_params(model: ModelSpec) -> int:
    """Weights of all decoder layers: their matrices and two norms each. A mixture of experts has in
    its MoE layers, instead of the dense MLP, the router, every routed expert and the shared experts."""
    dense_layer = layer_matmul_params(model) + 2 * model.hidden_size
    if not model.is_moe:
        return model.num_layers * dense_layer
    assert model.num_experts is not None
    dense_mlp = (3 if model.gated_mlp else 2) * model.hidden_size * model.intermediate_size
    moe_mlp = (
        model.hidden_size * model.num_experts
        + model.num_experts * model.expert_params
        + 3 * model.hidden_size * model.shared_expert_intermediate_size
    )
    return model.num_layers * dense_layer + model.num_moe_layers * (moe_mlp - dense_mlp)


def embedding_is_tied(model: ModelSpec) -> bool:
    """Whether the checkpoint shares one ``vocab x hidden`` table between embedding and LM head.

    ``ModelSpec`` has no such flag; the parameter count tells: what is left after the decoder layers
    is about one table when tied and two when untied (OPT's learned positions and biases add < 5 %
    of a table)."""
    rest = model.num_params - decoder_layer_params(model)
    return rest < 1.5 * model.vocab_size * model.hidden_size


def elementwise_elements_per_token(model: ModelSpec, tensor_parallel_size: int = 1) -> int:
    """Activation elements read and written per token and layer by the elementwise kernels on one
    GPU, as Vidur profiles them: two RMSNorms (read and write ``hidden``), rotary embedding of q and k
    (read and write), the activation (gated: read gate and up, write one; else read and write one)
    and one residual add (read two, write one). Under tensor parallelism a GPU ropes its own heads
    and activates its ``intermediate / tp`` slice; norms and the residual add are whole on every GPU.
    A mixture of experts activates the MLP width of the experts a token uses
    (:attr:`ModelSpec.activated_mlp_width`)."""
    tp = tensor_parallel_size
    hidden, intermediate = model.hidden_size, -(-model.activated_mlp_width // tp)
    rope = (model.num_attention_heads // tp + max(1, model.num_kv_heads // tp)) * model.head_dim
    activation = 3 * intermediate if model.gated_mlp else 2 * intermediate
    return 2 * 2 * hidden + 2 * rope + activation + 3 * hidden


def relative_line(
    xs: Sequence[float], ys: Sequence[float], relative_to: Sequence[float] | None = None
) -> tuple[float, float]:
    """``(intercept, slope)`` minimising the squared error of ``intercept + slope * x`` relative to
    ``ys`` (or, given, to ``relative_to``: the error of a line standing in for part of a larger cost
    counts relative to that cost)."""
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    scale = y if relative_to is None else np.asarray(relative_to, dtype=float)
    design = np.column_stack([np.ones_like(x), x]) / scale[:, None]
    # (y / y is exactly 1. least_squares: the same bits on every machine, which LAPACK's lstsq is not.)
    intercept, slope = least_squares(design, y / scale)
    return float(intercept), float(slope)


class DeratedCostModel(DatasheetCostModel):
    """The roofline derated by ``gpu.efficiency`` (or ``efficiency``); see the module docstring."""

    measured = False

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        kv_cache_dtype: str = "auto",
        block_size: int = 16,
        host_bandwidth_bytes_per_s: float = DEFAULT_HOST_BANDWIDTH_BYTES_PER_S,
        efficiency: Efficiency | None = None,
        tensor_parallel_size: int = 1,
        serving: ServingCalibration | None = None,
        data_parallel_size: int = 1,
        expert_parallel_size: int = 1,
    ):
        # Built directly, the model is the kernel-level one (what Vidur's operations check);
        # ``cost_model: derated`` passes the shipped serving calibration (sim.costs.factory.make_cost_model).
        self.serving = serving if serving is not None else NEUTRAL
        tp = self._set_geometry(
            model,
            gpu,
            kv_cache_dtype,
            block_size,
            host_bandwidth_bytes_per_s,
            tensor_parallel_size,
            # vLLM's custom all-reduce needs NVLink; over PCIe the latency stays NCCL's
            all_reduce_latency_s=self.serving.all_reduce_latency_s
            if gpu.nvlink_bandwidth_bytes_per_s
            else None,
        )
        self.all_reduce = self.serving.all_reduce(self.all_reduce, bool(gpu.nvlink_bandwidth_bytes_per_s))
        # Factors measured on another GPU follow this one's memory; no read outruns what it delivers.
        ceiling = gpu.memory_ceiling.share
        kernels = effective_efficiency(
            efficiency if efficiency is not None else gpu.efficiency, ceiling, gpu.compute_ceiling.share
        )
        eff = self.serving.derate(kernels, ceiling)
        self.efficiency = eff
        self.iteration_overhead_s = self.serving.iteration_overhead_s
        self.request_overhead_s = self.serving.request_overhead_s
        bandwidth, flops = float(gpu.hbm_bandwidth_bytes_per_s), float(gpu.fp16_flops)
        weight_bytes = model.weight_dtype_bytes
        layers = model.num_layers
        head_params = model.vocab_size * model.hidden_size
        # An untied embedding table is not read each step (only its rows, below); a tied one is the
        # LM head's matrix and is read there.
        table_params = 0 if embedding_is_tied(model) else head_params
        body_params = max(model.num_params - head_params - table_params, 0)
        if model.is_moe:
            # from the shape, whatever num_active_params counts (DeepSeek's leave the embedding out)
            body_active = body_params - model.inactive_expert_params
        else:
            body_active = max(model.active_params - head_params - table_params, 0)
        weight_bw = bandwidth * eff.weight_bandwidth
        gemm_flops = flops * eff.gemm_flops
        # vLLM's fused MoE kernels read the routed experts at their own share where it was measured
        expert_bw = (
            weight_bw if eff.routed_expert_bandwidth is None else bandwidth * eff.routed_expert_bandwidth
        )
        # each GPU's share of the matrices (dividing by tp last keeps tp = 1 bit for bit what it was);
        # a vocabulary-parallel embedding looks up 1 / tp of the rows on each GPU on average.
        # Routed experts are read only as far as the iteration's tokens route to them: body_read_s is
        # the rest (attention, dense layers, shared experts, routers), expert_read_s one expert in
        # every MoE layer, times the expected number of distinct experts the tokens touch.
        self.body_read_s = (body_params - model.routed_expert_params) * weight_bytes / weight_bw / tp
        # (at their own bytes: a checkpoint may store the experts quantised, gpt-oss's MXFP4)
        expert_bytes = model.expert_bytes_per_param
        self.expert_read_s = model.num_moe_layers * model.expert_params * expert_bytes / expert_bw / tp
        self.num_experts = model.num_experts or 0
        self.experts_per_token = model.experts_per_token or 0
        if expert_parallel_size > 1:
            # A rank of an expert-parallel group runs its routed experts on every rank's tokens:
            # that is the group's shared part of a step (self.expert_parallel); its own iteration
            # (this model's) has none of their reads or FLOPs.
            self.expert_parallel = self._expert_parallel_cost(
                model, gpu, data_parallel_size, expert_parallel_size, expert_bw, gemm_flops
            )
            self.expert_read_s = 0.0
            body_active = body_params - model.routed_expert_params
        self.body_flops_per_token_s = 2.0 * body_active / gemm_flops / tp
        self.head_read_s = head_params * weight_bytes / weight_bw / tp
        self.head_flops_per_row_s = 2.0 * head_params / gemm_flops / tp
        self.embedding_row_s = model.hidden_size * weight_bytes / weight_bw / tp
        self.elementwise_fixed_s = layers * eff.layer_fixed_s
        self.elementwise_per_token_s = (
            layers
            * elementwise_elements_per_token(model, tp)
            * weight_bytes
            / (bandwidth * eff.elementwise_bandwidth)
        )
        self.kv_read_per_token_s = self.kv_bytes_per_token / (bandwidth * eff.kv_bandwidth)
        # Attention kernels run in the attention layers only; a state layer (Mamba, linear attention)
        # runs its own kernel, reads and writes each request's state and scans each prompt token.
        attention_layers = attention_layer_count(model)
        self.decode_attention_fixed_s = attention_layers * eff.decode_attention_fixed_s
        # The decode kernels' grid is (sequence, head): each GPU runs its own heads' share.
        self.decode_attention_per_seq_s = attention_layers * eff.decode_attention_per_seq_s / tp
        self.prefill_attention_fixed_s = attention_layers * eff.prefill_attention_fixed_s
        self.prefill_attention_per_pair_s = (
            attention_layers * 4.0 * attention_width(model) / (flops * eff.prefill_attention_flops) / tp
        )
        self.decode_states = StateLayerCost.of(
            model,
            tp,
            bandwidth * eff.kv_bandwidth,
            flops * eff.prefill_attention_flops,
            eff.decode_attention_fixed_s,
        )
        self.prefill_states = StateLayerCost.of(
            model,
            tp,
            bandwidth * eff.kv_bandwidth,
            flops * eff.prefill_attention_flops,
            eff.prefill_attention_fixed_s,
        )
        self.decode_attention_fixed_s += self.decode_states.fixed_s
        self.decode_attention_per_seq_s += self.decode_states.per_seq_s
        self._copy_per_block_s = 2.0 * self.block_bytes / (bandwidth * eff.kv_bandwidth)
        batches = DECODE_LINEARIZATION_BATCHES
        if self.expert_read_s:
            # The line stands in for the matrix products with every expert read, the part a batch
            # of any size pays, and the decode step adds back what its batch leaves unread; the
            # line's error counts relative to the products the batch really costs.
            every_expert = [self.gemm_s(b, b, self.num_experts) for b in batches]
            routed = [self.gemm_s(b, b) for b in batches]
            gemm_intercept, gemm_per_seq = relative_line(batches, every_expert, relative_to=routed)
        else:
            gemm_intercept, gemm_per_seq = relative_line(batches, [self.gemm_s(b, b) for b in batches])
        intercept_s = (
            gemm_intercept
            + self.elementwise_fixed_s
            + self.decode_attention_fixed_s
            + self.all_reduce.per_iteration_s
            + self.iteration_overhead_s
        )
        per_seq_s = (
            gemm_per_seq
            + self.elementwise_per_token_s
            + self.embedding_row_s
            + self.decode_attention_per_seq_s
            + self.all_reduce.per_token_s
        )
        # The line is only the base: per batch up to DECODE_TABLE_BATCHES the step adds what the
        # matrix products really cost beyond it, so no batch pays the line's error (at one sequence
        # it was 5-6 % under the quadrature sum, which made every GPU's batch-1 decode fast).
        line_error_s = tuple(
            self.gemm_s(batch, batch) - (gemm_intercept + gemm_per_seq * batch)
            for batch in range(DECODE_TABLE_BATCHES + 1)
        )
        self._decode = RoutedDecodeCost(
            intercept_s, per_seq_s, self.kv_read_per_token_s, batch_s=line_error_s
        )
        serving_label = "" if self.serving.is_neutral else f"; {self.serving.describe()}"
        label = tensor_parallel_label(f"derated-analytic ({eff.source}{serving_label})", self.all_reduce)
        if self.expert_parallel is not None:
            label = f"{label}; {expert_parallel_label(self.expert_parallel, expert_parallel_size)}"
        self.label = label
        end_to_end = self.serving.error_band(gpu)
        self.error_band = f"{eff.error_band}; {end_to_end}" if end_to_end else eff.error_band

    def _expert_parallel_cost(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        data_parallel_size: int,
        expert_parallel_size: int,
        expert_bw: float,
        gemm_flops: float,
    ) -> ExpertParallelCost:
        """One rank's share of the routed experts (whole experts, read at the experts' bandwidth,
        not split over its TP group) and the all-to-all over the DP group, NCCL's over
        PCIe scaled as the fitted all-reduces are (``serving.pcie_all_reduce_scale``)."""
        local = model.local_experts(expert_parallel_size)
        per_token_pairs = self.experts_per_token * local / self.num_experts
        return ExpertParallelCost(
            num_experts=self.num_experts,
            experts_per_token=self.experts_per_token,
            local_experts=local,
            expert_read_s=model.num_moe_layers
            * model.expert_params
            * model.expert_bytes_per_param
            / expert_bw,
            routed_flops_per_token_s=2.0
            * per_token_pairs
            * model.num_moe_layers
            * model.expert_params
            / gemm_flops,
            all_to_all=self.serving.all_reduce(
                AllToAllCost.of(model, gpu, data_parallel_size), bool(gpu.nvlink_bandwidth_bytes_per_s)
            ),
        )

    def gemm_s(self, tokens: float, logit_rows: float, experts: float | None = None) -> float:
        """Matrix products of one iteration: decoder layers over ``tokens``, LM head over
        ``logit_rows``, each the quadrature sum of its weight read and its FLOPs. A mixture of
        experts reads ``experts`` routed experts per MoE layer, by default the number ``tokens``
        are expected to route to (:func:`sim.costs.terms.expected_distinct_experts`)."""
        read_s = self.body_read_s
        if self.expert_read_s:
            if experts is None:
                experts = expected_distinct_experts(tokens, self.num_experts, self.experts_per_token)
            read_s += self.expert_read_s * experts
        return math.hypot(read_s, self.body_flops_per_token_s * tokens) + math.hypot(
            self.head_read_s, self.head_flops_per_row_s * logit_rows
        )

    @property
    def prefill_fixed_s(self) -> float:
        """A prefill-carrying iteration's cost at zero tokens: the weight reads, the layers' floor and
        the all-reduces' latency."""
        return (
            self.gemm_s(0, 0)
            + self.elementwise_fixed_s
            + self.all_reduce.per_iteration_s
            + self.iteration_overhead_s
        )

    def iteration_s(
        self, batch_size: int, sum_context: float, prefill_chunks: Sequence[tuple[int, int]] = ()
    ) -> float:
        if not prefill_chunks:
            return self._decode.step_s(batch_size, sum_context)
        chunk_tokens = sum(chunk[0] for chunk in prefill_chunks)  # (indexed: see content_length)
        tokens = batch_size + chunk_tokens
        seconds = (
            self.gemm_s(tokens, batch_size + len(prefill_chunks))
            + self.elementwise_fixed_s
            + (self.elementwise_per_token_s + self.embedding_row_s) * tokens
            + self.all_reduce.seconds(tokens)
            + self.iteration_overhead_s
        )
        if batch_size > 0:
            seconds += (
                self.decode_attention_fixed_s
                + self.decode_attention_per_seq_s * batch_size
                + self.kv_read_per_token_s * sum_context
            )
        windows = self.attention_windows
        states = self.prefill_states
        if states.per_seq_s:  # (state layers: each chunk reads and writes its request's state once)
            seconds += (
                states.fixed_s + states.per_seq_s * len(prefill_chunks) + states.per_token_s * chunk_tokens
            )
        for num_tokens, start in prefill_chunks:
            seconds += self._chunk_attention_s(num_tokens, start, windows)
        return seconds

    def _chunk_attention_s(
        self, num_tokens: int, start: int, windows: tuple[tuple[int, float], ...]
    ) -> float:
        """One prefill chunk's attention: its pairs and the context it reads (a windowed layer's
        queries see, and read, at most its window)."""
        if windows:
            return (
                self.prefill_attention_fixed_s
                + self.prefill_attention_per_pair_s * attended_pairs(num_tokens, start, windows)
                + self.kv_read_per_token_s * attended_context(start, windows)
            )
        return (
            self.prefill_attention_fixed_s
            + self.prefill_attention_per_pair_s * attention_pairs(num_tokens, start)
            + self.kv_read_per_token_s * start
        )

    def uniform_prefill_s(self, count: int, num_tokens: int, start_pos: int) -> float:
        """:meth:`iteration_s` of ``count`` identical chunks alone, in constant time."""
        if count <= 0 or num_tokens <= 0:
            return self.iteration_s(0, 0.0, [(num_tokens, start_pos)] * max(count, 0))
        tokens = count * num_tokens
        seconds = (
            self.gemm_s(tokens, count)
            + self.elementwise_fixed_s
            + (self.elementwise_per_token_s + self.embedding_row_s) * tokens
            + self.all_reduce.seconds(tokens)
            + self.iteration_overhead_s
        )
        states = self.prefill_states
        if states.per_seq_s:
            seconds += states.fixed_s + states.per_seq_s * count + states.per_token_s * tokens
        return seconds + count * self._chunk_attention_s(num_tokens, start_pos, self.attention_windows)

    def prefill_s(self, num_tokens: int, start_pos: int) -> float:
        """A chunk's time in an iteration of its own, less :attr:`prefill_fixed_s` (in an iteration
        shared with other work it adds less: the matrix products grow sub-linearly below the ridge)."""
        if num_tokens <= 0:
            return 0.0
        return self.iteration_s(0, 0, [(num_tokens, start_pos)]) - self.prefill_fixed_s
