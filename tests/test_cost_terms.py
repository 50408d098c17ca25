"""The cost terms (``sim/costs/terms.py``) with round numbers, each figure worked out by hand: decode
steps with and without prefill, chunks of causal attention with and without sliding windows, the
experts a batch routes to, and the collectives of tensor and expert parallelism."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from sim.costs.terms import (
    AllReduceCost,
    AllToAllCost,
    DecodeCost,
    ExpertParallelCost,
    PrefillCost,
    RoutedDecodeCost,
    attended_context,
    attended_pairs,
    expected_distinct_experts,
    pairs_past_window,
    unread_experts_s,
)


def test_a_decode_step_and_one_carrying_prefill():
    """Step = 1 + 0.1 per sequence + 0.01 per context token. With prefill, one fixed cost: the larger
    of the intercept (only when sequences decode) and the prefill's own, plus the chunks."""
    decode = DecodeCost(1.0, 0.1, 0.01)
    assert decode.step_s(2, 100) == pytest.approx(1 + 0.2 + 1.0)
    assert decode.with_prefill_s(2, 100, 0.5, 0.25) == pytest.approx(1 + 0.2 + 1.0 + 0.25)
    assert decode.with_prefill_s(2, 100, 1.5, 0.25) == pytest.approx(1.5 + 0.2 + 1.0 + 0.25)
    # One decoding sequence pays the intercept too; none pays only the prefill's fixed cost.
    assert decode.with_prefill_s(1, 10, 0.5, 0.25) == pytest.approx(1 + 0.1 + 0.1 + 0.25)
    assert decode.with_prefill_s(0, 0, 0.5, 0.25) == pytest.approx(0.5 + 0.25)


def test_a_routed_decode_step_takes_off_what_its_batch_leaves_unread():
    routed = RoutedDecodeCost(1.0, 0.0, 0.0, batch_s=(-0.125, -0.5, -0.25))
    assert [routed.step_s(batch, 0) for batch in range(4)] == [0.875, 0.5, 0.75, 1.0]  # past the table: 0


def test_a_prefill_chunks_pairs_with_and_without_windows():
    """A chunk of 4 tokens at position 6: its queries see 7, 8, 9, 10 keys (34 pairs; the cost model
    counts n (start + n / 2) = 4 x 8 = 32). In the half of the layers with an 8-token window they see
    7, 8, 8, 8: 3 pairs fewer, so 32 - 0.5 x 3 = 30.5 on average over the layers."""
    cost = PrefillCost(fixed_s=9.0, per_chunk_s=0.5, per_token_s=0.1, per_pair_s=0.01)
    assert cost.chunk_s(4, 6) == pytest.approx(0.5 + 0.4 + 0.32)
    assert cost.chunk_s(0, 6) == 0.0 and cost.chunk_s(-1, 6) == 0.0
    windowed = PrefillCost(9.0, 0.5, 0.1, 0.01, windows=((8, 0.5),))
    assert pairs_past_window(4, 6, 8) == 3  # 9 - 8 + 10 - 8
    assert windowed.chunk_s(4, 6) == pytest.approx(0.5 + 0.4 + 0.01 * 30.5)
    assert attended_pairs(4, 6, ((8, 0.5),)) == pytest.approx(30.5)


@pytest.mark.parametrize(
    ("num_tokens", "start", "window", "past"),
    [
        (3, 10, 4, 7 + 8 + 9),  # every query past the window: 11-4, 12-4, 13-4
        (4, 0, 4, 0),  # the last query sees exactly the window
        (5, 0, 4, 1),  # only the last: 5 - 4
        (3, 2, 4, 0 + 1),  # queries see 3, 4, 5 keys
        (1, 4, 4, 1),  # one query seeing 5
    ],
)
def test_pairs_past_a_sliding_window_against_a_count_by_query(num_tokens, start, window, past):
    by_query = sum(max(0, start + index + 1 - window) for index in range(num_tokens))
    assert by_query == past
    assert pairs_past_window(num_tokens, start, window) == past


def test_the_attended_context_of_windowed_layers():
    assert attended_context(100, ()) == 100.0
    assert attended_context(100, ((40, 0.5),)) == pytest.approx(100 - 0.5 * 60)
    assert attended_context(40, ((40, 0.5),)) == 40.0  # exactly the window: nothing left out
    assert attended_context(100, ((40, 0.25), (10, 0.5))) == pytest.approx(100 - 15 - 45)


def test_the_experts_a_batch_routes_to():
    """8 experts, 2 per token: a token misses a given expert with probability 6/8, so B tokens reach
    8 (1 - 0.75^B): 2 at one token, 3.5 at two, none at zero."""
    assert expected_distinct_experts(0, 8, 2) == 0.0
    assert expected_distinct_experts(-1, 8, 2) == 0.0
    assert expected_distinct_experts(1, 8, 2) == pytest.approx(2.0)
    assert expected_distinct_experts(2, 8, 2) == pytest.approx(3.5)
    # Unread per batch x 1 s: 8, 6, 4.5, 3.375, ... until under the threshold (1.2 s: batch 6 reads
    # all but 8 x 0.75^6 = 1.42, batch 7 all but 1.07, where the table ends).
    table = unread_experts_s(1.0, 8, 2, 1.2)
    assert table == pytest.approx(tuple(-8 * 0.75**batch for batch in range(7)))
    # The batch of 0 is always in the table, however small the threshold makes its saving look.
    assert unread_experts_s(1.0, 8, 2, 100.0) == (-8.0,)
    # A saving exactly at the threshold ends the table (batch 1: 6 unread x 1 s).
    assert unread_experts_s(1.0, 8, 2, 6.0) == (-8.0,)
    # Half a second an expert: the same cut (0.6 s is 1.2 experts), each saving halved.
    assert unread_experts_s(0.5, 8, 2, 0.6) == pytest.approx(tuple(-4 * 0.75**batch for batch in range(7)))


GPU = SimpleNamespace(tensor_parallel_link_bytes_per_s=100e9, tensor_parallel_link_name="NVLink")


def test_the_all_reduces_of_tensor_parallelism():
    """TP 4, 10 layers of hidden 1,000 in 16-bit: 20 calls of 20 us (10 us x log2 4) = 400 us; a
    token's messages 20 x 2 x 3/4 x 2,000 bytes over 100 GB/s = 0.6 us."""
    model = SimpleNamespace(num_layers=10, hidden_size=1000, weight_dtype_bytes=2)
    cost = AllReduceCost.of(model, GPU, 4)
    assert cost.per_iteration_s == pytest.approx(400e-6)
    assert cost.per_token_s == pytest.approx(0.6e-6)
    assert cost.seconds(1000) == pytest.approx(400e-6 + 600e-6)
    assert cost.seconds(1) == pytest.approx(400.6e-6)
    assert cost.seconds(0) == 0.0
    assert AllReduceCost.of(model, GPU, 4, latency_s=5e-6).per_iteration_s == pytest.approx(200e-6)
    assert AllReduceCost.of(model, GPU, 1) == AllReduceCost()
    assert cost.describe() == "TP 4: per-GPU shares + 2 all-reduces/layer over NVLink 100 GB/s per direction"


def test_the_all_to_all_and_the_shared_part_of_an_expert_parallel_step():
    """DP 2, 4 MoE layers of hidden 1,000 and 8 experts, 16-bit: 2 x 4 calls of 10 us = 80 us; a row
    is (2,000 + 8) x 2 bytes, half of it crossing the link per layer: 4 x 0.5 x 4,016 / 100e9."""
    model = SimpleNamespace(num_moe_layers=4, hidden_size=1000, num_experts=8, weight_dtype_bytes=2)
    all_to_all = AllToAllCost.of(model, GPU, 2)
    assert all_to_all.per_iteration_s == pytest.approx(80e-6)
    assert all_to_all.per_token_s == pytest.approx(4 * 0.5 * 4016 / 100e9)
    assert all_to_all.seconds(0) == 0.0
    assert all_to_all.seconds(1) == pytest.approx(80e-6 + 4 * 0.5 * 4016 / 100e9)
    assert (all_to_all.data_parallel_size, all_to_all.link_bytes_per_s, all_to_all.link) == (
        2,
        100e9,
        "NVLink",
    )
    assert AllToAllCost.of(model, GPU, 1) == AllToAllCost()
    # DP 4: 3/4 of each row crosses the link; calls of 10 us x log2 4.
    four = AllToAllCost.of(model, GPU, 4)
    assert four.per_iteration_s == pytest.approx(2 * 4 * 20e-6)
    assert four.per_token_s == pytest.approx(4 * 0.75 * 4016 / 100e9)
    dense = SimpleNamespace(num_moe_layers=4, hidden_size=1000, num_experts=None, weight_dtype_bytes=2)
    assert AllToAllCost.of(dense, GPU, 2).per_token_s == pytest.approx(4 * 0.5 * 4000 / 100e9)
    # The rank holds 4 of the 8 experts: at 2 tokens it reads 3.5 x 4/8 = 1.75 experts (1 s each)
    # against 2 tokens x 1 s of FLOPs: hypot(1.75, 2) s, plus the all-to-all.
    step = ExpertParallelCost(8, 2, 4, 1.0, 1.0, all_to_all)
    assert step.step_s(2) == pytest.approx(math.hypot(1.75, 2.0) + all_to_all.seconds(2))
    assert step.step_s(0) == 0.0
    # One token: 2 experts, half of them this rank's: hypot(1, 1).
    assert step.step_s(1) == pytest.approx(math.sqrt(2) + all_to_all.seconds(1))
