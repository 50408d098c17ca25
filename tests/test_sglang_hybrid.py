"""``policy: sglang-hybrid``: SGLang's two token pools (full attention, sliding window) without its
radix cache. The pool sizes and the SWA slots freed as the window moves worked out by hand from
SGLang's rules (``sim/hardware/sglang_hybrid_capacity.py``, ``policies/hybrid/
sglang_sliding_window.py``), admission needing room in both pools, a run beside paged and
vllm-hybrid whose breakdown stays whole, and random operations against a step-by-step replay of
SGLang's eviction rule."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import ChildSpec, OutOfKVMemory, PoolSpec
from policies.hybrid.block_pool import SharedBlockPool
from policies.hybrid.full import FullAttentionGroup
from policies.hybrid.sglang_sliding_window import SGLangSlidingWindowGroup, prefill_hold
from sim.config import validate_experiment
from sim.hardware.sglang_hybrid_capacity import sglang_hybrid_kv_capacity
from sim.kv.allocators import sglang_hybrid_layout
from sim.kv.coordinator import KVGroup, make_coordinator
from sim.runner import run_experiment
from tests.test_hybrid_runs import BREAKDOWN, refused_with
from tests.test_hybrid_runs import config as hybrid_config


def prompt(tokens: int, content: int = 1):
    return ((content, tokens),)


# -- sizing -------------------------------------------------------------------------------------------
def test_gpt_oss_pools_by_hand():
    """gpt-oss-20b, 1.5e9 B of KV, ratio 0.8. A token in one layer: K and V of 8 heads of 64 at 2 B =
    2,048 B; 12 full + 12 SWA layers: cell size 49,152 B. max_total_num_tokens = 1,500,000,000 //
    49,152 = 30,517 (1,499,971,584 B). full = int(1,499,971,584 / (2,048 x 12 + 0.8 x 2,048 x 12 =
    44,236.8)) = int(33,907.6) = 33,907; swa = int(33,907 x 0.8) = int(27,125.6) = 27,125. Together
    (33,907 + 27,125) x 24,576 B = 1,499,922,432 B, within the memory. SWAKVPool's buffers hold one
    padding token more per pool: (33,908 + 27,126) x 24,576 B = 1.40 GiB."""
    capacity = sglang_hybrid_kv_capacity("gpt-oss-20b", 1_500_000_000)
    assert (capacity.layer_bytes, capacity.full_layers, capacity.swa_layers) == (2048, 12, 12)
    assert capacity.cell_size == 49_152 and capacity.max_total_num_tokens == 30_517
    assert (capacity.full_tokens, capacity.swa_tokens) == (33_907, 27_125)
    assert capacity.pool_bytes == 1_499_922_432 <= 1_500_000_000
    assert capacity.window == 128 and capacity.num_blocks == 33_907 + 27_125
    assert capacity.capacity_lines() == [
        "Use sliding window memory pool. full_layer_tokens=33907, swa_layer_tokens=27125",
        "SWAKVPool mem usage: 1.40 GB, swa size: 27125, full size: 33907",
    ]


def test_gemma_3_pools_by_hand_and_a_ratio_and_page_size():
    """Gemma-3-27B, 20 GiB: a token in one layer 2 x 16 x 128 x 2 = 8,192 B; 10 full + 52 SWA layers:
    cell 507,904 B; 21,474,836,480 // 507,904 = 42,281 tokens (21,474,689,024 B). full =
    int(21,474,689,024 / (81,920 + 0.8 x 425,984 = 422,707.2)) = int(50,802.6) = 50,802; swa =
    int(40,641.6) = 40,641. With ratio 0.5 and pages of 16: max_total_num_tokens 42,281 // 16 x 16 =
    42,272 (21,470,117,888 B); denominator 81,920 + 0.5 x 425,984 = 294,912; full =
    int(72,801.4) = 72,801, swa = int(72,801 x 0.5) = 36,400, each then rounded down to a page:
    72,800 and 36,400."""
    capacity = sglang_hybrid_kv_capacity("Gemma-3-27B", 20 * 2**30)
    assert (capacity.full_tokens, capacity.swa_tokens, capacity.max_total_num_tokens) == (
        50_802,
        40_641,
        42_281,
    )
    paged = sglang_hybrid_kv_capacity("Gemma-3-27B", 20 * 2**30, swa_full_tokens_ratio=0.5, page_size=16)
    assert paged.max_total_num_tokens == 42_272
    assert (paged.full_tokens, paged.swa_tokens) == (72_800, 36_400)
    assert paged.pool_bytes <= 42_272 * 507_904


@pytest.mark.parametrize("ratio", [0, -0.5, float("nan"), float("inf"), "0.8", True, None])
def test_a_bad_ratio_is_refused_naming_the_option_and_value(ratio):
    with pytest.raises(
        ValueError, match=re.escape("option swa_full_tokens_ratio must be a positive finite number")
    ):
        sglang_hybrid_kv_capacity("gpt-oss-20b", 1_500_000_000, swa_full_tokens_ratio=ratio)
    with pytest.raises(ValueError, match=re.escape(f"got {ratio!r}")):
        sglang_hybrid_kv_capacity("gpt-oss-20b", 1_500_000_000, swa_full_tokens_ratio=ratio)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("Nemotron-H-8B-Base-8K", "SGLang keeps no SWA pools for it but a Mamba pool"),
        ("Llama-3.1-8B", "has no sliding-window layers"),
        ("Mistral-7B-v0.1", "has no full-attention layers"),
    ],
)
def test_models_the_two_pools_do_not_fit_are_refused(model, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        sglang_hybrid_kv_capacity(model, 10 * 2**30)


def test_a_run_needs_as_many_full_as_sliding_layers():
    with pytest.raises(ValueError, match="10 full-attention and 52 sliding-window layers"):
        sglang_hybrid_layout("Gemma-3-27B", 20 * 2**30, max_model_len=8192, prefill_tokens=8192)


# -- the SWA pool's frontier, by hand ------------------------------------------------------------------
def groups(full_tokens: int, swa_tokens: int, *, window: int = 4, chunk: int = 4096, page: int = 1):
    spec = PoolSpec(full_tokens + swa_tokens, page, 4096)
    full_pool, swa_pool = (
        SharedBlockPool(full_tokens // page, page),
        SharedBlockPool(swa_tokens // page, page),
    )
    full = FullAttentionGroup(spec, full_pool, chunk)
    swa = SGLangSlidingWindowGroup(spec, swa_pool, chunk, window)
    coordinator = make_coordinator([KVGroup("full", full, 1), KVGroup("sliding", swa, 1)])
    return coordinator, full, swa, full_pool, swa_pool


def test_the_swa_slots_freed_as_the_window_moves():
    """W = 4, page 1, one chunk. Prompt 10: SGLang allocates all 10 in both pools (``alloc``); the
    chunk's eviction (pre_len 0) frees nothing. Decode step 0 (token 11) evicts nothing (0 % 4 != 1);
    step 1 (pre_len 11) frees tokens 0-6: [7, 12) = 5 tokens held; steps 2-4 take one each (8 held
    at 15 tokens); step 5 (5 % 4 == 1, pre_len 15) frees 7-10: [11, 16)."""
    coordinator, full, swa, full_pool, swa_pool = groups(100, 100)
    coordinator.admit(1, prompt(10), 40, 101)
    assert swa.held_blocks(1) == (0, 10) and full.held_blocks(1) == (0, 10)
    assert swa.growth_room(1) == 0  # (page 1: every token takes a slot)
    expected = {11: (0, 11), 12: (7, 12), 13: (7, 13), 14: (7, 14), 15: (7, 15), 16: (11, 16), 17: (11, 17)}
    for tokens, run in expected.items():
        coordinator.grow(1, 1)
        assert swa.held_blocks(1) == run, tokens
        assert full.held_blocks(1) == (0, tokens)
        assert swa_pool.free_blocks == 100 - (run[1] - run[0]) and full_pool.free_blocks == 100 - tokens
    # Step 1 frees 7 and takes 1: the pool gets 6 back in the one growth.
    coordinator.free(1)
    assert swa_pool.free_blocks == full_pool.free_blocks == 100


def test_the_decode_frontier_is_rounded_down_to_a_page():
    """W = 4, pages of 2 tokens, prompt 10 (pages 0-4). Step 1 (12 tokens, pre_len 11) frees before
    11 - 4 = 7, rounded down to the page: pages before token 6 go, [3, 6) held (page 3 still holds
    token 7, which the window needs). Step 5 (16 tokens, pre_len 15): before 11, rounded to 10: [5, 8)."""
    coordinator, _, swa, _, _ = groups(100, 100, window=4, page=2)
    coordinator.admit(1, prompt(10), 40, 101)
    expected = {11: (0, 6), 12: (3, 6), 13: (3, 7), 15: (3, 8), 16: (5, 8)}
    tokens = 10
    for target, run in expected.items():
        coordinator.grow(1, target - tokens)
        tokens = target
        assert swa.held_blocks(1) == run, tokens


def test_a_chunked_prompt_holds_its_chunks_window_then_the_frontier():
    """Prompt 40, W = 8, chunks of 8: the chunk at pre_len k x 8 first frees [.., 8k - 8): held
    8, 16, 16, 16, 16 tokens, so 16 from admission; the last chunk leaves the frontier at 24, where
    the first decoded token's run starts (17 tokens). With the overlap scheduler the chunk at
    pre_len 8k frees only before 8(k - 1) - 8 and not at the first two: 24 held, frontier 16."""
    assert prefill_hold(40, 8, 8, 1, False) == (16, 24)
    assert prefill_hold(40, 8, 8, 1, True) == (24, 16)
    # Pages of 16: frontiers 0, 0, 0, 16, 16 (rounded down), ends 16, 16, 32, 32, 48 (whole pages).
    assert prefill_hold(40, 8, 8, 16, False) == (32, 16)
    coordinator, _, swa, _, swa_pool = groups(100, 100, window=8, chunk=8)
    assert coordinator.can_admit(prompt(40), 60)
    coordinator.admit(1, prompt(40), 60, 101)
    assert swa.held_blocks(1) == (24, 40) and swa_pool.free_blocks == 84
    coordinator.grow(1, 1)
    assert swa.held_blocks(1) == (24, 41)
    coordinator.grow(1, 1)  # step 1: pre_len 41, frontier 33
    assert swa.held_blocks(1) == (33, 42) and swa_pool.free_blocks == 91


def test_a_fork_copies_the_parents_window_and_keeps_its_cadence():
    coordinator, full, swa, _, swa_pool = groups(100, 100)
    coordinator.admit(1, prompt(10), 40, 101)
    coordinator.grow(1, 1)
    coordinator.fork(1, [ChildSpec(2, 40, 102)])
    assert swa.held_blocks(2) == (0, 11) and full.held_blocks(2) == (0, 11)
    coordinator.grow_each([1, 2], [1, 1])
    assert swa.held_blocks(1) == swa.held_blocks(2) == (7, 12)
    assert swa_pool.free_blocks == 100 - 10


# -- admission and growth: both pools or nothing -------------------------------------------------------
@pytest.mark.parametrize(("full_tokens", "swa_tokens"), [(9, 100), (100, 9)])
def test_admission_needs_room_in_both_pools_and_a_refusal_changes_nothing(full_tokens, swa_tokens):
    coordinator, full, swa, full_pool, swa_pool = groups(full_tokens, swa_tokens)
    coordinator.admit(1, prompt(3), 10, 101)
    before = (full_pool.free_blocks, swa_pool.free_blocks, coordinator.breakdown_values())
    assert not coordinator.can_admit(prompt(10), 20)
    with pytest.raises(OutOfKVMemory):
        coordinator.admit(2, prompt(10), 20, 102)
    assert (full_pool.free_blocks, swa_pool.free_blocks, coordinator.breakdown_values()) == before
    assert 2 not in full.sequences and 2 not in swa.sequences


def test_a_growth_either_pool_cannot_hold_changes_nothing():
    coordinator, full, swa, full_pool, swa_pool = groups(100, 12)
    coordinator.admit(1, prompt(12), 40, 101)  # the SWA pool is full
    assert not coordinator.fits_growth([1], 1)
    with pytest.raises(OutOfKVMemory):
        coordinator.grow(1, 1)
    assert swa.held_blocks(1) == full.held_blocks(1) == (0, 12) and full_pool.free_blocks == 88


# -- random operations against SGLang's rule, step by step ----------------------------------------------
class Replay:
    """SGLang's rule replayed token by token: a request's KV length and SWA frontier."""

    def __init__(self, window: int, chunk: int, page: int):
        self.window, self.chunk, self.page = window, chunk, page
        self.state: dict[int, list[int]] = {}  # seq -> [prompt, kv length, frontier]

    def admit(self, seq: int, prompt_len: int) -> None:
        frontier = 0
        for index in range((prompt_len + self.chunk - 1) // self.chunk):  # each chunk's eviction
            frontier = max(frontier, (index * self.chunk - self.window) // self.page * self.page)
        self.state[seq] = [prompt_len, prompt_len, frontier]

    def decode(self, seq: int) -> None:
        state = self.state[seq]
        step = state[1] - state[0]  # (its decode_batch_idx)
        if step % self.window == 1:  # maybe_evict_swa, then alloc
            state[2] = max(state[2], (state[1] - self.window) // self.page * self.page)
        state[1] += 1

    def swa_run(self, seq: int) -> tuple[int, int]:
        _, length, frontier = self.state[seq]
        return frontier // self.page, -(-length // self.page)


@settings(max_examples=150, deadline=None)
@given(
    window=st.integers(1, 12),
    page=st.sampled_from([1, 1, 2, 4]),
    chunk=st.integers(4, 40),
    operations=st.lists(
        st.tuples(
            st.sampled_from(["admit", "grow", "grow", "grow", "free"]), st.integers(0, 5), st.integers(1, 60)
        ),
        max_size=80,
    ),
)
def test_random_operations_keep_both_pools_whole_and_follow_sglangs_rule(window, page, chunk, operations):
    full_tokens, swa_tokens = 160 // page * page, 96 // page * page
    coordinator, full, swa, full_pool, swa_pool = groups(
        full_tokens, swa_tokens, window=window, chunk=chunk, page=page
    )
    replay = Replay(window, chunk, page)
    for operation, seq, length in operations:
        before = (full_pool.free_blocks, swa_pool.free_blocks)
        if operation == "admit" and seq not in replay.state:
            if coordinator.can_admit(prompt(length), length + 30):
                coordinator.admit(seq, prompt(length), length + 30, 100 + seq)
                replay.admit(seq, length)
            else:
                with pytest.raises(OutOfKVMemory):
                    coordinator.admit(seq, prompt(length), length + 30, 100 + seq)
        elif operation == "grow" and seq in replay.state and replay.state[seq][1] < replay.state[seq][0] + 30:
            if coordinator.fits_growth([seq], 1):
                coordinator.grow(seq, 1)
                replay.decode(seq)
            else:
                with pytest.raises(OutOfKVMemory):
                    coordinator.grow(seq, 1)
                assert (full_pool.free_blocks, swa_pool.free_blocks) == before
        elif operation == "free" and seq in replay.state:
            coordinator.free(seq)
            del replay.state[seq]
        # Every pool whole and never negative; every request's tokens held where SGLang holds them.
        assert (
            0 <= full_pool.free_blocks <= full_pool.num_blocks
            and 0 <= swa_pool.free_blocks <= swa_pool.num_blocks
        )
        assert sum(coordinator.breakdown_values()) == coordinator.pool_slots == full_tokens + swa_tokens
        assert all(value >= 0 for value in coordinator.breakdown_values())
        held_full = held_swa = 0
        for sequence, (prompt_len, length, _) in replay.state.items():
            assert full.held_blocks(sequence) == (0, -(-length // page))
            held_full += -(-length // page)
            first, end = swa.held_blocks(sequence)
            if length == prompt_len:  # (from admission to its first decoded token: its chunks' most)
                most, _ = prefill_hold(prompt_len, chunk, window, page, False)
                assert (first, end) == (end - most // page, -(-length // page))
            else:
                assert (first, end) == replay.swa_run(sequence)
            held_swa += end - first
            used = full.breakdown_values()[0]
            assert used >= 0
        assert full_pool.num_blocks - full_pool.free_blocks == held_full
        assert swa_pool.num_blocks - swa_pool.free_blocks == held_swa
        assert full.breakdown_values()[0] == sum(length for _, length, _ in replay.state.values())


# -- end to end ------------------------------------------------------------------------------------------
def config(variants: list[dict], **engine) -> dict:
    """The hybrid runs' experiment (tests/test_hybrid_runs.py) on gpt-oss-20b."""
    return hybrid_config("gpt-oss-20b", variants, **engine)


PAGED = {"name": "paged", "policy": "paged"}
VLLM = {"name": "vllm", "policy": "vllm-hybrid"}
SGLANG = {"name": "sglang", "policy": "sglang-hybrid"}


def test_beside_paged_and_vllm_hybrid_its_two_pools_stay_whole(tmp_path):
    experiment = validate_experiment(config([PAGED, VLLM, SGLANG]))
    results = {
        result.name: result
        for result in run_experiment(experiment, tmp_path / "c.yaml", out_dir=tmp_path / "out")
    }
    summary = results["sglang"].summary
    assert (
        results["sglang"].capacity_lines
        == sglang_hybrid_kv_capacity("gpt-oss-20b", 1_500_000_000).capacity_lines()
    )
    assert summary["kv_groups"] == 2 and summary["block_size"] == 1
    assert summary["kv_pool_tokens"] == 33_907 + 27_125 == summary["num_gpu_blocks"]
    # A slot is 12 layers' K and V, as vllm-hybrid's: half a token of paged's.
    assert summary["kv_bytes_per_token"] == results["vllm"].summary["kv_bytes_per_token"]
    assert summary["kv_bytes_per_token"] * 2 == results["paged"].summary["kv_bytes_per_token"]
    assert summary["requests_finished"] == 120
    # The SWA pool keeps a window (and a prompt until its second step), not every token: more at once.
    assert summary["peak_running"] > results["paged"].summary["peak_running"]
    series = pd.read_parquet(tmp_path / "out" / "sglang" / "timeseries.parquet")
    assert (series[BREAKDOWN].sum(axis=1) == summary["kv_pool_tokens"]).all()
    assert (series[BREAKDOWN] >= 0).all().all()
    # Nothing is shared: the slots its sequences hold are the used, reserved and internal ones, the
    # decoded tokens its pools have not been told of once among them.
    held = series[["used_tokens", "reserved_tokens", "internal_fragmentation_tokens"]].sum(axis=1)
    assert (series["physical_tokens"] == held).all() and (series["logical_tokens"] == held).all()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"variants": [PAGED, {**SGLANG, "options": {"window": 3}}]}, "unknown option(s) 'window'"),
        (
            {"variants": [PAGED, {**SGLANG, "options": {"swa_full_tokens_ratio": -1}}]},
            "variants.1.policy: sglang-hybrid: option swa_full_tokens_ratio must be a positive finite number",
        ),
        ({"model": "Gemma-3-27B"}, "variants.1.policy: sglang-hybrid: Gemma-3-27B has 10 full-attention"),
        ({"engine": {"preemption_mode": "swap"}}, "sglang-hybrid preempts by recompute only"),
    ],
)
def test_what_it_cannot_do_is_refused_before_anything_runs(tmp_path, change, message):
    raw = config([PAGED, SGLANG])
    refused_with(raw, change, message, tmp_path)


def test_padding_pages_of_the_pools_and_tensor_parallel():
    """gpt-oss-20b, 1.5e9 B, pages of 64: max_total_num_tokens 30,517 // 64 x 64 = 30,464 (1,497,366,528 B);
    full int(1,497,366,528 / 44,236.8) = 33,849 -> 33,792, swa int(33,849 x 0.8) = 27,079 -> 27,072.
    SWAKVPool's buffers hold a padding page more per pool: (33,856 + 27,136) x 24,576 B = 1.396 GiB
    ("1.40 GB"; without the full pool's padding page it would read 1.39). At TP 2 a token in one layer
    is 4 KV heads x 64 x (K, V) x 2 B = 1,024 B."""
    capacity = sglang_hybrid_kv_capacity("gpt-oss-20b", 1_500_000_000, page_size=64)
    assert (capacity.max_total_num_tokens, capacity.full_tokens, capacity.swa_tokens) == (
        30_464,
        33_792,
        27_072,
    )
    assert capacity.capacity_lines()[1] == "SWAKVPool mem usage: 1.40 GB, swa size: 27072, full size: 33792"
    assert sglang_hybrid_kv_capacity("gpt-oss-20b", 1_500_000_000, tensor_parallel_size=2).layer_bytes == 1024


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"available_kv_bytes": 0}, "available_kv_bytes must be a positive integer, got 0"),
        ({"page_size": 0}, "option page_size must be a positive integer, got 0"),
        ({"page_size": True}, "option page_size must be a positive integer, got True"),
        ({"page_size": 2.5}, "option page_size must be a positive integer, got 2.5"),
        # pages of 64 and a ratio of 0.001: full 60,864 tokens, swa int(60.9) = 60 -> 0 pages
        (
            {"page_size": 64, "swa_full_tokens_ratio": 0.001},
            "give SGLang's pools 60864 full and 0 SWA tokens (cell size 49,152 B, swa_full_tokens_ratio 0.001): "
            "no request can run. Give the KV cache more memory",
        ),
        # pages of 64, ratio 2, one page of memory (64 x 49,152 B): full int(3,145,728 / 73,728) = 42 -> 0
        # pages, swa 84 -> 64: the full pool gets nothing
        (
            {"available_kv_bytes": 64 * 49_152, "page_size": 64, "swa_full_tokens_ratio": 2},
            "give SGLang's pools 0 full and 64 SWA tokens",
        ),
    ],
)
def test_bad_sizes_are_refused_naming_the_option(changes, message):
    arguments = {"available_kv_bytes": 1_500_000_000} | changes
    with pytest.raises(ValueError, match=re.escape(message)):
        sglang_hybrid_kv_capacity("gpt-oss-20b", **arguments)


def test_chunked_local_and_several_windows_are_refused_with_the_reason():
    from dataclasses import replace

    from sim.hardware.layers import FullAttention, SlidingWindow
    from sim.hardware.models import resolve_model

    with pytest.raises(
        ValueError, match=re.escape("Llama-3.1-8B has no sliding-window layers: SGLang keeps one")
    ):
        sglang_hybrid_kv_capacity("Llama-3.1-8B", 10 * 2**30)
    with pytest.raises(ValueError, match=re.escape("(no SWAKVPool); use policy paged")):
        sglang_hybrid_kv_capacity("Llama-3.1-8B", 10 * 2**30)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "Llama-4-Scout-17B-16E has chunked local attention layers: SGLang's attention_chunk_size "
            "eviction (Llama 4) is not modelled by sglang-hybrid; use policy vllm-hybrid"
        ),
    ):
        sglang_hybrid_kv_capacity("Llama-4-Scout-17B-16E", 10 * 2**30)
    kinds = (FullAttention(), SlidingWindow(128), SlidingWindow(256)) * 8
    two_windows = replace(resolve_model("gpt-oss-20b"), name="two windows", layer_kinds=kinds)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "two windows has sliding windows of [128, 256] tokens: SGLang evicts by one sliding_window_size per model"
        ),
    ):
        sglang_hybrid_kv_capacity(two_windows, 10 * 2**30)


def test_the_smallest_pools_that_run():
    """Two tokens' memory (98,304 B), ratio 2: full int(98,304 / 73,728) = 1, swa int(1 x 2) = 2:
    one full-attention token is enough to run. Ratio 0.5: full int(98,304 / 36,864) = 2, swa 1: one
    sliding-window token is too."""
    capacity = sglang_hybrid_kv_capacity("gpt-oss-20b", 2 * 49_152, swa_full_tokens_ratio=2)
    assert (capacity.full_tokens, capacity.swa_tokens) == (1, 2)
    assert (capacity.available_kv_bytes, capacity.swa_full_tokens_ratio) == (98_304, 2.0)
    half = sglang_hybrid_kv_capacity("gpt-oss-20b", 2 * 49_152, swa_full_tokens_ratio=0.5)
    assert (half.full_tokens, half.swa_tokens) == (2, 1)
