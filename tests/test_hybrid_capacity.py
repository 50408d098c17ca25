"""vLLM's KV pool and start-up lines for hybrid models, worked out by hand step by step.

The steps (sim/hardware/hybrid_capacity.py): page = block x bytes per token of one layer; group
size from the layer counts; num_blocks = available // page // group size; a request's worst case
per group; concurrency = num_blocks / blocks per request; tokens = int(concurrency x L). Unless
said otherwise: 40 GiB = 42,949,672,960 B available, block 16, max_num_batched_tokens 8,192 and
two batches in flight (F = 16,384 tokens), max_model_len the model's context.
"""

from __future__ import annotations

import dataclasses

import pytest

from sim.hardware.hybrid_capacity import vllm_hybrid_kv_capacity
from sim.hardware.layers import FULL_ATTENTION, SlidingWindow
from sim.hardware.models import MODEL_PRESETS

GiB = 2**30
AVAILABLE = 40 * GiB


def test_gpt_oss_20b_two_groups() -> None:
    capacity = vllm_hybrid_kv_capacity("gpt-oss-20b", AVAILABLE)
    # page 16 x 2,048 = 32,768 B; 12 sliding + 12 full: group size 12, two groups.
    assert (capacity.page_bytes, capacity.group_size, len(capacity.groups)) == (32_768, 12, 2)
    # num_blocks = 42,949,672,960 // 32,768 // 12 = 1,310,720 // 12 = 109,226
    assert capacity.num_blocks == 109_226
    # sliding: cdiv(min(128 - 1 + 16,384, 131,072), 16) + 1 = cdiv(16,511, 16) + 1 = 1,032 + 1
    # full: 131,072 / 16 = 8,192
    assert [group.blocks_per_request for group in capacity.groups] == [1_033, 8_192]
    # 109,226 / 9,225 = 11.840...; int(11.840... x 131,072) = 1,551,920
    assert capacity.capacity_lines() == [
        "GPU KV cache size: 1,551,920 tokens",
        "Maximum concurrency for 131,072 tokens per request: 11.84x",
    ]


def test_gpt_oss_120b() -> None:
    capacity = vllm_hybrid_kv_capacity("gpt-oss-120b", AVAILABLE)
    # 18 + 18 layers: group size 18; num_blocks = 1,310,720 // 18 = 72,817; per request 1,033 + 8,192
    assert (capacity.group_size, capacity.num_blocks, capacity.blocks_per_request) == (18, 72_817, 9_225)
    # 72,817 / 9,225 = 7.893...; int(7.893... x 131,072) = 1,034,609
    assert capacity.capacity_lines() == [
        "GPU KV cache size: 1,034,609 tokens",
        "Maximum concurrency for 131,072 tokens per request: 7.89x",
    ]


def test_gemma3_pads_the_sliding_groups() -> None:
    capacity = vllm_hybrid_kv_capacity("Gemma-3-27B", AVAILABLE)
    # 52 sliding, 10 full: 52 >= 1.5 x 10, so group size 10; sliding into cdiv(52, 10) = 6 groups of
    # layers[i::6] (4 of 9 layers, 2 of 8: 8 padding slots), then one full group.
    assert capacity.group_size == 10
    assert [(group.kind, group.layers) for group in capacity.groups] == [(SlidingWindow(1024), 9)] * 4 + [
        (SlidingWindow(1024), 8)
    ] * 2 + [(FULL_ATTENTION, 10)]
    # page 16 x 8,192 = 131,072; num_blocks = 42,949,672,960 // 131,072 // 10 = 327,680 // 10 = 32,768
    assert capacity.num_blocks == 32_768
    # sliding: cdiv(min(1,023 + 16,384, 131,072), 16) + 1 = cdiv(17,407, 16) + 1 = 1,088 + 1 = 1,089
    # per request 6 x 1,089 + 8,192 = 14,726; 32,768 / 14,726 = 2.225...; x 131,072 -> 291,658
    assert capacity.blocks_per_request == 14_726
    assert capacity.capacity_lines() == [
        "GPU KV cache size: 291,658 tokens",
        "Maximum concurrency for 131,072 tokens per request: 2.23x",
    ]


def test_gemma3_hybrid_manager_off_treats_sliding_as_full() -> None:
    # At 32,768 tokens: with the manager, 6 x 1,089 + 32,768 / 16 = 6,534 + 2,048 = 8,582 blocks per
    # request; 32,768 / 8,582 = 3.818...; x 32,768 -> 125,115
    on = vllm_hybrid_kv_capacity("Gemma-3-27B", AVAILABLE, max_model_len=32_768)
    assert on.capacity_lines()[0] == "GPU KV cache size: 125,115 tokens"
    assert on.capacity_lines()[1].endswith("3.82x")
    # Off: one group of all 62 layers as full attention; num_blocks = 327,680 // 62 = 5,285;
    # per request 2,048; 5,285 / 2,048 = 2.58...; x 32,768 = 5,285 x 16 = 84,560
    off = vllm_hybrid_kv_capacity(
        "Gemma-3-27B", AVAILABLE, max_model_len=32_768, hybrid_kv_cache_manager=False
    )
    assert (off.group_size, off.num_blocks, off.groups[0].kind) == (62, 5_285, FULL_ATTENTION)
    assert off.capacity_lines() == [
        "GPU KV cache size: 84,560 tokens",
        "Maximum concurrency for 32,768 tokens per request: 2.58x",
    ]
    # At the full 131,072 tokens the unified pool cannot hold one request: 8,192 blocks of
    # 131,072 x 62 B = 66,571,993,088 B > 40 GiB, and vLLM refuses to start.
    with pytest.raises(ValueError, match="needs 66,571,993,088 bytes of KV cache"):
        vllm_hybrid_kv_capacity("Gemma-3-27B", AVAILABLE, hybrid_kv_cache_manager=False)


def test_llama4_scout_chunked_groups_and_the_old_default() -> None:
    capacity = vllm_hybrid_kv_capacity("Llama-4-Scout-17B-16E", AVAILABLE, max_model_len=131_072)
    # 36 chunked, 12 full: group size 12, 3 chunked groups + 1 full; page 16 x 4,096 = 65,536;
    # num_blocks = 42,949,672,960 // 65,536 // 12 = 655,360 // 12 = 54,613
    assert (capacity.group_size, len(capacity.groups), capacity.num_blocks) == (12, 4, 54_613)
    # chunked: cdiv(min(8,192 + 16,384, 131,072), 16) = 1,536; per request 3 x 1,536 + 8,192 = 12,800
    # 54,613 / 12,800 = 4.266...; x 131,072 -> 559,237
    assert capacity.capacity_lines() == [
        "GPU KV cache size: 559,237 tokens",
        "Maximum concurrency for 131,072 tokens per request: 4.27x",
    ]
    # Before 2026 vLLM turned the hybrid manager off for chunked local attention by default: all 48
    # layers full, num_blocks = 655,360 // 48 = 13,653, 8,192 per request -> 1.67x, 13,653 x 16 tokens.
    off = vllm_hybrid_kv_capacity(
        "Llama-4-Scout-17B-16E", AVAILABLE, max_model_len=131_072, hybrid_kv_cache_manager=False
    )
    assert off.capacity_lines() == [
        "GPU KV cache size: 218,448 tokens",
        "Maximum concurrency for 131,072 tokens per request: 1.67x",
    ]


def test_qwen3_next_block_size_raised_for_the_state() -> None:
    capacity = vllm_hybrid_kv_capacity("Qwen3-Next-80B-A3B", AVAILABLE)
    # attention 2 x 2 x 256 x 2 = 2,048 B per token; state 1,097,728 B per layer;
    # block = 16 x cdiv(1,097,728, 16 x 2,048) = 16 x 34 = 544; page 544 x 2,048 = 1,114,112
    # (the state padded by 16,384 B).
    assert (capacity.block_size, capacity.page_bytes, capacity.mamba_state_bytes) == (
        544,
        1_114_112,
        1_097_728,
    )
    # 36 gdn + 12 full: group size 12, 3 state groups first (layer 0 is gdn), then full.
    assert [group.kind.label for group in capacity.groups] == ["gdn", "gdn", "gdn", "full"]
    # num_blocks = 42,949,672,960 // 1,114,112 // 12 = 38,550 // 12 = 3,212
    # per request: full cdiv(262,144, 544) = 482, one block per state group ("none"): 485
    assert (capacity.num_blocks, capacity.blocks_per_request) == (3_212, 485)
    # 3,212 / 485 = 6.622...; x 262,144 -> 1,736,095
    assert capacity.capacity_lines() == [
        "GPU KV cache size: 1,736,095 tokens",
        "Maximum concurrency for 262,144 tokens per request: 6.62x",
    ]
    # "align" (prefix caching on): two state blocks per group, 482 + 6 = 488; 3,212 / 488 = 6.58
    align = vllm_hybrid_kv_capacity("Qwen3-Next-80B-A3B", AVAILABLE, mamba_cache_mode="align")
    assert (align.block_size, align.blocks_per_request) == (544, 488)
    assert align.capacity_lines()[1].endswith("6.58x")


def test_qwen3_next_against_a_public_vllm_log() -> None:
    # vLLM 0.10.2, Qwen3-Next-80B-A3B-Instruct on 2 x H200, tensor_parallel_size 2, prefix caching
    # off, max_model_len 262,144 (a public start-up log, vllm-project/vllm issue thread):
    #   Setting attention block size to 544 tokens ... Padding mamba page size by 1.49% ...
    #   Available KV cache memory: 44.59 GiB
    #   GPU KV cache size: 973,760 tokens
    #   Maximum concurrency for 262,144 tokens per request: 14.77x
    # Per GPU: 1 KV head, 2 x 1 x 256 x 2 = 1,024 B per token; state 548,864 B (conv 3 x 8,192 / 2,
    # SSM 16 x 128 x 128, bf16); block 16 x cdiv(548,864, 16,384) = 16 x 34 = 544; page 557,056;
    # padding 8,192 / 548,864 = 1.49 %. int(44.59 GiB) = 47,878,147,932 B // 557,056 // 12 = 7,162;
    # that vLLM printed num_blocks // 4 groups x 544 = 1,790 x 544 = 973,760 tokens and
    # 7,162 / (482 + 3) = 14.767 -> 14.77x.
    capacity = vllm_hybrid_kv_capacity(
        "Qwen3-Next-80B-A3B",
        int(44.59 * GiB),
        tensor_parallel_size=2,
        max_concurrent_batches=1,
        tokens_line="blocks",
    )
    assert (capacity.block_size, capacity.page_bytes, capacity.mamba_state_bytes) == (544, 557_056, 548_864)
    assert f"{(capacity.page_bytes - capacity.mamba_state_bytes) / capacity.mamba_state_bytes:.2%}" == "1.49%"
    assert capacity.num_blocks == 7_162
    assert capacity.capacity_lines() == [
        "GPU KV cache size: 973,760 tokens",
        "Maximum concurrency for 262,144 tokens per request: 14.77x",
    ]


def test_nemotron_h_mamba2_groups() -> None:
    capacity = vllm_hybrid_kv_capacity("Nemotron-H-8B-Base-8K", AVAILABLE)
    # attention 2 x 8 x 128 x 2 = 4,096 B per token; state 4,255,744 B (float32 SSM);
    # block = 16 x cdiv(4,255,744, 65,536) = 16 x 65 = 1,040; page 1,040 x 4,096 = 4,259,840.
    assert (capacity.block_size, capacity.page_bytes) == (1_040, 4_259_840)
    # 24 Mamba2 + 4 attention (the 24 MLP blocks keep nothing): group size 4; 6 state groups + 1.
    assert (capacity.group_size, len(capacity.groups)) == (4, 7)
    # num_blocks = 42,949,672,960 // 4,259,840 // 4 = 10,082 // 4 = 2,520;
    # per request cdiv(8,192, 1,040) = 8 + 6 = 14; 2,520 / 14 = 180; 180 x 8,192 = 1,474,560
    assert capacity.capacity_lines() == [
        "GPU KV cache size: 1,474,560 tokens",
        "Maximum concurrency for 8,192 tokens per request: 180.00x",
    ]


def test_nemotron_h_all_mode_aligns_to_the_chunk() -> None:
    # "all" (Mamba prefix caching), chunk size 128: chunk = lcm(128, 16) = 128; the state is
    # 4,255,744 / 4,096 = 1,039 tokens of attention; block = 128 x cdiv(1,039, 128) = 1,152;
    # page 4,718,592; num_blocks = 42,949,672,960 // 4,718,592 // 4 = 9,102 // 4 = 2,275;
    # per request cdiv(8,192, 1,152) = 8 for the full group and for each of the 6 state groups: 56;
    # 2,275 / 56 = 40.625 -> "40.62x"; 40.625 x 8,192 = 332,800
    capacity = vllm_hybrid_kv_capacity(
        "Nemotron-H-8B-Base-8K", AVAILABLE, mamba_cache_mode="all", mamba_chunk_size=128
    )
    assert (capacity.block_size, capacity.num_blocks, capacity.blocks_per_request) == (1_152, 2_275, 56)
    assert capacity.capacity_lines() == [
        "GPU KV cache size: 332,800 tokens",
        "Maximum concurrency for 8,192 tokens per request: 40.62x",
    ]


def test_mistral_all_sliding_is_one_group() -> None:
    capacity = vllm_hybrid_kv_capacity("Mistral-7B-v0.1", AVAILABLE)
    # One SlidingWindowSpec for all 32 layers: num_blocks = 655,360 // 32 = 20,480;
    # per request cdiv(min(4,095 + 16,384, 32,768), 16) + 1 = 1,280 + 1 = 1,281
    assert (capacity.group_size, capacity.num_blocks, capacity.blocks_per_request) == (32, 20_480, 1_281)
    # 20,480 / 1,281 = 15.987...; x 32,768 -> 523,878
    assert capacity.capacity_lines() == [
        "GPU KV cache size: 523,878 tokens",
        "Maximum concurrency for 32,768 tokens per request: 15.99x",
    ]


def test_uniform_model_one_full_group() -> None:
    capacity = vllm_hybrid_kv_capacity("Llama-3.1-8B", AVAILABLE, max_model_len=8_192)
    # 20,480 blocks of 16 tokens; 8,192 / 16 = 512 per request: 40.00x, 40 x 8,192 tokens
    assert capacity.capacity_lines() == [
        "GPU KV cache size: 327,680 tokens",
        "Maximum concurrency for 8,192 tokens per request: 40.00x",
    ]
    assert capacity.pool_bytes == 20_480 * 65_536 * 32 == AVAILABLE


def test_group_size_rises_when_the_counts_are_close() -> None:
    # 12 sliding + 13 full (gpt-oss with one more full layer, an EAGLE drafter's): 13 < 1.5 x 12, so
    # group size 13 (12 sliding layers and one padding slot); num_blocks = 1,310,720 // 13 = 100,824
    base = MODEL_PRESETS["gpt-oss-20b"]
    spec = dataclasses.replace(
        base, num_layers=25, layer_kinds=(SlidingWindow(128), FULL_ATTENTION) * 12 + (FULL_ATTENTION,)
    )
    capacity = vllm_hybrid_kv_capacity(spec, AVAILABLE)
    assert capacity.group_size == 13
    assert [(group.kind, group.layers) for group in capacity.groups] == [
        (SlidingWindow(128), 12),
        (FULL_ATTENTION, 13),
    ]
    assert capacity.num_blocks == 100_824


def test_one_batch_in_flight_shrinks_the_sliding_reservation() -> None:
    # max_concurrent_batches 1: cdiv(min(127 + 8,192, 131,072), 16) + 1 = cdiv(8,319, 16) + 1 = 521
    capacity = vllm_hybrid_kv_capacity("gpt-oss-20b", AVAILABLE, max_concurrent_batches=1)
    assert capacity.groups[0].blocks_per_request == 521


def test_num_gpu_blocks_override() -> None:
    capacity = vllm_hybrid_kv_capacity("gpt-oss-20b", AVAILABLE, num_gpu_blocks_override=9_225)
    # Exactly one request's worth: 1.00x, 131,072 tokens.
    assert capacity.capacity_lines() == [
        "GPU KV cache size: 131,072 tokens",
        "Maximum concurrency for 131,072 tokens per request: 1.00x",
    ]


def test_refusals() -> None:
    with pytest.raises(ValueError, match="refuses to start it with the hybrid KV cache manager disabled"):
        vllm_hybrid_kv_capacity("Qwen3-Next-80B-A3B", AVAILABLE, hybrid_kv_cache_manager=False)
    with pytest.raises(ValueError, match=r"max_model_len \(262,145\) exceeds Qwen3-Next-80B-A3B's"):
        vllm_hybrid_kv_capacity("Qwen3-Next-80B-A3B", AVAILABLE, max_model_len=262_145)
    with pytest.raises(ValueError, match="mamba_cache_mode 'all' needs mamba_chunk_size"):
        vllm_hybrid_kv_capacity("Nemotron-H-8B-Base-8K", AVAILABLE, mamba_cache_mode="all")
    with pytest.raises(ValueError, match="available_kv_bytes must be a positive integer, got 0"):
        vllm_hybrid_kv_capacity("gpt-oss-20b", 0)
    with pytest.raises(ValueError, match="tokens_line must be"):
        vllm_hybrid_kv_capacity("gpt-oss-20b", AVAILABLE, tokens_line="tokens")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mamba_cache_mode must be"):
        vllm_hybrid_kv_capacity("gpt-oss-20b", AVAILABLE, mamba_cache_mode="some")  # type: ignore[arg-type]


def test_layers_are_grouped_by_the_fewest_kind_once_the_most_reach_one_and_a_half_times_it():
    # vLLM's get_kv_cache_groups: the group size is the most layers of a kind when that is under 1.5x
    # the fewest, else the fewest. 10 full and 16 sliding layers (1.6x): groups of 10, the sliding
    # layers split in two groups of 8 (layers[i::2]); 10 and 14 (1.4x): groups of 14, one each.
    from sim.hardware.hybrid_capacity import _group_layers

    sliding = SlidingWindow(128)
    assert _group_layers([FULL_ATTENTION] * 10 + [sliding] * 16) == (
        10,
        [(FULL_ATTENTION, 10), (sliding, 8), (sliding, 8)],
    )
    assert _group_layers([FULL_ATTENTION] * 10 + [sliding] * 14) == (
        14,
        [(FULL_ATTENTION, 10), (sliding, 14)],
    )
    assert _group_layers([FULL_ATTENTION] * 10 + [sliding] * 15) == (
        10,
        [(FULL_ATTENTION, 10), (sliding, 8), (sliding, 7)],
    )
