"""What a hybrid model's state layers (Mamba 2, gated delta net) and its attention layers cost, by
hand: attention kernels and attention FLOPs run in the attention layers only, and every state layer
reads and writes each request's state once per decode step and per prompt chunk, and scans every
prompt token. A model without state layers costs exactly what it did."""

from __future__ import annotations

import pytest

from sim.costs.core import SCAN_FLOPS_PER_STATE_ELEMENT, StateLayerCost
from sim.costs.factory import make_cost_model
from sim.hardware.gpus import resolve_gpu
from sim.hardware.models import resolve_model

H100 = resolve_gpu("H100-80GB")
BANDWIDTH, FLOPS = float(H100.hbm_bandwidth_bytes_per_s), float(H100.fp16_flops)
# Nemotron-H-8B: 52 blocks, 24 Mamba2 + 24 MLP-only + 4 attention. A Mamba2 layer's state: an SSM state
# of 128 heads x 64 x 128 = 1,048,576 float32 elements (4,194,304 B) and a conv state of (4 - 1) x
# (8,192 + 2 x 8 x 128) = 30,720 bf16 elements (61,440 B): 4,255,744 B a layer, 102,137,856 B a request.
NEMOTRON_STATE_BYTES = 24 * (128 * 64 * 128 * 4 + 3 * (8192 + 2 * 8 * 128) * 2)
NEMOTRON_SCAN_ELEMENTS = 24 * 128 * 64 * 128


def analytic(model: str, tensor_parallel_size: int = 1):
    return make_cost_model(
        "analytic", resolve_model(model), H100, block_size=16, tensor_parallel_size=tensor_parallel_size
    )


def test_state_terms_of_nemotron_by_hand():
    assert (
        NEMOTRON_STATE_BYTES
        == 102_137_856
        == resolve_model("Nemotron-H-8B-Base-8K").state_bytes_per_request(1)
    )
    states = StateLayerCost.of(
        resolve_model("Nemotron-H-8B-Base-8K"), 1, BANDWIDTH, FLOPS, kernel_fixed_s=1e-5
    )
    assert states.fixed_s == pytest.approx(24 * 1e-5)  # one kernel per Mamba2 layer
    assert states.per_seq_s == pytest.approx(2 * NEMOTRON_STATE_BYTES / BANDWIDTH)  # read and written
    assert states.per_token_s == pytest.approx(SCAN_FLOPS_PER_STATE_ELEMENT * NEMOTRON_SCAN_ELEMENTS / FLOPS)
    assert StateLayerCost.of(resolve_model("Llama-3.1-8B"), 1, BANDWIDTH, FLOPS, 1e-5) == StateLayerCost()


def test_analytic_prices_attention_in_attention_layers_and_states_per_request():
    model = resolve_model("Nemotron-H-8B-Base-8K")
    costs = analytic("Nemotron-H-8B-Base-8K")
    # causal (query, key) pairs: 4 attention layers of 32 heads x 128, 4 FLOPs each (QK and PV)
    assert costs.prefill_per_attention_pair_s == pytest.approx(4 * 4 * 32 * 128 / FLOPS)
    state_s = 2 * NEMOTRON_STATE_BYTES / BANDWIDTH  # 63.0 us on an H100's 3.35 TB/s
    assert costs.decode.per_seq_s == pytest.approx(2 * model.active_params / FLOPS + state_s)
    prefill = costs.linear_iteration.prefill
    assert prefill.per_chunk_s == pytest.approx(state_s)
    assert prefill.per_token_s == pytest.approx(
        2 * model.active_params / FLOPS + SCAN_FLOPS_PER_STATE_ELEMENT * NEMOTRON_SCAN_ELEMENTS / FLOPS
    )


def test_derated_decode_step_grows_by_each_requests_state():
    """One more decoding request adds its state's read and write (at the K/V bandwidth the model
    reads the cache at) beside what a request costs Llama-3.1-8B's way: the matrix products' share
    and the attention layers' per-sequence kernel work."""
    costs = make_cost_model(None, resolve_model("Nemotron-H-8B-Base-8K"), H100, block_size=16)
    states = costs.decode_states
    assert states.per_seq_s == pytest.approx(
        2 * NEMOTRON_STATE_BYTES / (BANDWIDTH * costs.efficiency.kv_bandwidth)
    )
    # 4 attention layers' kernels, not 52; the Mamba2 layers' 24 kernels beside them
    fixed = costs.efficiency.decode_attention_fixed_s
    assert costs.decode_attention_fixed_s == pytest.approx(4 * fixed + 24 * fixed)
    grown = costs.decode.step_s(65, 65 * 2000) - costs.decode.step_s(64, 64 * 2000)
    assert grown > states.per_seq_s > 60e-6


def test_prefill_chunk_reads_each_requests_state_once():
    costs = make_cost_model(None, resolve_model("Nemotron-H-8B-Base-8K"), H100, block_size=16)
    states = costs.prefill_states
    one = costs.iteration_s(0, 0, [(512, 0)])
    two = costs.iteration_s(0, 0, [(256, 0), (256, 0)])
    # same tokens; the second chunk reads and writes one more state, runs the attention kernels once
    # more over fewer pairs, and samples one more row of logits
    pairs_saved = 512 * 513 / 2 - 2 * (256 * 257 / 2)
    one_more_logit_row = costs.gemm_s(512, 2) - costs.gemm_s(512, 1)
    assert two - one == pytest.approx(
        states.per_seq_s
        - costs.prefill_attention_per_pair_s * pairs_saved
        + costs.prefill_attention_fixed_s
        + one_more_logit_row,
        rel=1e-9,
    )


def test_models_without_state_layers_cost_what_they_did():
    # Llama-3.1-8B's numbers before state layers were priced (the same expressions, all layers attention)
    costs = make_cost_model(None, resolve_model("Llama-3.1-8B"), H100, block_size=16)
    fixed = costs.efficiency.decode_attention_fixed_s
    assert costs.decode_attention_fixed_s == 32 * fixed
    assert costs.decode_states == StateLayerCost() and costs.prefill_states == StateLayerCost()
