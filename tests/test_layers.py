"""Layer kinds: state sizes, the ModelSpec figures per kind, reading them from config.json, bad input.

Expected numbers are worked out by hand in the comments; none is computed by the code under test.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sim.hardware.layers import (
    FULL_ATTENTION,
    MLP_ONLY,
    ChunkedLocal,
    GatedDeltaNetState,
    Mamba1State,
    Mamba2State,
    SlidingWindow,
)
from sim.hardware.models import MODEL_PRESETS, ModelSpec, model_from_hf_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "models"
HF_CONFIGS = Path(__file__).parent / "data" / "hf_configs"

# Qwen3-Next's gated delta net and Nemotron-H's Mamba2 mixer, as the presets carry them.
QWEN3_NEXT_GDN = GatedDeltaNetState(
    num_key_heads=16, num_value_heads=32, key_head_dim=128, value_head_dim=128, conv_kernel=4
)
NEMOTRON_H_MAMBA2 = Mamba2State(
    intermediate_size=8192,
    n_groups=8,
    num_heads=128,
    head_dim=64,
    state_size=128,
    conv_kernel=4,
    ssm_dtype="float32",
)


def _write(tmp_path: Path, cfg: object, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def _same_shapes(a: ModelSpec, b: ModelSpec, *skip: str) -> None:
    for field in dataclasses.fields(ModelSpec):
        if field.name not in ("name", *skip) and field.compare:  # (architecture: not a shape)
            assert getattr(a, field.name) == getattr(b, field.name), field.name


# ------------------------------------------------------------------------------- state shapes


def test_gated_delta_net_state_by_hand() -> None:
    # conv: (4 - 1) x (2 x 16 x 128 + 32 x 128) = 3 x 8,192 = 24,576 elements
    # SSM: 32 value heads x 128 x 128 = 524,288 elements
    assert QWEN3_NEXT_GDN.conv_state_elements() == 24_576
    assert QWEN3_NEXT_GDN.ssm_state_elements() == 524_288
    # bf16 both: (24,576 + 524,288) x 2 B = 1,097,728 B
    assert QWEN3_NEXT_GDN.state_bytes(1, 2, 2) == 1_097_728
    # tp 2: conv 3 x 8,192 / 2 = 12,288; SSM 16 x 128 x 128 = 262,144; x 2 B = 548,864 B
    assert QWEN3_NEXT_GDN.state_bytes(2, 2, 2) == 548_864


def test_mamba2_state_by_hand_and_group_replication() -> None:
    # conv: 3 x (8,192 + 2 x 8 x 128) = 3 x 10,240 = 30,720; SSM: 128 x 64 x 128 = 1,048,576
    assert NEMOTRON_H_MAMBA2.conv_state_elements() == 30_720
    assert NEMOTRON_H_MAMBA2.ssm_state_elements() == 1_048_576
    # bf16 conv, float32 SSM: 30,720 x 2 + 1,048,576 x 4 = 61,440 + 4,194,304 = 4,255,744 B
    assert NEMOTRON_H_MAMBA2.state_bytes(1, 2, 4) == 4_255_744
    # tp 4: 8 groups split evenly: conv 3 x 10,240 / 4 = 7,680; SSM 32 x 64 x 128 = 262,144
    assert NEMOTRON_H_MAMBA2.conv_state_elements(4) == 7_680
    assert NEMOTRON_H_MAMBA2.ssm_state_elements(4) == 262_144
    # One group at tp 2: vLLM gives each shard its own copy, groups 1 + (2 - 1) = 2:
    # conv 3 x (64 + 2 x 2 x 16) / 2 = 3 x 64 = 192 elements.
    one_group = Mamba2State(
        intermediate_size=64, n_groups=1, num_heads=4, head_dim=16, state_size=16, conv_kernel=4
    )
    assert one_group.conv_state_elements(2) == 192
    with pytest.raises(
        ValueError, match=r"Mamba2 heads \(4\) is not divisible by tensor_parallel_size \(8\)"
    ):
        one_group.ssm_state_elements(8)


def test_mamba1_state_by_hand() -> None:
    # Jamba-like: intermediate 2 x 4096 = 8,192, d_state 16, d_conv 4.
    # conv 3 x 8,192 = 24,576; SSM 8,192 x 16 = 131,072; bf16: (24,576 + 131,072) x 2 = 311,296 B
    jamba = Mamba1State(intermediate_size=8192, state_size=16, conv_kernel=4)
    assert jamba.state_bytes(1, 2, 2) == 311_296
    assert jamba.label == "mamba1"


# --------------------------------------------------------------------------- ModelSpec figures


def test_uniform_model_has_one_full_kind_and_no_state() -> None:
    llama = MODEL_PRESETS["Llama-3.1-8B"]
    assert llama.layer_kinds is None
    assert llama.layer_kind_counts == ((FULL_ATTENTION, 32),)
    assert llama.num_attention_layers == 32
    assert not llama.is_hybrid
    # 2 x 8 x 128 x 2 B = 4,096 B per layer; x 32 = 131,072
    assert llama.kv_bytes_per_token_per_layer() == 4_096
    assert llama.kv_bytes_per_token_by_kind() == {FULL_ATTENTION: 131_072}
    assert llama.state_bytes_per_request() == 0


def test_gpt_oss_kv_by_kind() -> None:
    spec = MODEL_PRESETS["gpt-oss-20b"]
    # layer 0 slides, layer 1 is full, and so on: 12 of each, 2 x 8 x 64 x 2 B = 2,048 B per layer.
    assert spec.layer_kinds is not None and spec.layer_kinds[:2] == (SlidingWindow(128), FULL_ATTENTION)
    assert spec.kv_bytes_per_token_by_kind() == {SlidingWindow(128): 24_576, FULL_ATTENTION: 24_576}
    # Treated as full attention, every layer: 24 x 2,048 = 49,152 (what kvsim's engine holds).
    assert spec.kv_bytes_per_token() == 49_152
    # fp8 KV halves the attention bytes; tp 8 keeps one KV head per GPU: 2 x 1 x 64 x 2 = 256 B.
    assert spec.kv_bytes_per_token_by_kind("fp8")[FULL_ATTENTION] == 12_288
    assert spec.kv_bytes_per_token_by_kind(tensor_parallel_size=8)[SlidingWindow(128)] == 12 * 256
    assert spec.is_hybrid


def test_gemma3_and_llama4_kinds() -> None:
    gemma = MODEL_PRESETS["Gemma-3-27B"]
    # A full layer at layers 5, 11, ..., 59 (every 6th): 10 of 62.
    assert gemma.layer_kinds is not None
    assert [layer for layer, kind in enumerate(gemma.layer_kinds) if kind == FULL_ATTENTION] == list(
        range(5, 62, 6)
    )
    # 2 x 16 x 128 x 2 B = 8,192 B per layer: 52 x 8,192 = 425,984; 10 x 8,192 = 81,920
    assert gemma.kv_bytes_per_token_by_kind() == {SlidingWindow(1024): 425_984, FULL_ATTENTION: 81_920}
    scout = MODEL_PRESETS["Llama-4-Scout-17B-16E"]
    # NoPE (full) layers 3, 7, ..., 47: 12; the 36 others chunked; 2 x 8 x 128 x 2 B = 4,096 B.
    assert scout.kv_bytes_per_token_by_kind() == {ChunkedLocal(8192): 147_456, FULL_ATTENTION: 49_152}


def test_qwen3_next_state_per_request() -> None:
    spec = MODEL_PRESETS["Qwen3-Next-80B-A3B"]
    assert spec.layer_kind_counts == ((QWEN3_NEXT_GDN, 36), (FULL_ATTENTION, 12))
    assert spec.num_attention_layers == 12
    # 36 x 1,097,728 = 39,518,208 B per request, bf16 ("auto" = the model dtype)
    assert spec.state_bytes_per_request() == 39_518_208
    # float32 SSM state: 36 x (24,576 x 2 + 524,288 x 4) = 36 x 2,146,304 = 77,266,944
    assert spec.state_bytes_per_request(mamba_ssm_cache_dtype="float32") == 77_266_944
    # Both float32: 36 x (24,576 + 524,288) x 4 = 36 x 2,195,456 = 79,036,416
    assert spec.state_bytes_per_request(mamba_cache_dtype="float32") == 79_036_416
    # kv_cache_dtype does not touch the state: fp8 K/V, the same state.
    assert spec.kv_bytes_per_token("fp8") == 12_288
    # tp 2: 36 x 548,864 = 19,759,104
    assert spec.state_bytes_per_request(tensor_parallel_size=2) == 19_759_104


def test_nemotron_h_state_and_blocks() -> None:
    spec = MODEL_PRESETS["Nemotron-H-8B-Base-8K"]
    counts = dict(spec.layer_kind_counts)
    assert counts == {NEMOTRON_H_MAMBA2: 24, MLP_ONLY: 24, FULL_ATTENTION: 4}
    # Its SSM state is float32 ("auto" as vLLM's NemotronH hook resolves it): 24 x 4,255,744
    assert spec.state_bytes_per_request() == 102_137_856
    # --mamba-ssm-cache-dtype float16 overrides: 24 x (61,440 + 1,048,576 x 2) = 24 x 2,158,592
    assert spec.state_bytes_per_request(mamba_ssm_cache_dtype="float16") == 51_806_208
    assert spec.num_attention_layers == 4
    with pytest.raises(ValueError, match="unknown Mamba state dtype 'int8'"):
        spec.state_bytes_per_request(mamba_cache_dtype="int8")


def test_mistral_window_changes_no_engine_input() -> None:
    mistral = MODEL_PRESETS["Mistral-7B-v0.1"]
    assert mistral.layer_kind_counts == ((SlidingWindow(4096), 32),)
    assert not mistral.is_hybrid  # one kind of cache
    # kv_bytes_per_token is what the engine reads: unchanged, 2 x 32 x 8 x 128 x 2 = 131,072.
    assert mistral.kv_bytes_per_token() == 131_072
    # Without the window the spec differs only in layer_kinds, which repr leaves out.
    plain = dataclasses.replace(mistral, layer_kinds=None)
    assert repr(plain) == repr(mistral)
    assert plain != mistral


# --------------------------------------------------------------------------- ModelSpec checks


def test_layer_kinds_must_match_the_layers() -> None:
    llama = MODEL_PRESETS["Llama-3.1-8B"]
    with pytest.raises(
        ValueError, match="model 'Llama-3.1-8B': layer_kinds has 31 entries but num_layers is 32"
    ):
        dataclasses.replace(llama, layer_kinds=(FULL_ATTENTION,) * 31)
    with pytest.raises(ValueError, match="layer_kinds must be a tuple"):
        dataclasses.replace(llama, layer_kinds=[FULL_ATTENTION] * 32)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="layer 3 has kind 'full'"):
        dataclasses.replace(llama, layer_kinds=(FULL_ATTENTION,) * 3 + ("full",) + (FULL_ATTENTION,) * 28)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        (
            SlidingWindow(0),
            r"sliding\(0\) layers: sliding window \(tokens\) must be a positive integer, got 0",
        ),
        (
            ChunkedLocal(-8),
            r"chunked\(-8\) layers: attention chunk \(tokens\) must be a positive integer, got -8",
        ),
        (
            Mamba1State(intermediate_size=0, state_size=16, conv_kernel=4),
            "mamba1 layers: Mamba intermediate_size must be a positive integer, got 0",
        ),
        (
            dataclasses.replace(QWEN3_NEXT_GDN, ssm_dtype="int4"),
            "gdn layers: ssm_dtype must be one of",
        ),
    ],
)
def test_bad_layer_kinds_name_the_model_and_value(kind: object, message: str) -> None:
    kinds = (kind, FULL_ATTENTION) * 16
    with pytest.raises(ValueError, match=f"model 'Llama-3.1-8B': {message}"):
        dataclasses.replace(MODEL_PRESETS["Llama-3.1-8B"], layer_kinds=kinds)  # type: ignore[arg-type]


def test_a_model_needs_an_attention_layer_and_mla_only_full() -> None:
    with pytest.raises(ValueError, match="no attention layer"):
        dataclasses.replace(MODEL_PRESETS["Llama-3.1-8B"], layer_kinds=(QWEN3_NEXT_GDN,) * 32)
    lite = MODEL_PRESETS["DeepSeek-V2-Lite"]  # MLA, 27 layers
    with pytest.raises(ValueError, match="MLA with sliding-window"):
        dataclasses.replace(lite, layer_kinds=(SlidingWindow(128),) * 27)
    # MLA with full attention and MLP blocks is fine: 26 x (512 + 64) x 2 B = 29,952
    with_mlp = dataclasses.replace(lite, layer_kinds=(FULL_ATTENTION,) * 26 + (MLP_ONLY,))
    assert with_mlp.kv_bytes_per_token() == 29_952


def test_tensor_parallel_must_divide_the_state() -> None:
    qwen = MODEL_PRESETS["Qwen3-Next-80B-A3B"]
    qwen.check_tensor_parallel(8)  # 32 value heads / 8, conv width 8,192 / 8
    # 16 attention heads refuse tp 32 first (vLLM's own message).
    with pytest.raises(ValueError, match="must be divisible by tensor parallel size"):
        qwen.check_tensor_parallel(32)
    odd = dataclasses.replace(
        MODEL_PRESETS["Nemotron-H-8B-Base-8K"],
        layer_kinds=tuple(
            dataclasses.replace(kind, num_heads=100, intermediate_size=6400)
            if kind == NEMOTRON_H_MAMBA2
            else kind
            for kind in MODEL_PRESETS["Nemotron-H-8B-Base-8K"].layer_kinds or ()
        ),
    )
    with pytest.raises(
        ValueError,
        match=r"mamba2 layers: Mamba2 heads \(100\) is not divisible by tensor_parallel_size \(8\)",
    ):
        odd.check_tensor_parallel(8)


# -------------------------------------------------------------------------- config.json kinds


def test_gpt_oss_configs_load_like_the_presets() -> None:
    for file, preset in (("gpt-oss-20b", "gpt-oss-20b"), ("gpt-oss-120b", "gpt-oss-120b")):
        spec = model_from_hf_config(CONFIGS / f"{file}.config.json")  # (MXFP4 is sized: no warning)
        # The shape estimate misses the expert and o biases, the sinks and router biases; the rest
        # (layer kinds and the MXFP4 experts included) is the preset's.
        _same_shapes(spec, MODEL_PRESETS[preset], "num_params", "num_active_params")
        assert spec.routed_expert_bits == 4.25


def test_gpt_oss_weights_are_sized_with_mxfp4_experts() -> None:
    """gpt-oss-20b: 24 layers x 32 experts x 3 x 2880 x 2880 = 19,110,297,600 expert parameters at
    4.25 bits = 10,152,345,600 B; the other 20,914,757,184 - 19,110,297,600 = 1,804,459,584 at 2 B =
    3,608,919,168 B; 13,761,264,768 B in all (the card's "about 13 GB"; at bf16 it would be 41.8 GB).
    With expert parallelism over 2 GPUs at TP 1: 3,608,919,168 + 10,152,345,600 / 2 = 8,685,091,968 B."""
    spec = MODEL_PRESETS["gpt-oss-20b"]
    assert spec.routed_expert_params == 19_110_297_600
    assert spec.routed_expert_bytes == 10_152_345_600
    assert spec.weight_bytes() == 13_761_264_768
    assert spec.weight_bytes_per_gpu(1, expert_parallel_size=2) == 8_685_091_968
    assert spec.expert_bytes_per_param == 4.25 / 8
    with pytest.raises(ValueError, match="routed_expert_bits must be a number of bits in \\(0, 32\\]"):
        dataclasses.replace(spec, routed_expert_bits=0)
    with pytest.raises(ValueError, match="for a mixture of experts"):
        dataclasses.replace(MODEL_PRESETS["Llama-3.1-8B"], routed_expert_bits=4.25)


def test_an_mxfp4_checkpoint_reads_cheaper_experts_in_the_cost_models() -> None:
    """The routed experts' read time scales with their bytes: 4.25 bits against bf16's 16."""
    from sim.costs.factory import make_cost_model
    from sim.hardware.gpus import resolve_gpu

    spec = MODEL_PRESETS["gpt-oss-20b"]
    bf16 = dataclasses.replace(spec, routed_expert_bits=None)
    gpu = resolve_gpu("H100-80GB")
    quantised = make_cost_model("derated", spec, gpu, block_size=16)
    plain = make_cost_model("derated", bf16, gpu, block_size=16)
    assert quantised.expert_read_s == pytest.approx(plain.expert_read_s * 4.25 / 16, rel=1e-12)
    assert quantised.body_read_s == plain.body_read_s


def test_qwen3_next_config_loads_like_the_preset() -> None:
    path = CONFIGS / "qwen3-next-80b-a3b.config.json"
    with pytest.raises(ValueError, match="has gdn layers; its parameter count cannot be estimated") as info:
        model_from_hf_config(path)
    assert str(path) in str(info.value)
    spec = model_from_hf_config(path, num_params=79_674_391_296)
    _same_shapes(spec, MODEL_PRESETS["Qwen3-Next-80B-A3B"])
    # Without the excerpt's layer_types the interval gives the same layers.
    cfg = json.loads(path.read_text())
    assert "layer_types" not in cfg


def test_gemma3_config_uses_its_class_defaults(tmp_path: Path) -> None:
    # google/gemma-3-27b-it's config.json writes only these text_config fields (no vocab_size,
    # max_position_embeddings or sliding_window_pattern): Gemma3TextConfig's defaults fill them in.
    cfg = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {
            "head_dim": 128,
            "hidden_size": 5376,
            "intermediate_size": 21504,
            "model_type": "gemma3_text",
            "num_attention_heads": 32,
            "num_hidden_layers": 62,
            "num_key_value_heads": 16,
            "query_pre_attn_scalar": 168,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
        "torch_dtype": "bfloat16",
        "vision_config": {"hidden_size": 1152},
    }
    spec = model_from_hf_config(_write(tmp_path, cfg))
    _same_shapes(spec, MODEL_PRESETS["Gemma-3-27B"], "num_params", "num_active_params")


def test_llama4_chunks_follow_the_rope_layers(tmp_path: Path) -> None:
    text = {
        "model_type": "llama4_text",
        "num_hidden_layers": 8,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "attention_chunk_size": 8192,
        "no_rope_layers": [],
    }
    cfg = {"model_type": "llama4", "text_config": text}
    # Empty no_rope_layers: a NoPE (full) layer every 4th, layers 3 and 7.
    kinds = model_from_hf_config(_write(tmp_path, cfg)).layer_kinds
    assert kinds == (ChunkedLocal(8192),) * 3 + (FULL_ATTENTION,) + (ChunkedLocal(8192),) * 3 + (
        FULL_ATTENTION,
    )
    # An explicit list wins: 0 marks the NoPE layers.
    text["no_rope_layers"] = [1, 0, 1, 1, 1, 1, 1, 1]
    kinds = model_from_hf_config(_write(tmp_path, cfg)).layer_kinds
    assert kinds is not None and kinds[1] == FULL_ATTENTION and kinds.count(FULL_ATTENTION) == 1


NEMOTRON_H_8B = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "num_hidden_layers": 52,
    "hidden_size": 4096,
    "intermediate_size": 21504,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "attention_head_dim": 128,
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "expand": 2,
    "vocab_size": 131072,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def test_nemotron_h_pattern_loads_like_the_preset(tmp_path: Path) -> None:
    spec = model_from_hf_config(_write(tmp_path, NEMOTRON_H_8B), num_params=8_100_852_736)
    _same_shapes(spec, MODEL_PRESETS["Nemotron-H-8B-Base-8K"])
    # A config naming its SSM state dtype overrides vLLM's float32 default for Nemotron-H.
    spec = model_from_hf_config(
        _write(tmp_path, {**NEMOTRON_H_8B, "mamba_ssm_cache_dtype": "float16"}), num_params=1
    )
    assert spec.state_bytes_per_request() == 51_806_208  # 24 x (61,440 + 2,097,152)


def test_jamba_period_gives_mamba1_layers(tmp_path: Path) -> None:
    # ai21labs/AI21-Jamba-Mini-1.5's layout: attention where layer % 8 == 4, Mamba elsewhere.
    cfg = json.loads((HF_CONFIGS / "llama-3.1-8b.json").read_text())
    cfg.update(
        model_type="jamba",
        attn_layer_period=8,
        attn_layer_offset=4,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_expand=2,
    )
    spec = model_from_hf_config(_write(tmp_path, cfg), num_params=10**10)
    assert spec.layer_kinds is not None
    assert [layer for layer, kind in enumerate(spec.layer_kinds) if kind == FULL_ATTENTION] == [4, 12, 20, 28]
    # 28 Mamba1 layers x 311,296 B (intermediate 2 x 4096, test_mamba1_state_by_hand) = 8,716,288
    assert spec.state_bytes_per_request() == 8_716_288


def test_layer_type_names_for_granite_style_mamba2(tmp_path: Path) -> None:
    cfg = json.loads((HF_CONFIGS / "llama-3.1-8b.json").read_text())
    cfg.update(
        layer_types=["mamba"] * 3 + ["attention"] + ["mamba"] * 28,
        mamba_n_heads=64,
        mamba_d_head=64,
        mamba_d_state=128,
        mamba_n_groups=1,
        mamba_d_conv=4,
    )
    spec = model_from_hf_config(_write(tmp_path, cfg), num_params=10**10)
    mamba = Mamba2State(
        intermediate_size=4096, n_groups=1, num_heads=64, head_dim=64, state_size=128, conv_kernel=4
    )
    assert spec.layer_kind_counts == ((mamba, 31), (FULL_ATTENTION, 1))
    # conv 3 x (4,096 + 2 x 1 x 128) = 13,056; SSM 64 x 64 x 128 = 524,288; bf16: 1,074,688 B x 31
    assert spec.state_bytes_per_request() == 31 * 1_074_688


def test_sliding_windows_from_the_window_fields(tmp_path: Path) -> None:
    # Mistral-7B-v0.1: a window and nothing else, every layer slides.
    mistral = model_from_hf_config(HF_CONFIGS / "mistral-7b-v0.1.json")
    assert mistral.layer_kinds == (SlidingWindow(4096),) * 32
    # Gemma 2: its class alternates from layer 0 (sliding, full, ...).
    gemma2 = model_from_hf_config(HF_CONFIGS / "gemma2-like.json")
    assert gemma2.layer_kinds == (SlidingWindow(4096), FULL_ATTENTION) * 13
    # Qwen2.5 carries a window with use_sliding_window false: no kinds, as before.
    qwen = model_from_hf_config(CONFIGS / "qwen2.5-0.5b.config.json")
    assert qwen.layer_kinds is None
    cfg = json.loads((CONFIGS / "qwen2.5-0.5b.config.json").read_text())
    cfg.update(use_sliding_window=True, max_window_layers=20)
    kinds = model_from_hf_config(_write(tmp_path, cfg)).layer_kinds
    assert kinds == (FULL_ATTENTION,) * 20 + (SlidingWindow(32768),) * 4
    # An explicit pattern: a full layer every third.
    cfg = json.loads((HF_CONFIGS / "llama-3.1-8b.json").read_text())
    cfg.update(sliding_window=512, sliding_window_pattern=3)
    kinds = model_from_hf_config(_write(tmp_path, cfg)).layer_kinds
    assert kinds is not None and kinds[:3] == (SlidingWindow(512), SlidingWindow(512), FULL_ATTENTION)


def test_a_window_longer_than_the_context_is_kept(tmp_path: Path) -> None:
    # vLLM accepts it (the window never binds) and still groups such layers apart, so kvsim keeps it.
    cfg = json.loads((HF_CONFIGS / "llama-3.1-8b.json").read_text())
    cfg.update(sliding_window=10**6, layer_types=["sliding_attention", "full_attention"] * 16)
    spec = model_from_hf_config(_write(tmp_path, cfg))
    assert spec.layer_kinds is not None and spec.layer_kinds[0] == SlidingWindow(10**6)
    assert spec.kv_bytes_per_token() == 131_072


def test_all_full_layer_types_mean_no_kinds(tmp_path: Path) -> None:
    cfg = json.loads((HF_CONFIGS / "llama-3.1-8b.json").read_text())
    cfg["layer_types"] = ["full_attention"] * 32
    assert model_from_hf_config(_write(tmp_path, cfg)).layer_kinds is None


# ---------------------------------------------------------------------------------- bad input


def _llama_with(tmp_path: Path, **fields: object) -> Path:
    cfg = json.loads((HF_CONFIGS / "llama-3.1-8b.json").read_text())
    cfg.update(fields)
    return _write(tmp_path, cfg)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"layer_types": ["full_attention"] * 31 + ["global_attention"]},
            "field 'layer_types' has an unknown layer type 'global_attention' at layer 31",
        ),
        (
            {"layer_types": ["full_attention"] * 30},
            "field 'layer_types' has 30 entries but num_hidden_layers is 32",
        ),
        ({"layer_types": "full_attention"}, "field 'layer_types' must be a list"),
        (
            {"hybrid_override_pattern": "M*" * 15 + "MX"},
            "field 'hybrid_override_pattern' has an unknown layer type 'X' at layer 31",
        ),
        (
            {"hybrid_override_pattern": "M*"},
            "field 'hybrid_override_pattern' has 2 characters but num_hidden_layers is 32",
        ),
        (
            {"sliding_window": 0, "layer_types": ["sliding_attention"] * 32},
            "field 'sliding_window' must be a positive integer, got 0",
        ),
        ({"sliding_window": -4096}, "field 'sliding_window' must be a positive integer, got -4096"),
        (
            {"layer_types": ["sliding_attention"] * 32},
            "names 'sliding_attention' at layer 0 but 'sliding_window' is missing",
        ),
        ({"attention_chunk_size": 0}, "field 'attention_chunk_size' must be a positive integer, got 0"),
        (
            {"attention_chunk_size": 8192, "no_rope_layers": [1, 2] * 16},
            "field 'no_rope_layers' must hold 0 or 1, got 2 at layer 1",
        ),
        (
            {"sliding_window": 4096, "sliding_window_pattern": 0},
            "field 'sliding_window_pattern' must be a positive integer, got 0",
        ),
        (
            {"attn_layer_period": 8, "attn_layer_offset": 8, "mamba_d_state": 16},
            r"field 'attn_layer_offset' must be an integer in \[0, attn_layer_period = 8\), got 8",
        ),
        ({"layer_types": ["mamba"] * 31 + ["attention"]}, "Mamba layers need their state shapes"),
        (
            {"layer_types": ["linear_attention", "full_attention"] * 16},
            "missing required field 'linear_num_key_heads'",
        ),
        ({"use_sliding_window": True, "sliding_window": 4096}, "needs an integer 'max_window_layers'"),
    ],
)
def test_bad_layer_fields_name_the_file_field_and_value(
    tmp_path: Path, fields: dict[str, object], message: str
) -> None:
    path = _llama_with(tmp_path, **fields)
    with pytest.raises(ValueError, match=message) as info:
        model_from_hf_config(path, num_params=10**10)
    assert str(path) in str(info.value)


def test_hybrid_without_a_count_points_at_the_presets(tmp_path: Path) -> None:
    path = _write(tmp_path, NEMOTRON_H_8B)
    with pytest.raises(ValueError, match="has mamba2, mlp layers.*Nemotron-H-8B-Base-8K") as info:
        model_from_hf_config(path)
    assert str(path) in str(info.value)
