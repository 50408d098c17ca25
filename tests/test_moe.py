"""Mixture of experts in the cost models: the expected experts a batch routes to, the derated and
analytic weight reads, the decode step's per-batch table and event skipping over it.

Expected numbers are worked out by hand in the comments."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.costs.core import AnalyticCostModel
from sim.costs.derated import (
    DECODE_LINEARIZATION_BATCHES,
    DECODE_TABLE_BATCHES,
    DeratedCostModel,
    decoder_layer_params,
    elementwise_elements_per_token,
    embedding_is_tied,
)
from sim.costs.factory import make_cost_model
from sim.costs.terms import (
    ROUTING_SATURATED,
    DecodeCost,
    RoutedDecodeCost,
    expected_distinct_experts,
    unread_experts_s,
)
from sim.engine.event_skip import decode_series_s, decode_token_weight_s, iterations_to_reach
from sim.hardware.gpus import Efficiency, GpuSpec, resolve_gpu
from sim.hardware.models import MODEL_PRESETS, ModelSpec, estimate_num_params, resolve_model


def approx(value: float) -> object:
    return pytest.approx(value, rel=1e-12, abs=0.0)


# ------------------------------------------------------------------ expected distinct experts


def test_expected_distinct_experts_by_hand() -> None:
    # one token uses exactly k experts; none are touched without tokens
    assert expected_distinct_experts(1, 128, 8) == approx(8.0)
    assert expected_distinct_experts(0, 128, 8) == 0.0
    # E = 8, k = 2, 3 tokens: a token misses an expert with probability 6/8;
    # 8 x (1 - (3/4)^3) = 8 x 37/64 = 4.625
    assert expected_distinct_experts(3, 8, 2) == approx(4.625)
    # E = 4, k = 2: 4 x (1 - (1/2)^B): 2, 3, 3.5, 3.75
    assert [expected_distinct_experts(b, 4, 2) for b in (1, 2, 3, 4)] == [2.0, 3.0, 3.5, 3.75]
    # every expert for every token: all of them at once
    assert expected_distinct_experts(5, 8, 8) == 8.0
    # many tokens: all but a vanishing share (Qwen3-30B-A3B at 1024 tokens: 128 x (15/16)^1024 ~ 2e-27)
    assert expected_distinct_experts(1024, 128, 8) == pytest.approx(128.0, rel=1e-15)
    assert expected_distinct_experts(64, 128, 8) == pytest.approx(128 * (1 - (120 / 128) ** 64), rel=1e-15)


@pytest.mark.parametrize(("tokens", "num_experts", "per_token"), [(3, 8, 2), (16, 128, 8), (6, 64, 6)])
def test_expected_distinct_experts_against_monte_carlo(tokens: int, num_experts: int, per_token: int) -> None:
    """Each token draws ``per_token`` distinct experts uniformly (the ``per_token`` smallest of
    ``num_experts`` uniform keys); count the distinct experts over the batch. With 40,000 trials the
    standard error of the mean is about 0.5 % of the spread: a 5-sigma tolerance is tight enough to
    tell the exact formula from, say, the with-replacement one ``E (1 - (1 - 1/E)^(kB))``."""
    rng = np.random.default_rng(20240917)
    trials = 40_000
    keys = rng.random((trials, tokens, num_experts))
    chosen = np.argpartition(keys, per_token - 1, axis=-1)[..., :per_token]
    touched = np.zeros((trials, num_experts), dtype=bool)
    rows = np.arange(trials)[:, None, None]
    touched[rows, chosen] = True
    counts = touched.sum(axis=1)
    mean, standard_error = counts.mean(), counts.std(ddof=1) / math.sqrt(trials)
    exact = expected_distinct_experts(tokens, num_experts, per_token)
    assert abs(mean - exact) < 5 * standard_error
    with_replacement = num_experts * (1 - (1 - 1 / num_experts) ** (per_token * tokens))
    assert abs(mean - with_replacement) > 5 * standard_error


# ------------------------------------------------------------------------ a tiny MoE, by hand

# 2 layers, hidden 4, 2 query heads and 1 KV head of 2, vocab 16. Layer 0 dense (SwiGLU 8), layer 1
# MoE: router 4 x 4 = 16, 4 experts of width 2 (3 x 4 x 2 = 24 each), 2 per token.
#   attention per layer: q 16 + k, v 16 + o 16 = 48; norms 8
#   layer 0: 48 + MLP 96 + 8 = 152; layer 1: 48 + 16 + 4 x 24 + 8 = 168
#   + embedding 64 + LM head 64 + final norm 4 = 452 parameters
TINY_MOE = ModelSpec(
    name="tiny-moe",
    num_layers=2,
    hidden_size=4,
    num_attention_heads=2,
    num_kv_heads=1,
    head_dim=2,
    intermediate_size=8,
    vocab_size=16,
    num_params=452,
    num_experts=4,
    experts_per_token=2,
    moe_intermediate_size=2,
    num_dense_layers=1,
)
# 1000 B/s, 10^4 FLOP/s, every share 0.5 (as in tests/test_derated.py)
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


def test_tiny_moe_shape_by_hand() -> None:
    estimate = estimate_num_params(
        vocab_size=16,
        hidden_size=4,
        num_layers=2,
        num_attention_heads=2,
        num_kv_heads=1,
        head_dim=2,
        intermediate_size=8,
        num_experts=4,
        moe_intermediate_size=2,
        num_dense_layers=1,
    )
    assert estimate == TINY_MOE.num_params == 452
    assert decoder_layer_params(TINY_MOE) == 152 + 168
    assert not embedding_is_tied(TINY_MOE)  # 452 - 320 = 132 >= 1.5 x 64
    # 2 of 4 experts unused per token in the one MoE layer: 452 - 2 x 24 = 404 active
    assert TINY_MOE.active_params == 404
    # width activated: layer 0 8, layer 1 2 experts x 2 -> mean 6
    assert TINY_MOE.activated_mlp_width == 6
    # norms 2 x (4 + 4), rope 2 x (2 + 1) x 2, SwiGLU 3 x 6, add 12
    assert elementwise_elements_per_token(TINY_MOE) == 16 + 12 + 18 + 12


def test_tiny_moe_derated_reads_only_the_experts_touched() -> None:
    costs = DeratedCostModel(TINY_MOE, UNIT_GPU)
    # decoder weights 452 - 64 - 64 = 324, of which the 4 routed experts 96: 228 always read,
    # at 2 B over 500 B/s = 0.912 s; one expert 24 x 2 / 500 = 0.096 s
    assert costs.body_read_s == approx(0.912)
    assert costs.expert_read_s == approx(0.096)
    # FLOPs of the active decoder weights, 324 - 48 = 276: 2 x 276 / 5000 = 0.1104 s per token
    assert costs.body_flops_per_token_s == approx(0.1104)
    head = math.hypot(0.256, 0.0256)  # the LM head, one row of logits
    # one token touches 2 experts: read 0.912 + 2 x 0.096 = 1.104
    assert costs.gemm_s(1, 1) == approx(math.hypot(1.104, 0.1104) + head)
    # three tokens touch 3.5 experts on average: 0.912 + 0.336 = 1.248; all four: 1.296
    assert costs.gemm_s(3, 1) == approx(math.hypot(1.248, 0.3312) + head)
    assert costs.gemm_s(3, 1, 4) == approx(math.hypot(1.296, 0.3312) + head)
    # a prefill chunk of 3 tokens alone: the exact expected read for its 3 tokens
    elementwise = 2.0 + (2 * 58 * 2 / 500 + 4 * 2 / 500) * 3
    attention = 2 * 3.0 + 2 * 4 * 4 / 5000 * 3 * 1.5
    assert costs.iteration_s(0, 0, [(3, 0)]) == approx(costs.gemm_s(3, 1) + elementwise + attention)
    # no tokens, no experts: the fixed cost reads the rest only
    assert costs.prefill_fixed_s == approx(0.912 + 0.256 + 2.0)


def test_quantised_experts_are_read_at_their_own_bytes() -> None:
    # A checkpoint that stores its routed experts in 4.25 bits (gpt-oss's MXFP4: 4-bit values and a
    # shared 8-bit scale per 32) reads one expert as 24 x 4.25 / 8 = 12.75 B, over 500 B/s 0.0255 s,
    # where bf16 experts take 0.096 s; the rest of the weights are read as before.
    from dataclasses import replace

    quantised = DeratedCostModel(replace(TINY_MOE, routed_expert_bits=4.25), UNIT_GPU)
    assert quantised.expert_read_s == approx(0.0255)
    assert quantised.body_read_s == approx(0.912)


def test_tiny_moe_decode_line_and_table() -> None:
    costs = DeratedCostModel(TINY_MOE, UNIT_GPU)
    decode = costs.decode
    assert isinstance(decode, RoutedDecodeCost)
    # the line stands in for the products with every expert read, its error relative to the real ones
    batches = np.array(DECODE_LINEARIZATION_BATCHES, dtype=float)
    every = np.array([costs.gemm_s(b, b, 4) for b in DECODE_LINEARIZATION_BATCHES])
    routed = np.array([costs.gemm_s(b, b) for b in DECODE_LINEARIZATION_BATCHES])
    slope, intercept = np.polyfit(batches, every, 1, w=1 / routed)  # minimises sum(((y - p) / routed)^2)
    assert decode.intercept_s - (2.0 + 4.0) == pytest.approx(intercept, rel=1e-9)
    elementwise_per_token = 2 * 58 * 2 / 500
    per_seq_rest = elementwise_per_token + 4 * 2 / 500 + 2 * 0.5
    assert decode.per_seq_s - per_seq_rest == pytest.approx(slope, rel=1e-9)
    # the table: per batch up to DECODE_TABLE_BATCHES, the routed products less the line's part of the
    # step at that batch; beyond it, nothing
    table = decode.batch_s
    assert len(table) == DECODE_TABLE_BATCHES + 1
    line_products = intercept + slope * np.arange(len(table))
    for batch in (0, 1, 2, 7, DECODE_TABLE_BATCHES):
        assert table[batch] == approx(costs.gemm_s(batch, batch) - line_products[batch])
    # the step: the line plus the table, i.e. the routed products themselves; the line alone beyond
    for batch, context in ((1, 10), (3, 30), (DECODE_TABLE_BATCHES, 100)):
        routed_step = 6.0 + per_seq_rest * batch + costs.gemm_s(batch, batch)
        assert decode.step_s(batch, context) == approx(routed_step + decode.per_context_token_s * context)
        assert costs.iteration_s(batch, context) == decode.step_s(batch, context)
    beyond = DECODE_TABLE_BATCHES + 5
    line = decode.intercept_s + decode.per_seq_s * beyond + decode.per_context_token_s * 100
    assert decode.step_s(beyond, 100) == approx(line)


@pytest.mark.parametrize(
    "name", sorted(name for name, spec in MODEL_PRESETS.items() if (spec.num_experts or 0) > 1)
)
def test_every_moe_preset_routes_to_every_expert_past_the_decode_table(name: str) -> None:
    # Beyond DECODE_TABLE_BATCHES a routed decode step is the line alone, which prices every expert
    # as read. For that to be the step's real cost, a batch past the table must leave a negligible
    # share of the experts unread: (1 - k/E)^b, the chance that b tokens all miss one expert
    # (Qwen3-Next's 10 of 512, the slowest preset: 2.8e-18 at 2,049 sequences). A preset whose
    # routing saturated later would need the table to run to its saturation instead.
    spec = MODEL_PRESETS[name]
    beyond = DECODE_TABLE_BATCHES + 1
    unread_share = 1.0 - expected_distinct_experts(beyond, spec.num_experts, spec.experts_per_token) / (
        spec.num_experts
    )
    assert unread_share < ROUTING_SATURATED
    assert unread_share == pytest.approx((1 - spec.experts_per_token / spec.num_experts) ** beyond, abs=1e-15)


def test_dense_decode_steps_are_the_quadrature_sum_not_its_line() -> None:
    # The derated model prices every batch up to DECODE_TABLE_BATCHES exactly (the line was 5-6 %
    # under the quadrature sum at one sequence); the analytic roofline keeps its plain line.
    costs = DeratedCostModel(resolve_model("Llama-3.1-8B"), resolve_gpu("A100-80GB"))
    assert costs.expert_read_s == 0.0
    rest = costs.elementwise_fixed_s + costs.decode_attention_fixed_s + costs.all_reduce.per_iteration_s
    rest += costs.iteration_overhead_s
    per_seq = costs.elementwise_per_token_s + costs.embedding_row_s + costs.decode_attention_per_seq_s
    per_seq += costs.all_reduce.per_token_s
    for batch in (1, 2, 64, 256, 1000, DECODE_TABLE_BATCHES):
        exact = rest + per_seq * batch + costs.gemm_s(batch, batch) + costs.kv_read_per_token_s * 5000
        assert costs.iteration_s(batch, 5000) == pytest.approx(exact, rel=1e-12), batch
    assert type(AnalyticCostModel(resolve_model("Qwen3-32B"), resolve_gpu("A100-80GB")).decode) is DecodeCost


@pytest.mark.parametrize(
    ("model", "gpu", "tp", "within"),
    [
        ("Qwen3-30B-A3B", "A100-80GB", 1, 0.007),
        ("Qwen3-30B-A3B", "H100-80GB", 1, 0.003),
        ("Mixtral-8x7B", "A100-80GB", 1, 0.03),
        ("Mixtral-8x7B", "H100-80GB", 2, 0.01),
        ("DeepSeek-V2-Lite", "A100-80GB", 1, 0.013),
    ],
)
def test_moe_decode_follows_the_routed_products(model: str, gpu: str, tp: int, within: float) -> None:
    """From 1 to 256 sequences the decode step's matrix products (line + table) are the quadrature
    sum over the experts each batch routes to, where a plain line is off by -54..+134 % (Qwen3-30B-A3B
    on A100); ``within`` is what the table of unread experts alone left (the line's own error)."""
    costs = DeratedCostModel(resolve_model(model), resolve_gpu(gpu), tensor_parallel_size=tp)
    decode = costs.decode
    fixed = (
        costs.elementwise_fixed_s
        + costs.decode_attention_fixed_s
        + costs.all_reduce.per_iteration_s
        + costs.iteration_overhead_s
    )
    per_seq = (
        costs.elementwise_per_token_s
        + costs.embedding_row_s
        + costs.decode_attention_per_seq_s
        + costs.all_reduce.per_token_s
    )
    for batch in range(1, 257):
        products = decode.step_s(batch, 0) - fixed - per_seq * batch
        assert products == pytest.approx(costs.gemm_s(batch, batch), rel=1e-9), batch
    assert within > 0


def test_qwen3_moe_decode_reads_far_less_at_small_batches() -> None:
    costs = DeratedCostModel(resolve_model("Qwen3-30B-A3B"), resolve_gpu("H100-80GB"))
    # one sequence touches 8 of 128 experts per layer; 64 sequences touch 126 of them
    assert costs.decode.step_s(1, 1000) < 0.3 * costs.decode.step_s(64, 64_000)
    # the weights stay resident: memory sizing counts every expert
    assert resolve_model("Qwen3-30B-A3B").weight_bytes() == 30_532_122_624 * 2


def test_analytic_moe_by_hand() -> None:
    costs = AnalyticCostModel(TINY_MOE, UNIT_GPU)
    # all weights 452 x 2 B over 1000 B/s: 0.904 s; FLOPs 2 x 404 / 10^4 = 0.0808 s per sequence;
    # one expert 24 x 2 / 1000 = 0.048 s
    decode = costs.decode
    assert isinstance(decode, RoutedDecodeCost)
    assert (decode.intercept_s, decode.per_seq_s) == (approx(0.904), approx(0.0808))
    # unread experts by batch: 4, 2, 1, 0.5, ... x 0.048 s
    assert decode.batch_s[:4] == (approx(-0.192), approx(-0.096), approx(-0.048), approx(-0.024))
    assert decode.batch_s == unread_experts_s(0.048, 4, 2, ROUTING_SATURATED * 0.904)
    assert costs.iteration_s(1, 0) == approx(0.904 + 0.0808 - 0.096)
    # an iteration carrying prefill reads every expert: the decode table is not added
    chunk = costs.prefill_s(3, 0)
    assert costs.iteration_s(1, 0, [(3, 0)]) == approx(0.904 + 0.0808 + chunk)


def test_event_skipping_is_exact_over_the_routed_table() -> None:
    """A jump keeps its batch, so the table's term is a constant of the jump: the closed forms equal
    stepping one iteration at a time."""
    decode = DeratedCostModel(resolve_model("Qwen3-30B-A3B"), resolve_gpu("A100-80GB")).decode
    batch, context = 12, 6_000
    stepped = [decode.step_s(batch, context + batch * j) for j in range(1, 41)]
    assert decode_series_s(decode, 40, batch, context) == pytest.approx(sum(stepped), rel=1e-12)
    weights = sum(j * d for j, d in enumerate(stepped, start=1))
    assert decode_token_weight_s(decode, 40, batch, context) == pytest.approx(weights, rel=1e-12)
    budget = sum(stepped[:17]) - 1e-9
    assert iterations_to_reach(decode, batch, context, budget) == 17


def test_make_cost_model_builds_moe_models() -> None:
    model, gpu = resolve_model("Mixtral-8x7B"), resolve_gpu("H100-80GB")
    for kind in ("derated", "analytic"):
        costs = make_cost_model(kind, model, gpu, block_size=16, tensor_parallel_size=2)
        assert isinstance(costs.decode, RoutedDecodeCost)
        assert costs.iteration_s(4, 4000) > 0 and costs.iteration_s(0, 0, [(512, 0)]) > 0
