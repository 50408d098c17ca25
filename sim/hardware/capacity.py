"""KV-cache pool sizing, the way vLLM sizes ``num_gpu_blocks`` at start-up.

vLLM (``vllm/v1/worker/gpu_worker.py``, ``kv_cache_utils.py``) does, per GPU::

    requested   = ceil(total_gpu_memory x gpu_memory_utilization)
    available   = requested - (weights + peak activation + non-torch memory)
    num_blocks  = available // (block_size x kv_bytes_per_token)

then logs ``GPU KV cache size: N tokens`` (N = num_blocks x block_size) and ``Maximum concurrency
for L tokens per request: X.XXx`` (X = num_blocks / ceil(L / block_size)). ``kv_cache_memory_bytes``
replaces the computed ``available``; ``num_gpu_blocks_override`` replaces ``num_blocks``.

:func:`size_kv_pool` does the same arithmetic with a model and a GPU from :mod:`sim.hardware.models` and
:mod:`sim.hardware.gpus`. Profiling is replaced by an estimate (:func:`estimate_activation_reserve`) that
the caller can override with ``activation_reserve_bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from sim.hardware.gpus import GpuSpec, resolve_gpu
from sim.hardware.models import ModelSpec, check_expert_parallel, resolve_model

__all__ = [
    "DEFAULT_PROFILE_NUM_SEQS",
    "DEFAULT_PROFILE_TOKENS",
    "KVCapacity",
    "ModelDoesNotFitError",
    "estimate_activation_reserve",
    "size_kv_pool",
]

GiB = 2**30

# The profiling forward pass the default activation reserve is sized for: a batch of
# max_num_batched_tokens tokens (8192 is what a vLLM server profiles an 8k-context model with) and a
# sampler run over max_num_seqs sequences (vLLM's default max_num_seqs is 256).
DEFAULT_PROFILE_TOKENS = 8192
DEFAULT_PROFILE_NUM_SEQS = 256

Source = Literal["gpu_memory_utilization", "kv_cache_memory_bytes", "num_gpu_blocks_override"]


MOST_OVERRIDE_BLOCKS = 2**26
"""The most blocks ``num_gpu_blocks_override`` may ask for. The override is a what-if (the README runs
a pool of 250,000 blocks, 3.5 times what an H200 holds), but kvsim builds a block pool's tables in
memory: 56 bytes a block at the peak (measured building `paged` of 4.2 M blocks: 0.27 s), so 2**26
blocks take about 3.5 GiB and 4 s. No GPU's pool comes near: an H200 (141 GiB) holds 770,048 blocks of 16
tokens of a 0.5 B model (12 KiB a token)."""


class OverrideTooLargeError(ValueError):
    """``num_gpu_blocks_override`` is above :data:`MOST_OVERRIDE_BLOCKS`; ``detail`` is the message
    without the key's name (a caller that knows its path in a file puts that first)."""

    def __init__(self, detail: str):
        super().__init__(f"num_gpu_blocks_override: {detail}")
        self.detail = detail


class ModelDoesNotFitError(ValueError):
    """The weights (plus the activation reserve) leave no room for even one KV block.

    The message carries the numbers; so do the attributes (bytes): ``memory_bytes``, ``budget_bytes``
    (the memory the instance may use), ``weight_bytes``, ``activation_reserve_bytes`` and
    ``left_bytes`` (negative when the weights alone do not fit).
    """

    def __init__(
        self,
        message: str,
        *,
        memory_bytes: int = 0,
        budget_bytes: int = 0,
        weight_bytes: int = 0,
        activation_reserve_bytes: int = 0,
        left_bytes: int = 0,
    ) -> None:
        super().__init__(message)
        self.memory_bytes = memory_bytes
        self.budget_bytes = budget_bytes
        self.weight_bytes = weight_bytes
        self.activation_reserve_bytes = activation_reserve_bytes
        self.left_bytes = left_bytes


@dataclass(frozen=True)
class KVCapacity:
    """The KV pool of one GPU (one tensor-parallel rank).

    ``kv_bytes_per_token`` is per GPU: under tensor parallelism each rank caches its share of the
    KV heads for every token, so every rank holds the same ``num_gpu_blocks`` and the engine's
    token capacity is :attr:`kv_pool_tokens`.
    """

    kv_bytes_per_token: int
    block_size: int
    num_gpu_blocks: int
    kv_pool_bytes: int
    available_kv_bytes: int
    weight_bytes: int
    activation_reserve_bytes: int
    source: Source
    tensor_parallel_size: int = 1
    """GPUs of the instance; every number above is per GPU (each holds the same pool)."""
    expert_parallel_size: int = 1
    """GPUs a mixture of experts' routed experts are dealt over (``weight_bytes`` holds this GPU's share)."""
    data_parallel_size: int = 1
    """Data-parallel ranks of the server, each with ``tensor_parallel_size`` GPUs and a pool of its own
    like this one."""

    @property
    def block_bytes(self) -> int:
        """Bytes of one block (all layers) on one GPU."""
        return self.block_size * self.kv_bytes_per_token

    @property
    def kv_pool_tokens(self) -> int:
        """Tokens the pool holds: ``num_gpu_blocks x block_size`` (vLLM's "GPU KV cache size")."""
        return self.num_gpu_blocks * self.block_size

    @property
    def kv_memory_slots(self) -> int:
        """Token slots the KV memory holds before any rounding to blocks: ``available // bytes per
        token``. A pool without blocks (contiguous allocation) is this many slots, whatever
        ``block_size`` is; with ``num_gpu_blocks_override`` it is that many whole blocks."""
        return self.available_kv_bytes // self.kv_bytes_per_token

    def max_concurrency(self, tokens_per_request: int) -> float:
        """Requests of ``tokens_per_request`` tokens that fit at once: blocks / ceil(L / block_size)."""
        if (
            isinstance(tokens_per_request, bool)
            or not isinstance(tokens_per_request, int)
            or tokens_per_request <= 0
        ):
            raise ValueError(f"tokens_per_request must be a positive integer, got {tokens_per_request!r}")
        return self.num_gpu_blocks / math.ceil(tokens_per_request / self.block_size)

    def capacity_lines(self, max_model_len: int) -> list[str]:
        """vLLM's two start-up lines, character for character (with TP vLLM prints them once for the
        instance: each GPU holds ``num_gpu_blocks`` blocks of its share of every token; with DP each
        rank prints its own, the same). With several GPUs a third line gives the per-GPU memory."""
        lines = [
            f"GPU KV cache size: {self.kv_pool_tokens:,} tokens",
            f"Maximum concurrency for {max_model_len:,} tokens per request: {self.max_concurrency(max_model_len):.2f}x",
        ]
        parallel = (
            [f"tensor_parallel_size {self.tensor_parallel_size}"] if self.tensor_parallel_size > 1 else []
        )
        if self.data_parallel_size > 1:
            parallel.insert(0, f"data_parallel_size {self.data_parallel_size} (a pool per rank)")
        if self.expert_parallel_size > 1:
            parallel.append(f"routed experts dealt over {self.expert_parallel_size} GPUs")
        if parallel:
            lines.append(
                f"{', '.join(parallel)}, per GPU: weights {_gib(self.weight_bytes)}, "
                f"activation reserve {_gib(self.activation_reserve_bytes)}, KV cache {_gib(self.kv_pool_bytes)} "
                f"({self.kv_bytes_per_token:,} B per token)"
            )
        return lines


def estimate_activation_reserve(
    model: ModelSpec | str,
    *,
    num_tokens: int = DEFAULT_PROFILE_TOKENS,
    num_seqs: int = DEFAULT_PROFILE_NUM_SEQS,
    tensor_parallel_size: int = 1,
) -> int:
    """Peak activation memory of vLLM's profiling run, estimated from the model's shapes (bytes).

    vLLM profiles one forward pass of ``max_num_batched_tokens`` tokens plus a sampler run over
    ``max_num_seqs`` sequences, and keeps the peak out of the KV pool. The estimate counts what is
    alive at the MLP, the widest point of a layer, per token and per GPU:

    * MLP: gate and up projections and their activated product, ``3 x intermediate / tp``
      (``2 x`` for an ungated MLP: fc1 output and its ReLU);
    * attention: the fused q/k/v projection output, ``(heads / tp + 2 x kv_heads_per_gpu) x head_dim``;
    * four hidden-sized tensors: residual, normed input, attention output, o_proj output;

    all at the activation dtype (2 bytes; 4 for an fp32 model), times ``num_tokens``; plus fp32
    logits ``num_seqs x vocab x 4`` for the sampler run.

    For Llama-3.1-8B at 8192 tokens this is 1 GiB + 125 MiB = 1.12 GiB; vLLM's own profiler reports
    1.20-1.26 GiB of "PyTorch activation peak memory" for Llama-3-8B (same shapes) in published
    start-up logs (vLLM PR #10511, issue logs). Non-torch memory (CUDA context, cuBLAS/NCCL
    workspaces: 0.1-1.8 GiB in those logs) and CUDA graphs are not included; pass
    ``activation_reserve_bytes`` to :func:`size_kv_pool` to account for them.
    """
    spec = resolve_model(model)
    for label, value, minimum in (
        ("num_tokens", num_tokens, 0),
        ("num_seqs", num_seqs, 0),
        ("tensor_parallel_size", tensor_parallel_size, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{label} must be an integer >= {minimum}, got {value!r}")
    tp = tensor_parallel_size
    mlp = (3 if spec.gated_mlp else 2) * math.ceil(spec.intermediate_size / tp)
    kv_heads = max(1, spec.num_kv_heads // tp)
    qkv = (math.ceil(spec.num_attention_heads / tp) + 2 * kv_heads) * spec.head_dim
    per_token_elements = mlp + qkv + 4 * spec.hidden_size
    return num_tokens * per_token_elements * spec.activation_dtype_bytes + num_seqs * spec.vocab_size * 4


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def size_kv_pool(
    model: ModelSpec | str,
    gpu: GpuSpec | str | Mapping[str, object],
    *,
    block_size: int = 16,
    kv_cache_dtype: str = "auto",
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    num_gpu_blocks_override: int | None = None,
    tensor_parallel_size: int = 1,
    expert_parallel_size: int = 1,
    data_parallel_size: int = 1,
    draft_weight_bytes: int = 0,
    draft_kv_bytes_per_token: int = 0,
) -> KVCapacity:
    """Size the KV pool of one GPU like vLLM.

    ``draft_weight_bytes`` and ``draft_kv_bytes_per_token``: speculative decoding's draft
    (``sim/hardware/draft.py``), whose weights load beside the target's and whose layers keep K/V in
    every token's slot of the same pool, as vLLM registers them.

    The pool comes from the first of these that is set:

    * ``num_gpu_blocks_override``: exactly that many blocks (vLLM's testing knob). The model must
      still load (weights + reserve within the ``gpu_memory_utilization`` budget); the blocks
      themselves are not checked against memory (a what-if pool may be larger than the GPU), only
      against :data:`MOST_OVERRIDE_BLOCKS`, the most kvsim builds.
    * ``kv_cache_memory_bytes``: that many bytes of KV cache, whatever the utilisation; weights,
      reserve and cache must fit in the GPU's whole memory.
    * otherwise ``memory_bytes x gpu_memory_utilization - weights - activation reserve``.

    Setting both ``num_gpu_blocks_override`` and ``kv_cache_memory_bytes`` is an error.

    Activation reserve: by default :func:`estimate_activation_reserve` for one profiling pass of
    8192 tokens and 256 sampled sequences, i.e. the peak activation vLLM's profiler would measure,
    scaled with the model's width. It was chosen over a fixed reserve because it follows the model
    (0.97 GiB for Llama-2-7B, 2.09 GiB for Llama-3.1-70B at tp 1) and lands about 10 % under the
    peaks vLLM logs for 8B models (1.12 vs 1.20-1.26 GiB); it does not include non-torch memory (CUDA context, NCCL buffers) or CUDA
    graphs, which vLLM's newest releases also subtract, so real pools can be up to ~2 GiB smaller.
    Set ``activation_reserve_bytes`` to the sum from a real start-up log to match it exactly.

    Tensor parallelism: each GPU holds ``weights / tp`` and ``max(1, kv_heads // tp)`` KV heads per
    layer (an MLA latent is replicated on every GPU).

    Data and expert parallelism (vLLM ``--data-parallel-size``, ``--enable-expert-parallel``): each of
    the ``data_parallel_size`` ranks sizes its own pool from its own GPUs, as here; with
    ``expert_parallel_size`` > 1 a GPU holds ``num_experts / ep`` whole routed experts per MoE layer
    and its TP share of the rest (:meth:`ModelSpec.weight_bytes_per_gpu`), so the pool grows by the
    experts it does not hold. Its KV heads are those of its TP group, as without.

    Raises ``ModelDoesNotFitError`` (a ``ValueError``) with the numbers when not even one block
    fits, and ``ValueError`` for invalid arguments.
    """
    spec = resolve_model(model)
    card = resolve_gpu(gpu)

    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive integer (tokens per block), got {block_size!r}")
    if (
        isinstance(gpu_memory_utilization, bool)
        or not isinstance(gpu_memory_utilization, int | float)
        or not 0 < gpu_memory_utilization <= 1
    ):
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    if activation_reserve_bytes is not None and (
        isinstance(activation_reserve_bytes, bool)
        or not isinstance(activation_reserve_bytes, int)
        or activation_reserve_bytes < 0
    ):
        raise ValueError(
            f"activation_reserve_bytes must be a non-negative integer, got {activation_reserve_bytes!r}"
        )
    if kv_cache_memory_bytes is not None and (
        isinstance(kv_cache_memory_bytes, bool)
        or not isinstance(kv_cache_memory_bytes, int)
        or kv_cache_memory_bytes <= 0
    ):
        raise ValueError(f"kv_cache_memory_bytes must be a positive integer, got {kv_cache_memory_bytes!r}")
    if num_gpu_blocks_override is not None and (
        isinstance(num_gpu_blocks_override, bool)
        or not isinstance(num_gpu_blocks_override, int)
        or num_gpu_blocks_override <= 0
    ):
        raise ValueError(
            f"num_gpu_blocks_override must be a positive integer, got {num_gpu_blocks_override!r}"
        )
    if kv_cache_memory_bytes is not None and num_gpu_blocks_override is not None:
        raise ValueError("set at most one of kv_cache_memory_bytes and num_gpu_blocks_override")
    spec.check_tensor_parallel(tensor_parallel_size)
    tp = tensor_parallel_size
    ep = expert_parallel_size
    for label, value in (("expert_parallel_size", ep), ("data_parallel_size", data_parallel_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be an integer >= 1, got {value!r}")
    if ep > 1:
        if ep % tp:
            raise ValueError(f"expert_parallel_size ({ep}) must be a multiple of tensor_parallel_size ({tp})")
        check_expert_parallel(spec, ep // tp, tp, enable_expert_parallel=True)

    kv_bpt = spec.kv_bytes_per_token(kv_cache_dtype, tensor_parallel_size=tp) + draft_kv_bytes_per_token
    block_bytes = block_size * kv_bpt
    weights = spec.weight_bytes_per_gpu(tp, ep) + draft_weight_bytes
    reserve = (
        activation_reserve_bytes
        if activation_reserve_bytes is not None
        else estimate_activation_reserve(spec, tensor_parallel_size=tp)
    )
    # Exact decimal product: 0.9 x 80 GiB is 77,309,411,328 bytes, not one more from float rounding.
    budget = math.ceil(Decimal(card.memory_bytes) * Decimal(repr(float(gpu_memory_utilization))))
    shares = [f"tensor_parallel_size={tp}"] if tp > 1 else []
    shares += [f"experts dealt over {ep} GPUs"] if ep > 1 else []
    where = f"{spec.name} on {card.name}" + (f" ({', '.join(shares)}, per GPU)" if shares else "")
    split = f"/ tp {tp}" if ep == 1 else f"/ tp {tp}, routed experts / ep {ep}"

    def no_fit(total_label: str, total: int, left: int, kv_label: str) -> ModelDoesNotFitError:
        reason = (
            "the weights alone exceed it"
            if weights > total
            else f"less than one KV block ({block_bytes:,} bytes) is left"
        )
        return ModelDoesNotFitError(
            f"{where} does not fit: {total_label} = {_gib(total)}; weights {_gib(weights)} "
            f"({spec.num_params:,} params x {spec.weight_dtype_bytes} B {split}"
            + (f", with the speculative draft's {_gib(draft_weight_bytes)}" if draft_weight_bytes else "")
            + "); activation reserve "
            f"{_gib(reserve)}; {kv_label} {_gib(left)} ({left:,} bytes): {reason}. "
            "Use a bigger GPU, a larger tensor_parallel_size, a higher gpu_memory_utilization or "
            "smaller weights (weight_dtype_bytes).",
            memory_bytes=card.memory_bytes,
            budget_bytes=total,
            weight_bytes=weights,
            activation_reserve_bytes=reserve,
            left_bytes=left,
        )

    budget_label = f"GPU memory {_gib(card.memory_bytes)} x gpu_memory_utilization {gpu_memory_utilization:g}"
    if num_gpu_blocks_override is not None:
        left = budget - weights - reserve
        if left < 0:
            raise no_fit(budget_label, budget, left, "left before the KV cache:")
        if num_gpu_blocks_override > MOST_OVERRIDE_BLOCKS:
            raise OverrideTooLargeError(
                f"{num_gpu_blocks_override:,} blocks are more than kvsim builds a pool of "
                f"({MOST_OVERRIDE_BLOCKS:,} blocks; {where} holds "
                f"{card.memory_bytes // block_bytes:,} blocks of {block_bytes:,} bytes in all its memory)"
            )
        blocks = num_gpu_blocks_override
        available = blocks * block_bytes
        source: Source = "num_gpu_blocks_override"
    elif kv_cache_memory_bytes is not None:
        if kv_cache_memory_bytes < block_bytes:
            raise ValueError(
                f"kv_cache_memory_bytes ({kv_cache_memory_bytes:,}) is smaller than one KV block "
                f"({block_bytes:,} bytes = {block_size} tokens x {kv_bpt:,} bytes)"
            )
        left = card.memory_bytes - weights - reserve - kv_cache_memory_bytes
        if left < 0:
            raise no_fit(
                f"GPU memory {_gib(card.memory_bytes)}",
                card.memory_bytes,
                card.memory_bytes - weights - reserve,
                f"left for kv_cache_memory_bytes={_gib(kv_cache_memory_bytes)}:",
            )
        available = kv_cache_memory_bytes
        blocks = available // block_bytes
        source = "kv_cache_memory_bytes"
    else:
        available = budget - weights - reserve
        if available < block_bytes:
            raise no_fit(budget_label, budget, available, "left for the KV cache:")
        blocks = available // block_bytes
        source = "gpu_memory_utilization"

    return KVCapacity(
        kv_bytes_per_token=kv_bpt,
        block_size=block_size,
        num_gpu_blocks=blocks,
        kv_pool_bytes=blocks * block_bytes,
        available_kv_bytes=available,
        weight_bytes=weights,
        activation_reserve_bytes=reserve,
        source=source,
        tensor_parallel_size=tp,
        expert_parallel_size=ep,
        data_parallel_size=data_parallel_size,
    )
