"""Model presets, KV bytes per token and Hugging Face config loading.

Expected numbers are worked out by hand in the comments; none is computed by the code under test.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sim.hardware.models import (
    MODEL_PRESETS,
    ModelSpec,
    estimate_num_params,
    model_from_hf_config,
    resolve_model,
)

HF_CONFIGS = Path(__file__).parent / "data" / "hf_configs"

# bytes per token, all layers, fp16/bf16 KV, tp = 1.
#   MHA/GQA: 2 (K, V) x layers x kv_heads x head_dim x 2 B;  MLA: (kv_lora_rank + rope) x layers x 2 B.
KV_BYTES_PER_TOKEN = {
    "Llama-2-7B": 2 * 32 * 32 * 128 * 2,  # 524,288 = 512 KiB
    "Llama-2-13B": 2 * 40 * 40 * 128 * 2,  # 819,200 = 800 KiB
    "Llama-2-70B": 2 * 80 * 8 * 128 * 2,  # 327,680 = 320 KiB
    "Llama-3.1-8B": 2 * 32 * 8 * 128 * 2,  # 131,072 = 128 KiB
    "Llama-3.1-70B": 2 * 80 * 8 * 128 * 2,  # 327,680
    "Llama-3.2-1B": 2 * 16 * 8 * 64 * 2,  # 32,768
    "Mistral-7B-v0.1": 2 * 32 * 8 * 128 * 2,  # 131,072
    "Qwen2.5-7B": 2 * 28 * 4 * 128 * 2,  # 57,344 = 56 KiB
    "Qwen2.5-72B": 2 * 80 * 8 * 128 * 2,  # 327,680
    "OPT-13B": 2 * 40 * 40 * 128 * 2,  # 819,200 = 800 KiB, the vLLM paper's figure
    "OPT-66B": 2 * 64 * 72 * 128 * 2,  # 2,359,296
    "OPT-175B": 2 * 96 * 96 * 128 * 2,  # 4,718,592 = 4.5 MiB
    "DeepSeek-V2-Lite": (512 + 64) * 27 * 2,  # 31,104
    "DeepSeek-V3": (512 + 64) * 61 * 2,  # 70,272 (naive MHA treatment would give 4,997,120)
    "CodeLlama-34B": 2 * 48 * 8 * 128 * 2,  # 196,608 = 192 KiB
    "Qwen3-14B": 2 * 40 * 8 * 128 * 2,  # 163,840 = 160 KiB
    "Qwen3-32B": 2 * 64 * 8 * 128 * 2,  # 262,144 = 256 KiB (head_dim 128, not 5120 / 64 = 80)
    "Mixtral-8x7B": 2 * 32 * 8 * 128 * 2,  # 131,072: experts do not touch the cache
    "Qwen3-30B-A3B": 2 * 48 * 4 * 128 * 2,  # 98,304 = 96 KiB (head_dim 128, not 2048 / 32 = 64)
    "Qwen3-30B-A3B-Instruct-2507": 2 * 48 * 4 * 128 * 2,  # 98,304
    # Hybrid models: every attention layer counted as full attention; state and MLP blocks none.
    "gpt-oss-20b": 2 * 24 * 8 * 64 * 2,  # 49,152: 12 sliding + 12 full layers
    "gpt-oss-120b": 2 * 36 * 8 * 64 * 2,  # 73,728: 18 + 18
    "Gemma-3-27B": 2 * 62 * 16 * 128 * 2,  # 507,904: 52 sliding + 10 full
    "Llama-4-Scout-17B-16E": 2 * 48 * 8 * 128 * 2,  # 196,608: 36 chunked + 12 full
    "Qwen3-Next-80B-A3B": 2 * 12 * 2 * 256 * 2,  # 24,576: the 12 full layers (36 gated delta net)
    "Nemotron-H-8B-Base-8K": 2 * 4 * 8 * 128 * 2,  # 16,384: 4 attention blocks of 52
}


def test_reference_table_literals() -> None:
    # Guard the table itself against typos in the products above.
    assert KV_BYTES_PER_TOKEN["Llama-3.1-8B"] == 131_072
    assert KV_BYTES_PER_TOKEN["Llama-2-7B"] == 524_288
    assert KV_BYTES_PER_TOKEN["Qwen2.5-7B"] == 57_344
    assert KV_BYTES_PER_TOKEN["OPT-13B"] == 819_200
    assert KV_BYTES_PER_TOKEN["DeepSeek-V2-Lite"] == 31_104
    assert KV_BYTES_PER_TOKEN["DeepSeek-V3"] == 70_272
    assert KV_BYTES_PER_TOKEN["CodeLlama-34B"] == 196_608
    assert KV_BYTES_PER_TOKEN["Qwen3-32B"] == 262_144
    assert KV_BYTES_PER_TOKEN["Qwen3-30B-A3B"] == 98_304
    assert KV_BYTES_PER_TOKEN["gpt-oss-20b"] == 49_152
    assert KV_BYTES_PER_TOKEN["Gemma-3-27B"] == 507_904
    assert KV_BYTES_PER_TOKEN["Qwen3-Next-80B-A3B"] == 24_576
    assert KV_BYTES_PER_TOKEN["Nemotron-H-8B-Base-8K"] == 16_384


def test_every_preset_is_in_the_reference_table() -> None:
    assert set(MODEL_PRESETS) == set(KV_BYTES_PER_TOKEN)
    for key, spec in MODEL_PRESETS.items():
        assert spec.name == key


@pytest.mark.parametrize("name", sorted(KV_BYTES_PER_TOKEN))
def test_kv_bytes_per_token_matches_reference(name: str) -> None:
    spec = MODEL_PRESETS[name]
    expected = KV_BYTES_PER_TOKEN[name]
    assert spec.kv_bytes_per_token() == expected
    assert spec.kv_bytes_per_token("auto") == expected
    assert spec.kv_bytes_per_token("bf16") == expected
    assert spec.kv_bytes_per_token("FP16") == expected  # case-insensitive


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("name", sorted(KV_BYTES_PER_TOKEN))
def test_fp8_halves_kv_bytes(name: str, dtype: str) -> None:
    assert MODEL_PRESETS[name].kv_bytes_per_token(dtype) * 2 == KV_BYTES_PER_TOKEN[name]


def test_fp8_ds_mla_layout_is_656_bytes_per_layer() -> None:
    # 512 fp8 latent + 4 fp32 scales (16 B) + 64 bf16 rope dims (128 B) = 656 B; x 61 layers.
    assert MODEL_PRESETS["DeepSeek-V3"].kv_bytes_per_token("fp8_ds_mla") == 656 * 61 == 40_016
    with pytest.raises(ValueError, match="MLA models only"):
        MODEL_PRESETS["Llama-3.1-8B"].kv_bytes_per_token("fp8_ds_mla")


def test_unknown_kv_dtype_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown kv_cache_dtype 'int4'"):
        MODEL_PRESETS["Llama-3.1-8B"].kv_bytes_per_token("int4")


def test_auto_kv_dtype_follows_weight_dtype() -> None:
    fp32 = dataclasses.replace(MODEL_PRESETS["Llama-3.1-8B"], weight_dtype_bytes=4)
    assert fp32.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 4
    assert fp32.kv_bytes_per_token("bf16") == 131_072


def test_tensor_parallel_kv_heads_split_then_replicate() -> None:
    llama70 = MODEL_PRESETS["Llama-3.1-70B"]  # 8 KV heads
    assert llama70.kv_bytes_per_token(tensor_parallel_size=4) == 2 * 80 * 2 * 128 * 2  # 81,920
    assert llama70.kv_bytes_per_token(tensor_parallel_size=8) == 2 * 80 * 1 * 128 * 2  # 40,960
    # tp 16 > 8 KV heads: each GPU still keeps one (replicated) head.
    assert llama70.kv_bytes_per_token(tensor_parallel_size=16) == 40_960
    assert llama70.kv_heads_per_gpu(16) == 1
    # The MLA latent is replicated on every GPU.
    assert MODEL_PRESETS["DeepSeek-V3"].kv_bytes_per_token(tensor_parallel_size=8) == 70_272
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        llama70.kv_bytes_per_token(tensor_parallel_size=0)


def test_weight_bytes() -> None:
    # 8,030,261,248 params x 2 B = 16,060,522,496 B = 14.96 GiB; vLLM logs "model weights take
    # 14.96GiB" for Meta-Llama-3-8B (same shapes), vLLM PR #10511.
    assert MODEL_PRESETS["Llama-3.1-8B"].weight_bytes() == 16_060_522_496
    assert MODEL_PRESETS["OPT-13B"].weight_bytes() == 12_853_473_280 * 2


# Published sizes (model cards / safetensors totals) the preset counts must agree with.
PUBLISHED_PARAMS = {
    "Llama-2-7B": 6.74e9,
    "Llama-2-13B": 13.0e9,
    "Llama-2-70B": 69.0e9,
    "Llama-3.1-8B": 8.03e9,
    "Llama-3.1-70B": 70.6e9,
    "Llama-3.2-1B": 1.24e9,  # model card: 1.23B; safetensors total 1,235,814,400 (embedding tied)
    "Mistral-7B-v0.1": 7.24e9,
    "Qwen2.5-7B": 7.61e9,
    "Qwen2.5-72B": 72.7e9,
    "OPT-13B": 12.85e9,
    "OPT-66B": 65.7e9,
    "OPT-175B": 175e9,
    "DeepSeek-V2-Lite": 15.7e9,
    "DeepSeek-V3": 671e9,
    "CodeLlama-34B": 33.7e9,  # safetensors total of the CodeLlama-34B shapes (Phind-CodeLlama-34B)
    "Qwen3-14B": 14.8e9,
    "Qwen3-32B": 32.8e9,
    "Mixtral-8x7B": 46.7e9,
    "Qwen3-30B-A3B": 30.5e9,
    "Qwen3-30B-A3B-Instruct-2507": 30.5e9,
    "gpt-oss-20b": 20.91e9,  # gpt-oss model card: 20.91B total
    "gpt-oss-120b": 116.83e9,  # 116.83B total
    "Gemma-3-27B": 27.4e9,  # the checkpoint, vision tower included
    "Qwen3-Next-80B-A3B": 80e9,  # card: "80B in total"
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_preset_param_counts_match_published_sizes(name: str) -> None:
    assert MODEL_PRESETS[name].num_params == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01)


def test_moe_presets_carry_active_params() -> None:
    assert MODEL_PRESETS["DeepSeek-V3"].active_params == pytest.approx(36.6e9, rel=0.01)  # README_WEIGHTS
    assert MODEL_PRESETS["gpt-oss-20b"].active_params == pytest.approx(3.61e9, rel=0.01)  # card
    assert MODEL_PRESETS["gpt-oss-120b"].active_params == pytest.approx(5.13e9, rel=0.01)  # card
    # Llama 4 Scout: 107,769,861,120 - 48 layers x 15 unused experts x 3 x 5120 x 8192 (125,829,120)
    # = 17,172,894,720 (card: 17B active; its 109B total counts the vision encoder, not modelled).
    assert MODEL_PRESETS["Llama-4-Scout-17B-16E"].active_params == 17_172_894_720
    assert MODEL_PRESETS["DeepSeek-V2-Lite"].active_params == pytest.approx(2.4e9, rel=0.03)
    assert MODEL_PRESETS["Llama-3.1-8B"].active_params == MODEL_PRESETS["Llama-3.1-8B"].num_params


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("Llama-2-7B", {}),
        ("Llama-2-13B", {}),
        ("Llama-2-70B", {}),
        ("Llama-3.1-8B", {}),
        ("Llama-3.1-70B", {}),
        ("Mistral-7B-v0.1", {}),
        ("Qwen2.5-7B", {"qkv_bias": True}),
        ("Qwen2.5-72B", {"qkv_bias": True}),
        ("OPT-13B", {"gated_mlp": False, "tie_word_embeddings": True, "opt_style": True}),
        ("OPT-66B", {"gated_mlp": False, "tie_word_embeddings": True, "opt_style": True}),
        ("OPT-175B", {"gated_mlp": False, "tie_word_embeddings": True, "opt_style": True}),
    ],
)
def test_dense_preset_counts_equal_the_shape_formula(name: str, extra: dict[str, bool]) -> None:
    spec = MODEL_PRESETS[name]
    estimate = estimate_num_params(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_layers=spec.num_layers,
        num_attention_heads=spec.num_attention_heads,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        **extra,
    )
    assert estimate == spec.num_params


# ----------------------------------------------------------------------------------- resolving


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("Llama-3.1-8B", "Llama-3.1-8B"),
        ("llama-3.1-8b", "Llama-3.1-8B"),
        ("meta-llama/Llama-3.1-8B", "Llama-3.1-8B"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
        ("meta-llama/Llama-2-7b-hf", "Llama-2-7B"),
        ("meta-llama/Llama-2-13b-chat-hf", "Llama-2-13B"),
        ("meta-llama/Llama-2-70b-hf", "Llama-2-70B"),
        ("mistralai/Mistral-7B-v0.1", "Mistral-7B-v0.1"),
        ("mistralai/Mistral-7B-Instruct-v0.1", "Mistral-7B-v0.1"),
        ("Mistral-7B", "Mistral-7B-v0.1"),
        ("Qwen/Qwen2.5-7B-Instruct", "Qwen2.5-7B"),
        ("qwen/qwen2.5-72b", "Qwen2.5-72B"),
        ("facebook/opt-13b", "OPT-13B"),
        ("facebook/opt-66b", "OPT-66B"),
        ("OPT-175B", "OPT-175B"),
        ("deepseek-ai/DeepSeek-V2-Lite", "DeepSeek-V2-Lite"),
        ("deepseek-ai/DeepSeek-V3", "DeepSeek-V3"),
        ("deepseek-ai/DeepSeek-V3-Base", "DeepSeek-V3"),
        ("codellama/CodeLlama-34b-Instruct-hf", "CodeLlama-34B"),
        ("codellama/CodeLlama-34b-hf", "CodeLlama-34B"),
        ("Qwen/Qwen3-14B", "Qwen3-14B"),
        ("Qwen/Qwen3-32B", "Qwen3-32B"),
        ("mistralai/Mixtral-8x7B-v0.1", "Mixtral-8x7B"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "Mixtral-8x7B"),
        ("Qwen/Qwen3-30B-A3B", "Qwen3-30B-A3B"),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen3-30B-A3B-Instruct-2507"),
        ("Qwen/Qwen3-30B-A3B-Thinking-2507", "Qwen3-30B-A3B-Instruct-2507"),
    ],
)
def test_resolve_model_names(given: str, expected: str) -> None:
    assert resolve_model(given) is MODEL_PRESETS[expected]


def test_resolve_model_passes_specs_through() -> None:
    spec = MODEL_PRESETS["OPT-13B"]
    assert resolve_model(spec) is spec


def test_resolve_model_unknown_name() -> None:
    with pytest.raises(ValueError, match="unknown model 'Llama-9-1B'.*Llama-3.1-8B"):
        resolve_model("Llama-9-1B")


def test_resolve_model_loads_paths(tmp_path: Path) -> None:
    from_file = resolve_model(str(HF_CONFIGS / "llama-3.1-8b.json"))
    assert from_file.kv_bytes_per_token() == 131_072
    # A directory holding config.json, as a str and as a Path.
    (tmp_path / "config.json").write_text((HF_CONFIGS / "mistral-7b-v0.1.json").read_text())
    assert resolve_model(str(tmp_path)).num_kv_heads == 8
    assert resolve_model(tmp_path).num_kv_heads == 8


def test_resolve_model_missing_path_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "config.json"
    with pytest.raises(ValueError, match="no such file") as info:
        resolve_model(str(missing))
    assert str(missing) in str(info.value)


# ------------------------------------------------------------------------------ config loading


def _same_shapes(a: ModelSpec, b: ModelSpec) -> None:
    for field in dataclasses.fields(ModelSpec):
        if field.name != "name" and field.compare:  # (architecture: a class name, not a shape)
            assert getattr(a, field.name) == getattr(b, field.name), field.name


def test_llama_3_1_8b_config_loads_like_the_preset() -> None:
    spec = model_from_hf_config(HF_CONFIGS / "llama-3.1-8b.json")
    _same_shapes(spec, MODEL_PRESETS["Llama-3.1-8B"])
    # Estimate from the shapes (no count in the file):
    #   embed 128256 x 4096 = 525,336,576; lm_head the same (untied)
    #   per layer: q 4096^2 + k, v 2 x 4096 x 1024 + o 4096^2 = 41,943,040
    #              MLP 3 x 4096 x 14336 = 176,160,768; norms 2 x 4096 = 8,192  -> 218,112,000
    #   32 layers 6,979,584,000 + 2 x 525,336,576 + final norm 4,096 = 8,030,261,248
    assert spec.num_params == 8_030_261_248
    assert spec.num_params == pytest.approx(8.03e9, rel=0.01)  # published "8B" (8.03B)
    assert spec.name == "llama-3.1-8b"  # from the file name: no _name_or_path in the file


def test_mistral_7b_config_estimate() -> None:
    spec = model_from_hf_config(HF_CONFIGS / "mistral-7b-v0.1.json")
    _same_shapes(spec, MODEL_PRESETS["Mistral-7B-v0.1"])
    #   embed + lm_head 2 x 32000 x 4096 = 262,144,000; 32 layers x 218,112,000 = 6,979,584,000
    #   + final norm 4,096 = 7,241,732,096 (published 7.24B)
    assert spec.num_params == 7_241_732_096
    assert spec.num_params == pytest.approx(7.24e9, rel=0.01)


def test_gemma2_head_dim_trap_and_fp32_config() -> None:
    spec = model_from_hf_config(HF_CONFIGS / "gemma2-like.json")
    # head_dim 256 is read from the file; hidden / heads would give 2304 / 8 = 288.
    assert spec.head_dim == 256
    assert spec.num_kv_heads == 4
    # torch_dtype float32 is served in 16 bits by vLLM ("auto"), so 2 B:
    # 2 x 26 layers x 4 heads x 256 x 2 B = 106,496 B/token.
    assert spec.weight_dtype_bytes == 2
    assert spec.kv_bytes_per_token() == 106_496
    # gemma2 ties embeddings by default (no tie_word_embeddings in the file). Estimate:
    #   embed 256000 x 2304 = 589,824,000; per layer q 2304 x 2048 + k, v 2 x 2304 x 1024
    #   + o 2048 x 2304 = 14,155,776, MLP 3 x 2304 x 9216 = 63,700,992, norms 4,608 -> 77,861,376
    #   x 26 = 2,024,395,776; + 589,824,000 + 2,304 = 2,614,222,080
    # vs the published gemma-2-2b count 2,614,341,888 (Gemma-2 has four norms per layer, not two).
    assert spec.num_params == 2_614_222_080
    assert spec.num_params == pytest.approx(2_614_341_888, rel=1e-4)


def test_opt_config_uses_ffn_dim_and_opt_layout() -> None:
    spec = model_from_hf_config(HF_CONFIGS / "opt-13b.json")
    _same_shapes(spec, MODEL_PRESETS["OPT-13B"])
    assert spec.kv_bytes_per_token() == 819_200
    assert not spec.gated_mlp


def test_mla_config_needs_a_count_then_loads() -> None:
    path = HF_CONFIGS / "deepseek-v2-lite.json"
    with pytest.raises(ValueError, match="mixture-of-experts.*num_params") as info:
        model_from_hf_config(path)
    assert str(path) in str(info.value)
    spec = model_from_hf_config(path, num_params=15_706_484_224, name="DeepSeek-V2-Lite")
    assert spec.attention == "mla"
    assert (spec.kv_lora_rank, spec.qk_rope_head_dim) == (512, 64)
    # The file's head_dim 64 (transformers' qk_rope_head_dim) is ignored; q/k heads are 128 + 64.
    assert spec.head_dim == 192
    assert spec.weight_dtype_bytes == 2  # from "dtype", the newer spelling of torch_dtype
    assert spec.kv_bytes_per_token() == 31_104
    _same_shapes(
        spec,
        dataclasses.replace(MODEL_PRESETS["DeepSeek-V2-Lite"], num_active_params=None),
    )


def _write(tmp_path: Path, cfg: object, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def _llama_cfg() -> dict[str, object]:
    return json.loads((HF_CONFIGS / "llama-3.1-8b.json").read_text())


def test_absent_kv_heads_and_head_dim_mean_mha_and_hidden_over_heads(tmp_path: Path) -> None:
    cfg = _llama_cfg()
    del cfg["num_key_value_heads"]
    spec = model_from_hf_config(_write(tmp_path, cfg))
    assert spec.num_kv_heads == 32
    assert spec.head_dim == 4096 // 32
    assert spec.kv_bytes_per_token() == 2 * 32 * 32 * 128 * 2


def test_num_params_from_file_and_override(tmp_path: Path) -> None:
    cfg = _llama_cfg()
    cfg["num_params"] = 123_456_789
    path = _write(tmp_path, cfg)
    assert model_from_hf_config(path).num_params == 123_456_789
    assert model_from_hf_config(path, num_params=42).num_params == 42


def test_text_config_is_unwrapped(tmp_path: Path) -> None:
    wrapper = {"model_type": "llava", "vision_config": {"hidden_size": 1024}, "text_config": _llama_cfg()}
    assert model_from_hf_config(_write(tmp_path, wrapper)).kv_bytes_per_token() == 131_072


def test_quantized_config_warns(tmp_path: Path) -> None:
    cfg = _llama_cfg()
    cfg["quantization_config"] = {"quant_method": "fp8"}
    with pytest.warns(UserWarning, match="quantization_config"):
        spec = model_from_hf_config(_write(tmp_path, cfg))
    assert spec.weight_dtype_bytes == 2


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        model_from_hf_config(tmp_path / "absent.json")
    with pytest.raises(ValueError, match="no such file"):
        model_from_hf_config(tmp_path)  # a directory without config.json


def test_bad_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON") as info:
        model_from_hf_config(path)
    assert str(path) in str(info.value)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        model_from_hf_config(path)


@pytest.mark.parametrize(
    "field", ["num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "intermediate_size"]
)
def test_missing_required_field_names_file_and_field(tmp_path: Path, field: str) -> None:
    cfg = _llama_cfg()
    del cfg[field]
    path = _write(tmp_path, cfg)
    with pytest.raises(ValueError, match=f"missing required field '{field}'") as info:
        model_from_hf_config(path)
    assert str(path) in str(info.value)


def test_invalid_field_values(tmp_path: Path) -> None:
    cfg = _llama_cfg()
    cfg["hidden_size"] = "4096"
    with pytest.raises(ValueError, match="'hidden_size' must be a positive integer"):
        model_from_hf_config(_write(tmp_path, cfg))
    cfg = _llama_cfg()
    cfg["num_key_value_heads"] = 5
    with pytest.raises(ValueError, match="not a multiple of num_key_value_heads"):
        model_from_hf_config(_write(tmp_path, cfg))
    cfg = _llama_cfg()
    cfg["torch_dtype"] = "int3"
    with pytest.raises(ValueError, match="unsupported torch_dtype"):
        model_from_hf_config(_write(tmp_path, cfg))


def test_mla_config_missing_rope_dim(tmp_path: Path) -> None:
    cfg = json.loads((HF_CONFIGS / "deepseek-v2-lite.json").read_text())
    del cfg["qk_rope_head_dim"]
    with pytest.raises(ValueError, match="missing required field 'qk_rope_head_dim'"):
        model_from_hf_config(_write(tmp_path, cfg), num_params=1)


def test_model_spec_validates() -> None:
    base = MODEL_PRESETS["Llama-3.1-8B"]
    with pytest.raises(ValueError, match="num_layers must be a positive integer"):
        dataclasses.replace(base, num_layers=0)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        dataclasses.replace(base, num_kv_heads=3)
    with pytest.raises(ValueError, match="attention='mla' needs a positive integer kv_lora_rank"):
        dataclasses.replace(base, attention="mla")
    with pytest.raises(ValueError, match="num_active_params"):
        dataclasses.replace(base, num_active_params=base.num_params + 1)


# ------------------------------------------------------------------------ new dense presets


@pytest.mark.parametrize(
    ("name", "qk_norm", "expected"),
    [
        # embed + lm_head 2 x 32000 x 8192 = 524,288,000; per layer q, o 2 x 8192^2 = 134,217,728,
        # k, v 2 x 8192 x 1024 = 16,777,216, MLP 3 x 8192 x 22016 = 541,065,216, norms 16,384
        # -> 692,076,544 x 48 = 33,219,674,112; + final norm 8,192 = 33,743,970,304
        ("CodeLlama-34B", False, 33_743_970_304),
        # embed + lm_head 2 x 151936 x 5120 = 1,555,824,640; per layer q, o 2 x 5120^2 = 52,428,800,
        # k, v 2 x 5120 x 1024 = 10,485,760, q/k norms 2 x 128, MLP 3 x 5120 x 17408 = 267,386,880,
        # norms 10,240 -> 330,311,936 x 40 = 13,212,477,440; + 5,120 = 14,768,307,200
        ("Qwen3-14B", True, 14_768_307_200),
        # q, o 2 x 5120 x 8192 = 83,886,080 (64 heads of 128), k, v 10,485,760, q/k norms 256, MLP
        # 3 x 5120 x 25600 = 393,216,000, norms 10,240 -> 487,598,336 x 64 = 31,206,293,504
        # + 1,555,824,640 + 5,120 = 32,762,123,264
        ("Qwen3-32B", True, 32_762_123_264),
    ],
)
def test_new_dense_presets_equal_the_shape_formula(name: str, qk_norm: bool, expected: int) -> None:
    spec = MODEL_PRESETS[name]
    estimate = estimate_num_params(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_layers=spec.num_layers,
        num_attention_heads=spec.num_attention_heads,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.intermediate_size,
        qk_norm=qk_norm,
    )
    assert estimate == spec.num_params == expected
    assert not spec.is_moe and spec.active_params == spec.num_params


# --------------------------------------------------------------------- mixture of experts


def test_moe_shapes_of_the_presets() -> None:
    mixtral = MODEL_PRESETS["Mixtral-8x7B"]
    # one expert: 3 x 4096 x 14336 = 176,160,768; 32 layers x 8 = 45,097,156,608 routed weights
    assert mixtral.expert_params == 176_160_768
    assert mixtral.routed_expert_params == 45_097_156_608
    # active: 46,702,792,704 - 32 x (8 - 2) x 176,160,768 = 12,879,925,248 (card: "12.9B")
    assert mixtral.active_params == 12_879_925_248
    assert mixtral.activated_mlp_width == 2 * 14336  # twice its intermediate_size
    qwen = MODEL_PRESETS["Qwen3-30B-A3B"]
    # one expert: 3 x 2048 x 768 = 4,718,592; unused per token: 48 x 120 experts = 27,179,089,920
    assert qwen.expert_params == 4_718_592
    assert qwen.inactive_expert_params == 27_179_089_920
    assert qwen.active_params == 30_532_122_624 - 27_179_089_920 == 3_353_032_704  # card: "3.3B"
    assert qwen.activated_mlp_width == 8 * 768
    assert qwen.num_moe_layers == 48
    assert MODEL_PRESETS["Qwen3-30B-A3B-Instruct-2507"].max_position_embeddings == 262144
    # DeepSeek: the presets' active counts leave the input embedding out; the shape gives it back.
    #   V2-Lite: 15,706,484,224 - 26 MoE layers x 58 x (3 x 2048 x 1408 = 8,650,752) = 2,661,150,208
    #            = 2,451,435,008 + the 102400 x 2048 = 209,715,200 embedding
    lite = MODEL_PRESETS["DeepSeek-V2-Lite"]
    assert (lite.num_moe_layers, lite.shared_expert_intermediate_size) == (26, 2816)
    assert lite.num_params - lite.inactive_expert_params == 2_451_435_008 + 102_400 * 2048
    #   V3: 671,026,419,200 - 58 x 248 x (3 x 7168 x 2048 = 44,040,192) = 37,552,297,472
    #       = 36,625,618,432 + the 129280 x 7168 = 926,679,040 embedding
    v3 = MODEL_PRESETS["DeepSeek-V3"]
    assert v3.num_params - v3.inactive_expert_params == 36_625_618_432 + 129_280 * 7168
    assert not MODEL_PRESETS["Llama-3.1-8B"].is_moe
    assert MODEL_PRESETS["Llama-3.1-8B"].routed_expert_params == 0


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # Mixtral: embed + lm_head 262,144,000; per layer attention 41,943,040, router 4096 x 8 =
        # 32,768, experts 8 x 176,160,768 = 1,409,286,144, norms 8,192 -> 1,451,270,144 x 32
        # = 46,440,644,608; + final norm 4,096 = 46,702,792,704
        ("Mixtral-8x7B", 46_702_792_704),
        # Qwen3-30B-A3B: embed + lm_head 2 x 151936 x 2048 = 622,329,856; per layer q, o 2 x 2048 x
        # 4096 = 16,777,216, k, v 2 x 2048 x 512 = 2,097,152, q/k norms 256, router 2048 x 128 =
        # 262,144, experts 128 x 4,718,592 = 603,979,776, norms 4,096 -> 623,120,640 x 48
        # = 29,909,790,720; + 2,048 = 30,532,122,624 (the safetensors count of the checkpoint)
        ("Qwen3-30B-A3B", 30_532_122_624),
    ],
)
def test_moe_presets_equal_the_shape_formula(name: str, expected: int) -> None:
    spec = MODEL_PRESETS[name]
    assert spec.moe_intermediate_size is not None and spec.num_experts is not None
    estimate = estimate_num_params(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_layers=spec.num_layers,
        num_attention_heads=spec.num_attention_heads,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.intermediate_size,
        qk_norm=name.startswith("Qwen3"),
        num_experts=spec.num_experts,
        moe_intermediate_size=spec.moe_intermediate_size,
    )
    assert estimate == spec.num_params == expected


@pytest.mark.parametrize(
    ("file", "preset"), [("qwen3-30b-a3b", "Qwen3-30B-A3B"), ("mixtral-8x7b-v0.1", "Mixtral-8x7B")]
)
def test_moe_configs_load_like_the_presets(file: str, preset: str) -> None:
    # No count in the file: the estimate, experts included, must give the checkpoint's exact count.
    spec = model_from_hf_config(HF_CONFIGS / f"{file}.json")
    _same_shapes(spec, MODEL_PRESETS[preset])


def test_moe_config_dense_layers(tmp_path: Path) -> None:
    cfg = json.loads((HF_CONFIGS / "qwen3-30b-a3b.json").read_text())
    # Qwen-MoE: layer i routes when i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
    # Step 2: layers 1, 3, ..., 47 route (24); mlp_only_layers [1, 3] turns two of them dense.
    cfg.update(decoder_sparse_step=2, mlp_only_layers=[1, 3], num_params=1_000_000_000_000)
    spec = model_from_hf_config(_write(tmp_path, cfg))
    assert (spec.num_moe_layers, spec.num_dense_layers) == (22, 26)
    # DeepSeek: layer i routes when i >= first_k_dense_replace and i % moe_layer_freq == 0:
    # 27 layers, first 3 dense, then every other one: 4, 6, ..., 26 -> 12 MoE layers.
    deepseek = json.loads((HF_CONFIGS / "deepseek-v2-lite.json").read_text())
    deepseek.update(first_k_dense_replace=3, moe_layer_freq=2)
    spec = model_from_hf_config(_write(tmp_path, deepseek, "ds.json"), num_params=15_706_484_224)
    assert (spec.num_moe_layers, spec.num_dense_layers) == (12, 15)
    assert spec.shared_expert_intermediate_size == 2 * 1408  # n_shared_experts x the expert width
    # Experts of a width but no count is a broken config.
    del cfg["num_experts"]
    with pytest.raises(ValueError, match="missing required field 'n_routed_experts'"):
        model_from_hf_config(_write(tmp_path, cfg, "broken.json"))


def test_moe_spec_validates() -> None:
    mixtral = MODEL_PRESETS["Mixtral-8x7B"]
    with pytest.raises(ValueError, match="experts_per_token \\(9\\) exceeds num_experts \\(8\\)"):
        dataclasses.replace(mixtral, experts_per_token=9)
    with pytest.raises(ValueError, match="needs a positive integer moe_intermediate_size"):
        dataclasses.replace(mixtral, moe_intermediate_size=None)
    with pytest.raises(ValueError, match="num_dense_layers must be an integer >= 0 and below num_layers"):
        dataclasses.replace(mixtral, num_dense_layers=32)
    with pytest.raises(ValueError, match="must exceed its routed experts' weights"):
        dataclasses.replace(mixtral, num_params=45_097_156_608)
    with pytest.raises(ValueError, match="set num_experts too"):
        dataclasses.replace(MODEL_PRESETS["Llama-3.1-8B"], experts_per_token=2)


def test_models_listing_names_the_attention_by_its_heads() -> None:
    from sim.listing import models_table

    presets = models_table().split("\n\n")[0]
    rows = {line.split()[0]: line for line in presets.splitlines()[1:]}
    assert " MHA " in rows["Llama-2-7B"]  # 32 KV heads for 32 query heads
    assert " GQA " in rows["Llama-3.1-8B"]  # 8 for 32
    assert "GQA, MoE" in rows["Mixtral-8x7B"]
    assert "MLA, MoE" in rows["DeepSeek-V3"]
    # the routed experts' bytes: Qwen3-30B-A3B 28,991,029,248 params x 2 B = 54.0 GiB of its 56.9;
    # a dense model has none
    assert rows["Qwen3-30B-A3B"].split()[-2:] == ["56.9", "54.0"]
    assert rows["Llama-3.1-8B"].split()[-1] == "-"


def test_models_listing_shows_layer_kinds_and_states() -> None:
    from sim.listing import layer_kinds_table

    rows = {line.split()[0]: line for line in layer_kinds_table().split("\n\n")[0].splitlines()[1:]}
    # Only the presets with layer kinds: 7 rows, none for Llama-3.1-8B.
    assert len(rows) == 7 and "Llama-3.1-8B" not in rows
    # gpt-oss-20b: 2 x 8 KV heads x 64 x 2 B = 2,048 B per token per layer, 12 layers of each kind.
    assert "sliding(128) 12 x 2,048; full 12 x 2,048" in rows["gpt-oss-20b"]
    assert rows["gpt-oss-20b"].rstrip().endswith("-")  # no state
    # Gemma 3: 2 x 16 x 128 x 2 B = 8,192 B; 52 sliding and 10 full layers.
    assert "sliding(1024) 52 x 8,192; full 10 x 8,192" in rows["Gemma-3-27B"]
    assert "chunked(8192) 36 x 4,096; full 12 x 4,096" in rows["Llama-4-Scout-17B-16E"]
    assert "sliding(4096) 32 x 4,096" in rows["Mistral-7B-v0.1"]
    # Qwen3-Next: 36 gated-delta-net layers x 1,097,728 B = 39,518,208 B per request.
    assert "full 12 x 2,048" in rows["Qwen3-Next-80B-A3B"]
    assert "39,518,208 (gdn 36 x 1,097,728)" in rows["Qwen3-Next-80B-A3B"]
    # Nemotron-H: 24 Mamba2 layers x 4,255,744 B (float32 SSM state) = 102,137,856 B.
    assert "102,137,856 (mamba2 24 x 4,255,744)" in rows["Nemotron-H-8B-Base-8K"]
    # The note names which policies hold every layer's K/V and which keep each kind.
    note = layer_kinds_table().split("\n\n")[1]
    assert "uniform policies (contiguous, paged, prefix, radix) hold every attention layer's K/V" in note
    assert "hybrid allocators (vllm-hybrid, sglang-hybrid, jenga) keep each kind" in note
