"""Iteration cost models: how long one engine iteration takes.

The engine needs decode steps to be linear in the batch and in the summed context, so that many
decode iterations can be applied at once in closed form (event skipping):

    decode_step_s = intercept_s + per_seq_s * batch + per_context_token_s * sum_context

Prefill chunks add their own time to the iteration they ride in, on top of one fixed cost per
iteration (:meth:`CostModel.iteration_s`: the weights are read once however many prompts share the
iteration); block copies (copy-on-write, fork) and swaps add theirs.

Three sources of numbers:

* :class:`sim.costs.derated.DeratedCostModel` (the default, ``cost_model: derated``): the roofline with
  the efficiency factors of the GPU preset (:class:`sim.hardware.gpus.Efficiency`, fitted to measured GPU
  operations), fixed per-layer costs, only the embedding rows used, LM-head FLOPs only for rows
  that need logits, and the cached-prefix K/V read during prefill.
* :class:`AnalyticCostModel` (``cost_model: analytic``): a roofline from the model's shapes and the
  GPU's datasheet (HBM bandwidth, fp16 FLOP/s, an assumed host link), no efficiency factors.
  Optimistic: :data:`ANALYTIC_ERROR_BAND`.
* :class:`ProfileCostModel`: a calibration profile (YAML, schema :class:`CostProfile`) written by
  ``kvsim calibrate`` from timings of one real torch decoder layer with a paged KV pool, by
  ``calibrate/vidur.py`` from Vidur's measured GPU operations, or an analytic profile written by
  ``calibrate/analytic_profiles.py`` in the same schema. Per-layer coefficients are multiplied by
  the layer count; the LM head is added once per step.

This module never imports torch: the simulator only reads profiles.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, model_validator

from sim.costs.shape import ModelShape
from sim.costs.terms import (  # the terms every iteration evaluates, compiled apart (make native)
    AllReduceCost,
    DecodeCost,
    ExpertParallelCost,
    LinearIterationCost,
    PrefillCost,
)
from workloads.config import FILE_FIELD
from workloads.config_base import ConfigModel

if TYPE_CHECKING:
    from sim.hardware.gpus import GpuSpec
    from sim.hardware.models import ModelSpec

REPO_ROOT = Path(__file__).resolve().parents[2]

DEFAULT_HOST_BANDWIDTH_BYTES_PER_S = 25e9
"""Host <-> device bandwidth used for swaps when nothing was measured: 25 GB/s, roughly what a
PCIe 4.0 x16 link sustains with pinned memory (32 GB/s peak). PCIe 5.0 hosts reach about 50 GB/s."""

PROFILE_SCHEMA_VERSION = 1


class CostModel(ABC):
    """Times for the pieces of an iteration. ``label`` says where the numbers come from and
    ``error_band`` how far they were found from measured iteration times (both go into every run's
    summary as ``cost_model`` and ``cost_model_error_band``)."""

    label: str = ""
    measured: bool = False
    error_band: str = "not validated"
    request_overhead_s: float = 0.0
    """Time outside the engine in each request's client-side TTFT and E2E (HTTP, API server,
    tokenization, streaming); a fitted serving term (``sim/costs/serving.py``), 0 unless calibrated."""
    expert_parallel: ExpertParallelCost | None = None
    """Expert parallelism: the part of a lockstep step every rank pays for all ranks' tokens (its
    routed experts, the all-to-all); this model's own iterations leave it out. None without."""
    attention_windows: tuple[tuple[int, float], ...] = ()
    """``(window, share)`` per window size of the model's sliding-window and chunked-local layers:
    their share of the K/V bytes a token holds over all attention layers. A decode step's context
    term reads ``per_context_token_s`` x the *attended* context, in which each sequence counts
    ``(1 - sum of shares) x its tokens + sum of share x min(its tokens, window)``
    (``sim.engine.decoding.DecodeClock.sum_context``). Empty: every attention layer reads every token."""
    shared_kv_cached_tokens: float = 0.0
    """How many tokens of one attention layer's K/V (this GPU's share) the GPU's last-level cache
    holds: a decode step reads a block that several running sequences share from memory once, and
    from the cache for the others while the layer's K/V fits in it (``sim/engine/shared_reads.py``).
    0: no credit (a measured profile already has whatever its GPU did)."""
    # Set by models whose prefill chunks cost a linear form: their iterations are timed by it.
    _linear: LinearIterationCost | None = None

    @property
    def linear_iteration(self) -> LinearIterationCost | None:
        """This model's :meth:`iteration_s` as compiled linear terms, when it has them (the analytic
        model and the fitted profiles): the engine calls those directly."""
        return self._linear

    @property
    @abstractmethod
    def decode(self) -> DecodeCost: ...

    def prefill_s(self, num_tokens: int, start_pos: int) -> float:
        """Time a prefill chunk of ``num_tokens`` starting at ``start_pos`` adds to the iteration that
        carries it, on top of the iteration's fixed cost (:attr:`prefill_fixed_s`). A model with
        linear terms is timed by them; any other model defines this."""
        if self._linear is None:
            raise NotImplementedError(f"{type(self).__name__} defines no prefill_s")
        return self._linear.prefill.chunk_s(num_tokens, start_pos)

    @property
    def prefill_fixed_s(self) -> float:
        """Fixed cost of an iteration that runs prefill tokens (reading the weights once, launching
        every layer). By default the decode intercept, the same weight read."""
        return self.decode.intercept_s if self._linear is None else self._linear.prefill.fixed_s

    def iteration_s(
        self, batch_size: int, sum_context: float, prefill_chunks: Sequence[tuple[int, int]] = ()
    ) -> float:
        """One engine iteration: ``batch_size`` decoding sequences holding ``sum_context`` tokens, and
        the prefill chunks ``(num_tokens, start_pos)`` scheduled with them.

        The fixed per-iteration cost is paid once, however many prompts share the iteration: the
        fixed cost of the costliest kind of work present, i.e. :attr:`prefill_fixed_s` for prefill
        alone and the larger of it and the decode intercept when decoding sequences ride along; each
        chunk adds only its :meth:`prefill_s` and each sequence its per-sequence and context costs.
        Without chunks this is exactly ``decode.step_s(batch_size, sum_context)``, which event
        skipping relies on. Block copies and swaps are not included (:meth:`copy_blocks_s`,
        :meth:`swap_blocks_s`)."""
        if self._linear is not None:
            return self._linear.iteration_s(batch_size, sum_context, prefill_chunks)
        decode = self.decode
        if not prefill_chunks:
            return decode.step_s(batch_size, sum_context)
        chunks_s = sum(self.prefill_s(num_tokens, start) for num_tokens, start in prefill_chunks)
        return decode.with_prefill_s(batch_size, sum_context, self.prefill_fixed_s, chunks_s)

    def uniform_prefill_s(self, count: int, num_tokens: int, start_pos: int) -> float:
        """``iteration_s(0, 0, [(num_tokens, start_pos)] * count)``: an iteration of ``count``
        identical prefill chunks and nothing else (what verifying speculative drafts costs, per batch
        size up to ``max_num_seqs``), in constant time where the model's chunks add up (the list,
        else: a model with rules of its own and no override of this)."""
        if count <= 0:
            return self.iteration_s(0, 0.0)
        if self._linear is not None:
            return self._linear.uniform_prefill_s(count, num_tokens, start_pos)
        if type(self).iteration_s is not CostModel.iteration_s:
            return self.iteration_s(0, 0.0, [(num_tokens, start_pos)] * count)
        chunks_s = count * self.prefill_s(num_tokens, start_pos)
        return self.decode.with_prefill_s(0, 0.0, self.prefill_fixed_s, chunks_s)

    @abstractmethod
    def copy_blocks_s(self, num_blocks: int) -> float:
        """Device-side copy of ``num_blocks`` KV blocks across all layers (copy-on-write)."""

    @abstractmethod
    def swap_blocks_s(self, num_blocks: float) -> float:
        """Moving ``num_blocks`` KV blocks between host and device memory, one direction."""


class WrappedCostModel(CostModel):
    """A cost model made from another (``inner``) by changing some of its times: what describes it
    (label, measured, error band, the client-side overhead, expert parallelism, attention windows)
    starts as the inner model's, and anything else read off it (its GPU, its KV bytes per token) is
    the inner model's. Subclasses set their decode and linear terms."""

    def __init__(self, inner: CostModel):
        self.inner = inner
        self.label = inner.label
        self.measured = inner.measured
        self.error_band = inner.error_band
        self.request_overhead_s = inner.request_overhead_s
        self.expert_parallel = inner.expert_parallel
        self.attention_windows = inner.attention_windows
        self.shared_kv_cached_tokens = inner.shared_kv_cached_tokens

    def __getattr__(self, name: str) -> object:
        # (Only for names the wrapper does not have: what the runner and reports read off a cost
        # model beyond the interface. Not its own wiring, nor dunder lookups such as unpickling's,
        # which come before ``inner`` exists.)
        if name == "inner" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)


class CostModelError(ValueError):
    """A cost model cannot be built: a missing or invalid profile, or a model mismatch."""


# --------------------------------------------------------------------------------------------------
# Shape arithmetic shared by the analytic model, the rescaling and the calibration
# --------------------------------------------------------------------------------------------------


def attention_windows(model: ModelSpec | ModelShape) -> tuple[tuple[int, float], ...]:
    """:attr:`CostModel.attention_windows` of ``model``: each window's layers' share of the
    attention layers (they hold the same K/V bytes per token each). A chunked-local layer attends
    within its chunk, at most ``chunk`` tokens: counted as a window of that size, an upper bound
    (on average it reads half a chunk)."""
    from sim.hardware.layers import ChunkedLocal, SlidingWindow

    counts = getattr(model, "layer_kind_counts", ())
    attention_layers = getattr(model, "num_attention_layers", 0)
    shares: dict[int, int] = {}
    for kind, count in counts:
        if isinstance(kind, SlidingWindow):
            shares[kind.window] = shares.get(kind.window, 0) + count
        elif isinstance(kind, ChunkedLocal):
            shares[kind.chunk] = shares.get(kind.chunk, 0) + count
    if not shares or not attention_layers:
        return ()
    return tuple((window, count / attention_layers) for window, count in sorted(shares.items()))


def attention_layer_count(model: ModelSpec | ModelShape) -> int:
    """Layers whose mixer is attention (a Mamba, linear-attention or MLP-only block has no attention
    kernel); every layer for a model without layer kinds, such as a profile's shape."""
    return int(getattr(model, "num_attention_layers", model.num_layers))


SCAN_FLOPS_PER_STATE_ELEMENT = 6.0
"""FLOPs a prompt token costs per element of a Mamba / linear-attention state: the decay multiply,
the input's outer-product add and the read-out (recurrent form; the chunked kernels trade part of it
for matrix products). An estimate from the recurrence, not a measured kernel."""


@dataclass(frozen=True)
class StateLayerCost:
    """What a model's state layers (Mamba 1/2, gated delta net) add to an iteration, one GPU:
    ``fixed_s`` per iteration with decode or prefill work (one kernel per state layer),
    ``per_seq_s`` for each decoding request or prompt chunk (its state read and written once),
    ``per_token_s`` per prompt token (the scan's update of every state element). Their projections
    are matrix products, already in the weights."""

    fixed_s: float = 0.0
    per_seq_s: float = 0.0
    per_token_s: float = 0.0

    @classmethod
    def of(
        cls,
        model: ModelSpec | ModelShape,
        tensor_parallel_size: int,
        state_bandwidth: float,
        scan_flops: float,
        kernel_fixed_s: float = 0.0,
    ) -> StateLayerCost:
        from sim.hardware.layers import STATE_KINDS

        counts = [
            (kind, count)
            for kind, count in getattr(model, "layer_kind_counts", ())
            if isinstance(kind, STATE_KINDS)
        ]
        if not counts:
            return cls()
        state_bytes = model.state_bytes_per_request(tensor_parallel_size)  # type: ignore[union-attr]
        elements = sum(count * kind.ssm_state_elements(tensor_parallel_size) for kind, count in counts)
        return cls(
            fixed_s=sum(count for _, count in counts) * kernel_fixed_s,
            per_seq_s=2.0 * state_bytes / state_bandwidth,
            per_token_s=SCAN_FLOPS_PER_STATE_ELEMENT * elements / scan_flops,
        )


def attention_width(model: ModelShape) -> int:
    """Query width per layer, ``num_attention_heads * head_dim`` (= hidden size in Llama shapes)."""
    return model.num_attention_heads * model.head_dim


def kv_elements_per_token_per_layer(model: ModelShape, tensor_parallel_size: int = 1) -> int:
    """Cache elements one token holds in one layer on one GPU: K and V of ``max(1, kv_heads // tp)``
    heads (replicated when TP exceeds them), or MLA's latent plus rope key (replicated on every GPU)."""
    if model.attention == "mla":
        return int(model.kv_lora_rank or 0) + int(model.qk_rope_head_dim or 0)
    return 2 * max(1, model.num_kv_heads // tensor_parallel_size) * model.head_dim


def layer_matmul_params(model: ModelShape) -> int:
    """Weights of one decoder layer's matrices: Q, K, V, O projections and the MLP (3 matrices when
    gated, SwiGLU; 2 otherwise, OPT).

    For MLA models the K/V projections are approximated by the down projection to the latent and the
    up projection back to the heads; the calibration layer itself is MHA/GQA only."""
    hidden, width = model.hidden_size, attention_width(model)
    if model.attention == "mla":
        latent = int(model.kv_lora_rank or 0)
        kv = hidden * (latent + int(model.qk_rope_head_dim or 0)) + latent * 2 * width
    else:
        kv = 2 * hidden * model.num_kv_heads * model.head_dim
    mlp_matrices = 3 if model.gated_mlp else 2
    return hidden * width + kv + width * hidden + mlp_matrices * hidden * model.intermediate_size


def checked_tensor_parallel(model: ModelShape | ModelSpec, tensor_parallel_size: int) -> int:
    """``tensor_parallel_size`` after vLLM's checks (:func:`sim.hardware.models.check_tensor_parallel`), or a
    :class:`CostModelError` with vLLM's words."""
    from sim.hardware.models import check_tensor_parallel

    try:
        check_tensor_parallel(model, tensor_parallel_size)
    except ValueError as error:
        raise CostModelError(str(error)) from None
    return tensor_parallel_size


def head_params(model: ModelShape) -> int:
    """The LM head (logits projection): ``vocab_size * hidden_size``."""
    return model.vocab_size * model.hidden_size


def expert_parallel_label(cost: ExpertParallelCost, expert_parallel_size: int) -> str:
    """A phrase for cost-model labels: how the experts are dealt out and what carries their tokens."""
    a2a = cost.all_to_all
    over = (
        f"; all-gather + reduce-scatter over {a2a.link} {a2a.link_bytes_per_s / 1e9:g} GB/s per direction"
        if a2a.data_parallel_size > 1
        else ""
    )
    return (
        f"EP {expert_parallel_size}: {cost.local_experts} of {cost.num_experts} routed experts per GPU{over}"
    )


def tensor_parallel_label(label: str, all_reduce: AllReduceCost) -> str:
    """``label`` with the TP phrase appended at tp > 1 (unchanged at tp = 1)."""
    return label if all_reduce.tensor_parallel_size == 1 else f"{label}; {all_reduce.describe()}"


# --------------------------------------------------------------------------------------------------
# Analytic roofline
# --------------------------------------------------------------------------------------------------


ANALYTIC_ERROR_BAND = (
    "decode -32..-3 %, prefill -43..-7 % vs held-out Vidur A100 Llama-2-7B iterations (datasheet peaks, "
    "no derating: too fast everywhere)"
)
"""How far the analytic roofline lands from Vidur's measured A100 Llama-2-7B iterations (decoder layers
only); recomputed by ``python -m calibrate.vidur`` and checked by ``tests/test_vidur.py``."""
ANALYTIC_BAND_GPU = "A100-80GB"  # the GPU those iterations were measured on


def shared_kv_cached_tokens(model: ModelSpec, gpu: GpuSpec, kv_bytes_per_token: int) -> float:
    """Tokens of one attention layer's K/V (``kv_bytes_per_token``: one GPU's, over its attention
    layers, which hold the same bytes per token each) that ``gpu``'s last-level cache holds."""
    layers = attention_layer_count(model)
    if not gpu.l2_cache_bytes or not kv_bytes_per_token or not layers:
        return 0.0
    return gpu.l2_cache_bytes / (kv_bytes_per_token / layers)


class DatasheetCostModel(CostModel):
    """A cost model computed from a model's shape and a GPU's datasheet (the analytic roofline and its
    derated form): the block geometry, the host link and the all-reduces they share, and block moves
    priced per block (each subclass sets ``_copy_per_block_s`` and ``_decode``)."""

    _decode: DecodeCost
    _copy_per_block_s: float

    def _set_geometry(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        kv_cache_dtype: str,
        block_size: int,
        host_bandwidth_bytes_per_s: float,
        tensor_parallel_size: int,
        all_reduce_latency_s: float | None = None,
    ) -> int:
        """Check and store what both datasheet models need; returns the tensor-parallel size.
        ``all_reduce_latency_s``: one all-reduce's fixed time at TP 2 (None: the NCCL figure)."""
        if block_size <= 0:
            raise CostModelError(f"block_size must be positive, got {block_size}")
        if host_bandwidth_bytes_per_s <= 0:
            raise CostModelError(f"host bandwidth must be positive, got {host_bandwidth_bytes_per_s}")
        tp = checked_tensor_parallel(model, tensor_parallel_size)
        self.model = model
        self.gpu = gpu
        self.kv_cache_dtype = kv_cache_dtype
        self.block_size = block_size
        self.tensor_parallel_size = tp
        self.host_bandwidth_bytes_per_s = float(host_bandwidth_bytes_per_s)
        self.all_reduce = AllReduceCost.of(model, gpu, tp, latency_s=all_reduce_latency_s)
        self.kv_bytes_per_token = model.kv_bytes_per_token(kv_cache_dtype, tensor_parallel_size=tp)
        self.attention_windows = attention_windows(model)
        self.shared_kv_cached_tokens = shared_kv_cached_tokens(model, gpu, self.kv_bytes_per_token)
        self.block_bytes = self.kv_bytes_per_token * block_size
        self._swap_per_block_s = self.block_bytes / self.host_bandwidth_bytes_per_s
        return tp

    @property
    def decode(self) -> DecodeCost:
        return self._decode

    def copy_blocks_s(self, num_blocks: int) -> float:
        return self._copy_per_block_s * max(num_blocks, 0)

    def swap_blocks_s(self, num_blocks: float) -> float:
        return self._swap_per_block_s * max(num_blocks, 0)


class AnalyticCostModel(DatasheetCostModel):
    """Roofline estimate from the model's shapes and the GPU's datasheet numbers.

    * Decode is memory bound: each step reads every weight once and each sequence's K/V once, so
      ``intercept = weight_bytes / BW`` and ``per_context_token = kv_bytes_per_token / BW``. The compute
      of a decode token, ``2 * num_params`` FLOPs (active parameters for mixture-of-experts models), is *added* as ``per_seq`` instead of taking the
      max of the memory and compute times: a simplification that keeps the step linear in the batch
      (the engine needs that); it overestimates by at most the smaller of the two terms. A mixture
      of experts' decode batch reads only the routed experts it is expected to touch
      (:class:`RoutedDecodeCost`); an iteration carrying prefill reads them all.
    * Prefill is compute bound: ``(2 * num_params * n + 4 * layers * heads * head_dim * n * (start + n/2))
      / FLOP/s`` (matmuls, then QK^T and PV over the causal prefix).
    * A copy-on-write block copy reads and writes the block in every layer:
      ``2 * blocks * block_bytes / BW``.
    * A swap moves ``blocks * block_bytes`` over the host link, ``host_bandwidth_bytes_per_s``
      (default :data:`DEFAULT_HOST_BANDWIDTH_BYTES_PER_S`, 25 GB/s; :func:`make_cost_model` passes the
      GPU's PCIe link, one direction).
    * Tensor parallelism (``tensor_parallel_size`` > 1): every GPU reads ``weights / tp``, does
      ``1 / tp`` of the FLOPs and reads its own KV heads (``max(1, kv_heads // tp)`` per layer), all at
      once, so those terms divide; blocks are per GPU (each GPU copies and swaps its share over its own
      links); :class:`AllReduceCost` adds the all-reduces.

    Peak numbers, no efficiency factors: real servers run slower, by a factor a measured profile shows.
    """

    label = "analytic roofline (datasheet peaks, no derating)"
    measured = False
    error_band = ANALYTIC_ERROR_BAND

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        kv_cache_dtype: str = "auto",
        block_size: int = 16,
        host_bandwidth_bytes_per_s: float = DEFAULT_HOST_BANDWIDTH_BYTES_PER_S,
        tensor_parallel_size: int = 1,
    ):
        tp = self._set_geometry(
            model, gpu, kv_cache_dtype, block_size, host_bandwidth_bytes_per_s, tensor_parallel_size
        )
        bandwidth, flops = float(gpu.hbm_bandwidth_bytes_per_s), float(gpu.fp16_flops)
        # FLOPs per token use the parameters one token touches (all of them for a dense model);
        # dividing by tp last keeps tp = 1 bit for bit what it was
        active_params = getattr(model, "active_params", model.num_params)
        states = StateLayerCost.of(model, tp, bandwidth, flops)
        self._decode = DecodeCost(
            intercept_s=model.weight_bytes() / bandwidth / tp + self.all_reduce.per_iteration_s,
            per_seq_s=2.0 * active_params / flops / tp + self.all_reduce.per_token_s + states.per_seq_s,
            per_context_token_s=self.kv_bytes_per_token / bandwidth,
        )
        if getattr(model, "is_moe", False):
            from sim.costs.terms import ROUTING_SATURATED, RoutedDecodeCost, unread_experts_s

            # a decode batch reads only the experts it routes to; prefill chunks (tens of tokens and
            # more touch nearly every expert) keep the whole weight read as their fixed cost
            decode = self._decode
            self._decode = RoutedDecodeCost(
                decode.intercept_s,
                decode.per_seq_s,
                decode.per_context_token_s,
                batch_s=unread_experts_s(
                    model.num_moe_layers
                    * model.expert_params
                    * model.expert_bytes_per_param
                    / bandwidth
                    / tp,
                    model.num_experts or 0,
                    model.experts_per_token or 0,
                    ROUTING_SATURATED * decode.intercept_s,
                ),
            )
        self.prefill_per_token_s = (
            2.0 * active_params / flops / tp + self.all_reduce.per_token_s + states.per_token_s
        )
        self.prefill_per_attention_pair_s = (
            4.0 * attention_layer_count(model) * attention_width(model) / flops / tp
        )
        prefill = PrefillCost(
            fixed_s=self._decode.intercept_s,  # the same weight read as a decode step
            per_chunk_s=states.per_seq_s,
            per_token_s=self.prefill_per_token_s,
            per_pair_s=self.prefill_per_attention_pair_s,
            windows=self.attention_windows,
        )
        self._linear = LinearIterationCost(self._decode, prefill)
        self.label = tensor_parallel_label(self.label, self.all_reduce)
        self._copy_per_block_s = 2.0 * self.block_bytes / bandwidth
        self.error_band = analytic_error_band(gpu.name)


def analytic_error_band(gpu_name: str) -> str:
    """The analytic roofline's band on ``gpu_name``: measured on the A100-80GB only, so any other GPU
    is told so rather than handed the A100's numbers as its own."""
    if gpu_name == ANALYTIC_BAND_GPU:
        return ANALYTIC_ERROR_BAND
    return f"not validated on {gpu_name} (no held-out iterations of it); on the {ANALYTIC_BAND_GPU}: {ANALYTIC_ERROR_BAND}"


# --------------------------------------------------------------------------------------------------
# Calibration profile schema (written by ``kvsim calibrate`` and calibrate/analytic_profiles.py)
# --------------------------------------------------------------------------------------------------


class _Strict(ConfigModel):
    model_config = ConfigDict(extra="forbid")


class ProfileModel(_Strict):
    """The shapes of the model a profile was measured (or computed) for."""

    name: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    num_params: int = Field(gt=0)
    weight_dtype_bytes: int = 2
    attention: Literal["mha", "mla"] = "mha"
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    gated_mlp: bool = True

    @classmethod
    def from_spec(cls, model: ModelSpec) -> ProfileModel:
        return cls(**{name: getattr(model, name) for name in cls.model_fields if hasattr(model, name)})

    def shapes(self) -> dict[str, Any]:
        """Everything but the name: two models with equal shapes cost the same."""
        return self.model_dump(exclude={"name", "num_params", "weight_dtype_bytes"})


class ProfileDevice(_Strict):
    kind: str
    """``cpu``, ``cuda`` or, for analytic profiles, ``analytic``."""
    name: str
    torch_version: str | None = None
    num_threads: int | None = None
    load_average: list[float] | None = None
    hbm_bandwidth_bytes_per_s: float | None = None
    fp16_flops: float | None = None


class LayerDecodeCoefficients(_Strict):
    """One layer's decode step: ``intercept + per_seq * batch + per_context_token * sum_context``."""

    intercept_s: float = Field(ge=0)
    per_seq_s: float = Field(ge=0)
    per_context_token_s: float = Field(ge=0)


class StepCoefficients(_Strict):
    """Work done once per step, not per layer (final norm + LM head): ``intercept + per_seq * rows``."""

    intercept_s: float = Field(ge=0)
    per_seq_s: float = Field(ge=0)
    measured: bool = True
    note: str | None = None


class LayerPrefillCoefficients(_Strict):
    """One layer's prefill chunk: ``intercept + per_token * n + per_attention_pair * n * (start + n/2)``."""

    intercept_s: float = Field(ge=0)
    per_token_s: float = Field(ge=0)
    per_attention_pair_s: float = Field(ge=0)


class BlockCoefficients(_Strict):
    """Moving ``n`` blocks of K and V across every layer of the profile's model: ``intercept + per_block * n``."""

    intercept_s: float = Field(ge=0)
    per_block_s: float = Field(ge=0)
    measured: bool = True
    note: str | None = None


class BlockSizePoint(_Strict):
    """Coefficients that depend on the block size, from the block-size sweep."""

    block_size: int = Field(gt=0)
    per_context_token_s: float = Field(ge=0)
    """Per layer, like ``decode_per_layer.per_context_token_s``."""
    block_copy: BlockCoefficients
    block_swap: BlockCoefficients
    measured: bool = True
    """False when the point was filled analytically (no measurement at this block size)."""


class ProfileCoefficients(_Strict):
    decode_per_layer: LayerDecodeCoefficients
    decode_per_step: StepCoefficients
    prefill_per_layer: LayerPrefillCoefficients
    block_copy: BlockCoefficients
    block_swap: BlockCoefficients
    block_size_sweep: list[BlockSizePoint] = Field(default_factory=list)


class CostProfile(_Strict):
    """A calibration profile: per-layer and per-step coefficients plus how they were obtained.

    All times are seconds. ``decode_per_layer`` and ``prefill_per_layer`` are for one decoder layer;
    multiply by the layer count. ``decode_per_step`` (final norm + LM head) is added once per step, and
    its ``per_seq_s`` once per prefill chunk (the chunk's last row). ``block_copy`` and ``block_swap`` are for
    blocks of ``block_size`` tokens across all ``model.num_layers`` layers."""

    kvsim_profile: int = PROFILE_SCHEMA_VERSION
    measured: bool
    label: str
    created: str
    kvsim_version: str
    device: ProfileDevice
    model: ProfileModel
    dtype: str
    block_size: int = Field(gt=0)
    timed_layers: int = Field(1, ge=0)
    coefficients: ProfileCoefficients
    fit_quality: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, Any] = Field(default_factory=dict)
    formula: str | None = None
    samples_csv: str | None = None
    notes: list[str] = Field(default_factory=list)
    source: dict[str, Any] | None = None
    """Where the measurements come from when kvsim did not take them (e.g. Vidur's profiling data:
    repository, paths, commit, blob ids, licence)."""
    analytic_parts: list[str] = Field(default_factory=list)
    """Coefficients filled analytically in an otherwise measured profile (they are marked
    ``measured: false`` where the schema has the flag)."""
    tensor_parallel_size: int = Field(1, ge=1)
    """The tensor-parallel size the times were measured at: they are one GPU's share of the work
    (its slice of the weights, heads and KV heads). All-reduce time is never part of a profile;
    kvsim adds it analytically at TP > 1 (:class:`AllReduceCost`). A run at another TP refuses the
    profile unless ``cost_model: {tensor_parallel_rescale: true}``."""

    @model_validator(mode="after")
    def _check_version(self) -> CostProfile:
        if self.kvsim_profile != PROFILE_SCHEMA_VERSION:
            raise ValueError(
                f"kvsim_profile is {self.kvsim_profile}; this kvsim reads version {PROFILE_SCHEMA_VERSION}"
            )
        return self

    def yaml_text(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", exclude_none=True), sort_keys=False, width=110)

    def to_yaml(self, path: str | Path) -> None:
        Path(path).write_text(self.yaml_text(), encoding="utf-8")


def load_profile(path: str | Path) -> CostProfile:
    """Read and validate a profile; errors name the file and the offending key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CostModelError(f"cost profile not found: {path}") from None
    except OSError as error:
        raise CostModelError(f"cannot read cost profile {path}: {error}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise CostModelError(f"cost profile {path} is not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise CostModelError(f"cost profile {path} must be a YAML mapping, got {type(data).__name__}")
    try:
        return CostProfile.model_validate(data)
    except ValidationError as error:
        raise CostModelError(f"invalid cost profile {path}: {one_line_problems(error)}") from None


def one_line_problems(
    error: ValidationError, top_level: str = "<top>", key_prefix: str = "", show_input: bool = False
) -> str:
    """pydantic's problems on one line, ``key.path: message`` each (``top_level`` names an empty path),
    for errors short enough to sit inside a sentence."""
    return "; ".join(
        f"{key_prefix}{'.'.join(str(part) for part in item['loc']) or top_level}: {item['msg']}"
        + (f" (got {item.get('input')!r})" if show_input else "")
        for item in error.errors()
    )


# --------------------------------------------------------------------------------------------------
# Profile-driven cost model
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RescaleRatios:
    """Target / profile ratios used when a profile is applied to a different model.

    ``weights``: per-layer matmul parameters (the decode intercept reads them, per-seq and per-token
    prefill work multiplies them). ``kv``: per-layer K/V elements per token (decode context cost).
    ``attention``: query width ``heads * head_dim`` (prefill attention pairs). ``head``:
    ``vocab * hidden`` (LM head). ``block``: K/V elements per token across all layers (copy, swap).
    """

    weights: float
    kv: float
    attention: float
    head: float
    block: float

    @classmethod
    def between(
        cls, profile_model: ProfileModel, target: ProfileModel, profile_tp: int = 1, target_tp: int = 1
    ) -> RescaleRatios:
        """Ratios of one GPU's work: the model's shapes, and under tensor parallelism each GPU's share
        (``1 / tp`` of the matrices, heads and vocabulary; its own KV heads, replicated when fewer than
        TP, for the K/V terms)."""

        def ratio(f: Any) -> float:
            return float(f(target)) / float(f(profile_model)) * profile_tp / target_tp

        def kv_ratio(f: Any) -> float:
            return float(f(target, target_tp)) / float(f(profile_model, profile_tp))

        return cls(
            weights=ratio(layer_matmul_params),
            kv=kv_ratio(kv_elements_per_token_per_layer),
            attention=ratio(attention_width),
            head=ratio(head_params),
            block=kv_ratio(lambda m, tp: m.num_layers * kv_elements_per_token_per_layer(m, tp)),
        )


def _interpolate_log2(points: list[tuple[int, float]], block_size: int) -> float:
    """Linear interpolation in log2(block size) between the two nearest sweep points; clamped to the
    nearest end outside the swept range."""
    points = sorted(points)
    if block_size <= points[0][0]:
        return points[0][1]
    if block_size >= points[-1][0]:
        return points[-1][1]
    x = math.log2(block_size)
    for (b0, y0), (b1, y1) in zip(points, points[1:], strict=False):
        if b0 <= block_size <= b1:
            t = (x - math.log2(b0)) / (math.log2(b1) - math.log2(b0))
            return y0 + t * (y1 - y0)
    raise AssertionError("unreachable")  # pragma: no cover


class ProfileCostModel(CostModel):
    """Costs from a calibration profile, for the profile's model or (``rescale=True``) another one.

    * Layer scaling: per-layer coefficients times ``num_layers``; the LM head once per step.
    * Block size: the decode per-context-token cost and the copy/swap coefficients come from the
      block-size sweep. Between swept sizes they are interpolated linearly in log2(block size): the
      per-context-token cost directly, copy and swap per *slot* (``per_block_s / block_size``) and
      intercepts directly. Outside the swept range the nearest end is used (per slot for copy and
      swap, so their per-block cost keeps growing with the block's bytes).
    * Rescaling to a different model multiplies each coefficient by a shape ratio (see
      :class:`RescaleRatios`): the decode intercept, per-seq cost and prefill per-token cost and
      intercept by the per-layer weight ratio; the decode per-context-token cost by the per-layer
      K/V ratio; the prefill attention cost by the query-width ratio; the LM head by the
      ``vocab * hidden`` ratio; copy and swap per-block costs by the all-layer K/V ratio (intercepts
      unchanged); and the layer count is the target's. It assumes the same device and dtype, and that
      time is proportional to bytes and FLOPs, which is roughly true only for similar shapes. It
      always warns.
    * Tensor parallelism: a profile holds one GPU's times at ``profile.tensor_parallel_size``
      (default 1). At another TP it is refused unless ``tensor_parallel_rescale=True``, which divides
      the per-GPU terms like a shape rescale (:meth:`RescaleRatios.between` with both TPs: matrices,
      heads and LM head by the TP ratio, K/V by the per-GPU KV heads) and warns. At any TP > 1 the
      all-reduces are added analytically (:class:`AllReduceCost`, over ``gpu``'s link).
    """

    def __init__(
        self,
        profile: CostProfile,
        model: ModelSpec | ProfileModel | None = None,
        *,
        rescale: bool = False,
        block_size: int | None = None,
        host_bandwidth_bytes_per_s: float | None = None,
        source: str | Path | None = None,
        tensor_parallel_size: int = 1,
        tensor_parallel_rescale: bool = False,
        gpu: GpuSpec | None = None,
    ):
        self.profile = profile
        self.source = str(source) if source is not None else "<profile>"
        target = profile.model
        if model is not None:
            target = model if isinstance(model, ProfileModel) else ProfileModel.from_spec(model)
        self.target = target
        # (A profile measured its own model's decode: the windows are those of the model simulated.)
        self.attention_windows = attention_windows(model) if model is not None else ()
        self.rescaled = target.shapes() != profile.model.shapes()
        if self.rescaled and not rescale:
            differences = ", ".join(
                f"{key} {value} vs {target.shapes()[key]}"
                for key, value in profile.model.shapes().items()
                if target.shapes()[key] != value
            )
            raise CostModelError(
                f"cost profile {self.source} was measured on {profile.model.name!r}, but the simulated model is "
                f"{target.name!r} ({differences}). Calibrate the model (`kvsim calibrate --model {target.name}`) "
                "or set `rescale: true` in cost_model to rescale the profile by shape ratios."
            )
        tp = self._check_tensor_parallel(tensor_parallel_size, tensor_parallel_rescale, gpu)
        self.tensor_parallel_size = tp
        self.all_reduce = AllReduceCost() if gpu is None else AllReduceCost.of(target, gpu, tp)
        ratios = (
            RescaleRatios.between(profile.model, target, profile.tensor_parallel_size, tp)
            if self.rescaled or self.tp_rescaled
            else RescaleRatios(weights=1.0, kv=1.0, attention=1.0, head=1.0, block=1.0)
        )
        self.ratios = ratios
        if self.rescaled or self.tp_rescaled:
            warnings.warn(
                f"cost profile {self.source} measured on {profile.model.name!r} at TP "
                f"{profile.tensor_parallel_size} is rescaled to {target.name!r} at TP {tp} "
                f"(ratios: weights {ratios.weights:.3g}, kv {ratios.kv:.3g}, attention {ratios.attention:.3g}, "
                f"head {ratios.head:.3g}, block {ratios.block:.3g}); times are an extrapolation, not a measurement",
                stacklevel=2,
            )
        self.block_size = int(block_size if block_size is not None else profile.block_size)
        if self.block_size <= 0:
            raise CostModelError(f"block_size must be positive, got {self.block_size}")

        c = profile.coefficients
        per_context, copy, swap = self._block_size_coefficients(self.block_size)
        if host_bandwidth_bytes_per_s is not None:
            if swap.measured:
                raise CostModelError(
                    f"cost profile {self.source} has measured swap times; a host bandwidth cannot replace them"
                )
            swap = self._analytic_swap(host_bandwidth_bytes_per_s)
        layers = target.num_layers
        # the all-reduce terms are 0.0 at TP 1: adding them leaves those times bit for bit as they were
        self._decode = DecodeCost(
            intercept_s=layers * c.decode_per_layer.intercept_s * ratios.weights
            + c.decode_per_step.intercept_s * ratios.head
            + self.all_reduce.per_iteration_s,
            per_seq_s=layers * c.decode_per_layer.per_seq_s * ratios.weights
            + c.decode_per_step.per_seq_s * ratios.head
            + self.all_reduce.per_token_s,
            per_context_token_s=layers * per_context * ratios.kv,
        )
        p = c.prefill_per_layer
        # One fixed cost per iteration (the layers' prefill intercept and the LM head's): a chunk adds
        # only its marginal time, including the one row of logits it needs.
        prefill_fixed_s = (
            layers * p.intercept_s * ratios.weights
            + c.decode_per_step.intercept_s * ratios.head
            + self.all_reduce.per_iteration_s
        )
        self._linear = LinearIterationCost(
            self._decode,
            PrefillCost(
                fixed_s=prefill_fixed_s,
                per_chunk_s=c.decode_per_step.per_seq_s * ratios.head,  # its one row of logits
                per_token_s=layers * p.per_token_s * ratios.weights + self.all_reduce.per_token_s,
                per_pair_s=layers * p.per_attention_pair_s * ratios.attention,
                windows=self.attention_windows,
            ),
        )
        self._copy = (copy.intercept_s, copy.per_block_s * ratios.block)
        self._swap = (swap.intercept_s, swap.per_block_s * ratios.block)
        self.swap_measured = swap.measured
        self.measured = profile.measured
        kind = "measured profile" if profile.measured else "analytic profile"
        if profile.measured and profile.analytic_parts:
            kind = "partly measured profile"
        origin = f"{profile.source['name']}: " if profile.source and "name" in profile.source else ""
        mode = ""
        if profile.device.kind == "cuda" and profile.source is None:
            mode = ", CUDA graphs" if profile.grid.get("cuda_graphs") else ", eager"
        self.label = tensor_parallel_label(
            f"{kind}: {origin}{profile.device.name} ({profile.device.kind}, {profile.dtype}{mode}), "
            f"{profile.model.name}"
            + (f" rescaled to {target.name}" if self.rescaled else "")
            + (f" rescaled from TP {profile.tensor_parallel_size}" if self.tp_rescaled else ""),
            self.all_reduce,
        )
        self.error_band = (
            profile_error_band(profile)
            + (f"; rescaled to {target.name}: not validated" if self.rescaled else "")
            + (
                f"; rescaled from TP {profile.tensor_parallel_size} to {tp}: not validated"
                if self.tp_rescaled
                else ""
            )
            + ("; all-reduce time analytic (not measured)" if tp > 1 else "")
        )

    def _check_tensor_parallel(self, tp: int, rescale: bool, gpu: GpuSpec | None) -> int:
        """The run's TP after vLLM's checks; refuses a profile measured at another TP unless
        ``rescale``, and TP > 1 without a GPU (its link times the all-reduces). Sets ``tp_rescaled``."""
        checked_tensor_parallel(self.target, tp)
        measured = self.profile.tensor_parallel_size
        self.tp_rescaled = tp != measured
        if self.tp_rescaled and not rescale:
            raise CostModelError(
                f"cost profile {self.source} was measured at tensor_parallel_size {measured}, but the engine "
                f"runs at tensor_parallel_size {tp}. Calibrate at that size, or set "
                "`tensor_parallel_rescale: true` in cost_model to divide the profile's per-GPU times by the "
                "TP ratio (with analytic all-reduce time added)."
            )
        if tp > 1 and gpu is None:
            raise CostModelError(
                f"cost profile {self.source}: tensor_parallel_size {tp} needs the GPU (its link times the all-reduces)"
            )
        return tp

    @classmethod
    def from_yaml(
        cls,
        path: str | Path,
        model: ModelSpec | ProfileModel | None = None,
        rescale: bool = False,
        *,
        block_size: int | None = None,
        host_bandwidth_bytes_per_s: float | None = None,
        tensor_parallel_size: int = 1,
        tensor_parallel_rescale: bool = False,
        gpu: GpuSpec | None = None,
    ) -> ProfileCostModel:
        return cls(
            load_profile(path),
            model,
            rescale=rescale,
            block_size=block_size,
            host_bandwidth_bytes_per_s=host_bandwidth_bytes_per_s,
            source=path,
            tensor_parallel_size=tensor_parallel_size,
            tensor_parallel_rescale=tensor_parallel_rescale,
            gpu=gpu,
        )

    def _block_size_coefficients(self, block_size: int) -> tuple[float, BlockCoefficients, BlockCoefficients]:
        c = self.profile.coefficients
        sweep = {point.block_size: point for point in c.block_size_sweep}
        # the main grid's fit is authoritative at its own block size
        sweep[self.profile.block_size] = BlockSizePoint(
            block_size=self.profile.block_size,
            per_context_token_s=c.decode_per_layer.per_context_token_s,
            block_copy=c.block_copy,
            block_swap=c.block_swap,
        )
        points = sorted(sweep.values(), key=lambda point: point.block_size)

        def interp(get: Any) -> float:
            return _interpolate_log2([(point.block_size, float(get(point))) for point in points], block_size)

        def blocks(get: Any) -> BlockCoefficients:
            chosen: BlockCoefficients = get(points[0])
            per_slot = interp(lambda point: get(point).per_block_s / point.block_size)
            return BlockCoefficients(
                intercept_s=interp(lambda point: get(point).intercept_s),
                per_block_s=per_slot * block_size,
                measured=chosen.measured,
                note=chosen.note,
            )

        return (
            interp(lambda point: point.per_context_token_s),
            blocks(lambda point: point.block_copy),
            blocks(lambda point: point.block_swap),
        )

    def _analytic_swap(self, host_bandwidth_bytes_per_s: float) -> BlockCoefficients:
        if host_bandwidth_bytes_per_s <= 0:
            raise CostModelError(f"host bandwidth must be positive, got {host_bandwidth_bytes_per_s}")
        block_bytes = profile_block_bytes(self.profile, self.block_size)
        return BlockCoefficients(
            intercept_s=0.0,
            per_block_s=block_bytes / host_bandwidth_bytes_per_s,
            measured=False,
            note=f"analytic: block bytes / {host_bandwidth_bytes_per_s / 1e9:g} GB/s host link",
        )

    @property
    def decode(self) -> DecodeCost:
        return self._decode

    def copy_blocks_s(self, num_blocks: int) -> float:
        return 0.0 if num_blocks <= 0 else self._copy[0] + self._copy[1] * num_blocks

    def swap_blocks_s(self, num_blocks: float) -> float:
        return 0.0 if num_blocks <= 0 else self._swap[0] + self._swap[1] * num_blocks


def _band(phase: str, report: dict[str, Any]) -> str | None:
    held = report.get("holdout")
    if not isinstance(held, dict) or not held.get("n_points"):
        return None
    if "min_signed_rel_err" in held:
        low, high = held["min_signed_rel_err"] * 100, held["max_signed_rel_err"] * 100
        return f"{phase} {low:+.0f}..{high:+.0f} %"
    return f"{phase} mean {held['mean_rel_err']:.0%} / max {held['max_rel_err']:.0%}"


def profile_error_band(profile: CostProfile) -> str:
    """A short band for a profile: its fits' signed (or absolute) errors on the points it held out.

    An analytic profile has no points of its own; it gets the analytic roofline's band."""
    if not profile.measured:
        return f"analytic profile, same times as the roofline: {ANALYTIC_ERROR_BAND}"
    parts = [
        band
        for band in (_band(phase, profile.fit_quality.get(phase, {})) for phase in ("decode", "prefill"))
        if band
    ]
    if not parts:
        return "no held-out points: not validated"
    what = profile.source.get("name", "the measurement") if profile.source else "the measurement"
    return f"{', '.join(parts)} vs held-out points of {what} ({profile.device.name}, fit of kvsim's forms)"


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "float8_e4m3fn": 1}


def profile_block_bytes(profile: CostProfile, block_size: int | None = None) -> int:
    """Bytes of one block (K and V, every layer of the profile's model) in the profile's dtype."""
    size = profile.block_size if block_size is None else block_size
    dtype_bytes = DTYPE_BYTES.get(profile.dtype, profile.model.weight_dtype_bytes)
    return profile.model.num_layers * kv_elements_per_token_per_layer(profile.model) * dtype_bytes * size


# --------------------------------------------------------------------------------------------------
# Configuration: the ``cost_model:`` key of an experiment YAML
# --------------------------------------------------------------------------------------------------


class CostModelConfig(ConfigModel):
    """``cost_model:`` in an experiment YAML. Accepted forms::

        cost_model: derated                                   # the default
        cost_model: analytic
        cost_model: {kind: analytic, host_bandwidth_gb_per_s: 25}
        cost_model: {profile: configs/profiles/cpu-qwen2.5-0.5b.yaml, rescale: false}
        cost_model: configs/profiles/cpu-qwen2.5-0.5b.yaml      # a path ending in .yaml/.yml

    ``derated`` takes its efficiency factors from the GPU (``gpu: {base: ..., efficiency: {...}}``
    overrides them). ``host_bandwidth_gb_per_s`` (10^9 bytes/s) sets the swap link for ``derated``
    and ``analytic`` (default: one direction of the GPU preset's PCIe link), and for a profile whose
    swaps were not measured (CPU and Vidur profiles; default: the profile's own, 25 GB/s).
    ``tensor_parallel_rescale: true`` lets a profile measured at one TP run at another.
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    kind: Literal["derated", "analytic", "profile"] = "derated"
    """derated: the roofline with the GPU's efficiency factors; analytic: the plain roofline; profile:
    coefficients measured by ``kvsim calibrate`` (or converted from Vidur)."""
    profile: str | None = Field(default=None, json_schema_extra={FILE_FIELD: []})
    """Path to a calibration profile; relative paths resolve against the experiment file's folder,
    then the repository root."""
    rescale: bool = False
    """Allow a profile measured on another model to be rescaled by shape ratios (with a warning)."""
    tensor_parallel_rescale: bool = False
    """Allow a profile measured at another ``tensor_parallel_size`` to be used: its per-GPU times are
    divided by the TP ratio and all-reduce time is added analytically (with a warning)."""
    host_bandwidth_gb_per_s: float | None = Field(default=None, gt=0)
    """Host link for swaps in 10^9 bytes/s, one direction (derated and analytic default: half the GPU
    preset's PCIe figure, e.g. 32 for PCIe Gen4 x16; also for profiles without measured swaps)."""
    time_scale: float = Field(default=1.0, gt=0)
    """Multiply every GPU-side time (iterations, block copies; not host-link swaps or the client's
    request overhead) by this: 1.1 asks what happens if the GPU is 10 % slower than modelled. Plans
    search again at the edges of the cost model's error band this way (``sim/costs/scaled.py``)."""
    calibration: str = Field(default="default", json_schema_extra={FILE_FIELD: []})  # a name or a file
    """derated only: the serving terms fitted to measured runs (``sim/costs/serving.py``): ``default``
    (the shipped fit, ``sim/costs/serving_calibration.yaml``), ``none`` (kernel-level factors only), or
    the path of a file written by ``kvsim calibrate --from-runs``."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if data is None:
            return {}
        if isinstance(data, str):
            if data in ("analytic", "derated"):
                return {"kind": data}
            if data.endswith((".yaml", ".yml")):
                return {"kind": "profile", "profile": data}
            raise ValueError(
                f"cost_model must be 'derated', 'analytic', a profile path (.yaml) or a mapping, got {data!r}"
            )
        if isinstance(data, dict) and "profile" in data and "kind" not in data:
            return {**data, "kind": "profile"}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> CostModelConfig:
        if self.kind == "profile" and not self.profile:
            raise ValueError("cost_model kind 'profile' needs `profile: PATH`")
        if self.kind != "profile" and (self.profile or self.rescale or self.tensor_parallel_rescale):
            raise ValueError(
                f"cost_model kind {self.kind!r} takes no `profile`, `rescale` or `tensor_parallel_rescale`"
            )
        if self.kind != "derated" and self.calibration != "default":
            raise ValueError(f"cost_model kind {self.kind!r} takes no `calibration` (only derated does)")
        return self


def resolve_profile_path(
    path: str | Path, base_dir: str | Path | None = None, what: str = "cost profile"
) -> Path:
    """An absolute path as is; a relative one against ``base_dir``, then the repository root."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute():
        tried = [candidate]
    else:
        tried = [Path(base_dir) / candidate] if base_dir is not None else []
        tried.append(REPO_ROOT / candidate)
    for option in tried:
        if option.is_file():
            return option
    raise CostModelError(
        f"{what} {str(path)!r} not found; tried: {', '.join(str(option) for option in tried)}"
    )
