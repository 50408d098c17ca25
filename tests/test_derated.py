"""The derated analytic cost model worked by hand on a tiny model, and the GPU efficiency factors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.costs.core import AnalyticCostModel
from sim.costs.derated import (
    DECODE_LINEARIZATION_BATCHES,
    DeratedCostModel,
    elementwise_elements_per_token,
    embedding_is_tied,
)
from sim.costs.factory import make_cost_model
from sim.hardware.gpus import EFFICIENCY_PRESETS, GPU_PRESETS, Efficiency, GpuSpec, resolve_gpu
from sim.hardware.models import ModelSpec, resolve_model


def approx(value: float) -> object:
    return pytest.approx(value, rel=1e-12, abs=0.0)


# 2 layers, hidden 4, 2 query heads and 1 KV head of 2, SwiGLU 8, vocab 16. Per layer: q 4x4 = 16,
# k and v 2 x 4x2 = 16, o 16, MLP 3 x 4x8 = 96 -> 144 matrix weights; + 2 norms of 4. Untied:
# embedding 64 + 2 x 152 + final norm 4 + LM head 64 = 436 parameters.
TINY = ModelSpec(
    name="tiny",
    num_layers=2,
    hidden_size=4,
    num_attention_heads=2,
    num_kv_heads=1,
    head_dim=2,
    intermediate_size=8,
    vocab_size=16,
    num_params=436,
)
# Round numbers: 1000 B/s, 10^4 FLOP/s, every share 0.5.
HALF = Efficiency(
    weight_bandwidth=0.5,
    gemm_flops=0.5,
    elementwise_bandwidth=0.5,
    layer_fixed_s=1.0,
    kv_bandwidth=0.5,
    decode_attention_fixed_s=2.0,
    decode_attention_per_seq_s=0.5,
    prefill_attention_flops=0.5,
    prefill_attention_fixed_s=3.0,
    source="unit factors",
    error_band="none",
)
UNIT_GPU = GpuSpec("unit", 2**30, 1e3, 1e4, HALF)


def test_coefficients_by_hand():
    costs = DeratedCostModel(TINY, UNIT_GPU)
    assert not embedding_is_tied(TINY)  # 436 - 2 x (144 + 8) = 132 >= 1.5 x 64
    # weights read each step: 436 - LM head 64 - embedding table 64 = 308 params x 2 B at 500 B/s
    assert costs.body_read_s == approx(1.232)
    assert costs.body_flops_per_token_s == approx(2 * 308 / 5000)  # 0.1232 s
    assert costs.head_read_s == approx(64 * 2 / 500)  # 0.256 s
    assert costs.head_flops_per_row_s == approx(2 * 64 / 5000)  # 0.0256 s
    assert costs.embedding_row_s == approx(4 * 2 / 500)  # one row of 4 x 2 B
    # elementwise, per token and layer: norms 2 x (4 + 4), rope 2 x (4 + 2), SwiGLU 16 + 8, add 12
    assert elementwise_elements_per_token(TINY) == 16 + 12 + 24 + 12
    assert costs.elementwise_per_token_s == approx(2 * 64 * 2 / 500)  # 0.512 s, both layers
    assert costs.elementwise_fixed_s == approx(2.0)
    assert costs.kv_read_per_token_s == approx(2 * 2 * 1 * 2 * 2 / 500)  # 16 B over 2 layers
    assert costs.prefill_attention_per_pair_s == approx(2 * 4 * 4 / 5000)
    assert costs.label == "derated-analytic (unit factors)" and costs.error_band == "none"


def test_iteration_with_chunks_by_hand():
    """2 decoding sequences holding 10 tokens, one chunk of 3 tokens after a 5-token prefix: 5 tokens
    through the matrices, 3 rows of logits (2 sequences + the chunk's last token)."""
    costs = DeratedCostModel(TINY, UNIT_GPU)
    gemm = math.hypot(1.232, 0.1232 * 5) + math.hypot(0.256, 0.0256 * 3)
    elementwise = 2.0 + (0.512 + 0.016) * 5
    decode_attention = 2 * 2.0 + 2 * 0.5 * 2 + 0.032 * 10
    # pairs 3 x (5 + 3/2) = 19.5; the 5-token prefix is read once
    prefill_attention = 2 * 3.0 + 0.0064 * 19.5 + 0.032 * 5
    expected = gemm + elementwise + decode_attention + prefill_attention
    assert costs.iteration_s(2, 10, [(3, 5)]) == approx(expected) == approx(18.88948972076798)
    # one fixed cost, however many chunks: two chunks of 3 cost one floor more of attention only
    two = costs.iteration_s(0, 0, [(3, 0), (3, 0)])
    assert two == approx(
        math.hypot(1.232, 0.1232 * 6)
        + math.hypot(0.256, 0.0256 * 2)
        + 2.0
        + 0.528 * 6
        + 2 * (6.0 + 0.0064 * 3 * 1.5)
    )
    # a chunk's marginal time is its iteration less the fixed cost (weights read, layers' floor)
    assert costs.prefill_fixed_s == approx(1.232 + 0.256 + 2.0)
    assert costs.prefill_s(3, 5) == approx(costs.iteration_s(0, 0, [(3, 5)]) - costs.prefill_fixed_s)
    assert costs.prefill_s(0, 5) == 0.0


def test_decode_is_the_relative_least_squares_line():
    """Decode must be linear in the batch: the quadrature sum is replaced by its line fitted for
    relative error over batches 1..256 at geometric spacing. Checked against numpy.polyfit with
    weights 1/y (the same criterion, computed independently)."""
    costs = DeratedCostModel(TINY, UNIT_GPU)
    batches = np.array(DECODE_LINEARIZATION_BATCHES, dtype=float)
    assert batches[0] == 1 and batches[-1] == 256 and len(batches) == 47  # 64 points, rounded, distinct
    gemm = np.hypot(1.232, 0.1232 * batches) + np.hypot(0.256, 0.0256 * batches)
    slope, intercept = np.polyfit(batches, gemm, 1, w=1 / gemm)
    decode = costs.decode
    assert decode.intercept_s == pytest.approx(intercept + 2.0 + 4.0, rel=1e-9)
    assert decode.per_seq_s == pytest.approx(slope + 0.512 + 0.016 + 1.0, rel=1e-9)
    assert decode.per_context_token_s == approx(0.032)
    assert costs.iteration_s(4, 40) == decode.step_s(4, 40)


def test_tied_embeddings_are_read_through_the_head_only():
    assert embedding_is_tied(resolve_model("OPT-13B"))
    assert not embedding_is_tied(resolve_model("Llama-3.1-8B"))
    assert not embedding_is_tied(resolve_model("Llama-2-7B"))
    tied = ModelSpec(**{**TINY.__dict__, "num_params": 436 - 64})
    costs = DeratedCostModel(tied, UNIT_GPU)
    assert embedding_is_tied(tied)
    assert costs.body_read_s == approx((372 - 64) * 2 / 500)  # the table is the head's matrix


def test_blocks_and_swaps():
    costs = DeratedCostModel(TINY, UNIT_GPU, block_size=4, host_bandwidth_bytes_per_s=8.0)
    # a block: 16 B per token x 4 tokens; copy reads and writes it at 500 B/s
    assert costs.copy_blocks_s(3) == approx(3 * 2 * 64 / 500)
    assert costs.swap_blocks_s(3) == approx(3 * 64 / 8.0)
    assert costs.copy_blocks_s(0) == costs.swap_blocks_s(-1) == 0.0


def test_derated_is_never_faster_than_either_datasheet_bound():
    """With every share below 1 and positive floors, an iteration takes longer than reading the
    weights at the datasheet bandwidth and longer than its FLOPs at the datasheet rate. (It can be
    faster than the analytic roofline, which adds the two: near the ridge point that sum is
    pessimistic.)"""
    model = resolve_model("Llama-3.1-8B")
    for name, gpu in GPU_PRESETS.items():
        derated = DeratedCostModel(model, gpu)
        read = model.weight_bytes() / gpu.hbm_bandwidth_bytes_per_s
        for batch, context in ((1, 1000), (32, 32_000), (256, 256_000)):
            flops = 2 * model.num_params * batch / gpu.fp16_flops
            assert derated.iteration_s(batch, context) > max(read, flops), name
        for chunk, start in ((128, 0), (2048, 0), (512, 8192)):
            flops = 2 * model.num_params * chunk / gpu.fp16_flops
            assert derated.iteration_s(0, 0, [(chunk, start)]) > max(read, flops), name
    # and it is slower than the roofline wherever one bound dominates (small decode, long prefill)
    a100 = GPU_PRESETS["A100-80GB"]
    derated, roofline = DeratedCostModel(model, a100), AnalyticCostModel(model, a100)
    assert derated.iteration_s(1, 1000) > roofline.iteration_s(1, 1000)
    assert derated.iteration_s(0, 0, [(4096, 0)]) > roofline.iteration_s(0, 0, [(4096, 0)])


def test_presets_say_where_their_factors_come_from():
    assert GPU_PRESETS["A100-80GB"].efficiency is EFFICIENCY_PRESETS["A100"]
    assert GPU_PRESETS["H100-80GB"].efficiency is EFFICIENCY_PRESETS["H100"]
    h200 = GPU_PRESETS["H200-141GB"].efficiency
    assert h200.weight_bandwidth == EFFICIENCY_PRESETS["H100"].weight_bandwidth
    assert "applied to H200-141GB" in h200.source and h200.error_band.startswith("not validated on H200")
    for name in ("L4-24GB", "T4-16GB", "A10G-24GB", "RTX-4090-24GB"):
        assert GPU_PRESETS[name].efficiency.error_band.startswith(f"not validated on {name}")
    costs = make_cost_model(
        {"kind": "derated", "calibration": "none"},
        resolve_model("Llama-2-7B"),
        resolve_gpu("A100-80GB"),
        block_size=16,
    )
    assert costs.label == f"derated-analytic ({EFFICIENCY_PRESETS['A100'].source})"
    fitted = make_cost_model("derated", resolve_model("Llama-2-7B"), resolve_gpu("A100-80GB"), block_size=16)
    assert fitted.label.startswith(
        f"derated-analytic ({EFFICIENCY_PRESETS['A100'].source}; serving terms fitted to "
    )
    assert "Vidur A100" in costs.error_band


def test_user_overrides_efficiency():
    gpu = resolve_gpu({"base": "A100-80GB", "efficiency": {"weight_bandwidth": 0.9, "layer_fixed_s": 0.0}})
    assert gpu.efficiency.weight_bandwidth == 0.9 and gpu.efficiency.layer_fixed_s == 0.0
    assert gpu.efficiency.gemm_flops == EFFICIENCY_PRESETS["A100"].gemm_flops
    assert "overridden by the user: weight_bandwidth=0.9" in gpu.efficiency.source
    assert gpu.efficiency.error_band.startswith("not validated")
    custom = resolve_gpu({"memory_gib": 24, "hbm_bandwidth_gb_per_s": 500, "fp16_tflops": 100})
    assert custom.efficiency == GpuSpec("x", 1, 1.0, 1.0).efficiency  # the generic, marked factors
    with pytest.raises(ValueError, match="unknown efficiency key"):
        resolve_gpu({"base": "L4", "efficiency": {"bandwidth": 0.5}})
    with pytest.raises(ValueError, match="share of the datasheet peak"):
        resolve_gpu({"base": "L4", "efficiency": {"gemm_flops": 2.0}})
    with pytest.raises(ValueError, match="must be a mapping"):
        resolve_gpu({"base": "L4", "efficiency": 0.5})
