"""Layer kinds: what one decoder layer keeps for a request, for models that are not all full attention.

Most models run full attention in every layer: each layer keeps the K and V of every token of a
request. The models people deploy since 2025 mix kinds (issue 39):

* :class:`SlidingWindow` (gpt-oss, Gemma 2/3, Mistral-7B-v0.1): the layer attends to the last
  ``window`` tokens, so an allocator may free what falls out of the window.
* :class:`ChunkedLocal` (Llama 4): the layer attends within aligned chunks of ``chunk`` tokens.
* State layers, a fixed-size state per request instead of per-token K/V: :class:`Mamba1State`
  (Jamba), :class:`Mamba2State` (Nemotron-H, Granite 4) and :class:`GatedDeltaNetState`
  (Qwen3-Next's linear attention). Each holds a convolution state and an SSM (recurrent) state.
* :class:`MlpOnly`: a block without a sequence mixer (Nemotron-H's ``-`` and ``E`` blocks): no cache.

Every attention kind has the model's KV heads and head size (:class:`sim.hardware.models.ModelSpec`
carries them); only how many tokens it keeps differs. The state shapes follow vLLM's
``MambaStateShapeCalculator`` (``vllm/model_executor/layers/mamba/mamba_utils.py`` at commit
02d710837549a368073552333f66d714477415d2), tensor parallelism included:

* Mamba1: conv ``(conv_kernel - 1) x intermediate / tp``, SSM ``intermediate / tp x state_size``.
* Mamba2: conv ``(conv_kernel - 1) x (intermediate + 2 x groups x state_size) / tp``, SSM
  ``num_heads / tp x head_dim x state_size``, where ``groups`` is ``n_groups`` raised to ``tp`` when
  ``tp`` does not divide it (vLLM replicates the groups a head shard needs:
  ``extra_groups_for_head_shards``).
* Gated delta net: conv ``(conv_kernel - 1) x (2 x key_heads x key_head_dim + value_heads x
  value_head_dim) / tp``, SSM ``value_heads / tp x value_head_dim x key_head_dim``.

Their dtypes follow ``MambaStateDtypeCalculator``: the conv state is stored at ``mamba_cache_dtype``
("auto": the model dtype), the SSM state at ``mamba_ssm_cache_dtype`` ("auto": the conv state's
dtype), whatever ``kv_cache_dtype`` is. A state kind's ``ssm_dtype`` is what "auto" becomes for
that model in vLLM: its per-model hook sets Nemotron-H's to the config's ``mamba_ssm_cache_dtype``,
else float32 (``NemotronHForCausalLMConfig`` in ``vllm/model_executor/models/config.py``).
A Mamba2 kind's ``chunk_size`` is its SSD scan's chunk (the config's ``mamba_chunk_size`` or
``chunk_size``, vLLM's ``ModelConfig.get_mamba_chunk_size``): vLLM's ``mamba_cache_mode: all`` aligns
the block size to it (``sim/hardware/hybrid_capacity.py``); it is no part of a kind's identity.

:func:`layer_kinds_from_hf_config` reads the kinds from a Hugging Face ``config.json``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

__all__ = [
    "FULL_ATTENTION",
    "MLP_ONLY",
    "MAMBA_DTYPES",
    "AttentionKind",
    "ChunkedLocal",
    "FullAttention",
    "GatedDeltaNetState",
    "LayerKind",
    "Mamba1State",
    "Mamba2State",
    "MlpOnly",
    "SlidingWindow",
    "StateKind",
    "kind_counts",
    "layer_kinds_from_hf_config",
    "mamba_dtype_bytes",
    "positive_int_field",
]

# vLLM's --mamba-cache-dtype / --mamba-ssm-cache-dtype choices -> bytes ("auto" is resolved per use).
MAMBA_DTYPES: dict[str, int | None] = {
    "auto": None,
    "float32": 4,
    "fp32": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
}


def mamba_dtype_bytes(name: str, auto_bytes: int) -> int:
    """Bytes of one state element stored at ``name`` ("auto" gives ``auto_bytes``)."""
    key = name.lower()
    if key not in MAMBA_DTYPES:
        raise ValueError(f"unknown Mamba state dtype {name!r}; expected one of {sorted(MAMBA_DTYPES)}")
    size = MAMBA_DTYPES[key]
    return auto_bytes if size is None else size


def _positive_problem(label: str, value: object) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return [f"{label} must be a positive integer, got {value!r}"]
    return []


def _divide(value: int, tensor_parallel_size: int, what: str) -> int:
    # vLLM's ``divide`` asserts the split is exact; a remainder would leave a rank a partial shard.
    if value % tensor_parallel_size:
        raise ValueError(
            f"{what} ({value}) is not divisible by tensor_parallel_size ({tensor_parallel_size})"
        )
    return value // tensor_parallel_size


@dataclass(frozen=True)
class FullAttention:
    """Keeps the K and V of every token of the request."""

    @property
    def label(self) -> str:
        return "full"

    def problems(self) -> list[str]:
        return []


@dataclass(frozen=True)
class SlidingWindow:
    """Attends to the last ``window`` tokens (the current one included)."""

    window: int

    @property
    def label(self) -> str:
        return f"sliding({self.window})"

    def problems(self) -> list[str]:
        return _positive_problem("sliding window (tokens)", self.window)


@dataclass(frozen=True)
class ChunkedLocal:
    """Attends within aligned chunks of ``chunk`` tokens (Llama 4's local attention)."""

    chunk: int

    @property
    def label(self) -> str:
        return f"chunked({self.chunk})"

    def problems(self) -> list[str]:
        return _positive_problem("attention chunk (tokens)", self.chunk)


@dataclass(frozen=True)
class MlpOnly:
    """A block without a sequence mixer: it keeps nothing per request."""

    @property
    def label(self) -> str:
        return "mlp"

    def problems(self) -> list[str]:
        return []


class _StateMethods:
    """What every state kind shares: its bytes per request from its two element counts."""

    ssm_dtype: str

    def conv_state_elements(self, tensor_parallel_size: int = 1) -> int:
        raise NotImplementedError

    def ssm_state_elements(self, tensor_parallel_size: int = 1) -> int:
        raise NotImplementedError

    def state_bytes(self, tensor_parallel_size: int, conv_dtype_bytes: int, ssm_dtype_bytes: int) -> int:
        """Bytes one request's state takes in this layer on one GPU."""
        return (
            self.conv_state_elements(tensor_parallel_size) * conv_dtype_bytes
            + self.ssm_state_elements(tensor_parallel_size) * ssm_dtype_bytes
        )

    def _dtype_problems(self) -> list[str]:
        if self.ssm_dtype.lower() not in MAMBA_DTYPES:
            return [f"ssm_dtype must be one of {sorted(MAMBA_DTYPES)}, got {self.ssm_dtype!r}"]
        return []


@dataclass(frozen=True)
class Mamba1State(_StateMethods):
    """A Mamba (1) mixer: ``intermediate_size = mamba_expand x hidden_size`` (Jamba)."""

    intermediate_size: int
    state_size: int
    conv_kernel: int
    ssm_dtype: str = "auto"

    @property
    def label(self) -> str:
        return "mamba1"

    def conv_state_elements(self, tensor_parallel_size: int = 1) -> int:
        width = _divide(self.intermediate_size, tensor_parallel_size, "Mamba intermediate size")
        return (self.conv_kernel - 1) * width

    def ssm_state_elements(self, tensor_parallel_size: int = 1) -> int:
        width = _divide(self.intermediate_size, tensor_parallel_size, "Mamba intermediate size")
        return width * self.state_size

    def problems(self) -> list[str]:
        return [
            *_positive_problem("Mamba intermediate_size", self.intermediate_size),
            *_positive_problem("Mamba state_size", self.state_size),
            *_positive_problem("Mamba conv_kernel", self.conv_kernel),
            *self._dtype_problems(),
        ]


@dataclass(frozen=True)
class Mamba2State(_StateMethods):
    """A Mamba2 mixer (Nemotron-H, Granite 4): ``intermediate_size = num_heads x head_dim``."""

    intermediate_size: int
    n_groups: int
    num_heads: int
    head_dim: int
    state_size: int
    conv_kernel: int
    ssm_dtype: str = "auto"
    chunk_size: int | None = field(default=None, compare=False)
    """The SSD scan's chunk in tokens (None: the config does not say; vLLM then uses 2048)."""

    @property
    def label(self) -> str:
        return "mamba2"

    def conv_state_elements(self, tensor_parallel_size: int = 1) -> int:
        # A head shard needs the B and C groups its heads read: vLLM replicates groups up to tp.
        groups = self.n_groups + (
            0 if self.n_groups % tensor_parallel_size == 0 else tensor_parallel_size - self.n_groups
        )
        conv_dim = self.intermediate_size + 2 * groups * self.state_size
        return (self.conv_kernel - 1) * _divide(conv_dim, tensor_parallel_size, "Mamba2 conv width")

    def ssm_state_elements(self, tensor_parallel_size: int = 1) -> int:
        heads = _divide(self.num_heads, tensor_parallel_size, "Mamba2 heads")
        return heads * self.head_dim * self.state_size

    def problems(self) -> list[str]:
        return [
            *_positive_problem("Mamba2 intermediate_size", self.intermediate_size),
            *_positive_problem("Mamba2 n_groups", self.n_groups),
            *_positive_problem("Mamba2 num_heads", self.num_heads),
            *_positive_problem("Mamba2 head_dim", self.head_dim),
            *_positive_problem("Mamba2 state_size", self.state_size),
            *_positive_problem("Mamba2 conv_kernel", self.conv_kernel),
            *([] if self.chunk_size is None else _positive_problem("Mamba2 chunk_size", self.chunk_size)),
            *self._dtype_problems(),
        ]


@dataclass(frozen=True)
class GatedDeltaNetState(_StateMethods):
    """Qwen3-Next's linear attention (gated delta net): a ``value_head_dim x key_head_dim`` state per
    value head and a short convolution over q, k and v."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    ssm_dtype: str = "auto"

    @property
    def label(self) -> str:
        return "gdn"

    def conv_state_elements(self, tensor_parallel_size: int = 1) -> int:
        conv_dim = 2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim
        return (self.conv_kernel - 1) * _divide(conv_dim, tensor_parallel_size, "gated delta net conv width")

    def ssm_state_elements(self, tensor_parallel_size: int = 1) -> int:
        heads = _divide(self.num_value_heads, tensor_parallel_size, "gated delta net value heads")
        return heads * self.value_head_dim * self.key_head_dim

    def problems(self) -> list[str]:
        return [
            *_positive_problem("gated delta net num_key_heads", self.num_key_heads),
            *_positive_problem("gated delta net num_value_heads", self.num_value_heads),
            *_positive_problem("gated delta net key_head_dim", self.key_head_dim),
            *_positive_problem("gated delta net value_head_dim", self.value_head_dim),
            *_positive_problem("gated delta net conv_kernel", self.conv_kernel),
            *self._dtype_problems(),
        ]


AttentionKind: TypeAlias = FullAttention | SlidingWindow | ChunkedLocal
StateKind: TypeAlias = Mamba1State | Mamba2State | GatedDeltaNetState
LayerKind: TypeAlias = AttentionKind | StateKind | MlpOnly

ATTENTION_KINDS = (FullAttention, SlidingWindow, ChunkedLocal)
STATE_KINDS = (Mamba1State, Mamba2State, GatedDeltaNetState)
LAYER_KINDS = (*ATTENTION_KINDS, *STATE_KINDS, MlpOnly)

FULL_ATTENTION = FullAttention()
MLP_ONLY = MlpOnly()


def kind_counts(kinds: Sequence[LayerKind]) -> tuple[tuple[LayerKind, int], ...]:
    """``(kind, layers)`` for each distinct kind, in the order the kinds first appear."""
    counts: dict[LayerKind, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return tuple(counts.items())


# ---------------------------------------------------------------------------------------------
# Hugging Face config.json
# ---------------------------------------------------------------------------------------------

# Where a config has a window but no per-layer list, transformers' config class derives the list:
# layer i slides unless (i + 1) is a multiple of the pattern (Gemma2Config, GptOssConfig: 2;
# Gemma3TextConfig: its sliding_window_pattern, default 6; Cohere2Config: 4).
_SLIDING_PATTERN_BY_MODEL_TYPE = {"gemma2": 2, "gpt_oss": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4}

# Nemotron-H's hybrid_override_pattern, one character per block.
_PATTERN_CHARACTERS = {"M": "mamba", "*": "full_attention", "-": "mlp", "E": "moe"}

_TYPE_NAMES = {
    "full_attention": "full",
    "attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "gated_delta_net",
    "mamba": "mamba",
    "mlp": "none",
    "moe": "none",
}


def positive_int_field(cfg: Mapping[str, Any], where: str, *names: str, required: bool = True) -> int | None:
    """The first of ``names`` the config sets, which must be a positive integer."""
    for name in names:
        value = cfg.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(
                f"model config {where!r}: field {name!r} must be a positive integer, got {value!r}"
            )
        return value
    if required:
        raise ValueError(
            f"model config {where!r}: missing required field {' or '.join(repr(n) for n in names)}"
        )
    return None


def _required_int(cfg: Mapping[str, Any], where: str, *names: str) -> int:
    value = positive_int_field(cfg, where, *names)
    assert value is not None
    return value


def _sliding_window(cfg: Mapping[str, Any], where: str) -> int | None:
    """The config's window, unless ``use_sliding_window`` turns it off (Qwen2/Qwen3 configs carry a
    window they do not use; vLLM's ``get_hf_config_sliding_window`` ignores it the same way)."""
    if cfg.get("use_sliding_window") is False:
        return None
    return positive_int_field(cfg, where, "sliding_window", required=False)


def _checked_list(cfg: Mapping[str, Any], where: str, key: str, num_layers: int) -> list[Any]:
    value = cfg[key]
    if not isinstance(value, list):
        raise ValueError(f"model config {where!r}: field {key!r} must be a list, got {value!r}")
    if len(value) != num_layers:
        raise ValueError(
            f"model config {where!r}: field {key!r} has {len(value)} entries but num_hidden_layers is {num_layers}"
        )
    return value


def _names_from_pattern(cfg: Mapping[str, Any], where: str, num_layers: int) -> list[str]:
    pattern = cfg["hybrid_override_pattern"]
    if not isinstance(pattern, str):
        raise ValueError(
            f"model config {where!r}: field 'hybrid_override_pattern' must be a string, got {pattern!r}"
        )
    if len(pattern) != num_layers:
        raise ValueError(
            f"model config {where!r}: field 'hybrid_override_pattern' has {len(pattern)} characters "
            f"but num_hidden_layers is {num_layers}"
        )
    for layer, character in enumerate(pattern):
        if character not in _PATTERN_CHARACTERS:
            raise ValueError(
                f"model config {where!r}: field 'hybrid_override_pattern' has an unknown layer type "
                f"{character!r} at layer {layer}; known: {', '.join(repr(c) for c in _PATTERN_CHARACTERS)}"
            )
    return [_PATTERN_CHARACTERS[character] for character in pattern]


def _names_from_attention_period(cfg: Mapping[str, Any], where: str, num_layers: int) -> list[str]:
    # JambaConfig.layers_block_type: attention where layer % attn_layer_period == attn_layer_offset.
    period = _required_int(cfg, where, "attn_layer_period")
    offset = cfg.get("attn_layer_offset", 0)
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < period:
        raise ValueError(
            f"model config {where!r}: field 'attn_layer_offset' must be an integer in [0, attn_layer_period "
            f"= {period}), got {offset!r}"
        )
    return ["attention" if layer % period == offset else "mamba" for layer in range(num_layers)]


def _names_from_chunk(cfg: Mapping[str, Any], where: str, num_layers: int) -> list[str]:
    # Llama4TextConfig: no_rope_layers[i] is 1 for a RoPE layer, 0 for a NoPE one; empty or absent, a
    # NoPE layer every no_rope_layer_interval (default 4). vLLM's Llama4Attention runs a RoPE layer
    # as ChunkedLocalAttention, a NoPE layer as full attention.
    uses_rope = cfg.get("no_rope_layers")
    if uses_rope:
        uses_rope = _checked_list(cfg, where, "no_rope_layers", num_layers)
        for layer, flag in enumerate(uses_rope):
            if flag not in (0, 1) or isinstance(flag, bool):
                raise ValueError(
                    f"model config {where!r}: field 'no_rope_layers' must hold 0 or 1, got {flag!r} at layer {layer}"
                )
    else:
        interval = positive_int_field(cfg, where, "no_rope_layer_interval", required=False) or 4
        uses_rope = [int((layer + 1) % interval != 0) for layer in range(num_layers)]
    return ["chunked_attention" if flag else "full_attention" for flag in uses_rope]


def _names_from_window(cfg: Mapping[str, Any], where: str, num_layers: int) -> list[str]:
    model_type = str(cfg.get("model_type", "")).lower()
    pattern = positive_int_field(cfg, where, "sliding_window_pattern", required=False)
    pattern = pattern or _SLIDING_PATTERN_BY_MODEL_TYPE.get(model_type)
    if pattern:
        return [
            "sliding_attention" if (layer + 1) % pattern else "full_attention" for layer in range(num_layers)
        ]
    if cfg.get("use_sliding_window") is True:
        # Qwen2Config: with use_sliding_window, layers from max_window_layers on slide.
        first = cfg.get("max_window_layers")
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ValueError(
                f"model config {where!r}: use_sliding_window needs an integer 'max_window_layers' >= 0, got {first!r}"
            )
        return ["sliding_attention" if layer >= first else "full_attention" for layer in range(num_layers)]
    # A window and nothing else (Mistral-7B-v0.1): vLLM sets CacheConfig.sliding_window and every
    # layer slides (arg_utils: "Only set CacheConfig.sliding_window if the model is all sliding window").
    return ["sliding_attention"] * num_layers


def _layer_type_names(cfg: Mapping[str, Any], where: str, num_layers: int) -> tuple[list[str], str] | None:
    """Each layer's type name and the field it came from; ``None`` for a model that names none."""
    if cfg.get("layer_types") is not None:
        names = _checked_list(cfg, where, "layer_types", num_layers)
        return names, "layer_types"
    if cfg.get("hybrid_override_pattern") is not None:
        return _names_from_pattern(cfg, where, num_layers), "hybrid_override_pattern"
    if cfg.get("layers_block_type") is not None:
        return _checked_list(cfg, where, "layers_block_type", num_layers), "layers_block_type"
    if cfg.get("attn_layer_period") is not None:
        return _names_from_attention_period(cfg, where, num_layers), "attn_layer_period"
    if cfg.get("attention_chunk_size") is not None:
        return _names_from_chunk(cfg, where, num_layers), "no_rope_layers"
    if str(cfg.get("model_type", "")).lower() == "qwen3_next":
        # Qwen3NextConfig: a full-attention layer every full_attention_interval (default 4).
        interval = positive_int_field(cfg, where, "full_attention_interval", required=False) or 4
        names = [
            "linear_attention" if (layer + 1) % interval else "full_attention" for layer in range(num_layers)
        ]
        return names, "full_attention_interval"
    if _sliding_window(cfg, where) is not None:
        return _names_from_window(cfg, where, num_layers), "sliding_window"
    return None


def _mamba_kind(cfg: Mapping[str, Any], where: str, hidden_size: int) -> StateKind:
    """A Mamba layer's state from the config's shape fields (both spellings of each)."""
    model_type = str(cfg.get("model_type", "")).lower()
    if cfg.get("mamba_num_heads") is not None or cfg.get("mamba_n_heads") is not None:
        num_heads = _required_int(cfg, where, "mamba_num_heads", "mamba_n_heads")
        head_dim = _required_int(cfg, where, "mamba_head_dim", "mamba_d_head")
        # vLLM's NemotronH model sizes the mixer as heads x head_dim (its config's expand is unused).
        default_ssm = "float32" if model_type == "nemotron_h" else "auto"
        return Mamba2State(
            intermediate_size=num_heads * head_dim,
            n_groups=_required_int(cfg, where, "n_groups", "mamba_n_groups"),
            num_heads=num_heads,
            head_dim=head_dim,
            state_size=_required_int(cfg, where, "ssm_state_size", "mamba_d_state"),
            conv_kernel=_required_int(cfg, where, "conv_kernel", "mamba_d_conv"),
            ssm_dtype=_state_dtype(cfg, where, "mamba_ssm_cache_dtype", default_ssm),
            chunk_size=positive_int_field(cfg, where, "mamba_chunk_size", "chunk_size", required=False),
        )
    if cfg.get("mamba_d_state") is not None:
        return Mamba1State(
            intermediate_size=_required_int(cfg, where, "mamba_expand") * hidden_size,
            state_size=_required_int(cfg, where, "mamba_d_state"),
            conv_kernel=_required_int(cfg, where, "mamba_d_conv"),
        )
    raise ValueError(
        f"model config {where!r}: Mamba layers need their state shapes: 'mamba_num_heads', "
        "'mamba_head_dim', 'ssm_state_size', 'n_groups', 'conv_kernel' (Mamba2) or 'mamba_d_state', "
        "'mamba_d_conv', 'mamba_expand' (Mamba1)"
    )


def _state_dtype(cfg: Mapping[str, Any], where: str, key: str, default: str) -> str:
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or value.lower() not in MAMBA_DTYPES:
        raise ValueError(
            f"model config {where!r}: field {key!r} must be one of {sorted(MAMBA_DTYPES)}, got {value!r}"
        )
    return value.lower()


def _gated_delta_net_kind(cfg: Mapping[str, Any], where: str) -> GatedDeltaNetState:
    return GatedDeltaNetState(
        num_key_heads=_required_int(cfg, where, "linear_num_key_heads"),
        num_value_heads=_required_int(cfg, where, "linear_num_value_heads"),
        key_head_dim=_required_int(cfg, where, "linear_key_head_dim"),
        value_head_dim=_required_int(cfg, where, "linear_value_head_dim"),
        conv_kernel=_required_int(cfg, where, "linear_conv_kernel_dim"),
        # Qwen3.5 configs name the SSM state's dtype; vLLM's Qwen3.5 hook applies it to "auto".
        ssm_dtype=_state_dtype(cfg, where, "mamba_ssm_dtype", "auto"),
    )


def _kind_for(
    cfg: Mapping[str, Any], where: str, key: str, layer: int, name: object, hidden_size: int
) -> LayerKind:
    family = _TYPE_NAMES.get(name) if isinstance(name, str) else None
    if family is None:
        raise ValueError(
            f"model config {where!r}: field {key!r} has an unknown layer type {name!r} at layer {layer}; "
            f"known: {', '.join(repr(n) for n in _TYPE_NAMES)}"
        )
    if family == "full":
        return FULL_ATTENTION
    if family == "sliding":
        window = _sliding_window(cfg, where)
        if window is None:
            raise ValueError(
                f"model config {where!r}: field {key!r} names 'sliding_attention' at layer {layer} but "
                "'sliding_window' is missing, null or turned off by use_sliding_window"
            )
        return SlidingWindow(window)
    if family == "chunked":
        return ChunkedLocal(_required_int(cfg, where, "attention_chunk_size"))
    if family == "gated_delta_net":
        return _gated_delta_net_kind(cfg, where)
    if family == "mamba":
        return _mamba_kind(cfg, where, hidden_size)
    return MLP_ONLY


def layer_kinds_from_hf_config(
    cfg: Mapping[str, Any], where: str, num_layers: int, hidden_size: int
) -> tuple[LayerKind, ...] | None:
    """Each decoder layer's kind, from a ``config.json`` already read into ``cfg``; ``None`` when every
    layer is full attention (the model then behaves exactly as a model without kinds).

    The first of these fields that the config sets names the layers:

    * ``layer_types``: "full_attention"/"attention", "sliding_attention" (gpt-oss, Gemma 3),
      "chunked_attention" (Llama 4, newer configs), "linear_attention" (Qwen3-Next's gated delta
      net), "mamba" (Granite 4), "mlp"/"moe" (no cache);
    * ``hybrid_override_pattern`` (Nemotron-H): ``M`` Mamba2, ``*`` attention, ``-`` MLP, ``E`` MoE;
    * ``layers_block_type``: a list of the names above;
    * ``attn_layer_period`` and ``attn_layer_offset`` (Jamba): attention where
      ``layer % period == offset``, Mamba elsewhere;
    * ``attention_chunk_size`` (Llama 4): chunked where ``no_rope_layers`` is 1, full where it is 0
      (absent or empty: a full layer every ``no_rope_layer_interval``, default 4);
    * ``model_type`` "qwen3_next": a full layer every ``full_attention_interval`` (default 4), gated
      delta net elsewhere;
    * ``sliding_window`` (unless ``use_sliding_window`` is false): with ``sliding_window_pattern``
      (or the model type's default: Gemma 3 6, Gemma 2 and gpt-oss 2, Cohere 2 4) a full layer every
      pattern-th layer; with ``use_sliding_window`` true, sliding from ``max_window_layers`` on;
      else every layer slides (Mistral-7B-v0.1).

    Windows come from ``sliding_window``, chunks from ``attention_chunk_size``, gated delta net
    states from ``linear_num_key_heads``, ``linear_num_value_heads``, ``linear_key_head_dim``,
    ``linear_value_head_dim`` and ``linear_conv_kernel_dim``, Mamba2 states from
    ``mamba_num_heads``/``mamba_n_heads``, ``mamba_head_dim``/``mamba_d_head``,
    ``ssm_state_size``/``mamba_d_state``, ``n_groups``/``mamba_n_groups`` and
    ``conv_kernel``/``mamba_d_conv``, Mamba1 states from ``mamba_d_state``, ``mamba_d_conv`` and
    ``mamba_expand``. A window or chunk longer than the context is kept as written: it never binds,
    and vLLM still puts such layers in a KV-cache group of their own.

    Raises ``ValueError`` naming the file, the field and the value for an unknown layer type, a list
    whose length is not ``num_hidden_layers``, or a missing or non-positive size.
    """
    found = _layer_type_names(cfg, where, num_layers)
    if found is None:
        return None
    names, key = found
    made: dict[object, LayerKind] = {}
    kinds: list[LayerKind] = []
    for layer, name in enumerate(names):
        hashable = name if isinstance(name, str) else repr(name)
        if hashable not in made:
            made[hashable] = _kind_for(cfg, where, key, layer, name, hidden_size)
        kinds.append(made[hashable])
    if all(kind == FULL_ATTENTION for kind in kinds):
        return None
    return tuple(kinds)
