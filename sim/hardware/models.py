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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "KV_CACHE_DTYPES",
    "MODEL_PRESETS",
    "ModelSpec",
    "activation_dtype_bytes",
    "check_tensor_parallel",
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

    @property
    def active_params(self) -> int:
        """Parameters used per token (all of them for a dense model)."""
        return self.num_active_params if self.num_active_params is not None else self.num_params

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
        """KV-cache bytes one token occupies on one GPU, summed over all layers.

        With tensor parallelism each GPU keeps ``max(1, num_kv_heads // tp)`` KV heads (heads are
        replicated once ``tp`` exceeds their number); an MLA latent is replicated on every GPU.
        ``tensor_parallel_size=1`` (the default) gives the whole model's bytes per token.
        """
        if isinstance(tensor_parallel_size, bool) or not isinstance(tensor_parallel_size, int):
            raise ValueError(f"tensor_parallel_size must be an integer, got {tensor_parallel_size!r}")
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        if self.attention == "mla":
            assert self.kv_lora_rank is not None and self.qk_rope_head_dim is not None
            if kv_cache_dtype.lower() == "fp8_ds_mla":
                return _FP8_DS_MLA_BYTES_PER_LAYER * self.num_layers
            return (
                (self.kv_lora_rank + self.qk_rope_head_dim)
                * self.num_layers
                * self.kv_dtype_bytes(kv_cache_dtype)
            )
        if kv_cache_dtype.lower() == "fp8_ds_mla":
            raise ValueError(
                f"kv_cache_dtype 'fp8_ds_mla' applies to MLA models only; {self.name!r} is MHA/GQA"
            )
        kv_heads = self.kv_heads_per_gpu(tensor_parallel_size)
        return 2 * self.num_layers * kv_heads * self.head_dim * self.kv_dtype_bytes(kv_cache_dtype)

    def kv_heads_per_gpu(self, tensor_parallel_size: int = 1) -> int:
        """KV heads one GPU holds under tensor parallelism (1 for MLA: the shared latent)."""
        if self.attention == "mla":
            return 1
        return max(1, self.num_kv_heads // tensor_parallel_size)

    def weight_bytes(self) -> int:
        """Bytes of all weights at ``weight_dtype_bytes`` per parameter (whole model, tp = 1)."""
        return self.num_params * self.weight_dtype_bytes

    def weight_bytes_per_gpu(self, tensor_parallel_size: int = 1) -> int:
        """Weight bytes one GPU holds: ``ceil(weight_bytes / tp)``. vLLM splits every matrix (QKV and
        MLP by columns, O and down projections by rows, embedding and LM head by vocabulary); the
        replicated norms, ``(2 x layers + 1) x hidden`` parameters (2.6 MB for Llama-3.1-70B), are
        counted split too, an error under 0.01 %."""
        return math.ceil(self.weight_bytes() / tensor_parallel_size)

    @property
    def activation_dtype_bytes(self) -> int:
        """Bytes of one activation element (:func:`activation_dtype_bytes`)."""
        return activation_dtype_bytes(self.weight_dtype_bytes)

    def check_tensor_parallel(self, tensor_parallel_size: int) -> None:
        """Raise ``ValueError`` for a TP size vLLM would refuse (:func:`check_tensor_parallel`)."""
        check_tensor_parallel(self, tensor_parallel_size)


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
    # mistralai/Mistral-7B-v0.1 config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads,
    # intermediate 14336, vocab 32000, max_position_embeddings 32768, sliding_window 4096 (not
    # modelled: every token is cached, an upper bound), bfloat16. 7,241,732,096 params ("7.24B").
    # Checked: sumitdotml/transformers mistral-7b-v0.1/README.md (params table); config copies with
    # max_position_embeddings 32768 and sliding_window 4096; transformers MistralConfig defaults.
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
    ),
}

# Extra names that resolve to a preset (compared after normalisation, see _normalise_name).
_PRESET_ALIASES: dict[str, str] = {
    "mistral-7b": "Mistral-7B-v0.1",
    "llama-3.1-8b": "Llama-3.1-8B",
    "llama3.1-8b": "Llama-3.1-8B",
    "llama-3.1-70b": "Llama-3.1-70B",
    "llama3.1-70b": "Llama-3.1-70B",
    "deepseek-v3-base": "DeepSeek-V3",
    "deepseek-v2-lite-chat": "DeepSeek-V2-Lite",
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
_UNGATED_MLP = {"opt", "gpt2", "gpt_bigcode", "bloom", "falcon", "gpt_neox", "gptj", "phi"}
_QKV_BIAS = {"qwen2", "qwen2_moe"}
_MOE_KEYS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_intermediate_size")


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
    for name in names:
        value = cfg.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(
                f"model config {str(path)!r}: field {name!r} must be a positive integer, got {value!r}"
            )
        return value
    if required:
        raise ValueError(
            f"model config {str(path)!r}: missing required field {' or '.join(repr(n) for n in names)}"
        )
    return None


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
) -> int:
    """Parameter count of a dense decoder-only transformer, from its shapes.

    ``embedding (vocab x hidden)``
    ``+ layers x [attention + MLP + norms]``
    ``+ final norm + lm_head (vocab x hidden, unless tie_word_embeddings)``, where

    * attention = q ``hidden x heads x head_dim`` + k, v ``2 x hidden x kv_heads x head_dim``
      + o ``heads x head_dim x hidden`` (+ q/k/v biases for Qwen2);
    * MLP = ``3 x hidden x intermediate`` when gated (SwiGLU: gate, up, down), else ``2 x``;
    * norms = two RMSNorm weight vectors of ``hidden`` per layer.

    ``opt_style`` adds what OPT has on top: biases on every linear layer, LayerNorms with bias
    (``4 x hidden`` per layer), and learned positions ``(max_position_embeddings + 2) x hidden``.
    Exact for Llama, Mistral, Qwen2 and OPT checkpoints; under by 2 x hidden per layer for Gemma-2
    (four norms per layer), i.e. < 0.01 %. Not valid for mixture-of-experts models.
    """
    q = hidden_size * num_attention_heads * head_dim
    kv = 2 * hidden_size * num_kv_heads * head_dim
    o = num_attention_heads * head_dim * hidden_size
    attention = q + kv + o
    if qkv_bias or opt_style:
        attention += (num_attention_heads + 2 * num_kv_heads) * head_dim
    if opt_style:
        attention += hidden_size  # out_proj bias
    mlp = (3 if gated_mlp else 2) * hidden_size * intermediate_size
    if opt_style:
        mlp += intermediate_size + hidden_size  # fc1 and fc2 biases
    norms = (4 if opt_style else 2) * hidden_size
    total = vocab_size * hidden_size  # token embedding
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

    Parameter count: ``num_params`` argument, else a ``num_params``/``num_parameters`` field in the
    file, else :func:`estimate_num_params` from the shapes. A mixture-of-experts config (any of
    ``n_routed_experts``, ``num_local_experts``, ``num_experts``, ``moe_intermediate_size``) has no
    shape estimate here and raises unless a count is given; the DeepSeek presets carry theirs.

    Quantised checkpoints (a ``quantization_config``) are sized at ``torch_dtype`` with a warning;
    adjust ``weight_dtype_bytes`` with :func:`dataclasses.replace`.

    Raises ``ValueError`` naming the file (and field) for a missing file, bad JSON or a missing or
    invalid field.
    """
    cfg_path = _config_path(path)
    cfg = _read_config(cfg_path)
    where = str(cfg_path)
    model_type = str(cfg.get("model_type", "")).lower()

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
    if cfg.get("quantization_config"):
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
    is_moe = any(cfg.get(key) for key in _MOE_KEYS)
    if num_params is None:
        num_params = _int_field(cfg, cfg_path, "num_params", "num_parameters", required=False)
    if num_params is None:
        if is_moe:
            raise ValueError(
                f"model config {where!r} describes a mixture-of-experts model; its parameter count "
                "cannot be estimated from the dense shapes. Pass num_params=... (total parameters, "
                "all experts), add a 'num_params' field to the file, or use a preset "
                f"({', '.join(k for k, v in MODEL_PRESETS.items() if v.num_active_params)})."
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
        )
    except ValueError as exc:
        raise ValueError(f"model config {where!r}: {exc}") from exc
