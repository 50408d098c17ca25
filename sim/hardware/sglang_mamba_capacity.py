"""SGLang's two pools for a model with Mamba / linear-attention and full-attention layers (Qwen3-Next,
Nemotron-H): a token pool for the full-attention layers (``HybridLinearKVPool``) and a pool of
Mamba states (``MambaPool``, inside ``HybridReqToTokenPool``), one state per slot.

How SGLang sizes them (``python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py``,
``profile_max_num_token``, ``handle_max_mamba_cache``, ``calculate_mamba_ratio``, ``init_memory``):

1. ``mamba_cache_per_req`` (``BaseLinearStateParams``, ``configs/mamba_utils.py``): every state layer's
   conv state at ``bfloat16`` (``SGLANG_MAMBA_CONV_DTYPE``'s default) and SSM state at ``float32``
   (``mamba2_state_dtype``: the config's ``mamba_ssm_dtype`` if it names one, else float32; option
   ``mamba_ssm_dtype`` stands for ``SGLANG_MAMBA_SSM_DTYPE``), the same element counts as vLLM's
   (:mod:`sim.hardware.layers`).
2. ``handle_max_mamba_cache``, in GB as floats (``rest`` = the KV memory / 2^30): unless
   ``--max-mamba-cache-size`` is set (option ``max_mamba_cache_size``), the states take
   ``rest x r / (1 + r)`` (``r = --mamba-full-memory-ratio``, 0.9 by default):
   ``max_mamba_cache_size = int(rest x r / (1 + r) x 2^30 // mamba_cache_per_req)``; the rest loses
   ``max_mamba_cache_size x mamba_cache_per_req / 2^30``.
3. ``profile_max_num_token``: ``max_total_num_tokens = int(rest x 2^30) // cell_size``, the cell a
   token's K and V in every full-attention layer only; then rounded down to the page size.
4. ``init_memory``: the running requests are capped at ``max_mamba_cache_size // ratio``
   (``calculate_mamba_ratio``: 1 with ``--disable-radix-cache``, 3 with the radix cache, whose tree
   keeps states of its own), below SGLang's default ``min(max(int(max_total_num_tokens / context_len x
   512), 2048), 4096)``. kvsim takes the lesser of that and ``engine.max_num_seqs``.
5. The Mamba radix cache's strategy (option ``mamba_scheduler_strategy``, SGLang's
   ``--mamba-scheduler-strategy``, since renamed ``--mamba-radix-cache-strategy``, which kvsim also
   accepts as the option ``mamba_radix_cache_strategy``), with the radix cache only:

   - ``auto`` (the default, SGLang's since 2026-07-20, sgl-project/sglang#28151):
     ``extra_buffer`` when the overlap scheduler is on (kvsim's ``engine.async_scheduling``) or
     pages are above one token, and the model's class (:attr:`ModelSpec.architecture`, a config's
     ``architectures[0]``) is one SGLang's ``_MAMBA_EXTRA_BUFFER_ARCHS`` lists; else ``no_buffer``.
     A model whose class is not known (no ``architectures`` in its config) resolves ``no_buffer``.
   - ``no_buffer``: a request holds its state only (ratio of step 4: 3). SGLang runs it without the
     overlap scheduler (``auto`` turns it off; given explicitly, SGLang asserts it is off), so kvsim
     runs such a variant without async scheduling (:attr:`SGLangMambaCapacity.overlap`).
   - ``extra_buffer``: each running request holds tracking buffers besides its state
     (``mamba_ping_pong_track_buffer_size``): two with the overlap scheduler, one without, so the
     ratio is 3 + 2 = 5 or 3 + 1 = 4; the pools do not change. Its states are kept at multiples of
     ``mamba_cache_chunk_size`` (the model's Mamba2 ``mamba_chunk_size``, else the FLA kernels' 64,
     at least a page) in a prefill chunk and of ``mamba_track_interval`` (option, 256) while
     decoding; pages above one token are allowed (``page_size`` dividing 64 or a multiple of it, the
     interval a whole number of pages). SGLang refuses it for a class its list does not name.
   - ``extra_buffer_lazy`` (sgl-project/sglang#27118, 2026-06): one tracking buffer held (ratio 4),
     the second taken on demand at a tracking boundary; it needs the overlap scheduler. kvsim runs
     it as ``extra_buffer`` with one buffer and always finds the on-demand slot (SGLang skips caching
     that state when the pool has none free at that instant).

   Read at sgl-project/sglang 64bca5315f59ae6b7e57cf4d8a13180f0e7e518f (2026-02-19:
   ``server_args.py``, ``_handle_mamba_radix_cache``, ``mamba_cache_chunk_size``;
   ``init_memory_pool``'s ``MAMBA_CACHE_V2_ADDITIONAL_RATIO_*``; ``memory_pool.py``'s
   ``HybridReqToTokenPool``) and, for ``auto``, the renamed flag, the buffers without overlap and the
   lazy strategy, at bc0c93b5e4955c5b27133ca587401e91cf628d27 (``arg_groups/overrides.py``:
   ``_MAMBA_EXTRA_BUFFER_ARCHS``, ``supports_mamba_cache_extra_buffer`` (which also needs the
   ``triton`` linear-attention backend, SGLang's default), ``_mamba_radix_cache_resolution``;
   ``arg_groups/mamba_hook.py``'s validations; ``MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_OVERLAP`` and
   ``_OVERLAP_LAZY``, 1 each).

Read at sgl-project/sglang commit 001ccef0072a4537d4ec6bdd50a73e6feb2c907d
(``model_runner_kv_cache_mixin.py``) and 02e208ded6769bd3332cbdc6cf0da939f541514f
(``configs/mamba_utils.py``); ``ServerArgs``' defaults (``mamba_full_memory_ratio = 0.9``,
``mamba_ssm_dtype = "float32"``) from the public code index. No code is copied. kvsim's available KV
bytes (:func:`sim.hardware.capacity.size_kv_pool`) stand for SGLang's ``rest_memory``. Not modelled:
the one padding slot every pool keeps past its size (in the start-up lines' bytes only), the
extra-buffer strategy's single buffer under speculative decoding and its intermediate states, ``--max-running-requests`` sizing the Mamba pool when the radix cache
is off (kvsim's ``max_num_seqs`` defaults to vLLM's 256, not SGLang's unset: set
``max_mamba_cache_size`` to reproduce it), ``--max-total-tokens``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.hardware.layers import (
    STATE_KINDS,
    ChunkedLocal,
    FullAttention,
    GatedDeltaNetState,
    Mamba2State,
    MlpOnly,
    SlidingWindow,
    StateKind,
    mamba_dtype_bytes,
)
from sim.hardware.models import ModelSpec, resolve_model

__all__ = [
    "DEFAULT_MAMBA_FULL_MEMORY_RATIO",
    "DEFAULT_MAMBA_TRACK_INTERVAL",
    "EXTRA_BUFFER_ARCHITECTURES",
    "MAMBA_CACHE_RATIO_RADIX",
    "MAMBA_STRATEGIES",
    "SGLangMambaCapacity",
    "has_state_layers",
    "resolve_strategy",
    "sglang_mamba_kv_capacity",
]

DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9
"""``ServerArgs.mamba_full_memory_ratio``'s default."""
MAMBA_CACHE_RATIO_RADIX = 3
"""``MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO``: Mamba slots per running request with the radix cache."""
EXTRA_BUFFER_RATIO = 2
"""``MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP``: the extra-buffer strategy's tracking buffers with the
overlap scheduler (``_NO_OVERLAP`` and the lazy strategy's ``_OVERLAP_LAZY``: 1)."""
MAMBA_STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
"""``--mamba-radix-cache-strategy``'s values (``auto``: SGLang's choice between the next two)."""
EXTRA_BUFFER_ARCHITECTURES = frozenset(
    {
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen3NextForCausalLM",
        "InternS2PreviewForConditionalGeneration",
        "MiniCPMV4_6ForConditionalGeneration",
        "BailingMoeV2_5ForCausalLM",
        "FalconH1ForCausalLM",
        "GraniteMoeHybridForCausalLM",
        "NemotronHForCausalLM",
        "NemotronHPuzzleForCausalLM",
    }
)
"""SGLang's ``_MAMBA_EXTRA_BUFFER_ARCHS`` at bc0c93b5: the model classes ``extra_buffer`` runs for."""
DEFAULT_MAMBA_TRACK_INTERVAL = 256
"""``ServerArgs.mamba_track_interval``: decode positions whose state the extra-buffer strategy tracks."""
FLA_CHUNK_SIZE = 64
"""The FLA kernels' chunk (``layers/attention/fla/chunk_delta_h.py``): the least prefill caching step."""
CONV_DTYPE_BYTES = 2  # (bfloat16: SGLANG_MAMBA_CONV_DTYPE's default)
DEFAULT_SSM_DTYPE = "float32"
SGLANG_SSM_DTYPES = ("float32", "bfloat16", "float16")  # (mamba2_state_dtype's dtype_map)
GIB = 1 << 30


def has_state_layers(model: ModelSpec) -> bool:
    """Whether ``model`` has Mamba / linear-attention layers (SGLang's ``mambaish_config``)."""
    return any(isinstance(kind, STATE_KINDS) for kind in model.layer_kinds or ())


@dataclass(frozen=True)
class SGLangMambaCapacity:
    """The full-attention token pool and the Mamba state pool SGLang builds on one GPU."""

    model: str
    available_kv_bytes: int
    mamba_full_memory_ratio: float
    page_size: int
    radix_cache: bool
    full_layers: int
    state_layers: int
    state_label: str
    """The state layers' kind (``gdn``, ``mamba2``...): the Mamba pool's group name."""
    layer_bytes: int
    """K and V of one token in one full-attention layer, one GPU."""
    conv_state_bytes: int
    """One request's conv states over every state layer."""
    ssm_state_bytes: int
    """One request's SSM states over every state layer."""
    mamba_slots: int
    """``max_mamba_cache_size``: states the Mamba pool holds."""
    strategy: str
    """The strategy SGLang runs: ``no_buffer``, ``extra_buffer`` or ``extra_buffer_lazy`` (``auto``
    resolved; module docstring, step 5)."""
    track_buffers: int
    """Tracking buffers a running request holds besides its state (``no_buffer``: 0)."""
    overlap: bool
    """Whether SGLang runs its overlap scheduler (kvsim's async scheduling): off with ``no_buffer``
    and the radix cache."""
    track_interval: int
    """``mamba_track_interval`` (extra-buffer): decode positions, multiples of it, whose state is kept."""
    cache_chunk: int
    """``mamba_cache_chunk_size`` (extra-buffer): prefill states are kept at multiples of it."""
    full_tokens: int
    """``max_total_num_tokens``: tokens the full-attention pool holds, page-aligned."""
    max_running_requests: int
    """SGLang's cap on running requests (``max_num_reqs``; step 4 of the module docstring)."""
    context_len: int

    @property
    def cell_size(self) -> int:
        """Bytes of one token in every full-attention layer (``get_cell_size_per_token``)."""
        return self.layer_bytes * self.full_layers

    @property
    def mamba_cache_per_req(self) -> int:
        """Bytes of one Mamba slot: a request's states in every state layer."""
        return self.conv_state_bytes + self.ssm_state_bytes

    @property
    def groups(self) -> tuple[tuple[str, int], ...]:
        """``(pool, layers)`` of the two pools, full attention first."""
        return (("full", self.full_layers), ("mamba", self.state_layers))

    @property
    def num_blocks(self) -> int:
        """Pages of the full pool and slots of the Mamba pool together."""
        return self.full_tokens // self.page_size + self.mamba_slots

    @property
    def pool_bytes(self) -> int:
        """Bytes both pools' slots take (without SGLang's padding slots)."""
        return self.full_tokens * self.cell_size + self.mamba_slots * self.mamba_cache_per_req

    def capacity_lines(self) -> list[str]:
        """SGLang's start-up lines: ``MambaPool``'s (its buffers hold one padding slot more),
        ``MHATokenToKVPool``'s over the full-attention layers (``size + page_size`` tokens each), and
        the scheduler's; with the radix cache, the strategy and overlap scheduler it resolved to (as
        the ``server_args`` line names them)."""
        padded = self.mamba_slots + 1
        half_cell = self.cell_size // 2 * (self.full_tokens + self.page_size)
        lines = [
            f"Mamba Cache is allocated. max_mamba_cache_size: {self.mamba_slots}, conv_state size: "
            f"{self.conv_state_bytes * padded / GIB:.2f}GB, ssm_state size: "
            f"{self.ssm_state_bytes * padded / GIB:.2f}GB",
            f"KV Cache is allocated. #tokens: {self.full_tokens}, K size: {half_cell / GIB:.2f} GB, "
            f"V size: {half_cell / GIB:.2f} GB",
            f"max_total_num_tokens={self.full_tokens}, max_running_requests={self.max_running_requests}, "
            f"context_len={self.context_len}",
        ]
        if self.radix_cache:
            lines.append(
                f"mamba_radix_cache_strategy={self.strategy!r}, disable_overlap_schedule={not self.overlap}"
            )
        return lines


def check_positive_number(name: str, value: object, what: str) -> float:
    """``value`` as a float; ``ValueError`` naming option ``name`` unless it is a positive finite number."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"option {name} must be a positive finite number ({what}), got {value!r}")
    return float(value)


def _check_positive_int(label: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{label} must be a positive integer, got {value!r}")
    return value


def _ssm_dtype_bytes(kind: StateKind, option: str | None) -> int:
    """The SSM state's element bytes (``mamba2_state_dtype``): the option, else the config's
    ``mamba_ssm_dtype`` (kvsim reads it into a gated delta net's ``ssm_dtype``; Nemotron-H's
    ``mamba_ssm_cache_dtype`` is vLLM's key, which SGLang does not read), else float32."""
    if option is not None:
        name = option
    elif isinstance(kind, GatedDeltaNetState) and kind.ssm_dtype.lower() != "auto":
        name = kind.ssm_dtype
    else:
        name = DEFAULT_SSM_DTYPE
    return mamba_dtype_bytes(name, 4)


def _layers(spec: ModelSpec) -> tuple[int, list[StateKind]]:
    """``(full-attention layers, state layers)``; ``ValueError`` for a model SGLang's two pools do not fit."""
    kinds = [kind for kind in (spec.layer_kinds or ()) if not isinstance(kind, MlpOnly)]
    states = [kind for kind in kinds if isinstance(kind, STATE_KINDS)]
    if not states:
        raise ValueError(
            f"{spec.name} has no Mamba/linear-attention layers: SGLang keeps no Mamba pool for it"
        )
    if any(isinstance(kind, SlidingWindow | ChunkedLocal) for kind in kinds):
        raise ValueError(
            f"{spec.name} has sliding-window or chunked layers beside its Mamba layers: SGLang's "
            "SWA and Mamba pools together are not modelled by sglang-hybrid; use policy vllm-hybrid"
        )
    full_layers = sum(1 for kind in kinds if isinstance(kind, FullAttention))
    if not full_layers:
        raise ValueError(
            f"{spec.name} has no full-attention layers: SGLang's all-Mamba pool is not modelled by sglang-hybrid"
        )
    return full_layers, states


def sglang_mamba_kv_capacity(
    model: ModelSpec | str,
    available_kv_bytes: int,
    *,
    max_model_len: int,
    radix_cache: bool = False,
    mamba_full_memory_ratio: float | None = None,
    max_mamba_cache_size: int | None = None,
    mamba_ssm_dtype: str | None = None,
    page_size: int = 1,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    mamba_scheduler_strategy: str | None = None,
    mamba_track_interval: int | None = None,
    overlap: bool = True,
    strategy_option: str = "mamba_scheduler_strategy",
) -> SGLangMambaCapacity:
    """SGLang's full-attention and Mamba pool sizes from ``available_kv_bytes`` (module docstring: the
    steps); ``max_model_len`` stands for SGLang's ``context_len``; ``overlap``: SGLang's overlap
    scheduler asked for (kvsim's ``engine.async_scheduling``); ``strategy_option``: the option that
    named the strategy (the old or the new name of SGLang's flag). ``ValueError``, naming the option,
    for invalid options, for a model the two pools do not fit, and (as SGLang, "Not enough memory")
    when a pool gets nothing or no request could run."""
    spec = resolve_model(model)
    ratio = check_positive_number(
        "mamba_full_memory_ratio",
        DEFAULT_MAMBA_FULL_MEMORY_RATIO if mamba_full_memory_ratio is None else mamba_full_memory_ratio,
        f"Mamba state memory per full-attention KV memory; SGLang's default {DEFAULT_MAMBA_FULL_MEMORY_RATIO}",
    )
    _check_positive_int("available_kv_bytes", available_kv_bytes)
    _check_positive_int("option page_size", page_size)
    _check_positive_int("max_model_len", max_model_len)
    if max_mamba_cache_size is not None:
        _check_positive_int("option max_mamba_cache_size", max_mamba_cache_size)
    if mamba_ssm_dtype is not None and (
        not isinstance(mamba_ssm_dtype, str) or mamba_ssm_dtype.lower() not in SGLANG_SSM_DTYPES
    ):
        raise ValueError(
            f"option mamba_ssm_dtype must be one of SGLang's 'float32', 'bfloat16', 'float16', "
            f"got {mamba_ssm_dtype!r}"
        )
    strategy = resolve_strategy(
        mamba_scheduler_strategy,
        radix_cache=radix_cache,
        architecture=spec.architecture,
        overlap=overlap,
        page_size=page_size,
        option=strategy_option,
    )
    tracks = strategy != "no_buffer"
    track_interval = _track_interval(mamba_track_interval, tracks, page_size)
    if radix_cache and page_size != 1 and not tracks:
        auto = "" if mamba_scheduler_strategy not in (None, "auto") else f" (auto: {_why_no_buffer(spec)})"
        raise ValueError(
            f"option page_size {page_size}: SGLang's Mamba radix cache runs pages of one token "
            f'("no_buffer only supports page_size=1") with strategy no_buffer{auto}; set page_size 1, '
            f"option {strategy_option} extra_buffer for a model SGLang runs it for, or turn prefix "
            "caching off"
        )
    track_buffers = _track_buffers(strategy, overlap)
    server_overlap = overlap and not (radix_cache and strategy == "no_buffer")
    spec.check_tensor_parallel(tensor_parallel_size)
    full_layers, states = _layers(spec)
    cache_chunk = _cache_chunk(states, page_size) if tracks else 0
    layer_bytes = spec.kv_bytes_per_token_per_layer(kv_cache_dtype, tensor_parallel_size)
    try:
        conv_bytes = sum(kind.conv_state_elements(tensor_parallel_size) * CONV_DTYPE_BYTES for kind in states)
        ssm_bytes = sum(
            kind.ssm_state_elements(tensor_parallel_size) * _ssm_dtype_bytes(kind, mamba_ssm_dtype)
            for kind in states
        )
    except ValueError as error:
        raise ValueError(f"model {spec.name!r}: {error}") from None
    per_req = conv_bytes + ssm_bytes
    cell_size = layer_bytes * full_layers

    # handle_max_mamba_cache and profile_max_num_token, in SGLang's float GB.
    rest = available_kv_bytes / GIB
    if max_mamba_cache_size is None:
        mamba_memory_raw = rest * ratio / (1 + ratio)
        mamba_slots = int((mamba_memory_raw * GIB) // per_req)
    else:
        mamba_slots = max_mamba_cache_size
    rest -= mamba_slots * per_req / GIB
    max_total_num_tokens = max(0, int(rest * GIB)) // cell_size
    # init_memory: the running requests, capped by the Mamba pool, then the page rounding.
    default_reqs = min(max(int(max_total_num_tokens / max_model_len * 512), 2048), 4096)
    mamba_ratio = 1
    if radix_cache:
        mamba_ratio = MAMBA_CACHE_RATIO_RADIX + track_buffers
    max_running = min(default_reqs, mamba_slots // mamba_ratio)
    full_tokens = max_total_num_tokens // page_size * page_size
    if full_tokens <= 0 or max_running <= 0:
        raise ValueError(
            f"{spec.name}: {available_kv_bytes:,} bytes of KV cache give SGLang's pools {full_tokens} "
            f"full-attention tokens and {mamba_slots} Mamba slots of {per_req:,} B (cell size {cell_size:,} B, "
            f"mamba_full_memory_ratio {ratio}): no request can run "
            f"({mamba_ratio} Mamba slot{'s' if mamba_ratio > 1 else ''} per running request). Give the KV "
            "cache more memory"
        )
    return SGLangMambaCapacity(
        model=spec.name,
        available_kv_bytes=available_kv_bytes,
        mamba_full_memory_ratio=ratio,
        page_size=page_size,
        radix_cache=radix_cache,
        full_layers=full_layers,
        state_layers=len(states),
        state_label=states[0].label,
        layer_bytes=layer_bytes,
        conv_state_bytes=conv_bytes,
        ssm_state_bytes=ssm_bytes,
        mamba_slots=mamba_slots,
        strategy=strategy,
        track_buffers=track_buffers,
        overlap=server_overlap,
        track_interval=track_interval,
        cache_chunk=cache_chunk,
        full_tokens=full_tokens,
        max_running_requests=max_running,
        context_len=max_model_len,
    )


def resolve_strategy(
    value: str | None,
    *,
    radix_cache: bool,
    architecture: str | None,
    overlap: bool,
    page_size: int,
    option: str = "mamba_scheduler_strategy",
) -> str:
    """The Mamba radix cache's strategy SGLang runs (module docstring, step 5): ``value`` (None:
    ``auto``) resolved as ``_mamba_radix_cache_resolution`` does; without the radix cache nothing is
    tracked (``no_buffer``). ``ValueError`` naming the option for a value SGLang refuses."""
    value = "auto" if value is None else value
    if value not in MAMBA_STRATEGIES:
        raise ValueError(f"option {option} must be one of {', '.join(MAMBA_STRATEGIES)}, got {value!r}")
    if not radix_cache:
        if value in ("extra_buffer", "extra_buffer_lazy"):
            raise ValueError(
                f"option {option} {value} tracks the states SGLang's Mamba radix cache "
                "keeps: it needs engine.enable_prefix_caching: true"
            )
        return "no_buffer"
    supported = architecture in EXTRA_BUFFER_ARCHITECTURES
    if value == "auto":
        return "extra_buffer" if supported and (overlap or page_size > 1) else "no_buffer"
    if value != "no_buffer" and architecture is not None and not supported:
        raise ValueError(
            f"option {option} {value}: SGLang runs it only for the model classes it "
            f"lists ({', '.join(sorted(EXTRA_BUFFER_ARCHITECTURES))}), not {architecture} "
            '("extra_buffer is not supported for ...; use no_buffer")'
        )
    if value == "extra_buffer_lazy" and not overlap:
        raise ValueError(
            f"option {option} extra_buffer_lazy needs SGLang's overlap scheduler "
            "(engine.async_scheduling: true)"
        )
    return value


def _why_no_buffer(spec: ModelSpec) -> str:
    """Why ``auto`` fell to ``no_buffer`` in pages above one token (which alone pick the extra buffer
    for a listed class): the model's class is unknown or not listed."""
    if spec.architecture is None:
        return f"{spec.name}'s model class is not known (its config names no architectures)"
    return f"SGLang runs extra_buffer for {spec.architecture} in no case"


def _track_buffers(strategy: str, overlap: bool) -> int:
    """A running request's tracking buffers: SGLang's ``MAMBA_CACHE_V2_ADDITIONAL_RATIO_*``."""
    if strategy == "no_buffer":
        return 0
    if strategy == "extra_buffer" and overlap:
        return EXTRA_BUFFER_RATIO
    return 1


def _track_interval(value: int | None, tracks: bool, page_size: int) -> int:
    """``mamba_track_interval``: the extra-buffer strategies' only, a whole number of pages (SGLang
    asserts ``mamba_track_interval % page_size == 0``)."""
    if value is not None and not tracks:
        raise ValueError(
            "option mamba_track_interval sets the extra-buffer strategy's decode tracking, but the "
            "strategy run is no_buffer; set option mamba_scheduler_strategy: extra_buffer with it"
        )
    if not tracks:
        return 0
    interval = (
        DEFAULT_MAMBA_TRACK_INTERVAL
        if value is None
        else _check_positive_int("option mamba_track_interval", value)
    )
    if interval % page_size:
        raise ValueError(
            f"option mamba_track_interval {interval} must be a multiple of option page_size {page_size}"
        )
    if max(FLA_CHUNK_SIZE, page_size) % min(FLA_CHUNK_SIZE, page_size):
        raise ValueError(
            f"option page_size {page_size}: the extra-buffer strategy needs a page that divides "
            f"{FLA_CHUNK_SIZE} tokens or is a multiple of it"
        )
    return interval


def _cache_chunk(states: list[StateKind], page_size: int) -> int:
    """``mamba_cache_chunk_size``: the model's Mamba2 scan chunk (its config's ``mamba_chunk_size``),
    else the FLA kernels' 64, and at least a page."""
    chunks = [kind.chunk_size for kind in states if isinstance(kind, Mamba2State) and kind.chunk_size]
    return max(chunks[0] if chunks else FLA_CHUNK_SIZE, page_size)
