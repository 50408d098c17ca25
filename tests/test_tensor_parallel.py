"""Tensor parallelism: per-GPU pool sizing (vLLM's arithmetic), the all-reduce cost, TP-split cost
models, profiles measured at one TP, and the run's output. Every expectation is worked by hand."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pandas as pd
import pytest

from sim.cli import main
from sim.costs.core import (
    AnalyticCostModel,
    CostModelConfig,
    CostModelError,
    ProfileCostModel,
    load_profile,
)
from sim.costs.derated import DeratedCostModel
from sim.costs.factory import make_cost_model
from sim.costs.terms import ALL_REDUCE_LATENCY_S, AllReduceCost
from sim.hardware.capacity import size_kv_pool
from sim.hardware.gpus import GPU_PRESETS, resolve_gpu
from sim.hardware.models import MODEL_PRESETS
from sim.results import load_results

LLAMA_8B = MODEL_PRESETS["Llama-3.1-8B"]
LLAMA_70B = MODEL_PRESETS["Llama-3.1-70B"]
H100 = GPU_PRESETS["H100-80GB"]
QUICKSTART = "configs/quickstart.yaml"
H100_PROFILE = "configs/profiles/analytic-llama-3.1-8b-h100-80gb.yaml"
VIDUR_DATA = Path(__file__).resolve().parents[1] / "calibrate" / "vidur_data"


# ----------------------------------------------------------------------------- pool sizing per GPU


def test_pool_llama_3_1_70b_on_8_h100() -> None:
    """vLLM per GPU: requested = 80 GiB x 0.9; available = requested - weights - activation peak;
    num_blocks = available // (page bytes per layer x layers); "GPU KV cache size" = blocks x 16.

    * budget 80 x 2**30 x 0.9                                  = 77,309,411,328 B
    * weights 70,553,706,496 params x 2 B / 8                  = 17,638,426,624 B
    * activation reserve (8192 tokens, 2 B): MLP 3 x 28672 / 8 = 10,752; qkv (64/8 + 2 x 8/8) x 128
      = 1,280; 4 x 8192 = 32,768 -> 44,800 x 2 x 8192 = 734,003,200; + logits 256 x 128,256 x 4
      = 131,334,144                                            =    865,337,344 B
    * available = 77,309,411,328 - 17,638,426,624 - 865,337,344 = 58,805,647,360 B
    * 8 KV heads over 8 GPUs: 1 per GPU; per token 2 x 80 x 1 x 128 x 2 = 40,960 B; a block of 16
      is 655,360 B (vLLM: page 16 x 2 x 1 x 128 x 2 = 8,192 B per layer, x 80 layers)
    * 58,805,647,360 // 655,360 = 89,730 blocks (89,730 x 655,360 = 58,805,452,800) -> 1,435,680 tokens
    * 8192-token requests: 89,730 / 512 blocks = 175.25x
    """
    cap = size_kv_pool("Llama-3.1-70B", "H100-80GB", tensor_parallel_size=8)
    assert cap.weight_bytes == 17_638_426_624
    assert cap.activation_reserve_bytes == 865_337_344
    assert cap.available_kv_bytes == 58_805_647_360
    assert cap.kv_bytes_per_token == 40_960
    assert cap.num_gpu_blocks == 89_730
    assert cap.capacity_lines(8192)[:2] == [
        "GPU KV cache size: 1,435,680 tokens",
        "Maximum concurrency for 8,192 tokens per request: 175.25x",
    ]


def test_pool_llama_3_1_8b_on_2_h100() -> None:
    """* budget 77,309,411,328 B; weights 8,030,261,248 x 2 / 2 = 8,030,261,248 B
    * reserve: MLP 3 x 14336 / 2 = 21,504; qkv (32/2 + 2 x 8/2) x 128 = 3,072; 4 x 4096 = 16,384
      -> 40,960 x 2 x 8192 = 671,088,640 + logits 131,334,144 = 802,422,784 B
    * available = 77,309,411,328 - 8,030,261,248 - 802,422,784 = 68,476,727,296 B
    * 4 KV heads per GPU: 2 x 32 x 4 x 128 x 2 = 65,536 B per token, 1,048,576 B per block
    * 68,476,727,296 // 1,048,576 = 65,304 blocks -> 1,044,864 tokens; 65,304 / 512 = 127.55x
    """
    cap = size_kv_pool("Llama-3.1-8B", "H100-80GB", tensor_parallel_size=2)
    assert (cap.weight_bytes, cap.activation_reserve_bytes) == (8_030_261_248, 802_422_784)
    assert cap.kv_bytes_per_token == 65_536
    assert cap.num_gpu_blocks == 65_304
    lines = cap.capacity_lines(8192)
    assert lines[:2] == [
        "GPU KV cache size: 1,044,864 tokens",
        "Maximum concurrency for 8,192 tokens per request: 127.55x",
    ]
    # the per-GPU line: 8,030,261,248 B = 7.48 GiB; 802,422,784 B = 0.75 GiB; 65,304 MiB = 63.77 GiB
    assert lines[2] == (
        "tensor_parallel_size 2, per GPU: weights 7.48 GiB, activation reserve 0.75 GiB, "
        "KV cache 63.77 GiB (65,536 B per token)"
    )
    assert len(size_kv_pool("Llama-3.1-8B", "H100-80GB").capacity_lines(8192)) == 2


def test_heads_not_divisible_is_vllms_error_before_any_run(tmp_path, capsys) -> None:
    out = tmp_path / "tp3"
    code = main(["run", QUICKSTART, "-q", "-o", str(out), "--set", "engine.tensor_parallel_size=3"])
    assert code == 2
    assert "Total number of attention heads (32) must be divisible by tensor parallel size (3)." in (
        capsys.readouterr().err
    )
    assert not out.exists()
    with pytest.raises(
        CostModelError, match=r"attention heads \(64\) must be divisible by tensor parallel size \(3\)"
    ):
        DeratedCostModel(LLAMA_70B, H100, tensor_parallel_size=3)


# ----------------------------------------------------------------------------- GPU links


def test_gpu_presets_carry_their_datasheet_links() -> None:
    # NVLink and PCIe figures are both directions together; a transfer gets half of each.
    assert H100.nvlink_bandwidth_bytes_per_s == 900e9 and H100.pcie_bandwidth_bytes_per_s == 128e9
    assert H100.tensor_parallel_link_bytes_per_s == 450e9 and H100.host_link_bytes_per_s == 64e9
    a100 = GPU_PRESETS["A100-80GB"]
    assert (a100.tensor_parallel_link_bytes_per_s, a100.host_link_bytes_per_s) == (300e9, 32e9)
    l4 = GPU_PRESETS["L4-24GB"]  # no NVLink: all-reduces go over PCIe Gen4, 32 GB/s each way
    assert l4.nvlink_bandwidth_bytes_per_s is None
    assert (l4.tensor_parallel_link_bytes_per_s, l4.tensor_parallel_link_name) == (32e9, "PCIe")
    assert GPU_PRESETS["T4-16GB"].host_link_bytes_per_s == 16e9  # PCIe Gen3 x16
    custom = resolve_gpu({"base": "H100-80GB", "nvlink_gb_per_s": None, "pcie_gb_per_s": 64})
    assert custom.tensor_parallel_link_bytes_per_s == 32e9
    with pytest.raises(ValueError, match="pcie_gb_per_s must be a positive, finite number"):
        resolve_gpu({"base": "H100-80GB", "pcie_gb_per_s": 0})


def test_swaps_default_to_the_presets_pcie_link() -> None:
    # A100: PCIe Gen4 64 GB/s both ways -> 32e9 B/s; one block of Llama-3.1-8B = 16 x 131,072 B.
    costs = make_cost_model("analytic", LLAMA_8B, GPU_PRESETS["A100-80GB"], block_size=16)
    assert costs.swap_blocks_s(10) == pytest.approx(10 * 2_097_152 / 32e9, rel=1e-15)
    derated = make_cost_model(None, LLAMA_8B, H100, block_size=16)  # Gen5: 64e9 B/s each way
    assert derated.swap_blocks_s(1) == pytest.approx(2_097_152 / 64e9, rel=1e-15)


# ----------------------------------------------------------------------------- all-reduce


def test_all_reduce_of_one_decode_iteration_by_hand() -> None:
    """Llama-3.1-70B at TP 4 on H100 SXM, a decode iteration of 64 sequences (64 tokens):

    * calls: 2 per layer x 80 layers = 160; latency 10 us x log2(4) = 20 us each: 3.2 ms
    * message per token: hidden 8192 x 2 B = 16,384 B; ring factor 2 x (4 - 1) / 4 = 1.5
    * link: NVLink 900 GB/s both ways -> 450e9 B/s each way
    * bandwidth term: 160 x 1.5 x 16,384 B x 64 / 450e9 = 251,658,240 / 450e9 = 0.559240533 ms
    * total 3.759240533 ms
    """
    all_reduce = AllReduceCost.of(LLAMA_70B, H100, 4)
    assert ALL_REDUCE_LATENCY_S == 10e-6
    assert all_reduce.per_iteration_s == pytest.approx(3.2e-3, rel=1e-12)
    assert all_reduce.seconds(64) == pytest.approx(3.2e-3 + 251_658_240 / 450e9, rel=1e-12)
    assert all_reduce.seconds(64) == pytest.approx(3.759240533e-3, rel=1e-9)
    # 2 GPUs: 10 us per call; 8 GPUs: 30 us
    assert AllReduceCost.of(LLAMA_70B, H100, 2).per_iteration_s == pytest.approx(160 * 10e-6, rel=1e-12)
    assert AllReduceCost.of(LLAMA_70B, H100, 8).per_iteration_s == pytest.approx(160 * 30e-6, rel=1e-12)
    assert all_reduce.seconds(0) == 0.0
    assert AllReduceCost.of(LLAMA_70B, H100, 1).seconds(64) == 0.0


def test_analytic_tp2_iteration_by_hand() -> None:
    """Llama-3.1-8B at TP 2 on H100 SXM (3.35e12 B/s HBM, 989.4e12 FLOP/s), decode of 8 sequences
    holding 8192 tokens:

    * weights: 8,030,261,248 x 2 B / 3.35e12 / 2 per GPU
    * all-reduce latency: 2 x 32 layers x 10 us x log2(2) = 640 us
    * per sequence: 2 x 8,030,261,248 FLOPs / 989.4e12 / 2, plus the all-reduce per token:
      64 calls x 2 (2 - 1) / 2 x 4096 x 2 B / 450e9 = 524,288 / 450e9
    * per context token: 4 KV heads per GPU -> 65,536 B / 3.35e12
    """
    costs = AnalyticCostModel(LLAMA_8B, H100, tensor_parallel_size=2)
    weights = 8_030_261_248 * 2 / 3.35e12 / 2
    per_seq = 2 * 8_030_261_248 / 989.4e12 / 2 + 524_288 / 450e9
    expected = weights + 640e-6 + 8 * per_seq + 8192 * 65_536 / 3.35e12
    assert costs.iteration_s(8, 8192) == pytest.approx(expected, rel=1e-12)
    # a prefill chunk of 512 tokens at 0 in its own iteration: the fixed part, then per token
    # (FLOPs / 2 + all-reduce) and the causal pairs 512 x 256 over 4 x 32 layers x 4096 / 2 per pair
    pairs = 512 * 256
    chunk = 512 * per_seq + pairs * 4 * 32 * 4096 / 989.4e12 / 2
    assert costs.iteration_s(0, 0, [(512, 0)]) == pytest.approx(weights + 640e-6 + chunk, rel=1e-12)
    assert "TP 2" in costs.label and "NVLink 450 GB/s per direction" in costs.label


def test_derated_divides_the_per_gpu_terms_and_adds_the_all_reduce() -> None:
    one, two = DeratedCostModel(LLAMA_8B, H100), DeratedCostModel(LLAMA_8B, H100, tensor_parallel_size=2)
    assert two.body_read_s == pytest.approx(one.body_read_s / 2, rel=1e-15)
    assert two.head_flops_per_row_s == pytest.approx(one.head_flops_per_row_s / 2, rel=1e-15)
    assert two.kv_read_per_token_s == pytest.approx(one.kv_read_per_token_s / 2, rel=1e-15)
    assert two.prefill_attention_per_pair_s == pytest.approx(one.prefill_attention_per_pair_s / 2, rel=1e-15)
    # floors are per GPU and do not divide
    assert two.elementwise_fixed_s == one.elementwise_fixed_s
    # elementwise bytes per token and layer: norms 4 x 4096 + residual 3 x 4096 stay whole; rope
    # 2 x (32 + 8) x 128 -> 2 x (16 + 4) x 128; activation 3 x 14336 -> 3 x 7168
    # TP 1: 16,384 + 10,240 + 43,008 + 12,288 = 81,920; TP 2: 16,384 + 5,120 + 21,504 + 12,288 = 55,296
    assert two.elementwise_per_token_s == pytest.approx(
        one.elementwise_per_token_s * 55_296 / 81_920, rel=1e-14
    )
    all_reduce = AllReduceCost.of(LLAMA_8B, H100, 2)
    tokens = 4 + 1024
    shared = two.iteration_s(4, 4096, [(1024, 0)])
    without = (
        two.gemm_s(tokens, 5)
        + two.elementwise_fixed_s
        + (two.elementwise_per_token_s + two.embedding_row_s) * tokens
        + two.decode_attention_fixed_s
        + two.decode_attention_per_seq_s * 4
        + two.kv_read_per_token_s * 4096
        + two.prefill_attention_fixed_s
        + two.prefill_attention_per_pair_s * 1024 * 512
    )
    assert shared == pytest.approx(without + all_reduce.seconds(tokens), rel=1e-12)


@pytest.mark.parametrize("kind", ["derated", "analytic"])
@pytest.mark.parametrize(
    ("batch", "context", "chunks"), [(1, 1000, []), (64, 64 * 2000, []), (8, 8000, [(2048, 0)])]
)
def test_two_gpus_are_faster_than_one_but_not_twice(kind, batch, context, chunks) -> None:
    one = make_cost_model(kind, LLAMA_70B, H100, block_size=16)
    two = make_cost_model(kind, LLAMA_70B, H100, block_size=16, tensor_parallel_size=2)
    t1, t2 = one.iteration_s(batch, context, chunks), two.iteration_s(batch, context, chunks)
    assert t1 / 2 < t2 < t1


# ----------------------------------------------------------------------------- profiles


def test_profile_measured_at_tp1_is_refused_at_tp2_unless_rescaled() -> None:
    with pytest.raises(
        CostModelError,
        match="measured at tensor_parallel_size 1, but the engine runs at tensor_parallel_size 2",
    ):
        make_cost_model(H100_PROFILE, LLAMA_8B, H100, block_size=16, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="tensor_parallel_rescale"):
        CostModelConfig.model_validate({"kind": "derated", "tensor_parallel_rescale": True})


def test_rescaled_profile_by_hand() -> None:
    """The profile's per-layer and LM-head terms halve at TP 2 (matrices, heads and vocabulary split);
    the K/V terms follow the KV heads per GPU (8 -> 4: half); the all-reduces are added:
    640 us per iteration and 524,288 / 450e9 s per token (see the analytic test above)."""
    profile = load_profile(H100_PROFILE)
    assert profile.tensor_parallel_size == 1
    c = profile.coefficients
    config = {"profile": H100_PROFILE, "tensor_parallel_rescale": True}
    with pytest.warns(UserWarning, match="at TP 1 is rescaled to 'Llama-3.1-8B' at TP 2"):
        costs = make_cost_model(config, LLAMA_8B, H100, block_size=16, tensor_parallel_size=2)
    assert isinstance(costs, ProfileCostModel)
    per_token = 524_288 / 450e9
    assert costs.decode.intercept_s == pytest.approx(
        32 * c.decode_per_layer.intercept_s / 2 + c.decode_per_step.intercept_s / 2 + 640e-6, rel=1e-12
    )
    assert costs.decode.per_seq_s == pytest.approx(
        32 * c.decode_per_layer.per_seq_s / 2 + c.decode_per_step.per_seq_s / 2 + per_token, rel=1e-12
    )
    assert costs.decode.per_context_token_s == pytest.approx(
        32 * c.decode_per_layer.per_context_token_s / 2, rel=1e-12
    )
    p = c.prefill_per_layer
    chunk = (
        c.decode_per_step.per_seq_s / 2
        + (32 * p.per_token_s / 2 + per_token) * 100
        + 32 * p.per_attention_pair_s / 2 * 100 * 50
    )
    assert costs.prefill_s(100, 0) == pytest.approx(chunk, rel=1e-12)
    assert "rescaled from TP 1" in costs.label and "TP 2" in costs.label
    assert "rescaled from TP 1 to 2: not validated" in costs.error_band


def test_profile_at_tp1_is_unchanged() -> None:
    plain = ProfileCostModel(load_profile(H100_PROFILE), LLAMA_8B)
    built = make_cost_model(H100_PROFILE, LLAMA_8B, H100, block_size=plain.block_size)
    assert built.decode == plain.decode
    assert built.prefill_s(300, 100) == plain.prefill_s(300, 100)
    assert built.label == plain.label


# ----------------------------------------------------------------------------- a run at TP 2


def test_runs_at_tp4_and_tp8_report_per_gpu_numbers_and_tp8_decodes_faster(tmp_path, capsys) -> None:
    small = ["run", QUICKSTART, "-q", "--set", "workload.num_requests=60", "--set", "model=Llama-3.1-70B"]
    small += ["--set", "gpu=H100-80GB"]
    tp4, tp8 = tmp_path / "tp4", tmp_path / "tp8"
    assert main([*small, "-o", str(tp4), "--set", "engine.tensor_parallel_size=4"]) == 0
    assert main([*small, "-o", str(tp8), "--set", "engine.tensor_parallel_size=8"]) == 0
    printed = capsys.readouterr().out
    assert "tensor_parallel_size 4, per GPU: weights 32.85 GiB" in printed  # 35,276,853,248 B
    assert "tensor_parallel_size 8, per GPU: weights 16.43 GiB" in printed  # 17,638,426,624 B
    four = json.loads((tp4 / "paged" / "summary.json").read_text())
    eight = json.loads((tp8 / "paged" / "summary.json").read_text())
    assert (four["tensor_parallel_size"], eight["tensor_parallel_size"]) == (4, 8)
    assert four["kv_bytes_per_token"] == 81_920 and eight["kv_bytes_per_token"] == 40_960
    assert "TP 4" in four["cost_model"] and "TP 8" in eight["cost_model"]
    # a token of decode is faster on 8 GPUs than on 4, but not twice as fast
    tpot4, tpot8 = four["tpot_p50_s"], eight["tpot_p50_s"]
    assert tpot4 / 2 < tpot8 < tpot4
    assert load_results(tp8).variant_summary("paged")["tensor_parallel_size"] == 8
    assert math.isfinite(eight["e2e_p99_s"])


# ----------------------------------------------------------------------------- measured check (Vidur)

VIDUR_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)


@pytest.mark.parametrize(("device", "gpu"), [("a100", "A100-80GB"), ("h100", "H100-80GB")])
def test_tp_split_of_the_layer_matches_vidurs_llama_2_70b_timings(device, gpu) -> None:
    """Vidur timed one Llama-2-70B layer's non-attention operations on one GPU's shard at TP 1, 2, 4
    and 8 (calibrate/vidur_data, not used in any fit). The derated model's same part of a layer
    (matrix products + elementwise kernels, per layer) divided by its TP-1 value, against the same
    ratio measured, token counts 1-4096 (259 per TP, duplicates averaged): the split is off by
    -1..+2 % in the median and at most -34..+16 % at any point (A100: -18..+10 %).
    """
    frame = pd.read_csv(VIDUR_DATA / f"{device}-Llama-2-70b-hf-mlp.csv")
    frame["layer_s"] = sum(frame[f"time_stats.{op}.median"] for op in VIDUR_OPS) * 1e-3
    measured = frame.groupby(["num_tensor_parallel_workers", "num_tokens"])["layer_s"].mean()
    model = MODEL_PRESETS["Llama-2-70B"]

    def layer_s(costs: DeratedCostModel, tokens: int) -> float:
        gemm = math.hypot(costs.body_read_s, costs.body_flops_per_token_s * tokens)
        return (gemm + costs.elementwise_fixed_s + costs.elementwise_per_token_s * tokens) / model.num_layers

    one = DeratedCostModel(model, GPU_PRESETS[gpu])
    for tp in (2, 4, 8):
        costs = DeratedCostModel(model, GPU_PRESETS[gpu], tensor_parallel_size=tp)
        errors = [
            layer_s(costs, tokens) / layer_s(one, tokens) / (measured[tp, tokens] / measured[1, tokens]) - 1
            for tokens in measured[tp].index
        ]
        assert len(errors) == 259
        assert abs(statistics.median(errors)) < 0.03
        assert min(errors) > -0.35 and max(errors) < 0.17
