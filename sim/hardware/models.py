"""Model shapes: what a model costs in KV-cache bytes per token and in weight bytes.

A :class:`ModelSpec` holds the few numbers of a Hugging Face ``config.json`` that memory sizing needs.
Specs come from three places:

* :data:`MODEL_PRESETS`, a curated table checked by hand against the published configs (the source
  is named beside each preset). Mirrors of configs are often wrong, so presets are not scraped.
* :func:`model_from_hf_config`, which reads a ``config.json`` (file or directory).
* :func:`resolve_model`, which accepts either: a preset name (case-insensitive; Hugging Face ids such
  as ``"meta-llama/Llama-3.1-8B"`` or ``"Qwen/Qwen2.5-7B-Instruct"`` also work) or a path.

KV bytes per token, over all layers, at tensor-parallel size 1:

* MHA / GQA / MQA: ``2 (K and V) x layers x kv_heads x head_dim x dtype_bytes``
  (vLLM ``AttentionSpec.page_size_bytes`` divided by the block size, summed over layers).
* MLA (DeepSeek-V2/V3): one latent vector per token per layer, no separate K and V:
  ``(kv_lora_rank + qk_rope_head_dim) x layers x dtype_bytes`` (vLLM ``MLAAttentionSpec``:
  one "kv head" of size 576, no factor 2).

Config traps handled here: ``head_dim`` is read before ``hidden_size // num_attention_heads``
(Gemma-2: 256 vs 2304/8 = 288); ``num_key_value_heads`` absent means MHA; newer configs write
``dtype`` instead of ``torch_dtype``; for MLA the config's ``head_dim`` (transformers sets it to
``qk_rope_head_dim``) and ``num_key_value_heads`` (= query heads) do not describe the cache.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any, Literal

from sim.hardware.layers import (
    ATTENTION_KINDS,
    FULL_ATTENTION,
    LAYER_KINDS,
    MLP_ONLY,
    STATE_KINDS,
    AttentionKind,
    ChunkedLocal,
    FullAttention,
    GatedDeltaNetState,
    LayerKind,
    Mamba2State,
    MlpOnly,
    SlidingWindow,
    StateKind,
    kind_counts,
    layer_kinds_from_hf_config,
    mamba_dtype_bytes,
    positive_int_field,
)

__all__ = [
    "KV_CACHE_DTYPES",
    "MODEL_PRESETS",
    "ModelSpec",
    "activation_dtype_bytes",
    "check_expert_parallel",
    "check_tensor_parallel",
    "expert_parallel_problems",
    "expert_parallel_size",
    "estimate_num_params",
    "model_from_hf_config",
    "resolve_model",
]

# kv_cache_dtype -> bytes per element; "auto" (the model dtype) is resolved per model.
# Names follow vLLM's ``--kv-cache-dtype`` choices.
KV_CACHE_DTYPES: dict[str, int | None] = {
    "auto": None,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,  # MLA only; sized specially below
}

# vLLM's "fp8_ds_mla" (DeepSeek's FlashMLA fp8 layout) stores, per token and layer, 512 fp8 latent
# values, 4 float32 scales and the 64 rope dims in bf16: 512 + 16 + 128 = 656 bytes.
_FP8_DS_MLA_BYTES_PER_LAYER = 656


@dataclass(frozen=True)
class ModelSpec:
    """Shapes of a decoder-only transformer, as far as memory sizing needs them.

    ``num_params`` is the total parameter count (weights bytes = ``num_params x weight_dtype_bytes``).
    For a mixture-of-experts model it counts every expert; ``num_active_params`` (optional) counts
    the parameters one token touches, which is what ``2 x params`` FLOPs-per-token estimates want
    (:attr:`active_params` falls back to ``num_params`` for dense models).

    For ``attention="mla"`` the KV cache is sized from ``kv_lora_rank`` and ``qk_rope_head_dim``;
    ``num_kv_heads`` and ``head_dim`` then describe the query/key heads only (``head_dim`` is
    ``qk_nope_head_dim + qk_rope_head_dim`` in the presets).

    ``gated_mlp`` is True for SwiGLU/GeGLU MLPs (three matrices: gate, up, down; Llama, Mistral,
    Qwen, Gemma, DeepSeek) and False for two-matrix MLPs (OPT, GPT-2).

    Mixture of experts (``num_experts`` set): each of the ``num_layers - num_dense_layers`` MoE
    layers has a router (``hidden x num_experts``), ``num_experts`` routed experts, each an MLP of
    width ``moe_intermediate_size``, of which every token uses ``experts_per_token``, and, where the
    architecture has them, shared experts every token uses, ``shared_expert_intermediate_size`` wide
    in all (DeepSeek: ``n_shared_experts x moe_intermediate_size``). The ``num_dense_layers`` other
    layers have a dense MLP of ``intermediate_size`` (DeepSeek's first ``first_k_dense_replace``).
    Only the count of dense layers matters here, not where they sit. Every expert stays in memory
    (``num_params`` counts them all); the cost models read only the experts a batch's tokens touch.
    ``routed_expert_bits`` (optional): bits per routed-expert parameter when a checkpoint stores the
    experts quantised and the rest at ``weight_dtype_bytes`` (gpt-oss: MXFP4, 4-bit values and an
    8-bit scale per 32, 4.25 bits); the routed experts' bytes are rounded up as a whole.

    Layer kinds (``layer_kinds``, optional): one :mod:`sim.hardware.layers` kind per layer for a model
    whose layers are not all full attention: :class:`SlidingWindow`, :class:`ChunkedLocal`, a
    Mamba/linear-attention state (:class:`Mamba2State` ...) or :class:`MlpOnly`. ``None`` (the
    default) means every layer is full attention, and the model behaves exactly as before kinds
    existed. The attention kinds share the model's KV heads and head size; ``num_layers`` counts
    every block, those without attention included (Nemotron-H's Mamba and MLP blocks).
    ``kv_bytes_per_token`` keeps its meaning for every model: the K/V bytes of all attention layers
    treated as full attention (what an allocator that ignores windows holds per token); the kinds'
    own figures are :meth:`kv_bytes_per_token_by_kind` and :meth:`state_bytes_per_request`. The
    hybrid allocators (``sim/kv/``) and the cost models read the kinds; the uniform policies refuse a
    model with state layers.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_params: int
    weight_dtype_bytes: int = 2
    attention: Literal["mha", "mla"] = "mha"
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    max_position_embeddings: int = 4096
    num_active_params: int | None = None
    gated_mlp: bool = True
    num_experts: int | None = None
    experts_per_token: int | None = None
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int = 0
    num_dense_layers: int = 0
    layer_kinds: tuple[LayerKind, ...] | None = dataclass_field(default=None, repr=False)
    routed_expert_bits: float | None = None
    architecture: str | None = dataclass_field(default=None, compare=False)
    """The Hugging Face model class (``config.json``'s ``architectures[0]``, e.g.
    ``Qwen3NextForCausalLM``): what a server's per-architecture defaults key on (SGLang's Mamba
    radix-cache strategy, ``sim/hardware/sglang_mamba_capacity.py``). None: not known (the presets
    name it where a default depends on it). Not compared: two specs of the same shapes are equal."""

    def __post_init__(self) -> None:
        for field in (
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "num_params",
            "weight_dtype_bytes",
            "max_position_embeddings",
        ):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"model {self.name!r}: {field} must be a positive integer, got {value!r}")
        if self.attention not in ("mha", "mla"):
            raise ValueError(f"model {self.name!r}: attention must be 'mha' or 'mla', got {self.attention!r}")
        if self.attention == "mla":
            for field in ("kv_lora_rank", "qk_rope_head_dim"):
                value = getattr(self, field)
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise ValueError(
                        f"model {self.name!r}: attention='mla' needs a positive integer {field}, got {value!r}"
                    )
        elif self.num_attention_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"model {self.name!r}: num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_kv_heads ({self.num_kv_heads})"
            )
        if self.num_active_params is not None and not 0 < self.num_active_params <= self.num_params:
            raise ValueError(
                f"model {self.name!r}: num_active_params must be in (0, num_params], got {self.num_active_params!r}"
            )
        self._check_moe_shape()
        bits = self.routed_expert_bits
        if bits is not None and (
            isinstance(bits, bool)
            or not isinstance(bits, int | float)
            or not 0 < bits <= 32
            or not self.is_moe
        ):
            raise ValueError(
                f"model {self.name!r}: routed_expert_bits must be a number of bits in (0, 32] for a mixture "
                f"of experts, got {bits!r}"
            )
        if self.architecture is not None and (
            not isinstance(self.architecture, str) or not self.architecture
        ):
            raise ValueError(
                f"model {self.name!r}: architecture must be a model class name, got {self.architecture!r}"
            )
        self._check_layer_kinds()

    def _check_layer_kinds(self) -> None:
        kinds = self.layer_kinds
        if kinds is None:
            return
        if not isinstance(kinds, tuple):
            raise ValueError(
                f"model {self.name!r}: layer_kinds must be a tuple with one layer kind per layer, "
                f"got {type(kinds).__name__}"
            )
        if len(kinds) != self.num_layers:
            raise ValueError(
                f"model {self.name!r}: layer_kinds has {len(kinds)} entries but num_layers is {self.num_layers}"
            )
        for layer, kind in enumerate(kinds):
            if not isinstance(kind, LAYER_KINDS):
                raise ValueError(
                    f"model {self.name!r}: layer {layer} has kind {kind!r}; expected one of "
                    f"{', '.join(cls.__name__ for cls in LAYER_KINDS)}"
                )
        for kind, _ in kind_counts(kinds):
            problems = kind.problems()
            if problems:
                raise ValueError(f"model {self.name!r}: {kind.label} layers: {problems[0]}")
        if not any(isinstance(kind, ATTENTION_KINDS) for kind in kinds):
            raise ValueError(
                f"model {self.name!r}: no attention layer among its layer_kinds; kvsim sizes the KV "
                "pool by attention K/V and does not model attention-free models"
            )
        if self.attention == "mla" and any(not isinstance(kind, (FullAttention, MlpOnly)) for kind in kinds):
            raise ValueError(
                f"model {self.name!r}: MLA with sliding-window, chunked or state layers is not modelled; "
                "an MLA model's layer_kinds may hold only FullAttention and MlpOnly"
            )

    def _check_moe_shape(self) -> None:
        moe = ("num_experts", "experts_per_token", "moe_intermediate_size")
        if self.num_experts is None:
            given = [
                field
                for field in (*moe[1:], "shared_expert_intermediate_size", "num_dense_layers")
                if getattr(self, field)
            ]
            if given:
                raise ValueError(
                    f"model {self.name!r}: {', '.join(given)} describe a mixture of experts; set num_experts too"
                )
            return
        for field in moe:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"model {self.name!r}: a mixture of experts needs a positive integer {field}, got {value!r}"
                )
        assert self.experts_per_token is not None
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"model {self.name!r}: experts_per_token ({self.experts_per_token}) exceeds num_experts "
                f"({self.num_experts})"
            )
        for field, upper in (
            ("shared_expert_intermediate_size", None),
            ("num_dense_layers", self.num_layers - 1),
        ):
            value = getattr(self, field)
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < 0
                or (upper is not None and value > upper)
            ):
                bound = f" and below num_layers ({self.num_layers})" if upper is not None else ""
                raise ValueError(
                    f"model {self.name!r}: {field} must be an integer >= 0{bound}, got {value!r}"
                )
        if self.routed_expert_params >= self.num_params:
            raise ValueError(
                f"model {self.name!r}: num_params ({self.num_params:,}) must exceed its routed experts' "
                f"weights ({self.routed_expert_params:,})"
            )

    @property
    def active_params(self) -> int:
        """Parameters used per token: ``num_active_params`` when given; else, for a mixture of
        experts, all but the routed experts a token does not use; all of them for a dense model."""
        if self.num_active_params is not None:
            return self.num_active_params
        return self.num_params - self.inactive_expert_params

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is routed experts (0 for a dense model)."""
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert of one layer (0 for a dense model)."""
        if self.moe_intermediate_size is None:
            return 0
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.moe_intermediate_size

    @property
    def routed_expert_params(self) -> int:
        """Weights of every routed expert of every MoE layer: the part of ``num_params`` a batch reads
        only as far as its tokens route to it."""
        return self.num_moe_layers * (self.num_experts or 0) * self.expert_params

    @property
    def inactive_expert_params(self) -> int:
        """Routed-expert weights one token does not use: ``(num_experts - experts_per_token)`` experts
        in every MoE layer."""
        unused = (self.num_experts or 0) - (self.experts_per_token or 0)
        return self.num_moe_layers * unused * self.expert_params

    @property
    def activated_mlp_width(self) -> int:
        """MLP width one token activates, averaged over the layers (rounded): ``intermediate_size`` for
        a dense model; ``experts_per_token x moe_intermediate_size`` plus the shared experts in MoE
        layers (Mixtral: 2 x 14336, twice its ``intermediate_size``)."""
        if not self.is_moe:
            return self.intermediate_size
        assert self.experts_per_token is not None and self.moe_intermediate_size is not None
        routed = self.experts_per_token * self.moe_intermediate_size + self.shared_expert_intermediate_size
        total = self.num_dense_layers * self.intermediate_size + self.num_moe_layers * routed
        return round(total / self.num_layers)

    def kv_dtype_bytes(self, kv_cache_dtype: str = "auto") -> int:
        """Bytes per cached element for ``kv_cache_dtype`` ("auto" = the weight dtype)."""
        key = kv_cache_dtype.lower()
        if key not in KV_CACHE_DTYPES:
            raise ValueError(
                f"unknown kv_cache_dtype {kv_cache_dtype!r}; expected one of {sorted(KV_CACHE_DTYPES)}"
            )
        size = KV_CACHE_DTYPES[key]
        return self.weight_dtype_bytes if size is None else size

    def kv_bytes_per_token(self, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1) -> int:
        """KV-cache bytes one token occupies on one GPU, summed over all attention layers, each
        treated as full attention (what an allocator that keeps every token holds); state and
        MLP-only layers have no per-token K/V. For a model without layer kinds: all layers.

        With tensor parallelism each GPU keeps ``max(1, num_kv_heads // tp)`` KV heads (heads are
        replicated once ``tp`` exceeds their number); an MLA latent is replicated on every GPU.
        ``tensor_parallel_size=1`` (the default) gives the whole model's bytes per token.
        """
        return (
            self.kv_bytes_per_token_per_layer(kv_cache_dtype, tensor_parallel_size)
            * self.num_attention_layers
        )

    def kv_bytes_per_token_per_layer(
        self, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1
    ) -> int:
        """K/V bytes one token occupies in one attention layer on one GPU (every attention kind has
        the same: only how many tokens it keeps differs). MHA/GQA: ``2 x kv_heads_per_gpu x head_dim
        x dtype``; MLA: ``(kv_lora_rank + qk_rope_head_dim) x dtype`` (656 B for ``fp8_ds_mla``)."""
        if isinstance(tensor_parallel_size, bool) or not isinstance(tensor_parallel_size, int):
            raise ValueError(f"tensor_parallel_size must be an integer, got {tensor_parallel_size!r}")
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        if self.attention == "mla":
            assert self.kv_lora_rank is not None and self.qk_rope_head_dim is not None
            if kv_cache_dtype.lower() == "fp8_ds_mla":
                return _FP8_DS_MLA_BYTES_PER_LAYER
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.kv_dtype_bytes(kv_cache_dtype)
        if kv_cache_dtype.lower() == "fp8_ds_mla":
            raise ValueError(
                f"kv_cache_dtype 'fp8_ds_mla' applies to MLA models only; {self.name!r} is MHA/GQA"
            )
        kv_heads = self.kv_heads_per_gpu(tensor_parallel_size)
        return 2 * kv_heads * self.head_dim * self.kv_dtype_bytes(kv_cache_dtype)

    @property
    def layer_kind_counts(self) -> tuple[tuple[LayerKind, int], ...]:
        """``(kind, layers)`` per distinct layer kind, in the order they first appear;
        ``((FULL_ATTENTION, num_layers),)`` for a model without layer kinds."""
        if self.layer_kinds is None:
            return ((FULL_ATTENTION, self.num_layers),)
        return kind_counts(self.layer_kinds)

    @property
    def num_attention_layers(self) -> int:
        """Layers with per-token K/V (full, sliding-window and chunked attention)."""
        return sum(count for kind, count in self.layer_kind_counts if isinstance(kind, ATTENTION_KINDS))

    @property
    def is_hybrid(self) -> bool:
        """More than one kind of cache (attention kinds and states; MLP-only blocks keep nothing)."""
        return len([kind for kind, _ in self.layer_kind_counts if kind != MLP_ONLY]) > 1

    def kv_bytes_per_token_by_kind(
        self, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1
    ) -> dict[AttentionKind, int]:
        """K/V bytes per token of each attention kind's layers together, one GPU (a sliding-window
        layer keeps them only for the tokens in its window)."""
        per_layer = self.kv_bytes_per_token_per_layer(kv_cache_dtype, tensor_parallel_size)
        return {
            kind: count * per_layer
            for kind, count in self.layer_kind_counts
            if isinstance(kind, (FullAttention, SlidingWindow, ChunkedLocal))
        }

    def state_bytes_by_kind(
        self,
        tensor_parallel_size: int = 1,
        mamba_cache_dtype: str = "auto",
        mamba_ssm_cache_dtype: str = "auto",
    ) -> dict[StateKind, int]:
        """Bytes of one request's fixed state in each state kind's layers together, one GPU
        (conv state at ``mamba_cache_dtype``, SSM state at ``mamba_ssm_cache_dtype``; "auto" as vLLM
        resolves it, :mod:`sim.hardware.layers`). Independent of ``kv_cache_dtype``."""
        return {
            kind: count
            * self.state_bytes_per_layer(kind, tensor_parallel_size, mamba_cache_dtype, mamba_ssm_cache_dtype)
            for kind, count in self.layer_kind_counts
            if isinstance(kind, STATE_KINDS)
        }

    def state_bytes_per_request(
        self,
        tensor_parallel_size: int = 1,
        mamba_cache_dtype: str = "auto",
        mamba_ssm_cache_dtype: str = "auto",
    ) -> int:
        """Bytes of one request's Mamba/linear-attention state over all state layers, one GPU
        (0 for a model without state layers): the part of a request's cache that does not grow."""
        return sum(
            self.state_bytes_by_kind(tensor_parallel_size, mamba_cache_dtype, mamba_ssm_cache_dtype).values()
        )

    def state_bytes_per_layer(
        self,
        kind: StateKind,
        tensor_parallel_size: int = 1,
        mamba_cache_dtype: str = "auto",
        mamba_ssm_cache_dtype: str = "auto",
    ) -> int:
        """One request's state in one layer of ``kind`` on one GPU. The conv state's dtype is
        ``mamba_cache_dtype`` ("auto": the model dtype); the SSM state's is ``mamba_ssm_cache_dtype``,
        whose "auto" is the kind's own ``ssm_dtype`` and then the conv state's dtype."""
        if (
            isinstance(tensor_parallel_size, bool)
            or not isinstance(tensor_parallel_size, int)
            or tensor_parallel_size < 1
        ):
            raise ValueError(f"tensor_parallel_size must be an integer >= 1, got {tensor_parallel_size!r}")
        conv_bytes = mamba_dtype_bytes(mamba_cache_dtype, self.weight_dtype_bytes)
        ssm_name = kind.ssm_dtype if mamba_ssm_cache_dtype.lower() == "auto" else mamba_ssm_cache_dtype
        ssm_bytes = mamba_dtype_bytes(ssm_name, conv_bytes)
        try:
            return kind.state_bytes(tensor_parallel_size, conv_bytes, ssm_bytes)
        except ValueError as exc:
            raise ValueError(f"model {self.name!r}: {kind.label} layers: {exc}") from exc

    def kv_heads_per_gpu(self, tensor_parallel_size: int = 1) -> int:
        """KV heads one GPU holds under tensor parallelism (1 for MLA: the shared latent)."""
        if self.attention == "mla":
            return 1
        return max(1, self.num_kv_heads // tensor_parallel_size)

    def weight_bytes(self) -> int:
        """Bytes of all weights (whole model, tp = 1): ``weight_dtype_bytes`` per parameter, the routed
        experts at ``routed_expert_bits`` when they are quantised."""
        routed = self.routed_expert_params
        return (self.num_params - routed) * self.weight_dtype_bytes + self.routed_expert_bytes

    @property
    def routed_expert_bytes(self) -> int:
        """Bytes of every routed expert of every MoE layer (0 for a dense model)."""
        if self.routed_expert_bits is None:
            return self.routed_expert_params * self.weight_dtype_bytes
        return math.ceil(self.routed_expert_params * self.routed_expert_bits / 8)

    @property
    def expert_bytes_per_param(self) -> float:
        """Bytes one routed-expert parameter takes (what reading an expert costs per parameter)."""
        return self.weight_dtype_bytes if self.routed_expert_bits is None else self.routed_expert_bits / 8

    def weight_bytes_per_gpu(self, tensor_parallel_size: int = 1, expert_parallel_size: int = 1) -> int:
        """Weight bytes one GPU holds: ``ceil(weight_bytes / tp)``. vLLM splits every matrix (QKV and
        MLP by columns, O and down projections by rows, embedding and LM head by vocabulary); the
        replicated norms, ``(2 x layers + 1) x hidden`` parameters (2.6 MB for Llama-3.1-70B), are
        counted split too, an error under 0.01 %.

        With expert parallelism (``expert_parallel_size`` > 1, a mixture of experts) the routed
        experts are not split but dealt out whole: each GPU holds ``num_experts / ep`` of them in
        every MoE layer, and the rest of the model (attention, dense layers, routers, shared experts,
        embedding, LM head) is split over the TP group as without:
        ``ceil(rest / tp) + routed / ep`` (:func:`check_expert_parallel` makes ``ep`` divide the
        experts)."""
        if expert_parallel_size == 1:
            return math.ceil(self.weight_bytes() / tensor_parallel_size)
        routed = self.routed_expert_bytes
        rest = self.weight_bytes() - routed
        return math.ceil(rest / tensor_parallel_size) + routed // expert_parallel_size

    @property
    def activation_dtype_bytes(self) -> int:
        """Bytes of one activation element (:func:`activation_dtype_bytes`)."""
        return activation_dtype_bytes(self.weight_dtype_bytes)

    def check_tensor_parallel(self, tensor_parallel_size: int) -> None:
        """Raise ``ValueError`` for a TP size vLLM would refuse (:func:`check_tensor_parallel`), or
        one that does not divide a Mamba/linear-attention state's heads and widths."""
        check_tensor_parallel(self, tensor_parallel_size)
        self.state_bytes_per_request(tensor_parallel_size)

    def local_experts(self, expert_parallel_size: int) -> int:
        """Routed experts one GPU holds per MoE layer under expert parallelism (all of them at 1)."""
        return (self.num_experts or 0) // expert_parallel_size


def activation_dtype_bytes(weight_dtype_bytes: int) -> int:
    """Bytes of one activation element: 2 (bf16/fp16), or 4 for an fp32 model; fp8 weights still
    compute in 16 bits."""
    return max(2, weight_dtype_bytes)


def check_tensor_parallel(model: Any, tensor_parallel_size: int) -> None:
    """Raise ``ValueError`` for a TP size vLLM would refuse, with vLLM's words. ``model``: anything
    with ``name``, ``num_attention_heads``, ``num_kv_heads`` and ``attention`` (a ``ModelSpec`` or a
    profile's model).

    vLLM's ``ModelConfig.verify_with_parallel_config``: "Total number of attention heads (N) must be
    divisible by tensor parallel size (T)." Its ``QKVParallelLinear`` then needs the KV heads and
    TP to divide one another (more KV heads than TP: split; fewer: replicated, ``tp % kv == 0``).
    """
    tp = tensor_parallel_size
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor_parallel_size must be an integer >= 1, got {tp!r}")
    if model.num_attention_heads % tp != 0:
        raise ValueError(
            f"{model.name}: Total number of attention heads ({model.num_attention_heads}) must be divisible "
            f"by tensor parallel size ({tp})."
        )
    if model.attention == "mha":
        kv = model.num_kv_heads
        if (kv >= tp and kv % tp != 0) or (kv < tp and tp % kv != 0):
            raise ValueError(
                f"{model.name}: num_kv_heads ({kv}) and tensor_parallel_size ({tp}) must divide one another "
                "(vLLM splits KV heads over TP, or replicates them when there are fewer)"
            )


def expert_parallel_size(
    model: Any, data_parallel_size: int, tensor_parallel_size: int, enable_expert_parallel: bool
) -> int:
    """The GPUs a mixture of experts' routed experts are dealt over: ``dp x tp`` with
    ``enable_expert_parallel`` (vLLM's ``EP_SIZE = TP_SIZE x DP_SIZE``), else 1. Raises ``ValueError``
    for what kvsim cannot run (:func:`expert_parallel_problems`)."""
    check_expert_parallel(model, data_parallel_size, tensor_parallel_size, enable_expert_parallel)
    return data_parallel_size * tensor_parallel_size if enable_expert_parallel else 1


def check_expert_parallel(
    model: Any, data_parallel_size: int, tensor_parallel_size: int, enable_expert_parallel: bool
) -> None:
    """Raise ``ValueError`` (``knob: problem``) for the first of :func:`expert_parallel_problems`."""
    problems = expert_parallel_problems(
        model, data_parallel_size, tensor_parallel_size, enable_expert_parallel
    )
    if problems:
        knob, text = problems[0]
        raise ValueError(f"{knob}: {text}")


def expert_parallel_problems(
    model: Any, data_parallel_size: int, tensor_parallel_size: int, enable_expert_parallel: bool
) -> list[tuple[str, str]]:
    """``(knob, problem)`` for data and expert parallelism kvsim does not run. ``model``: anything
    with ``name`` and ``num_experts`` (None for a dense model).

    * ``enable_expert_parallel`` on a dense model: there are no routed experts to deal out.
    * An expert-parallel size (``dp x tp``) that does not divide the routed experts: vLLM would give
      the first ``E mod ep`` GPUs one expert more (``determine_expert_map``), ranks of unequal
      memory and speed, which kvsim does not model.
    * A mixture of experts at ``data_parallel_size`` > 1 without expert parallelism: vLLM then
      splits every expert tensor-parallel over all ``dp x tp`` GPUs, which kvsim does not model.
    """
    for label, value in (
        ("data_parallel_size", data_parallel_size),
        ("tensor_parallel_size", tensor_parallel_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return [(label, f"must be an integer >= 1, got {value!r}")]
    experts: int = getattr(model, "num_experts", None) or 0
    size = data_parallel_size * tensor_parallel_size
    if enable_expert_parallel and not experts:
        return [
            (
                "enable_expert_parallel",
                f"{model.name} is a dense model (no routed experts to deal out over the GPUs); remove "
                "it, or pick a mixture of experts",
            )
        ]
    if enable_expert_parallel and experts % size:
        return [
            (
                "enable_expert_parallel",
                f"the expert-parallel size, data_parallel_size x tensor_parallel_size = "
                f"{data_parallel_size} x {tensor_parallel_size} = {size}, does not divide {model.name}'s "
                f"{experts} routed experts; vLLM would give {experts % size} GPU(s) one expert more, "
                f"which kvsim does not model. Choose sizes whose product divides {experts}",
            )
        ]
    if experts and data_parallel_size > 1 and not enable_expert_parallel:
        return [
            (
                "data_parallel_size",
                f"{data_parallel_size} on {model.name}, a mixture of experts, without "
                "enable_expert_parallel: vLLM then splits every expert tensor-parallel over all "
                f"{size} GPUs, which kvsim does not model. Set enable_expert_parallel: true, or use "
                "cluster: {replicas: N} for independent copies",
            )
        ]
    return []


# ---------------------------------------------------------------------------------------------
# Presets.
#
# Every shape below was compared with the published config.json of the checkpoint named in the
# comment (via copies of those files in public repositories; exact values are quoted where they
# matter). num_params is the exact count of the checkpoint's tensors, computed from those shapes
# with the per-architecture formula of estimate_num_params (and, for the DeepSeek MoE models, with
# every expert); each agrees with the size published on the model card, quoted in the comment.
# torch_dtype: Llama-2 and OPT checkpoints are float16, the others bfloat16; both are 2 bytes.
# ---------------------------------------------------------------------------------------------


def _preset(**kwargs: Any) -> ModelSpec:
    return ModelSpec(**kwargs)


MODEL_PRESETS: dict[str, ModelSpec] = {
    # meta-llama/Llama-2-7b-hf config.json: 32 layers, hidden 4096, 32 heads, no num_key_value_heads
    # (MHA; Meta's models/sku_list.py wrongly lists n_kv_heads 8), intermediate 11008, vocab 32000,
    # max_position_embeddings 4096, torch_dtype float16. 6,738,415,616 params (card: "7B").
    # Checked: microsoft/Olive examples/llm/config.py (model_id meta-llama/Llama-2-7b-chat-hf), a
    # printed LlamaForCausalLM in Retruth/deontic nlp_models/llama2/README.md.
    "Llama-2-7B": _preset(
        name="Llama-2-7B",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=32,
        head_dim=128,
        intermediate_size=11008,
        vocab_size=32000,
        num_params=6_738_415_616,
        max_position_embeddings=4096,
    ),
    # meta-llama/Llama-2-13b-hf config.json: 40 layers, hidden 5120, 40 heads (MHA), intermediate
    # 13824, vocab 32000, max_position_embeddings 4096, float16. 13,015,864,320 params ("13B").
    # Checked: a shape table keyed "meta-llama/Llama-2-13b-hf" in a public profiler, printed model
    # in Retruth/deontic nlp_models/llama2/README.md.
    "Llama-2-13B": _preset(
        name="Llama-2-13B",
        num_layers=40,
        hidden_size=5120,
        num_attention_heads=40,
        num_kv_heads=40,
        head_dim=128,
        intermediate_size=13824,
        vocab_size=32000,
        num_params=13_015_864_320,
        max_position_embeddings=4096,
    ),
    # meta-llama/Llama-2-70b-hf config.json: 80 layers, hidden 8192, 64 heads, 8 KV heads (GQA),
    # intermediate 28672, vocab 32000, max_position_embeddings 4096, float16. 68,976,648,192 params.
    # Checked: the same "meta-llama/Llama-2-70b-hf" shape table; microsoft/vidur config/model_config.py.
    "Llama-2-70B": _preset(
        name="Llama-2-70B",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=28672,
        vocab_size=32000,
        num_params=68_976_648_192,
        max_position_embeddings=4096,
    ),
    # codellama/CodeLlama-34b-Instruct-hf (and -34b-hf) config.json: 48 layers, hidden 8192, 64 heads,
    # 8 KV heads (GQA), intermediate 22016, vocab 32000, max_position_embeddings 16384, rope_theta 1e6,
    # untied embeddings. KV: 2 x 48 x 8 x 128 x 2 B = 196,608 B/token (192 KiB).
    # 33,743,970,304 params ("34B"; the count listed for the same-shaped Phind-CodeLlama-34B).
    # Checked: microsoft/vidur vidur/config/model_config.py CodeLlama34BModelConfig (48 layers, 64/8
    # heads, 8192, 22016, 16384 positions, rope_theta 1e6); epfLLM/Megatron-LLM PR #51 ("the vocab
    # size of the 34b model is still 32000": unlike the 7B/13B, no infilling tokens).
    "CodeLlama-34B": _preset(
        name="CodeLlama-34B",
        num_layers=48,
        hidden_size=8192,
        num_attention_heads=64,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=22016,
        vocab_size=32000,
        num_params=33_743_970_304,
        max_position_embeddings=16384,
    ),
    # meta-llama/Llama-3.1-8B config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads, intermediate
    # 14336, vocab 128256, max_position_embeddings 131072, tie_word_embeddings false, bfloat16.
    # 8,030,261,248 params ("8B"; safetensors total). Same shapes as tests/data/hf_configs/llama-3.1-8b.json.
    # Checked: full config.json copy in citsjtu2020/LLM-Prof sglang/Model_Config.md; oumi
    # configs/recipes/llama3_1/README.md (model info table); Ollama GGUF metadata dump.
    "Llama-3.1-8B": _preset(
        name="Llama-3.1-8B",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        num_params=8_030_261_248,
        max_position_embeddings=131072,
    ),
    # meta-llama/Llama-3.1-70B config.json: 80 layers, hidden 8192, 64 heads, 8 KV heads, intermediate
    # 28672, vocab 128256, max_position_embeddings 131072, bfloat16. 70,553,706,496 params ("70B").
    # Checked: oumi configs/recipes/llama3_1/README.md (70B table); a config copy for
    # meta-llama/Llama-3.1-70B-Instruct in a public config viewer.
    "Llama-3.1-70B": _preset(
        name="Llama-3.1-70B",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=28672,
        vocab_size=128256,
        num_params=70_553_706_496,
        max_position_embeddings=131072,
    ),
    # meta-llama/Llama-3.2-1B config.json: 16 layers, hidden 2048, 32 heads, 8 KV heads (head_dim 64),
    # intermediate 8192, vocab 128256, max_position_embeddings 131072, tie_word_embeddings true.
    # 1,235,814,400 params: 16 x (attention 10,485,760 + MLP 50,331,648 + norms 4,096) + the tied
    # embedding 262,668,288 + the final norm 2,048 ("1.23B"). The usual speculative draft for Llama 3.1
    # (engine.speculative.draft_model). Checked: apple/axlearn's Llama-3 parameter-conversion test
    # ("based on https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json"); a llama3
    # options serializer test's config copy (head_dim 64).
    "Llama-3.2-1B": _preset(
        name="Llama-3.2-1B",
        num_layers=16,
        hidden_size=2048,
        num_attention_heads=32,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=8192,
        vocab_size=128256,
        num_params=1_235_814_400,
        max_position_embeddings=131072,
    ),
    # mistralai/Mistral-7B-v0.1 config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads,
    # intermediate 14336, vocab 32000, max_position_embeddings 32768, sliding_window 4096 on every
    # layer (no layer_types: vLLM sets CacheConfig.sliding_window for an all-sliding model), bfloat16.
    # 7,241,732,096 params ("7.24B"). The engine still caches every token (kv_bytes_per_token counts
    # each layer as full attention) until the hybrid allocators of issue 39 read the window.
    # Checked: sumitdotml/transformers mistral-7b-v0.1/README.md (params table); config copies with
    # max_position_embeddings 32768 and sliding_window 4096 (tests/data/hf_configs/mistral-7b-v0.1.json);
    # transformers MistralConfig defaults.
    "Mistral-7B-v0.1": _preset(
        name="Mistral-7B-v0.1",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=32000,
        num_params=7_241_732_096,
        max_position_embeddings=32768,
        layer_kinds=(SlidingWindow(4096),) * 32,
    ),
    # Qwen/Qwen2.5-7B config.json: 28 layers, hidden 3584, 28 heads, 4 KV heads, intermediate 18944,
    # vocab 152064, max_position_embeddings 131072 (the -Instruct config says 32768), q/k/v biases,
    # untied embeddings, bfloat16. 7,615,616,512 params (card: "7.61B").
    # Checked: a verl training log that prints the Qwen2Config loaded from Qwen/Qwen2.5-7B (all the
    # fields above); printed Qwen2ForCausalLM modules (q/k/v bias=True) in Retruth/deontic.
    "Qwen2.5-7B": _preset(
        name="Qwen2.5-7B",
        num_layers=28,
        hidden_size=3584,
        num_attention_heads=28,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=18944,
        vocab_size=152064,
        num_params=7_615_616_512,
        max_position_embeddings=131072,
    ),
    # Qwen/Qwen2.5-72B config.json: 80 layers, hidden 8192, 64 heads, 8 KV heads, intermediate 29568,
    # vocab 152064, max_position_embeddings 131072 (-Instruct: 32768), bfloat16.
    # 72,706,203,648 params (card: "72.7B").
    # Checked: Qwen2.5-72B-Instruct config.json copies (shapes; max_position_embeddings 32768 there);
    # the base model's 131072 follows the verified Qwen2.5-7B base config, not a copy of this file.
    "Qwen2.5-72B": _preset(
        name="Qwen2.5-72B",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=29568,
        vocab_size=152064,
        num_params=72_706_203_648,
        max_position_embeddings=131072,
    ),
    # Qwen/Qwen3-14B config.json: 40 layers, hidden 5120, 40 heads, 8 KV heads, head_dim 128 (given
    # explicitly; hidden / heads is also 128 here), intermediate 17408, vocab 151936,
    # max_position_embeddings 40960, no q/k/v biases (attention_bias false) but RMSNorms of head_dim on
    # q and k, untied embeddings, bfloat16. KV: 2 x 40 x 8 x 128 x 2 B = 163,840 B/token (160 KiB).
    # 14,768,307,200 params (card: "14.8B", 13.2B non-embedding).
    # Checked: full config.json copy in citsjtu2020/LLM-Prof sglang/Model_Config.md; the count in
    # several model inventories (llama.cpp n_params 14768307200).
    "Qwen3-14B": _preset(
        name="Qwen3-14B",
        num_layers=40,
        hidden_size=5120,
        num_attention_heads=40,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=17408,
        vocab_size=151936,
        num_params=14_768_307_200,
        max_position_embeddings=40960,
    ),
    # Qwen/Qwen3-32B config.json: 64 layers, hidden 5120, 64 heads (so q is 64 x 128 = 8192 wide, not
    # hidden: head_dim 128 is explicit), 8 KV heads, intermediate 25600, vocab 151936,
    # max_position_embeddings 40960, q/k norms, untied, bfloat16.
    # KV: 2 x 64 x 8 x 128 x 2 B = 262,144 B/token (256 KiB). 32,762,123,264 params (card: "32.8B",
    # 31.2B non-embedding). Checked: the same LLM-Prof config copy; a GGUF dump (block_count 64,
    # embedding_length 5120, feed_forward_length 25600, head_count 64/8, key_length 128, context
    # 40960, 32762123264 logical parameters); vLLM's max_model_len 40960 in LLMServingSim's RTX PRO
    # 6000 run (casys-kaist/LLMServingSim bench/examples/RTXPRO6000/Qwen3-32B/vllm/meta.json).
    "Qwen3-32B": _preset(
        name="Qwen3-32B",
        num_layers=64,
        hidden_size=5120,
        num_attention_heads=64,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=25600,
        vocab_size=151936,
        num_params=32_762_123_264,
        max_position_embeddings=40960,
    ),
    # facebook/opt-13b config.json: 40 layers, hidden 5120, 40 heads (MHA), ffn_dim 20480, vocab 50272,
    # max_position_embeddings 2048, float16, tied embeddings, ReLU MLP with biases.
    # KV: 2 x 40 x 5120 x 2 B = 819,200 B = 800 KiB per token, the vLLM paper's (SOSP'23) figure.
    # 12,853,473,280 params ("13B").
    # Checked: OPT_13B_CONFIG in a minimal-OPT implementation (5120, 40
    # heads, ffn 20480, 40 layers, vocab 50272, 2050 learned positions = 2048 + 2); an OPT table
    # with max_seq_len 2048; the vLLM paper's 800 KB/token.
    "OPT-13B": _preset(
        name="OPT-13B",
        num_layers=40,
        hidden_size=5120,
        num_attention_heads=40,
        num_kv_heads=40,
        head_dim=128,
        intermediate_size=20480,
        vocab_size=50272,
        num_params=12_853_473_280,
        max_position_embeddings=2048,
        gated_mlp=False,
    ),
    # facebook/opt-66b config.json: 64 layers, hidden 9216, 72 heads, ffn_dim 36864, vocab 50272,
    # max_position_embeddings 2048, float16. 65,719,701,504 params ("66B").
    # Checked: OPT_66B_CONFIG in the same minimal-OPT file; a shape table citing
    # huggingface.co/facebook/opt-66b/blob/main/config.json (9216, 72 heads, 64 layers).
    "OPT-66B": _preset(
        name="OPT-66B",
        num_layers=64,
        hidden_size=9216,
        num_attention_heads=72,
        num_kv_heads=72,
        head_dim=128,
        intermediate_size=36864,
        vocab_size=50272,
        num_params=65_719_701_504,
        max_position_embeddings=2048,
        gated_mlp=False,
    ),
    # OPT-175B has no public HF checkpoint; shapes from the OPT paper (Zhang et al. 2022, Table 1:
    # 96 layers, 96 heads, d_model 12288) and metaseq (ffn 4 x 12288, vocab 50272, 2048 positions),
    # as in a minimal-OPT implementation's OPT_175B_CONFIG. 174,604,468,224 params ("175B").
    "OPT-175B": _preset(
        name="OPT-175B",
        num_layers=96,
        hidden_size=12288,
        num_attention_heads=96,
        num_kv_heads=96,
        head_dim=128,
        intermediate_size=49152,
        vocab_size=50272,
        num_params=174_604_468_224,
        max_position_embeddings=2048,
        gated_mlp=False,
    ),
    # mistralai/Mixtral-8x7B-v0.1 (and -Instruct-v0.1) config.json: MixtralForCausalLM, 32 layers,
    # hidden 4096, 32 heads, 8 KV heads, intermediate 14336 (each expert's width: Mixtral has no
    # moe_intermediate_size), num_local_experts 8, num_experts_per_tok 2, vocab 32000,
    # max_position_embeddings 32768, sliding_window null, untied, bfloat16. Every layer is MoE.
    # KV: 2 x 32 x 8 x 128 x 2 B = 131,072 B/token. 46,702,792,704 params (card "46.7B"; the
    # safetensors total quoted for Mixtral-8x7B-Instruct-v0.1); active: 46,702,792,704 - 32 layers x
    # 6 unused experts x 176,160,768 = 12,879,925,248 ("12.9B").
    # Checked: MIXTRAL_8X7B_CONFIG in TensorRT-LLM's Mixtral test and a copy of the HF config.json
    # (all the fields above); casys-kaist/LLMServingSim model_config/mistralai/Mixtral-8x7B-v0.1.json.
    "Mixtral-8x7B": _preset(
        name="Mixtral-8x7B",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=32000,
        num_params=46_702_792_704,
        max_position_embeddings=32768,
        num_experts=8,
        experts_per_token=2,
        moe_intermediate_size=14336,
    ),
    # Qwen/Qwen3-30B-A3B config.json: Qwen3MoeForCausalLM, 48 layers, hidden 2048, 32 heads, 4 KV
    # heads, head_dim 128 (explicit: q is 32 x 128 = 4096 wide, twice hidden), q/k norms, num_experts
    # 128, num_experts_per_tok 8, moe_intermediate_size 768, decoder_sparse_step 1, mlp_only_layers []
    # (every layer MoE; the config's intermediate_size 6144 is unused), no shared expert, vocab 151936,
    # max_position_embeddings 40960, untied, bfloat16. KV: 2 x 48 x 4 x 128 x 2 B = 98,304 B/token.
    # 30,532,122,624 params (card: "30.5B in total", 29.9B non-embedding); active: 30,532,122,624 - 48
    # x 120 x 4,718,592 = 3,353,032,704 ("3.3B activated").
    # Checked: full config.json copy in citsjtu2020/LLM-Prof sglang/Model_Config.md; slime
    # scripts/models/qwen3-30B-A3B.sh (48 layers, 2048, moe-ffn 768, kv-channels 128, 4 query groups,
    # untied, 151936); the Qwen3-30B-A3B-Instruct-2507 model card (30.5B / 3.3B, 48 layers, 32/4
    # heads, 128 experts, 8 activated).
    "Qwen3-30B-A3B": _preset(
        name="Qwen3-30B-A3B",
        num_layers=48,
        hidden_size=2048,
        num_attention_heads=32,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=6144,
        vocab_size=151936,
        num_params=30_532_122_624,
        max_position_embeddings=40960,
        num_experts=128,
        experts_per_token=8,
        moe_intermediate_size=768,
    ),
    # deepseek-ai/DeepSeek-V2-Lite config.json: 27 layers, hidden 2048, 16 heads, kv_lora_rank 512,
    # q_lora_rank null, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, intermediate 10944
    # (the one dense layer), moe_intermediate_size 1408, 64 routed + 2 shared experts, 6 per token,
    # vocab 102400, max_position_embeddings 163840, bfloat16.
    # KV: (512 + 64) x 27 x 2 B = 31,104 B/token. 15,706,484,224 params (card: "15.7B"/"16B");
    # 2,451,435,008 active per token excluding the embedding (card: "2.4B activated").
    # Checked: a full DeepseekV2Config dump for DeepSeek-V2-Lite (transformers 5; it writes
    # "head_dim": 64 and "dtype"), Megatron-style deepseek_v2_lite yaml (27 layers, 2048, 10944).
    "DeepSeek-V2-Lite": _preset(
        name="DeepSeek-V2-Lite",
        num_layers=27,
        hidden_size=2048,
        num_attention_heads=16,
        num_kv_heads=16,
        head_dim=192,
        intermediate_size=10944,
        vocab_size=102400,
        num_params=15_706_484_224,
        attention="mla",
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        max_position_embeddings=163840,
        num_active_params=2_451_435_008,
        num_experts=64,
        experts_per_token=6,
        moe_intermediate_size=1408,
        shared_expert_intermediate_size=2 * 1408,
        num_dense_layers=1,
    ),
    # deepseek-ai/DeepSeek-V3 config.json: 61 layers, hidden 7168, 128 heads, kv_lora_rank 512,
    # q_lora_rank 1536, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, intermediate 18432
    # (3 dense layers), moe_intermediate_size 2048, 256 routed + 1 shared expert, 8 per token, vocab
    # 129280, max_position_embeddings 163840, torch_dtype bfloat16.
    # KV: (512 + 64) x 61 x 2 B = 70,272 B/token. 671,026,419,200 params: the 671B main model,
    # without the 14B multi-token-prediction module; 36,625,618,432 active (README_WEIGHTS: 36.6B
    # incl. the 0.9B output head). NOTE: the official checkpoint stores FP8 (e4m3, block-scaled)
    # weights, about half the bytes modelled here; for it use
    # dataclasses.replace(spec, weight_dtype_bytes=1) and kv_cache_dtype="bf16" (vLLM's "auto" KV
    # dtype is the bf16 model dtype, not the weight storage type).
    # Checked: an annotated copy of the DeepSeek-V3 config.json (hidden 7168, 18432, kv_lora_rank 512,
    # 163840, moe 2048, 256 + 1 experts, 8 per token, 61 layers, q_lora_rank 1536, 128 + 64 heads),
    # a table with vocab 129280, deepseek-ai README_WEIGHTS.md (671B main + MTP; 36.6B activated).
    "DeepSeek-V3": _preset(
        name="DeepSeek-V3",
        num_layers=61,
        hidden_size=7168,
        num_attention_heads=128,
        num_kv_heads=128,
        head_dim=192,
        intermediate_size=18432,
        vocab_size=129280,
        num_params=671_026_419_200,
        attention="mla",
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        max_position_embeddings=163840,
        num_active_params=36_625_618_432,
        num_experts=256,
        experts_per_token=8,
        moe_intermediate_size=2048,
        shared_expert_intermediate_size=2048,
        num_dense_layers=3,
    ),
    # openai/gpt-oss-20b config.json (main, transformers_version 4.55.0.dev0, Aug 2025; an excerpt
    # of the fields read here is configs/models/gpt-oss-20b.config.json, Apache-2.0): GptOssForCausalLM,
    # 24 layers, hidden 2880, 64 heads of head_dim 64, 8 KV heads, layer_types alternating
    # sliding_attention (sliding_window 128) and full_attention from layer 0, num_local_experts 32,
    # num_experts_per_tok 4, intermediate_size 2880 (each expert's width), vocab 201088,
    # max_position_embeddings 131072, attention_bias true, untied, no torch_dtype (bf16 activations).
    # KV: 2 x 8 x 64 x 2 B = 2,048 B per token per layer; 12 sliding + 12 full layers = 49,152 B.
    # 20,914,757,184 params: per layer attention 2 x (2880 x 4096 + 2880 x 512) + biases 8,000 +
    # sinks 64 = 26,550,144, router 2880 x 32 + 32 = 92,192, 32 experts x (3 x 2880 x 2880 + biases
    # 8,640) = 796,538,880, norms 5,760 -> 823,186,976 x 24 = 19,756,487,424; + embedding and LM head
    # 2 x 201088 x 2880 + final norm 2,880 (card: 20.91B). Active 3,608,307,264: 24 x (26,550,144 +
    # 92,192 + 4 experts 99,567,360 + 5,760) + LM head + final norm (card: 3.61B).
    # The checkpoint stores the routed experts' matrices in MXFP4 (quantization_config quant_method
    # mxfp4: 4-bit values, an 8-bit scale per 32 = 4.25 bits), the rest (attention, router, expert
    # biases, embedding, LM head) in bf16: 24 x 32 x 3 x 2880 x 2880 = 19,110,297,600 expert params
    # x 4.25 / 8 = 10,152,345,600 B + 1,804,459,584 other params x 2 B = 13,761,264,768 B (12.8 GiB;
    # the card: "about 13 GB"). Checked: the full config copy in
    # circuit-tracer's tests (gpt_oss_config); vLLM gpt_oss.py (sliding window on even layers).
    "gpt-oss-20b": _preset(
        name="gpt-oss-20b",
        num_layers=24,
        hidden_size=2880,
        num_attention_heads=64,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=2880,
        vocab_size=201088,
        num_params=20_914_757_184,
        max_position_embeddings=131072,
        num_active_params=3_608_307_264,
        num_experts=32,
        experts_per_token=4,
        moe_intermediate_size=2880,
        layer_kinds=(SlidingWindow(128), FULL_ATTENTION) * 12,
        routed_expert_bits=4.25,
    ),
    # openai/gpt-oss-120b config.json (main, transformers_version 4.55.0.dev0; excerpt in
    # configs/models/gpt-oss-120b.config.json): the shapes of gpt-oss-20b with 36 layers (18 sliding,
    # 18 full) and 128 experts. KV: 2,048 B per token per layer, 36 layers = 73,728 B.
    # 116,829,156,672 params: per layer 26,550,144 + router 368,768 + 128 experts 3,186,155,520 +
    # norms 5,760 = 3,213,080,192, x 36 = 115,670,886,912; + 1,158,266,880 + 2,880 (card: 116.83B).
    # Active 5,132,849,472 = 36 x 126,492,032 + LM head + final norm (card: 5.13B). MXFP4 experts
    # (about 61 GiB in all) as for gpt-oss-20b. Checked: a public test transcribing
    # https://huggingface.co/openai/gpt-oss-120b/raw/main/config.json ("layer_types: 18 x [sliding, full]").
    "gpt-oss-120b": _preset(
        name="gpt-oss-120b",
        num_layers=36,
        hidden_size=2880,
        num_attention_heads=64,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=2880,
        vocab_size=201088,
        num_params=116_829_156_672,
        max_position_embeddings=131072,
        num_active_params=5_132_849_472,
        num_experts=128,
        experts_per_token=4,
        moe_intermediate_size=2880,
        layer_kinds=(SlidingWindow(128), FULL_ATTENTION) * 18,
        routed_expert_bits=4.25,
    ),
    # google/gemma-3-27b-it config.json (Gemma3ForConditionalGeneration, transformers_version
    # 4.50.0.dev0, Mar 2025; Gemma licence terms, cited not copied): text_config 62 layers, hidden
    # 5376, 32 heads of head_dim 128, 16 KV heads, intermediate 21504 (GeGLU), sliding_window 1024;
    # the file leaves out sliding_window_pattern, vocab_size and max_position_embeddings, so
    # Gemma3TextConfig's defaults hold: a full layer every 6th (layers 5, 11, ..., 59: 10 full, 52
    # sliding), vocab 262208, 131072 positions; tied embeddings, bfloat16.
    # KV: 2 x 16 x 128 x 2 B = 8,192 B per token per layer; 62 layers = 507,904 B.
    # 27,432,406,640 params in the checkpoint (the published total): the text decoder 27,009,346,304
    # (per layer q, k, v, o 66,060,288 + q/k norms 256 + MLP 3 x 5376 x 21504 = 346,816,512 + four
    # norms 21,504 = 412,898,560, x 62; + embedding 262208 x 5376 = 1,409,630,208 + final norm 5,376)
    # plus the SigLIP vision tower and projector, 423,060,336, which vLLM loads too; one token uses
    # the decoder only (num_active_params). Checked: TensorRT-LLM's GEMMA3_27B config copy,
    # transformers Gemma3TextConfig defaults, vLLM gemma3.py (layer_types decide sliding layers).
    "Gemma-3-27B": _preset(
        name="Gemma-3-27B",
        num_layers=62,
        hidden_size=5376,
        num_attention_heads=32,
        num_kv_heads=16,
        head_dim=128,
        intermediate_size=21504,
        vocab_size=262208,
        num_params=27_432_406_640,
        max_position_embeddings=131072,
        num_active_params=27_009_346_304,
        layer_kinds=tuple(
            FULL_ATTENTION if (layer + 1) % 6 == 0 else SlidingWindow(1024) for layer in range(62)
        ),
    ),
    # meta-llama/Llama-4-Scout-17B-16E config.json (Llama4ForConditionalGeneration, Apr 2025; Llama 4
    # licence, cited not copied): text_config 48 layers, hidden 5120, 40 heads of head_dim 128, 8 KV
    # heads, 16 experts, 1 per token, intermediate_size 8192 (each expert and the shared expert),
    # intermediate_size_mlp 16384 (dense layers; none: interleave_moe_layer_step 1), vocab 202048,
    # max_position_embeddings 10485760, attention_chunk_size 8192, no_rope_layers empty so
    # Llama4TextConfig's default holds: a NoPE layer every 4th (layers 3, 7, ..., 47). vLLM's
    # Llama4Attention runs RoPE layers as ChunkedLocalAttention (36 layers) and NoPE layers as full
    # attention (12). bfloat16, untied. KV: 2 x 8 x 128 x 2 B = 4,096 B per token per layer; 48
    # layers = 196,608 B. 107,769,861,120 params in the text decoder: per layer attention
    # 62,914,560 + router 81,920 + 16 experts 2,013,265,920 + shared expert 125,829,120 + norms
    # 10,240 = 2,202,101,760, x 48; + embedding and LM head 2 x 202048 x 5120 + 5,120 (card: 109B
    # with the vision encoder, which is not counted here; 17B active). Checked: config copies with
    # these fields (TensorRT-LLM's Llama 4 test, neuronx-distributed-inference's Scout mock config),
    # transformers Llama4TextConfig (no_rope_layers default), vLLM llama4.py.
    "Llama-4-Scout-17B-16E": _preset(
        name="Llama-4-Scout-17B-16E",
        num_layers=48,
        hidden_size=5120,
        num_attention_heads=40,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=8192,
        vocab_size=202048,
        num_params=107_769_861_120,
        max_position_embeddings=10485760,
        num_experts=16,
        experts_per_token=1,
        moe_intermediate_size=8192,
        shared_expert_intermediate_size=8192,
        layer_kinds=tuple(
            FULL_ATTENTION if (layer + 1) % 4 == 0 else ChunkedLocal(8192) for layer in range(48)
        ),
    ),
    # Qwen/Qwen3-Next-80B-A3B-Instruct (and -Thinking) config.json (Qwen3NextForCausalLM, Sep 2025,
    # Apache-2.0; excerpt in configs/models/qwen3-next-80b-a3b.config.json): 48 layers, hidden 2048,
    # full_attention_interval 4 (layers 3, 7, ..., 47 full attention with 16 heads of head_dim 256
    # and 2 KV heads; the other 36 gated delta net with linear_num_key_heads 16,
    # linear_num_value_heads 32, linear_key_head_dim 128, linear_value_head_dim 128,
    # linear_conv_kernel_dim 4), 512 experts, 10 per token, moe_intermediate_size 512, one shared
    # expert of 512, vocab 151936, max_position_embeddings 262144, untied, bfloat16.
    # KV: 2 x 2 x 256 x 2 B = 2,048 B per token per full layer, 12 layers = 24,576 B.
    # State per gated-delta-net layer (vLLM gated_delta_net_state_shape, bf16 "auto"): conv 3 x
    # (2 x 16 x 128 + 32 x 128) = 24,576 elements, SSM 32 x 128 x 128 = 524,288, x 2 B = 1,097,728 B;
    # 36 layers = 39,518,208 B per request. 79,674,391,296 params computed from the shapes: full
    # layer attention (q with its output gate 2048 x 8192, k, v 2048 x 512, o 4096 x 2048, q/k norms)
    # 27,263,488, gated-delta-net layer 33,718,464, MoE per layer (router, 512 experts, shared expert
    # and its gate) 1,614,809,088, norms 4,096; + embedding and LM head 2 x 151936 x 2048 + 2,048 (card:
    # 80B total, 3B activated; the multi-token-prediction layer is not counted). Checked: the
    # release's config.json transcribed in a public C++ test, transformers Qwen3NextConfig, vLLM
    # qwen3_next.py and mamba_utils.py.
    "Qwen3-Next-80B-A3B": _preset(
        name="Qwen3-Next-80B-A3B",
        architecture="Qwen3NextForCausalLM",
        num_layers=48,
        hidden_size=2048,
        num_attention_heads=16,
        num_kv_heads=2,
        head_dim=256,
        intermediate_size=5120,
        vocab_size=151936,
        num_params=79_674_391_296,
        max_position_embeddings=262144,
        num_experts=512,
        experts_per_token=10,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
        layer_kinds=tuple(
            FULL_ATTENTION
            if (layer + 1) % 4 == 0
            else GatedDeltaNetState(
                num_key_heads=16, num_value_heads=32, key_head_dim=128, value_head_dim=128, conv_kernel=4
            )
            for layer in range(48)
        ),
    ),
    # nvidia/Nemotron-H-8B-Base-8K config.json (NemotronHForCausalLM, Apr 2025; NVIDIA licence, cited
    # not copied): 52 blocks in hybrid_override_pattern "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-
    # M-M-M-M-M-" (24 Mamba2, 4 attention at blocks 7, 18, 29, 40, 24 MLP), hidden 4096, 32 heads of
    # head_dim 128, 8 KV heads, intermediate 21504 (squared-ReLU, two matrices), mamba_num_heads 128,
    # mamba_head_dim 64, ssm_state_size 128, n_groups 8, conv_kernel 4, vocab 131072,
    # max_position_embeddings 8192, untied, bfloat16. KV: 2 x 8 x 128 x 2 B = 4,096 B per token per
    # attention layer, 4 layers = 16,384 B. State per Mamba2 layer: conv 3 x (8192 + 2 x 8 x 128) =
    # 30,720 elements x 2 B = 61,440 B, SSM 128 x 64 x 128 = 1,048,576 elements x 4 B = 4,194,304 B
    # (vLLM's NemotronH hook makes "auto" float32) = 4,255,744 B; 24 layers = 102,137,856 B per
    # request. 8,100,852,736 params computed from the shapes: Mamba2 block (in_proj 4096 x 18560,
    # conv 10240 x 4 + bias, dt_bias, A_log, D, gated norm 8192, out_proj 8192 x 4096, norm)
    # 109,640,064, attention block 41,947,136, MLP block 2 x 4096 x 21504 + norm = 176,164,864;
    # + embedding and LM head 2 x 131072 x 4096 + final norm (card: 8B). Checked: the pattern and shapes
    # in transformers' NemotronHConfig defaults and Megatron's 8B hybrid config, vLLM nemotron_h.py
    # (intermediate = heads x head_dim) and mamba_utils.py. chunk_size 128: transformers' NemotronHConfig
    # default (the SSD chunk vLLM's get_mamba_chunk_size reads; not checked against this checkpoint).
    "Nemotron-H-8B-Base-8K": _preset(
        name="Nemotron-H-8B-Base-8K",
        architecture="NemotronHForCausalLM",
        num_layers=52,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=21504,
        vocab_size=131072,
        num_params=8_100_852_736,
        max_position_embeddings=8192,
        gated_mlp=False,
        layer_kinds=tuple(
            {
                "M": Mamba2State(
                    intermediate_size=8192,
                    n_groups=8,
                    num_heads=128,
                    head_dim=64,
                    state_size=128,
                    conv_kernel=4,
                    ssm_dtype="float32",
                    chunk_size=128,
                ),
                "*": FULL_ATTENTION,
                "-": MLP_ONLY,
            }[character]
            for character in "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
        ),
    ),
}
# Qwen/Qwen3-30B-A3B-Instruct-2507 (and -Thinking-2507): the shapes of Qwen3-30B-A3B, trained for a
# native 262,144-token context, which its config.json gives as max_position_embeddings (vLLM derives
# max_model_len 262144 from it: casys-kaist/LLMServingSim
# bench/examples/RTXPRO6000/Qwen3-30B-A3B-Instruct-2507/vllm/meta.json; model card: "Context Length:
# 262,144 natively", 30.5B total, 3.3B activated). A preset of its own, so that a request the 2507
# checkpoint serves is not refused at the base model's 40,960.
MODEL_PRESETS["Qwen3-30B-A3B-Instruct-2507"] = replace(
    MODEL_PRESETS["Qwen3-30B-A3B"], name="Qwen3-30B-A3B-Instruct-2507", max_position_embeddings=262144
)

# Extra names that resolve to a preset (compared after normalisation, see _normalise_name).
_PRESET_ALIASES: dict[str, str] = {
    "mistral-7b": "Mistral-7B-v0.1",
    "llama-3.1-8b": "Llama-3.1-8B",
    "llama-3.2-1b": "Llama-3.2-1B",
    "llama3.1-8b": "Llama-3.1-8B",
    "llama-3.1-70b": "Llama-3.1-70B",
    "llama3.1-70b": "Llama-3.1-70B",
    "deepseek-v3-base": "DeepSeek-V3",
    "deepseek-v2-lite-chat": "DeepSeek-V2-Lite",
    "mixtral-8x7b-v0.1": "Mixtral-8x7B",
    "qwen3-30b-a3b-thinking-2507": "Qwen3-30B-A3B-Instruct-2507",
    "gemma-3-27b-it": "Gemma-3-27B",
    "gemma-3-27b-pt": "Gemma-3-27B",
    "qwen3-next-80b-a3b-thinking": "Qwen3-Next-80B-A3B",
}

_NAME_SUFFIXES = ("-instruct", "-chat-hf", "-chat", "-hf", "-base")


def _normalise_name(name: str) -> str:
    """Lower-case, drop an HF organisation prefix, "Meta-" and instruct/chat/hf suffixes."""
    key = name.strip().lower().replace("_", "-")
    key = key.rsplit("/", 1)[-1]
    if key.startswith("meta-llama-"):
        key = key[len("meta-") :]
    changed = True
    while changed:
        changed = False
        for suffix in _NAME_SUFFIXES:
            if key.endswith(suffix) and key != suffix:
                key = key[: -len(suffix)]
                changed = True
    # "Mistral-7B-Instruct-v0.1" -> "mistral-7b-v0.1"
    key = re.sub(r"-instruct(-v\d)", r"\1", key)
    return key


_PRESET_INDEX: dict[str, str] = {_normalise_name(k): k for k in MODEL_PRESETS}
_PRESET_INDEX.update({_normalise_name(k): v for k, v in _PRESET_ALIASES.items()})


def _lookup_preset(name: str) -> ModelSpec | None:
    key = _PRESET_INDEX.get(_normalise_name(name))
    return MODEL_PRESETS[key] if key is not None else None


def resolve_model(name_or_path: str | os.PathLike[str] | ModelSpec) -> ModelSpec:
    """A preset by name (case-insensitive, HF ids accepted) or a ``config.json`` path (file or dir).

    A :class:`ModelSpec` is returned unchanged. Raises ``ValueError`` for an unknown name or a bad file.
    """
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    text = os.fspath(name_or_path)
    if not isinstance(text, str):
        raise ValueError(f"model must be a preset name or a path, got {name_or_path!r}")
    if not isinstance(name_or_path, os.PathLike):
        preset = _lookup_preset(text)
        if preset is not None:
            return preset
    path = Path(text).expanduser()
    looks_like_path = (
        isinstance(name_or_path, os.PathLike) or text.endswith(".json") or text.startswith((".", "/", "~"))
    )
    if path.exists() or looks_like_path:
        return model_from_hf_config(path)
    raise ValueError(
        f"unknown model {text!r}: not a preset ({', '.join(MODEL_PRESETS)}) "
        "and no such file; pass a preset name or a path to a Hugging Face config.json"
    )


# ---------------------------------------------------------------------------------------------
# Hugging Face config.json loading.
# ---------------------------------------------------------------------------------------------

# torch_dtype -> bytes per parameter as vLLM serves it with dtype="auto": float32 checkpoints are
# served in float16 (vLLM: "auto" uses FP16 for FP32 and FP16 models, BF16 for BF16 models).
_DTYPE_BYTES: dict[str, int] = {
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float32": 2,
    "fp32": 2,
    "float": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

# transformers' default for an absent tie_word_embeddings differs by architecture: PretrainedConfig
# ties (True), while LlamaConfig, MistralConfig, Qwen2Config, Phi3Config, DeepseekV*Config set False.
_TIED_BY_DEFAULT = {"opt", "gpt2", "gemma", "gemma2", "gemma3", "gemma3_text", "bloom", "gpt_neox_japanese"}
_UNGATED_MLP = {"opt", "gpt2", "gpt_bigcode", "bloom", "falcon", "gpt_neox", "gptj", "phi", "nemotron_h"}
_QKV_BIAS = {"qwen2", "qwen2_moe"}
_QK_NORM = {"qwen3", "qwen3_moe"}  # an RMSNorm of head_dim on q and on k in every layer
# Routed-expert counts as DeepSeek, Mixtral and Qwen-MoE configs spell them.
_EXPERT_COUNT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")
# Fields a config may leave out because its transformers class has a default for them (the
# google/gemma-3-*-it configs write neither; Gemma3TextConfig: vocab_size 262_208,
# max_position_embeddings 131_072).
_CLASS_DEFAULTS: dict[str, dict[str, int]] = {
    "gemma3_text": {"vocab_size": 262_208, "max_position_embeddings": 131_072},
}


def _config_path(path: str | os.PathLike[str]) -> Path:
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"model config {str(p)!r}: no such file")
    return p


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"model config {str(path)!r}: cannot read file: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"model config {str(path)!r}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"model config {str(path)!r}: expected a JSON object, got {type(data).__name__}")
    # Multimodal wrappers keep the decoder under "text_config".
    text_config = data.get("text_config")
    if "num_hidden_layers" not in data and isinstance(text_config, dict):
        data = {**data, **text_config}
    return data


def _int_field(cfg: Mapping[str, Any], path: Path, *names: str, required: bool = True) -> int | None:
    """The first of ``names`` the config at ``path`` sets, which must be a positive integer."""
    return positive_int_field(cfg, str(path), *names, required=required)


def _is_moe_layer(cfg: Mapping[str, Any], layer: int) -> bool:
    """Whether decoder layer ``layer`` (from 0) routes to experts, as the transformers model builds it:
    DeepSeek's ``layer >= first_k_dense_replace and layer % moe_layer_freq == 0``, Qwen-MoE's
    ``layer not in mlp_only_layers and (layer + 1) % decoder_sparse_step == 0``; else every layer."""
    if "first_k_dense_replace" in cfg or "moe_layer_freq" in cfg:
        first_dense = int(cfg.get("first_k_dense_replace") or 0)
        return layer >= first_dense and layer % int(cfg.get("moe_layer_freq") or 1) == 0
    step = int(cfg.get("decoder_sparse_step") or 1)
    return layer not in (cfg.get("mlp_only_layers") or []) and (layer + 1) % step == 0


def _moe_shape(cfg: Mapping[str, Any], path: Path, num_layers: int, intermediate: int) -> dict[str, int]:
    """The :class:`ModelSpec` mixture-of-experts fields a config describes (empty for a dense model)."""
    count_keys = [key for key in _EXPERT_COUNT_KEYS if cfg.get(key)]
    if not count_keys:
        if cfg.get("moe_intermediate_size"):
            _int_field(cfg, path, *_EXPERT_COUNT_KEYS)  # raises: experts of a size, but no count
        return {}
    moe_layers = sum(_is_moe_layer(cfg, layer) for layer in range(num_layers))
    if moe_layers == 0:
        return {}
    num_experts = _int_field(cfg, path, *count_keys)
    per_token = _int_field(cfg, path, "num_experts_per_tok")
    # Mixtral's experts are intermediate_size wide; the others name the expert width apart.
    expert_width = _int_field(cfg, path, "moe_intermediate_size", required=False) or intermediate
    shared_experts = _int_field(cfg, path, "n_shared_experts", required=False) or 0
    shared = shared_experts * expert_width or (
        _int_field(cfg, path, "shared_expert_intermediate_size", required=False) or 0
    )
    assert num_experts is not None and per_token is not None
    return {
        "num_experts": num_experts,
        "experts_per_token": per_token,
        "moe_intermediate_size": expert_width,
        "shared_expert_intermediate_size": shared,
        "num_dense_layers": num_layers - moe_layers,
    }


def estimate_num_params(
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_attention_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_size: int,
    gated_mlp: bool = True,
    tie_word_embeddings: bool = False,
    qkv_bias: bool = False,
    opt_style: bool = False,
    max_position_embeddings: int = 0,
    qk_norm: bool = False,
    num_experts: int = 0,
    moe_intermediate_size: int = 0,
    shared_expert_intermediate_size: int = 0,
    num_dense_layers: int = 0,
) -> int:
    """Parameter count of a decoder-only transformer, from its shapes.

    ``embedding (vocab x hidden)``
    ``+ layers x [attention + MLP + norms]``
    ``+ final norm + lm_head (vocab x hidden, unless tie_word_embeddings)``, where

    * attention = q ``hidden x heads x head_dim`` + k, v ``2 x hidden x kv_heads x head_dim``
      + o ``heads x head_dim x hidden`` (+ q/k/v biases for Qwen2; + an RMSNorm of ``head_dim`` on
      q and on k with ``qk_norm``, Qwen3);
    * MLP = ``3 x hidden x intermediate`` when gated (SwiGLU: gate, up, down), else ``2 x``;
    * norms = two RMSNorm weight vectors of ``hidden`` per layer.

    With ``num_experts`` (a mixture of experts), all but ``num_dense_layers`` layers have instead
    of the MLP a router ``hidden x num_experts``, ``num_experts`` MLPs of ``moe_intermediate_size``
    and a shared gated MLP of ``shared_expert_intermediate_size`` (none when 0): exact for Mixtral
    and Qwen3-MoE; Qwen2-MoE's shared-expert gate (``hidden`` per layer) is not counted.

    ``opt_style`` adds what OPT has on top: biases on every linear layer, LayerNorms with bias
    (``4 x hidden`` per layer), and learned positions ``(max_position_embeddings + 2) x hidden``.
    Exact for Llama, Mistral, Qwen2, Qwen3 and OPT checkpoints; under by 2 x hidden per layer for
    Gemma-2 (four norms per layer), i.e. < 0.01 %.
    """
    q = hidden_size * num_attention_heads * head_dim
    kv = 2 * hidden_size * num_kv_heads * head_dim
    o = num_attention_heads * head_dim * hidden_size
    attention = q + kv + o
    if qkv_bias or opt_style:
        attention += (num_attention_heads + 2 * num_kv_heads) * head_dim
    if opt_style:
        attention += hidden_size  # out_proj bias
    if qk_norm:
        attention += 2 * head_dim
    matrices = 3 if gated_mlp else 2
    mlp = matrices * hidden_size * intermediate_size
    if opt_style:
        mlp += intermediate_size + hidden_size  # fc1 and fc2 biases
    norms = (4 if opt_style else 2) * hidden_size
    total = vocab_size * hidden_size  # token embedding
    if num_experts:
        moe_mlp = (
            hidden_size * num_experts  # router
            + num_experts * matrices * hidden_size * moe_intermediate_size
            + 3 * hidden_size * shared_expert_intermediate_size
        )
        total += num_layers * (attention + norms) + num_dense_layers * mlp
        total += (num_layers - num_dense_layers) * moe_mlp
    else:
        total += num_layers * (attention + mlp + norms)
    total += (2 if opt_style else 1) * hidden_size  # final norm
    if not tie_word_embeddings:
        total += vocab_size * hidden_size  # lm_head
    if opt_style:
        total += (max_position_embeddings + 2) * hidden_size  # OPT's learned positions (offset 2)
    return total


def model_from_hf_config(
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    num_params: int | None = None,
) -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face ``config.json`` (a file, or a directory holding one).

    Fields read: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
    ``num_key_value_heads`` (absent: = heads), ``head_dim`` (absent: ``hidden_size // heads``),
    ``intermediate_size`` (OPT: ``ffn_dim``), ``vocab_size``, ``max_position_embeddings``,
    ``torch_dtype`` or ``dtype`` (absent: 2 bytes; float32 counts as 2 because vLLM serves it in
    float16), ``tie_word_embeddings``; MLA is detected by a non-null ``kv_lora_rank`` and then needs
    ``qk_rope_head_dim``.

    Mixture of experts: the routed-expert count (``n_routed_experts``, DeepSeek; ``num_local_experts``,
    Mixtral; ``num_experts``, Qwen-MoE), ``num_experts_per_tok``, the expert width
    (``moe_intermediate_size``; Mixtral's experts are ``intermediate_size`` wide), shared experts
    (DeepSeek ``n_shared_experts`` of the expert width; Qwen2-MoE ``shared_expert_intermediate_size``)
    and which layers are dense (DeepSeek ``first_k_dense_replace``/``moe_layer_freq``, Qwen-MoE
    ``mlp_only_layers``/``decoder_sparse_step``).

    Parameter count: ``num_params`` argument, else a ``num_params``/``num_parameters`` field in the
    file, else :func:`estimate_num_params` from the shapes (experts included). An MLA model (the
    DeepSeek family) has no shape estimate here and raises unless a count is given; the DeepSeek
    presets carry theirs.

    Quantised checkpoints (a ``quantization_config``) are sized at ``torch_dtype`` with a warning;
    adjust ``weight_dtype_bytes`` with :func:`dataclasses.replace`. The exception is MXFP4 experts
    (gpt-oss: ``quant_method: mxfp4``), sized at 4.25 bits a routed-expert parameter.

    Layer kinds (sliding-window, chunked-local, Mamba/linear-attention and MLP-only layers) come from
    ``layer_types``, ``hybrid_override_pattern``, ``layers_block_type``, ``attn_layer_period`` /
    ``attn_layer_offset``, ``attention_chunk_size`` / ``no_rope_layers``, ``full_attention_interval``
    (Qwen3-Next) or ``sliding_window`` / ``sliding_window_pattern`` / ``use_sliding_window``, with
    the state shapes beside them (:func:`sim.hardware.layers.layer_kinds_from_hf_config`). A model
    with Mamba, linear-attention or MLP-only blocks has no shape-based parameter estimate and needs a
    count, as MLA does. Gemma 3 configs may leave out ``vocab_size`` and ``max_position_embeddings``:
    Gemma3TextConfig's defaults (262,208 and 131,072) are used.

    Raises ``ValueError`` naming the file (and field) for a missing file, bad JSON or a missing or
    invalid field.
    """
    cfg_path = _config_path(path)
    cfg = _read_config(cfg_path)
    where = str(cfg_path)
    model_type = str(cfg.get("model_type", "")).lower()
    cfg = {**_CLASS_DEFAULTS.get(model_type, {}), **cfg}

    num_layers = _int_field(cfg, cfg_path, "num_hidden_layers")
    hidden = _int_field(cfg, cfg_path, "hidden_size")
    heads = _int_field(cfg, cfg_path, "num_attention_heads")
    vocab = _int_field(cfg, cfg_path, "vocab_size")
    intermediate = _int_field(cfg, cfg_path, "intermediate_size", "ffn_dim")
    assert num_layers and hidden and heads and vocab and intermediate
    kv_heads = _int_field(cfg, cfg_path, "num_key_value_heads", required=False) or heads
    max_pos = _int_field(cfg, cfg_path, "max_position_embeddings", required=False) or 4096

    dtype_name = cfg.get("torch_dtype", cfg.get("dtype"))
    if dtype_name is None:
        dtype_bytes = 2
    else:
        dtype_bytes_or_none = _DTYPE_BYTES.get(str(dtype_name).lower().removeprefix("torch."))
        if dtype_bytes_or_none is None:
            raise ValueError(f"model config {where!r}: unsupported torch_dtype/dtype {dtype_name!r}")
        dtype_bytes = dtype_bytes_or_none
    quantization = cfg.get("quantization_config") or {}
    routed_expert_bits = _quantised_expert_bits(quantization)
    if quantization and routed_expert_bits is None:
        warnings.warn(
            f"model config {where!r} has a quantization_config; weights are sized at {dtype_bytes} bytes "
            "per parameter (the torch_dtype). Set weight_dtype_bytes with dataclasses.replace for the "
            "quantised size.",
            stacklevel=2,
        )

    kv_lora_rank = cfg.get("kv_lora_rank")
    attention: Literal["mha", "mla"] = "mha"
    qk_rope: int | None = None
    if kv_lora_rank is not None:
        attention = "mla"
        kv_lora_rank = _int_field(cfg, cfg_path, "kv_lora_rank")
        qk_rope = _int_field(cfg, cfg_path, "qk_rope_head_dim")
        assert qk_rope is not None
        qk_nope = _int_field(cfg, cfg_path, "qk_nope_head_dim", required=False)
        # transformers writes head_dim = qk_rope_head_dim for DeepSeek; the q/k head is nope + rope.
        head_dim = qk_rope + qk_nope if qk_nope else qk_rope
    else:
        head_dim = _int_field(cfg, cfg_path, "head_dim", required=False) or hidden // heads
        if heads % kv_heads != 0:
            raise ValueError(
                f"model config {where!r}: num_attention_heads ({heads}) is not a multiple of "
                f"num_key_value_heads ({kv_heads})"
            )

    gated = model_type not in _UNGATED_MLP
    moe = _moe_shape(cfg, cfg_path, num_layers, intermediate)
    layer_kinds = layer_kinds_from_hf_config(cfg, where, num_layers, hidden)
    if num_params is None:
        num_params = _int_field(cfg, cfg_path, "num_params", "num_parameters", required=False)
    if num_params is None and layer_kinds is not None:
        _refuse_estimate_for_blocks_without_attention(where, layer_kinds)
    if num_params is None:
        if moe and attention == "mla":
            raise ValueError(
                f"model config {where!r} describes a mixture-of-experts model with MLA attention; its "
                "parameter count cannot be estimated from the shapes. Pass num_params=... (total "
                "parameters, all experts), add a 'num_params' field to the file, or use a preset "
                f"({', '.join(k for k, v in MODEL_PRESETS.items() if v.is_moe)})."
            )
        if attention == "mla":
            raise ValueError(
                f"model config {where!r}: MLA attention has no shape-based parameter estimate; pass num_params=..."
            )
        tie = cfg.get("tie_word_embeddings")
        if tie is None:
            tie = model_type in _TIED_BY_DEFAULT
        num_params = estimate_num_params(
            vocab_size=vocab,
            hidden_size=hidden,
            num_layers=num_layers,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            gated_mlp=gated,
            tie_word_embeddings=bool(tie),
            qkv_bias=model_type in _QKV_BIAS or bool(cfg.get("attention_bias")),
            opt_style=model_type == "opt",
            max_position_embeddings=max_pos,
            qk_norm=model_type in _QK_NORM,
            num_experts=moe.get("num_experts", 0),
            moe_intermediate_size=moe.get("moe_intermediate_size", 0),
            shared_expert_intermediate_size=moe.get("shared_expert_intermediate_size", 0),
            num_dense_layers=moe.get("num_dense_layers", 0),
        )

    if name is None:
        fallback = cfg_path.parent.name if cfg_path.name == "config.json" else cfg_path.stem
        name = str(cfg.get("_name_or_path") or fallback or cfg_path.stem)
    try:
        return ModelSpec(
            name=name,
            num_layers=num_layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            vocab_size=vocab,
            num_params=num_params,
            weight_dtype_bytes=dtype_bytes,
            attention=attention,
            kv_lora_rank=kv_lora_rank if attention == "mla" else None,
            qk_rope_head_dim=qk_rope,
            max_position_embeddings=max_pos,
            gated_mlp=gated,
            layer_kinds=layer_kinds,
            routed_expert_bits=routed_expert_bits if moe else None,
            architecture=_architecture(cfg, where),
            **moe,
        )
    except ValueError as exc:
        raise ValueError(f"model config {where!r}: {exc}") from exc


def _architecture(cfg: Mapping[str, Any], where: str) -> str | None:
    """``architectures[0]`` (the model class transformers and the servers load); None when absent."""
    architectures = cfg.get("architectures")
    if architectures is None:
        return None
    if not isinstance(architectures, list) or not architectures or not isinstance(architectures[0], str):
        raise ValueError(
            f"model config {where!r}: architectures must be a list of model class names, got {architectures!r}"
        )
    return architectures[0]


MXFP4_BITS = 4.25
"""OCP MX FP4: 4-bit values sharing an 8-bit scale per block of 32: 4 + 8 / 32 bits a parameter."""


def _quantised_expert_bits(quantization: Mapping[str, Any]) -> float | None:
    """Bits per routed-expert parameter of a ``quantization_config`` kvsim sizes (gpt-oss's MXFP4
    quantises the experts' matrices only), None for one it does not."""
    if isinstance(quantization, Mapping) and str(quantization.get("quant_method", "")).lower() == "mxfp4":
        return MXFP4_BITS
    return None


def _refuse_estimate_for_blocks_without_attention(where: str, layer_kinds: tuple[LayerKind, ...]) -> None:
    """The shape estimate counts every layer as attention plus MLP; Mamba, linear-attention and
    MLP-only blocks have other weights, so a count is required for such a model."""
    others = sorted({kind.label for kind in layer_kinds if isinstance(kind, (*STATE_KINDS, MlpOnly))})
    if others:
        hybrids = ", ".join(name for name, spec in MODEL_PRESETS.items() if spec.layer_kinds is not None)
        raise ValueError(
            f"model config {where!r} has {', '.join(others)} layers; its parameter count cannot be "
            "estimated from the shapes (the estimate counts attention and an MLP in every layer). Pass "
            f"num_params=..., add a 'num_params' field to the file, or use a preset ({hybrids})."
        )
