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
adds two all-reduces per layer. Decode attention's per-sequence cost is kept whole (it was fitted
at TP 1 and is not known to scale with heads).

Decode iterations must be linear in the batch (event skipping, :mod:`sim.engine.event_skip`): for them the
quadrature sum is replaced by its least-squares line (relative error) over batches 1..256 taken at
geometric spacing, i.e. equal weight per doubling of the batch; the line is within 6 % of the
quadrature sum from 1 to 128 sequences and 12 % at 256 for Vidur's A100 factors. Iterations that
carry prefill chunks use the quadrature sum itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from sim.costs.core import (
    DEFAULT_HOST_BANDWIDTH_BYTES_PER_S,
    DatasheetCostModel,
    attention_width,
    layer_matmul_params,
    tensor_parallel_label,
)
from sim.costs.terms import DecodeCost, attention_pairs

if TYPE_CHECKING:
    from sim.hardware.gpus import Efficiency, GpuSpec
    from sim.hardware.models import ModelSpec

DECODE_LINEARIZATION_BATCHES = tuple(sorted({round(2 ** (8 * i / 63)) for i in range(64)}))
"""Batch sizes the decode line is fitted over: 64 geometrically spaced points from 1 to 256 (after
rounding, the distinct ones); 256 is vLLM's default ``max_num_seqs``."""


def embedding_is_tied(model: ModelSpec) -> bool:
    """Whether the checkpoint shares one ``vocab x hidden`` table between embedding and LM head.

    ``ModelSpec`` has no such flag; the parameter count tells: what is left after the decoder layers
    is about one table when tied and two when untied (OPT's learned positions and biases add < 5 %
    of a table)."""
    layers = model.num_layers * (layer_matmul_params(model) + 2 * model.hidden_size)
    rest = model.num_params - layers
    return rest < 1.5 * model.vocab_size * model.hidden_size


def elementwise_elements_per_token(model: ModelSpec, tensor_parallel_size: int = 1) -> int:
    """Activation elements read and written per token and layer by the elementwise kernels on one
    GPU, as Vidur profiles them: two RMSNorms (read and write ``hidden``), rotary embedding of q and k
    (read and write), the activation (gated: read gate and up, write one; else read and write one)
    and one residual add (read two, write one). Under tensor parallelism a GPU ropes its own heads
    and activates its ``intermediate / tp`` slice; norms and the residual add are whole on every GPU."""
    tp = tensor_parallel_size
    hidden, intermediate = model.hidden_size, -(-model.intermediate_size // tp)
    rope = (model.num_attention_heads // tp + max(1, model.num_kv_heads // tp)) * model.head_dim
    activation = 3 * intermediate if model.gated_mlp else 2 * intermediate
    return 2 * 2 * hidden + 2 * rope + activation + 3 * hidden


def relative_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """``(intercept, slope)`` minimising the squared relative error of ``intercept + slope * x``."""
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    design = np.column_stack([np.ones_like(x), x]) / y[:, None]
    (intercept, slope), *_ = np.linalg.lstsq(design, np.ones_like(y), rcond=None)
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
    ):
        tp = self._set_geometry(
            model, gpu, kv_cache_dtype, block_size, host_bandwidth_bytes_per_s, tensor_parallel_size
        )
        eff = efficiency if efficiency is not None else gpu.efficiency
        self.efficiency = eff
        bandwidth, flops = float(gpu.hbm_bandwidth_bytes_per_s), float(gpu.fp16_flops)
        weight_bytes = model.weight_dtype_bytes
        layers = model.num_layers
        head_params = model.vocab_size * model.hidden_size
        # An untied embedding table is not read each step (only its rows, below); a tied one is the
        # LM head's matrix and is read there.
        table_params = 0 if embedding_is_tied(model) else head_params
        body_params = max(model.num_params - head_params - table_params, 0)
        body_active = max(model.active_params - head_params - table_params, 0)
        weight_bw = bandwidth * eff.weight_bandwidth
        gemm_flops = flops * eff.gemm_flops
        # each GPU's share of the matrices (dividing by tp last keeps tp = 1 bit for bit what it was);
        # a vocabulary-parallel embedding looks up 1 / tp of the rows on each GPU on average
        self.body_read_s = body_params * weight_bytes / weight_bw / tp
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
        self.decode_attention_fixed_s = layers * eff.decode_attention_fixed_s
        self.decode_attention_per_seq_s = layers * eff.decode_attention_per_seq_s
        self.prefill_attention_fixed_s = layers * eff.prefill_attention_fixed_s
        self.prefill_attention_per_pair_s = (
            layers * 4.0 * attention_width(model) / (flops * eff.prefill_attention_flops) / tp
        )
        self._copy_per_block_s = 2.0 * self.block_bytes / (bandwidth * eff.kv_bandwidth)
        batches = DECODE_LINEARIZATION_BATCHES
        gemm_intercept, gemm_per_seq = relative_line(batches, [self.gemm_s(b, b) for b in batches])
        self._decode = DecodeCost(
            intercept_s=gemm_intercept
            + self.elementwise_fixed_s
            + self.decode_attention_fixed_s
            + self.all_reduce.per_iteration_s,
            per_seq_s=gemm_per_seq
            + self.elementwise_per_token_s
            + self.embedding_row_s
            + self.decode_attention_per_seq_s
            + self.all_reduce.per_token_s,
            per_context_token_s=self.kv_read_per_token_s,
        )
        self.label = tensor_parallel_label(f"derated-analytic ({eff.source})", self.all_reduce)
        self.error_band = eff.error_band

    def gemm_s(self, tokens: float, logit_rows: float) -> float:
        """Matrix products of one iteration: decoder layers over ``tokens``, LM head over
        ``logit_rows``, each the quadrature sum of its weight read and its FLOPs."""
        return math.hypot(self.body_read_s, self.body_flops_per_token_s * tokens) + math.hypot(
            self.head_read_s, self.head_flops_per_row_s * logit_rows
        )

    @property
    def prefill_fixed_s(self) -> float:
        """A prefill-carrying iteration's cost at zero tokens: the weight reads, the layers' floor and
        the all-reduces' latency."""
        return self.gemm_s(0, 0) + self.elementwise_fixed_s + self.all_reduce.per_iteration_s

    def iteration_s(
        self, batch_size: int, sum_context: int, prefill_chunks: Sequence[tuple[int, int]] = ()
    ) -> float:
        if not prefill_chunks:
            return self._decode.step_s(batch_size, sum_context)
        chunk_tokens = sum(num_tokens for num_tokens, _ in prefill_chunks)
        tokens = batch_size + chunk_tokens
        seconds = (
            self.gemm_s(tokens, batch_size + len(prefill_chunks))
            + self.elementwise_fixed_s
            + (self.elementwise_per_token_s + self.embedding_row_s) * tokens
            + self.all_reduce.seconds(tokens)
        )
        if batch_size > 0:
            seconds += (
                self.decode_attention_fixed_s
                + self.decode_attention_per_seq_s * batch_size
                + self.kv_read_per_token_s * sum_context
            )
        for num_tokens, start in prefill_chunks:
            seconds += (
                self.prefill_attention_fixed_s
                + self.prefill_attention_per_pair_s * attention_pairs(num_tokens, start)
                + self.kv_read_per_token_s * start
            )
        return seconds

    def prefill_s(self, num_tokens: int, start_pos: int) -> float:
        """A chunk's time in an iteration of its own, less :attr:`prefill_fixed_s` (in an iteration
        shared with other work it adds less: the matrix products grow sub-linearly below the ridge)."""
        if num_tokens <= 0:
            return 0.0
        return self.iteration_s(0, 0, [(num_tokens, start_pos)]) - self.prefill_fixed_s
