"""KV pool sizing (vLLM's num_gpu_blocks) and GPU presets.

Every expected number is worked out by hand in the comments.
"""

from __future__ import annotations

import dataclasses

import pytest

from sim.hardware.capacity import (
    MOST_OVERRIDE_BLOCKS,
    KVCapacity,
    ModelDoesNotFitError,
    OverrideTooLargeError,
    estimate_activation_reserve,
    size_kv_pool,
)
from sim.hardware.gpus import GPU_PRESETS, GpuSpec, resolve_gpu
from sim.hardware.models import MODEL_PRESETS

GiB = 2**30
MiB = 2**20

# ------------------------------------------------------------------------------ activation reserve


def test_activation_reserve_llama_3_1_8b_by_hand() -> None:
    # Per token, at the MLP of one layer:
    #   MLP   3 x 14336                 = 43,008  (gate, up, gate*up)
    #   qkv   (32 + 2 x 8) x 128        =  6,144
    #   4 x hidden 4 x 4096             = 16,384
    #                                     65,536 elements x 2 B = 131,072 B
    # x 8192 tokens = 1,073,741,824 B (1 GiB)
    # + sampler logits 256 seqs x 128,256 vocab x 4 B (fp32) = 131,334,144 B
    # = 1,205,075,968 B (1.12 GiB; vLLM's profiler logs 1.20-1.26 GiB for Llama-3-8B)
    assert estimate_activation_reserve("Llama-3.1-8B") == 1_205_075_968


def test_activation_reserve_options() -> None:
    # Only the sampler term left when no tokens are profiled.
    assert estimate_activation_reserve("Llama-3.1-8B", num_tokens=0) == 256 * 128_256 * 4
    # OPT's MLP is ungated: 2 x 20480 + 3 x 5120 (qkv) + 4 x 5120 = 76,800 elements x 2 B.
    assert estimate_activation_reserve("OPT-13B", num_seqs=0) == 8192 * 76_800 * 2
    with pytest.raises(ValueError, match="num_tokens"):
        estimate_activation_reserve("OPT-13B", num_tokens=-1)


# ------------------------------------------------------------------------------ worked examples


def test_llama_3_1_8b_on_a100_80gb() -> None:
    # A100-80GB: 80 GiB = 85,899,345,920 B.
    #   x 0.9                                  = 77,309,411,328 B  (budget)
    #   - weights 8,030,261,248 x 2 B           = 16,060,522,496 B  (14.96 GiB)
    #   - activation reserve (test above)       =  1,205,075,968 B
    #   = available                             = 60,043,812,864 B  (55.92 GiB)
    # block = 16 tokens x 131,072 B = 2,097,152 B (2 MiB)
    #   60,043,812,864 // 2,097,152 = 28,631 blocks (28,631 x 2 MiB = 60,043,558,912; 253,952 B left)
    # tokens = 28,631 x 16 = 458,096
    # concurrency at 8,192 tokens: 28,631 / (8192 / 16 = 512) = 55.92x
    cap = size_kv_pool(MODEL_PRESETS["Llama-3.1-8B"], GPU_PRESETS["A100-80GB"])
    assert cap == KVCapacity(
        kv_bytes_per_token=131_072,
        block_size=16,
        num_gpu_blocks=28_631,
        kv_pool_bytes=60_043_558_912,
        available_kv_bytes=60_043_812_864,
        weight_bytes=16_060_522_496,
        activation_reserve_bytes=1_205_075_968,
        source="gpu_memory_utilization",
    )
    assert cap.kv_pool_tokens == 458_096
    assert cap.block_bytes == 2 * MiB
    assert cap.max_concurrency(8192) == pytest.approx(28_631 / 512)
    assert cap.capacity_lines(8192) == [
        "GPU KV cache size: 458,096 tokens",
        "Maximum concurrency for 8,192 tokens per request: 55.92x",
    ]
    # Same by name; names resolve case-insensitively.
    assert size_kv_pool("meta-llama/Llama-3.1-8B", "a100-80gb") == cap


def test_opt_13b_on_a100_40gb_the_vllm_paper_setup() -> None:
    # A100-40GB: 40 GiB = 42,949,672,960 B.
    #   x 0.9                                  = 38,654,705,664 B
    #   - weights 12,853,473,280 x 2 B          = 25,706,946,560 B  (23.94 GiB; paper: "26GB, 65%")
    #   - reserve: 8192 x (2 x 20480 + 3 x 5120 + 4 x 5120 = 76,800) x 2 B = 1,258,291,200
    #              + 256 x 50,272 x 4 B = 51,478,528                  -> 1,309,769,728 B
    #   = available                             = 11,637,989,376 B  (10.84 GiB)
    # block = 16 x 819,200 B = 13,107,200 B (12.5 MiB)
    #   11,637,989,376 // 13,107,200 = 887 blocks (887 x 13,107,200 = 11,626,086,400)
    # tokens = 887 x 16 = 14,192; at OPT's 2,048-token limit: 887 / 128 = 6.93x
    cap = size_kv_pool("OPT-13B", "A100-40GB")
    assert cap.activation_reserve_bytes == 1_309_769_728
    assert cap.available_kv_bytes == 11_637_989_376
    assert cap.num_gpu_blocks == 887
    assert cap.kv_pool_bytes == 11_626_086_400
    assert cap.capacity_lines(2048) == [
        "GPU KV cache size: 14,192 tokens",
        "Maximum concurrency for 2,048 tokens per request: 6.93x",
    ]


def test_fp8_kv_doubles_the_blocks() -> None:
    # Llama-3.1-8B on A100-80GB as above, fp8 KV: block = 16 x 65,536 = 1 MiB;
    # 60,043,812,864 // 1,048,576 = 57,262 blocks.
    cap = size_kv_pool("Llama-3.1-8B", "A100-80GB", kv_cache_dtype="fp8")
    assert cap.kv_bytes_per_token == 65_536
    assert cap.num_gpu_blocks == 57_262


def test_block_size_changes_rounding_only() -> None:
    # block 32: 4 MiB blocks; 60,043,812,864 // 4,194,304 = 14,315 blocks = 458,080 tokens.
    cap = size_kv_pool("Llama-3.1-8B", "A100-80GB", block_size=32)
    assert cap.num_gpu_blocks == 14_315
    assert cap.kv_pool_tokens == 458_080
    # 1000-token requests need ceil(1000 / 32) = 32 blocks: 14,315 / 32 = 447.34
    assert cap.max_concurrency(1000) == pytest.approx(14_315 / 32)


def test_tensor_parallel_llama_3_1_70b_on_4_h100() -> None:
    # Per GPU, tp 4:
    #   budget 80 GiB x 0.9                     = 77,309,411,328 B
    #   weights 70,553,706,496 x 2 / 4          = 35,276,853,248 B
    #   reserve: MLP 3 x 28672/4 = 21,504; qkv (64/4 + 2 x 8/4) x 128 = 2,560; 4 x 8192 = 32,768
    #            -> 56,832 x 2 B x 8192 = 931,135,488 + logits 131,334,144 = 1,062,469,632 B
    #   available                               = 40,970,088,448 B
    #   KV per token per GPU: 2 x 80 x (8/4 = 2) x 128 x 2 = 81,920 B; block 1,310,720 B
    #   40,970,088,448 // 1,310,720 = 31,257 blocks -> 500,112 tokens; 31,257 / 512 = 61.05x
    cap = size_kv_pool("Llama-3.1-70B", "H100-80GB", tensor_parallel_size=4)
    assert cap.kv_bytes_per_token == 81_920
    assert cap.weight_bytes == 35_276_853_248
    assert cap.activation_reserve_bytes == 1_062_469_632
    assert cap.num_gpu_blocks == 31_257
    assert cap.capacity_lines(8192)[1] == "Maximum concurrency for 8,192 tokens per request: 61.05x"


def test_deepseek_v3_needs_its_fp8_weights_on_8_h200() -> None:
    # bf16 weights: 671,026,419,200 x 2 / 8 = 167,756,604,800 B = 156.24 GiB per GPU > 126.90 GiB.
    with pytest.raises(ModelDoesNotFitError, match="weights 156.24 GiB"):
        size_kv_pool("DeepSeek-V3", "H200-141GB", tensor_parallel_size=8)
    # The official FP8 checkpoint: 1 B/param, KV stays bf16 (vLLM's "auto" = the bf16 model dtype).
    # Per GPU: budget ceil(141 GiB x 0.9) = ceil(136,257,837,465.6) = 136,257,837,466 B;
    # weights 671,026,419,200 x 1 B / 8 = 83,878,302,400 B;
    # the MLA latent is replicated: (512 + 64) x 61 layers x 2 B = 70,272 B/token, block 1,124,352 B.
    # Activation reserve from the published shapes (hidden 7168, intermediate 18432, 128 heads of
    # 192, vocab 129,280), per GPU at tp 8, activations at 2 B (fp8 weights still compute in bf16):
    #   MLP 3 x 18432 / 8 = 6,912; qkv (128/8 + 2 x 128/8) x 192 = 9,216; 4 x 7168 = 28,672
    #   -> 44,800 elements x 2 B x 8192 tokens = 734,003,200 B
    #   + sampler logits 256 x 129,280 x 4 B = 132,382,720 B  -> 866,385,920 B
    # available = 136,257,837,466 - 83,878,302,400 - 866,385,920 = 51,513,149,146 B
    #   // 1,124,352 = 45,815 blocks (45,815 x 1,124,352 = 51,512,186,880 B).
    fp8 = dataclasses.replace(MODEL_PRESETS["DeepSeek-V3"], weight_dtype_bytes=1)
    cap = size_kv_pool(fp8, "H200-141GB", tensor_parallel_size=8, kv_cache_dtype="bf16")
    assert cap == KVCapacity(
        kv_bytes_per_token=70_272,
        block_size=16,
        num_gpu_blocks=45_815,
        kv_pool_bytes=51_512_186_880,
        available_kv_bytes=51_513_149_146,
        weight_bytes=83_878_302_400,
        activation_reserve_bytes=866_385_920,
        source="gpu_memory_utilization",
        tensor_parallel_size=8,
    )


# ----------------------------------------------------------------------------- other sources


def test_kv_cache_memory_bytes() -> None:
    # 10 GiB of KV at 2 MiB per block = 5,120 blocks, whatever the utilisation.
    cap = size_kv_pool(
        "Llama-3.1-8B", "A100-80GB", kv_cache_memory_bytes=10 * GiB, gpu_memory_utilization=0.5
    )
    assert cap.source == "kv_cache_memory_bytes"
    assert cap.num_gpu_blocks == 5_120
    assert cap.available_kv_bytes == cap.kv_pool_bytes == 10 * GiB
    # 14.96 GiB weights + 1.12 GiB reserve + 70 GiB > 80 GiB.
    with pytest.raises(ModelDoesNotFitError, match="kv_cache_memory_bytes=70.00 GiB"):
        size_kv_pool("Llama-3.1-8B", "A100-80GB", kv_cache_memory_bytes=70 * GiB)
    with pytest.raises(ValueError, match="smaller than one KV block"):
        size_kv_pool("Llama-3.1-8B", "A100-80GB", kv_cache_memory_bytes=MiB)


def test_num_gpu_blocks_override() -> None:
    cap = size_kv_pool("Llama-3.1-8B", "A100-80GB", num_gpu_blocks_override=100)
    assert cap.source == "num_gpu_blocks_override"
    assert cap.num_gpu_blocks == 100
    assert cap.kv_pool_bytes == cap.available_kv_bytes == 100 * 2 * MiB
    assert cap.kv_pool_tokens == 1_600
    # The model must still load.
    with pytest.raises(ModelDoesNotFitError):
        size_kv_pool("Llama-2-70B", "T4-16GB", num_gpu_blocks_override=100)
    with pytest.raises(ValueError, match="at most one"):
        size_kv_pool("Llama-3.1-8B", "A100-80GB", num_gpu_blocks_override=100, kv_cache_memory_bytes=GiB)


def test_explicit_activation_reserve() -> None:
    # Reserve 0: available = 77,309,411,328 - 16,060,522,496 = 61,248,888,832 -> 29,205 blocks.
    cap = size_kv_pool("Llama-3.1-8B", "A100-80GB", activation_reserve_bytes=0)
    assert cap.activation_reserve_bytes == 0
    assert cap.num_gpu_blocks == 61_248_888_832 // (2 * MiB) == 29_205


def test_custom_gpu_dict_and_utilization() -> None:
    # A 48 GiB card at 0.8: budget 51,539,607,552 x 0.8 = 41,231,686,042 (ceil of ...041.6);
    # - 16,060,522,496 - 1,205,075,968 = 23,966,087,578 -> // 2,097,152 = 11,427 blocks
    # (11,427 x 2 MiB = 23,964,155,904; 1,931,674 B left over).
    gpu = {"name": "L40S", "memory_gib": 48, "hbm_bandwidth_gb_per_s": 864, "fp16_tflops": 362}
    cap = size_kv_pool("Llama-3.1-8B", gpu, gpu_memory_utilization=0.8)
    assert cap.available_kv_bytes == 23_966_087_578
    assert cap.num_gpu_blocks == 11_427


# ------------------------------------------------------------------------------ does not fit


# Llama-3.1-8B: weights 8,030,261,248 x 2 B = 16,060,522,496 B; default reserve 1,205,075,968 B
# (test_activation_reserve_llama_3_1_8b_by_hand); together 17,265,598,464 B.
LLAMA_8B_WEIGHTS = 16_060_522_496
LLAMA_8B_RESERVE = 1_205_075_968
# Llama-2-70B (hidden 8192, intermediate 28672, 64 heads, 8 KV heads of 128, vocab 32000):
# (3 x 28672 + (64 + 2 x 8) x 128 + 4 x 8192 = 129,024) x 2 B x 8192 + 256 x 32,000 x 4 B
# = 2,113,929,216 + 32,768,000 = 2,146,697,216 B.
LLAMA_2_70B_RESERVE = 2_146_697_216


def card(memory_bytes: int) -> dict[str, object]:
    return {"name": "card", "memory_bytes": memory_bytes, "hbm_bandwidth_gb_per_s": 1000, "fp16_tflops": 100}


def test_num_gpu_blocks_override_still_needs_room_for_the_activation_reserve() -> None:
    # Utilisation 1.0: the budget is the card. Weights + reserve = 17,265,598,464 B exactly: loads.
    fits = size_kv_pool(
        "Llama-3.1-8B",
        card(LLAMA_8B_WEIGHTS + LLAMA_8B_RESERVE),
        gpu_memory_utilization=1.0,
        num_gpu_blocks_override=100,
    )
    assert (fits.num_gpu_blocks, fits.kv_pool_bytes) == (100, 100 * 2 * MiB)
    # One byte less: the weights fit (16.06 GB < 17.27 GB) but weights + reserve do not.
    with pytest.raises(ModelDoesNotFitError, match="less than one KV block") as info:
        size_kv_pool(
            "Llama-3.1-8B",
            card(LLAMA_8B_WEIGHTS + LLAMA_8B_RESERVE - 1),
            gpu_memory_utilization=1.0,
            num_gpu_blocks_override=100,
        )
    err = info.value
    assert (err.budget_bytes, err.weight_bytes) == (LLAMA_8B_WEIGHTS + LLAMA_8B_RESERVE - 1, LLAMA_8B_WEIGHTS)
    assert (err.activation_reserve_bytes, err.left_bytes) == (LLAMA_8B_RESERVE, -1)
    # The utilisation budget applies: 2 x (weights + reserve) at 0.5 is exactly enough, 2 bytes less
    # (budget ceil(... - 1) = weights + reserve - 1) is not.
    twice = 2 * (LLAMA_8B_WEIGHTS + LLAMA_8B_RESERVE)
    assert (
        size_kv_pool(
            "Llama-3.1-8B", card(twice), gpu_memory_utilization=0.5, num_gpu_blocks_override=7
        ).num_gpu_blocks
        == 7
    )
    with pytest.raises(ModelDoesNotFitError):
        size_kv_pool("Llama-3.1-8B", card(twice - 2), gpu_memory_utilization=0.5, num_gpu_blocks_override=7)
    # An explicit reserve is the one checked: 1 GiB more than the card minus the weights fails,
    # exactly the card minus the weights loads.
    with pytest.raises(ModelDoesNotFitError):
        size_kv_pool(
            "Llama-3.1-8B",
            card(LLAMA_8B_WEIGHTS + GiB),
            gpu_memory_utilization=1.0,
            activation_reserve_bytes=GiB + 1,
            num_gpu_blocks_override=1,
        )
    exact = size_kv_pool(
        "Llama-3.1-8B",
        card(LLAMA_8B_WEIGHTS + GiB),
        gpu_memory_utilization=1.0,
        activation_reserve_bytes=GiB,
        num_gpu_blocks_override=1,
    )
    assert exact.activation_reserve_bytes == GiB


def test_num_gpu_blocks_override_may_pass_the_gpu_up_to_what_kvsim_builds() -> None:
    """A what-if pool larger than the GPU (A100-80GB's 80 GiB hold 40,960 blocks of Llama-3.1-8B's
    16 x 128 KiB) is built as asked, up to 2**26 blocks."""
    what_if = size_kv_pool("Llama-3.1-8B", "A100-80GB", num_gpu_blocks_override=40_961)
    assert what_if.num_gpu_blocks == 40_961 and what_if.kv_pool_bytes == 80 * GiB + 2 * MiB
    most = size_kv_pool("Llama-3.1-8B", "A100-80GB", num_gpu_blocks_override=2**26)
    assert most.num_gpu_blocks == MOST_OVERRIDE_BLOCKS == 67_108_864
    with pytest.raises(OverrideTooLargeError) as error:
        size_kv_pool("Llama-3.1-8B", "A100-80GB", num_gpu_blocks_override=2**26 + 1)
    assert str(error.value) == (
        "num_gpu_blocks_override: 67,108,865 blocks are more than kvsim builds a pool of (67,108,864 "
        "blocks; Llama-3.1-8B on A100-80GB holds 40,960 blocks of 2,097,152 bytes in all its memory)"
    )
    with pytest.raises(OverrideTooLargeError):  # (was an OverflowError building the pool)
        size_kv_pool("Llama-3.1-8B", "A100-80GB", num_gpu_blocks_override=2**63)


def test_num_gpu_blocks_override_weights_alone_too_big() -> None:
    # T4: budget ceil(16 GiB x 0.9) = 15,461,882,266 B < Llama-2-70B's 137,953,296,384 B of weights.
    with pytest.raises(ModelDoesNotFitError, match="the weights alone exceed it") as info:
        size_kv_pool("Llama-2-70B", "T4-16GB", num_gpu_blocks_override=100)
    assert info.value.budget_bytes == 15_461_882_266
    assert info.value.weight_bytes == 137_953_296_384


def test_kv_cache_memory_bytes_must_fit_the_whole_card() -> None:
    # kv_cache_memory_bytes is checked against the card's whole memory (not the utilisation budget):
    # card = weights + reserve + 10 MiB holds a 10 MiB cache (5 blocks of 2 MiB) and not a byte more.
    memory = LLAMA_8B_WEIGHTS + LLAMA_8B_RESERVE + 10 * MiB
    cap = size_kv_pool(
        "Llama-3.1-8B", card(memory), gpu_memory_utilization=0.5, kv_cache_memory_bytes=10 * MiB
    )
    assert (cap.num_gpu_blocks, cap.available_kv_bytes, cap.source) == (5, 10 * MiB, "kv_cache_memory_bytes")
    with pytest.raises(ModelDoesNotFitError, match="less than one KV block") as info:
        size_kv_pool("Llama-3.1-8B", card(memory), kv_cache_memory_bytes=10 * MiB + 1)
    err = info.value
    # Reported: the card, and what it leaves for the cache after weights and reserve (10 MiB).
    assert (err.budget_bytes, err.left_bytes) == (memory, 10 * MiB)
    # A cache of exactly one block (2 MiB) is accepted; one byte less is an argument error.
    assert size_kv_pool("Llama-3.1-8B", "A100-80GB", kv_cache_memory_bytes=2 * MiB).num_gpu_blocks == 1
    with pytest.raises(ValueError, match="smaller than one KV block"):
        size_kv_pool("Llama-3.1-8B", "A100-80GB", kv_cache_memory_bytes=2 * MiB - 1)


def test_kv_cache_memory_bytes_weights_alone_too_big() -> None:
    with pytest.raises(ModelDoesNotFitError, match="the weights alone exceed it") as info:
        size_kv_pool("Llama-2-70B", "T4-16GB", kv_cache_memory_bytes=GiB)
    # The whole card (16 GiB), minus weights and the estimated reserve, is what is left.
    assert info.value.budget_bytes == 17_179_869_184
    assert info.value.activation_reserve_bytes == LLAMA_2_70B_RESERVE
    assert info.value.left_bytes == 17_179_869_184 - 137_953_296_384 - LLAMA_2_70B_RESERVE


def test_llama_2_70b_does_not_fit_on_a_t4() -> None:
    # 16 GiB x 0.9 = 14.40 GiB budget; weights 68,976,648,192 x 2 B = 137,953,296,384 B = 128.48 GiB.
    with pytest.raises(ModelDoesNotFitError) as info:
        size_kv_pool("Llama-2-70B", "T4-16GB")
    err = info.value
    assert isinstance(err, ValueError)
    message = str(err)
    for piece in (
        "Llama-2-70B on T4-16GB",
        "16.00 GiB",
        "0.9",
        "14.40 GiB",
        "weights 128.48 GiB",
        "activation reserve",
        "the weights alone exceed it",
    ):
        assert piece in message
    assert err.weight_bytes == 137_953_296_384
    assert err.budget_bytes == 15_461_882_266  # ceil(17,179,869,184 x 0.9)
    assert err.activation_reserve_bytes == LLAMA_2_70B_RESERVE
    assert err.left_bytes == 15_461_882_266 - 137_953_296_384 - LLAMA_2_70B_RESERVE


def test_less_than_one_block_left_does_not_fit() -> None:
    # L4: 24 GiB = 25,769,803,776 B; x 0.9 = 23,192,823,398.4 -> 23,192,823,399 B.
    # - weights 16,060,522,496 = 7,132,300,903 B; a reserve 1 B short of that leaves 1 B < 2 MiB.
    with pytest.raises(ModelDoesNotFitError, match="less than one KV block"):
        size_kv_pool("Llama-3.1-8B", "L4-24GB", activation_reserve_bytes=7_132_300_902)
    # With exactly one block left it fits.
    cap = size_kv_pool("Llama-3.1-8B", "L4-24GB", activation_reserve_bytes=7_132_300_903 - 2 * MiB)
    assert cap.num_gpu_blocks == 1


# -------------------------------------------------------------------------------- validation


@pytest.mark.parametrize("util", [0, 0.0, -0.1, 1.01, True, "0.9"])
def test_gpu_memory_utilization_must_be_in_0_1(util: object) -> None:
    with pytest.raises(ValueError, match=r"gpu_memory_utilization must be in \(0, 1\]"):
        size_kv_pool("Llama-3.1-8B", "A100-80GB", gpu_memory_utilization=util)  # type: ignore[arg-type]


def test_gpu_memory_utilization_of_one_is_allowed() -> None:
    # 85,899,345,920 - 16,060,522,496 - 1,205,075,968 = 68,633,747,456 -> // 2 MiB = 32,727 blocks.
    assert size_kv_pool("Llama-3.1-8B", "A100-80GB", gpu_memory_utilization=1.0).num_gpu_blocks == 32_727


@pytest.mark.parametrize("block_size", [0, -16, 16.0, True])
def test_block_size_must_be_positive_int(block_size: object) -> None:
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        size_kv_pool("Llama-3.1-8B", "A100-80GB", block_size=block_size)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"activation_reserve_bytes": -1}, "activation_reserve_bytes"),
        ({"kv_cache_memory_bytes": 0}, "kv_cache_memory_bytes"),
        ({"num_gpu_blocks_override": 0}, "num_gpu_blocks_override"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        (
            {"tensor_parallel_size": 3},
            r"Total number of attention heads \(32\) must be divisible by tensor parallel size \(3\)\.",
        ),
        ({"kv_cache_dtype": "int4"}, "unknown kv_cache_dtype"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        size_kv_pool("Llama-3.1-8B", "A100-80GB", **kwargs)  # type: ignore[arg-type]


def test_kv_heads_and_tp_must_divide() -> None:
    # Qwen2.5-7B: 28 heads divide by 7, but 4 KV heads and tp 7 do not divide one another.
    with pytest.raises(ValueError, match="num_kv_heads \\(4\\) and tensor_parallel_size \\(7\\)"):
        size_kv_pool("Qwen2.5-7B", "A100-80GB", tensor_parallel_size=7)


def test_max_concurrency_validates() -> None:
    cap = size_kv_pool("Llama-3.1-8B", "A100-80GB")
    with pytest.raises(ValueError, match="tokens_per_request"):
        cap.max_concurrency(0)


# ------------------------------------------------------------------------------------- GPUs


def test_gpu_preset_memory_is_binary_gib() -> None:
    assert GPU_PRESETS["A100-80GB"].memory_bytes == 85_899_345_920  # 80 x 2**30
    assert GPU_PRESETS["H100-80GB"].memory_bytes == 85_899_345_920
    assert GPU_PRESETS["H200-141GB"].memory_bytes == 141 * GiB == 151_397_597_184
    assert GPU_PRESETS["A100-40GB"].memory_bytes == 42_949_672_960
    assert GPU_PRESETS["T4-16GB"].memory_bytes == 17_179_869_184
    for name in ("A10G-24GB", "L4-24GB", "RTX-4090-24GB"):
        assert GPU_PRESETS[name].memory_bytes == 24 * GiB


def test_gpu_preset_datasheet_rates() -> None:
    h100 = GPU_PRESETS["H100-80GB"]
    assert h100.hbm_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert h100.fp16_flops == pytest.approx(989.4e12)  # dense; 1,979 with sparsity
    assert GPU_PRESETS["A100-80GB"].hbm_bandwidth_bytes_per_s == pytest.approx(2.039e12)
    assert GPU_PRESETS["H200-141GB"].hbm_bandwidth_bytes_per_s == pytest.approx(4.8e12)
    assert GPU_PRESETS["L4-24GB"].fp16_flops == pytest.approx(121e12)
    for key, spec in GPU_PRESETS.items():
        assert spec.name == key


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("A100-80GB", "A100-80GB"),
        ("a100-80gb", "A100-80GB"),
        ("A100_80GB", "A100-80GB"),
        ("h100", "H100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("H200", "H200-141GB"),
        ("nvidia-h200-141gb", "H200-141GB"),
        ("T4", "T4-16GB"),
        ("a10g", "A10G-24GB"),
        ("L4", "L4-24GB"),
        ("rtx-4090", "RTX-4090-24GB"),
        ("A100-40GB", "A100-40GB"),
    ],
)
def test_resolve_gpu_names(given: str, expected: str) -> None:
    assert resolve_gpu(given) is GPU_PRESETS[expected]


def test_resolve_gpu_unknown_and_ambiguous() -> None:
    with pytest.raises(ValueError, match="A100 comes as A100-40GB and A100-80GB"):
        resolve_gpu("A100")
    with pytest.raises(ValueError, match="unknown GPU 'B300'"):
        resolve_gpu("B300")


def test_resolve_gpu_custom() -> None:
    gpu = resolve_gpu(
        {"name": "H100-PCIe", "memory_gib": 80, "hbm_bandwidth_tb_per_s": 2.0, "fp16_tflops": 756}
    )
    assert gpu == GpuSpec("H100-PCIe", 80 * GiB, 2.0e12, 756e12)
    decimal = resolve_gpu({"memory_gb": 24, "hbm_bandwidth_bytes_per_s": 1e12, "fp16_flops": 1e14})
    assert decimal.memory_bytes == 24_000_000_000
    assert decimal.name == "custom"
    # Start from a preset and change only the memory (e.g. to the CUDA-visible total).
    visible = resolve_gpu({"base": "h100", "memory_gib": 79.25})
    assert visible.memory_bytes == int(79.25 * GiB)
    assert visible.fp16_flops == GPU_PRESETS["H100-80GB"].fp16_flops
    assert visible.name == "H100-80GB-custom"
    assert resolve_gpu(visible) is visible


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"memory_gib": 80}, "missing one of hbm_bandwidth"),
        ({"memory_gib": 80, "memory_bytes": 1, "base": "T4"}, "give the memory once"),
        ({"base": "T4", "hbm_bandwidth_gbps": 300}, "unknown key"),
        ({"base": "T4", "memory_gib": 0}, "memory_gib must be a positive, finite number"),
        ({"base": "T4", "memory_gib": "16"}, "memory_gib must be a positive, finite number"),
        ({"base": "T4", "memory_gib": float("inf")}, "memory_gib must be a positive, finite number"),
        ({"base": 4}, "base must be a preset name"),
    ],
)
def test_resolve_gpu_custom_errors(spec: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve_gpu(spec)


# ------------------------------------------------------------------------- messages and limits

ADVICE = (
    "Use a bigger GPU, a larger tensor_parallel_size, a higher gpu_memory_utilization or "
    "smaller weights (weight_dtype_bytes)."
)


def test_does_not_fit_messages_in_full() -> None:
    # Override path: a card of exactly the weights (16,060,522,496 B = 14.96 GiB) at utilisation 1:
    # the weights fit (not "alone exceed"), the reserve (1.12 GiB) does not: -1,205,075,968 B left.
    with pytest.raises(ModelDoesNotFitError) as info:
        size_kv_pool(
            "Llama-3.1-8B", card(LLAMA_8B_WEIGHTS), gpu_memory_utilization=1.0, num_gpu_blocks_override=1
        )
    assert str(info.value) == (
        "Llama-3.1-8B on card does not fit: GPU memory 14.96 GiB x gpu_memory_utilization 1 = 14.96 GiB; "
        "weights 14.96 GiB (8,030,261,248 params x 2 B / tp 1); activation reserve 1.12 GiB; "
        "left before the KV cache: -1.12 GiB (-1,205,075,968 bytes): less than one KV block "
        f"(2,097,152 bytes) is left. {ADVICE}"
    )
    assert info.value.memory_bytes == LLAMA_8B_WEIGHTS
    # kv_cache_memory_bytes path, tp 2: 68,976,648,192 x 2 B / 2 = 68,976,648,192 B = 64.24 GiB per
    # GPU on a 16 GiB card. Reserve at tp 2: (3 x 28672/2 + (64/2 + 2 x 8/2) x 128 + 4 x 8192 = 80,896)
    # x 2 x 8192 + 256 x 32,000 x 4 = 1,325,400,064 + 32,768,000 = 1,358,168,064 B (1.26 GiB);
    # left: 17,179,869,184 - 68,976,648,192 - 1,358,168,064 = -53,154,947,072 B (-49.50 GiB).
    with pytest.raises(ModelDoesNotFitError) as info:
        size_kv_pool("Llama-2-70B", "T4-16GB", kv_cache_memory_bytes=GiB, tensor_parallel_size=2)
    assert str(info.value) == (
        "Llama-2-70B on T4-16GB (tensor_parallel_size=2, per GPU) does not fit: GPU memory 16.00 GiB = "
        "16.00 GiB; weights 64.24 GiB (68,976,648,192 params x 2 B / tp 2); activation reserve 1.26 GiB; "
        "left for kv_cache_memory_bytes=1.00 GiB: -49.50 GiB (-53,154,947,072 bytes): the weights alone "
        f"exceed it. {ADVICE}"
    )
    # Utilisation path: L4, 24 GiB x 0.9 = 23,192,823,399 B (21.60 GiB); a reserve of 7,132,300,902 B
    # (6.64 GiB) leaves 1 byte.
    with pytest.raises(ModelDoesNotFitError) as info:
        size_kv_pool("Llama-3.1-8B", "L4-24GB", activation_reserve_bytes=7_132_300_902)
    assert str(info.value) == (
        "Llama-3.1-8B on L4-24GB does not fit: GPU memory 24.00 GiB x gpu_memory_utilization 0.9 = 21.60 GiB; "
        "weights 14.96 GiB (8,030,261,248 params x 2 B / tp 1); activation reserve 6.64 GiB; "
        f"left for the KV cache: 0.00 GiB (1 bytes): less than one KV block (2,097,152 bytes) is left. {ADVICE}"
    )


def test_kv_cache_memory_bytes_rounds_down_to_whole_blocks() -> None:
    # 5 MiB of cache at 2 MiB per block: 2 whole blocks (4 MiB), 1 MiB unused.
    cap = size_kv_pool("Llama-3.1-8B", "A100-80GB", kv_cache_memory_bytes=5 * MiB)
    assert (cap.num_gpu_blocks, cap.kv_pool_bytes, cap.available_kv_bytes) == (2, 4 * MiB, 5 * MiB)
    assert isinstance(cap.num_gpu_blocks, int)


def test_argument_limits_are_inclusive_and_booleans_are_refused() -> None:
    # Smallest valid values: block_size 1, one block of override, tp 1.
    assert size_kv_pool("Llama-3.1-8B", "A100-80GB", block_size=1).block_size == 1
    cap = size_kv_pool("Llama-3.1-8B", "A100-80GB", kv_cache_memory_bytes=2 * MiB)
    assert cap.max_concurrency(1) == 1.0  # 1 block / ceil(1 / 16) = 1
    for bad in (0, True):
        with pytest.raises(ValueError, match="tokens_per_request must be a positive integer"):
            cap.max_concurrency(bad)
    for key, bad in (
        ("activation_reserve_bytes", True),
        ("kv_cache_memory_bytes", True),
        ("num_gpu_blocks_override", True),
        ("tensor_parallel_size", True),
    ):
        with pytest.raises(ValueError, match=key):
            size_kv_pool("Llama-3.1-8B", "A100-80GB", **{key: bad})
    with pytest.raises(
        ValueError, match="^set at most one of kv_cache_memory_bytes and num_gpu_blocks_override$"
    ):
        size_kv_pool("Llama-3.1-8B", "A100-80GB", num_gpu_blocks_override=1, kv_cache_memory_bytes=GiB)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_tokens": -1}, "num_tokens must be an integer >= 0, got -1"),
        ({"num_tokens": True}, "num_tokens must be an integer >= 0, got True"),
        ({"num_seqs": -1}, "num_seqs must be an integer >= 0, got -1"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size must be an integer >= 1, got 0"),
    ],
)
def test_activation_reserve_argument_messages(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError) as error:
        estimate_activation_reserve("Llama-3.1-8B", **kwargs)
    assert str(error.value) == message


def test_activation_reserve_with_one_kv_head_per_gpu() -> None:
    # Llama-3.1-70B at tp 8: 8 KV heads / 8 = 1 per GPU.
    #   MLP 3 x 28672 / 8 = 10,752; qkv (64/8 + 2 x 1) x 128 = 1,280; 4 x 8192 = 32,768
    #   -> 44,800 x 2 B x 8192 = 734,003,200 + logits 256 x 128,256 x 4 = 131,334,144 -> 865,337,344 B.
    assert estimate_activation_reserve("Llama-3.1-70B", tensor_parallel_size=8) == 865_337_344


def test_kv_heads_replicate_when_tp_is_a_multiple() -> None:
    # Llama-3.1-8B at tp 16: 32 heads / 16; 8 KV heads < 16 and 16 % 8 == 0: each GPU holds 1 KV head,
    # 2 x 32 layers x 1 x 128 x 2 B = 16,384 B per token.
    assert size_kv_pool("Llama-3.1-8B", "A100-80GB", tensor_parallel_size=16).kv_bytes_per_token == 16_384
    # 3 KV heads and tp 4 (4 % 3 = 1) do not divide one another.
    odd = dataclasses.replace(MODEL_PRESETS["Llama-3.1-8B"], num_attention_heads=24, num_kv_heads=3)
    with pytest.raises(ValueError, match=r"num_kv_heads \(3\) and tensor_parallel_size \(4\) must divide"):
        size_kv_pool(odd, "A100-80GB", tensor_parallel_size=4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kv_cache_memory_bytes": 0}, "kv_cache_memory_bytes must be a positive integer, got 0"),
        ({"kv_cache_memory_bytes": -5}, "kv_cache_memory_bytes must be a positive integer, got -5"),
        ({"kv_cache_memory_bytes": True}, "kv_cache_memory_bytes must be a positive integer, got True"),
        ({"num_gpu_blocks_override": 0}, "num_gpu_blocks_override must be a positive integer, got 0"),
        ({"activation_reserve_bytes": -1}, "activation_reserve_bytes must be a non-negative integer, got -1"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size must be an integer >= 1, got 0"),
        ({"tensor_parallel_size": True}, "tensor_parallel_size must be an integer >= 1, got True"),
        (
            {"kv_cache_memory_bytes": 1},
            "kv_cache_memory_bytes (1) is smaller than one KV block (2,097,152 bytes = 16 tokens x 131,072 bytes)",
        ),
        ({"expert_parallel_size": 0}, "expert_parallel_size must be an integer >= 1, got 0"),
        ({"data_parallel_size": 0}, "data_parallel_size must be an integer >= 1, got 0"),
        # A float of whole value is refused too, not only values under 1.
        ({"data_parallel_size": 2.0}, "data_parallel_size must be an integer >= 1, got 2.0"),
        # EP 2 over TP 4: 2 % 4 = 2, not a multiple.
        (
            {"expert_parallel_size": 2, "tensor_parallel_size": 4},
            "expert_parallel_size (2) must be a multiple of tensor_parallel_size (4)",
        ),
        # The smallest EP, 2, is checked too: Llama-3.1-8B has no experts to deal out.
        (
            {"expert_parallel_size": 2},
            "enable_expert_parallel: Llama-3.1-8B is a dense model (no routed experts to deal out over the "
            "GPUs); remove it, or pick a mixture of experts",
        ),
    ],
)
def test_argument_messages_in_full(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError) as error:
        size_kv_pool("Llama-3.1-8B", "A100-80GB", **kwargs)
    assert str(error.value) == message


@pytest.mark.parametrize(
    ("tp", "ep", "message"),
    [
        # Qwen3-30B-A3B: routed experts 28,991,029,248 params (tests/test_expert_parallel.py), the rest
        # 30,532,122,624 - 28,991,029,248 = 1,541,093,376 params; 2 B each.
        # EP 2, TP 1: 3,082,186,752 + 57,982,058,496 / 2 = 32,073,216,000 B (29.87 GiB) per GPU.
        # T4: budget ceil(17,179,869,184 x 0.9) = 15,461,882,266 B (14.40 GiB); reserve 1 GiB:
        # left 15,461,882,266 - 32,073,216,000 - 1,073,741,824 = -17,685,075,558 B (-16.47 GiB).
        (
            1,
            2,
            "Qwen3-30B-A3B on T4-16GB (experts dealt over 2 GPUs, per GPU) does not fit: GPU memory "
            "16.00 GiB x gpu_memory_utilization 0.9 = 14.40 GiB; weights 29.87 GiB (30,532,122,624 params "
            "x 2 B / tp 1, routed experts / ep 2); activation reserve 1.00 GiB; left for the KV cache: "
            f"-16.47 GiB (-17,685,075,558 bytes): the weights alone exceed it. {ADVICE}",
        ),
        # EP 4, TP 2: 3,082,186,752 / 2 + 57,982,058,496 / 4 = 1,541,093,376 + 14,495,514,624
        # = 16,036,608,000 B (14.94 GiB); left 15,461,882,266 - 16,036,608,000 - 1,073,741,824
        # = -1,648,467,558 B (-1.54 GiB).
        (
            2,
            4,
            "Qwen3-30B-A3B on T4-16GB (tensor_parallel_size=2, experts dealt over 4 GPUs, per GPU) does not "
            "fit: GPU memory 16.00 GiB x gpu_memory_utilization 0.9 = 14.40 GiB; weights 14.94 GiB "
            "(30,532,122,624 params x 2 B / tp 2, routed experts / ep 4); activation reserve 1.00 GiB; "
            f"left for the KV cache: -1.54 GiB (-1,648,467,558 bytes): the weights alone exceed it. {ADVICE}",
        ),
    ],
)
def test_does_not_fit_message_under_expert_parallelism(tp: int, ep: int, message: str) -> None:
    with pytest.raises(ModelDoesNotFitError) as info:
        size_kv_pool(
            "Qwen3-30B-A3B",
            "T4-16GB",
            tensor_parallel_size=tp,
            expert_parallel_size=ep,
            activation_reserve_bytes=GiB,
        )
    assert str(info.value) == message


def test_capacity_line_names_data_parallelism_first() -> None:
    # Llama-3.1-70B on H100s at tp 4 (test_tensor_parallel_llama_3_1_70b_on_4_h100), now 2 DP ranks:
    # each rank's pool is the same 31,257 blocks. Per GPU: weights 35,276,853,248 B = 32.85 GiB,
    # reserve 1,062,469,632 B = 0.99 GiB, KV 31,257 x 1,310,720 = 40,969,175,040 B = 38.16 GiB.
    cap = size_kv_pool("Llama-3.1-70B", "H100-80GB", tensor_parallel_size=4, data_parallel_size=2)
    assert (cap.num_gpu_blocks, cap.data_parallel_size) == (31_257, 2)
    assert cap.capacity_lines(8192)[2] == (
        "data_parallel_size 2 (a pool per rank), tensor_parallel_size 4, per GPU: weights 32.85 GiB, "
        "activation reserve 0.99 GiB, KV cache 38.16 GiB (81,920 B per token)"
    )


def test_zero_activation_reserve_is_allowed() -> None:
    # 0 is a valid reserve (a non-negative integer): see test_explicit_activation_reserve for the pool.
    assert size_kv_pool("Llama-3.1-8B", "A100-80GB", activation_reserve_bytes=0).activation_reserve_bytes == 0


# ------------------------------------------------------------------------ newer GPU presets


def test_newer_gpu_presets_datasheet_figures() -> None:
    expected = {
        # name: (memory GiB, bandwidth B/s, dense fp16 FLOP/s, NVLink-class link B/s, PCIe B/s)
        "H100-PCIe-80GB": (80, 2.0e12, 756e12, 600e9, 128e9),
        "H100-NVL-94GB": (94, 3.9e12, 835.5e12, 600e9, 128e9),  # 1,671 sparse / 2
        "B200-180GB": (180, 8e12, 2250e12, 1800e9, 128e9),
        "L40S-48GB": (48, 864e9, 362.05e12, None, 64e9),
        "RTX-PRO-6000-96GB": (96, 1792e9, 503.8e12, None, 128e9),
        "MI300X-192GB": (192, 5.3e12, 1307.4e12, 896e9, 128e9),
    }
    for name, (memory_gib, bandwidth, flops, peer, pcie) in expected.items():
        gpu = GPU_PRESETS[name]
        assert gpu.memory_bytes == memory_gib * GiB, name
        assert gpu.hbm_bandwidth_bytes_per_s == pytest.approx(bandwidth), name
        assert gpu.fp16_flops == pytest.approx(flops), name
        assert gpu.nvlink_bandwidth_bytes_per_s == (None if peer is None else pytest.approx(peer)), name
        assert gpu.pcie_bandwidth_bytes_per_s == pytest.approx(pcie), name
        # not measured: a stated, wider band than the measured GPUs'
        assert gpu.efficiency.error_band.startswith(
            f"not validated on {name} (no measurements of it): expect ±"
        )
    # The CUDA totals logged on these cards lie between the decimal and binary readings of "GB".
    assert 96 * 10**9 < 101_976_440_832 < GPU_PRESETS["RTX-PRO-6000-96GB"].memory_bytes
    assert 192 * 10**9 < 205_822_885_888 < GPU_PRESETS["MI300X-192GB"].memory_bytes


def test_peer_link_names() -> None:
    assert GPU_PRESETS["MI300X-192GB"].tensor_parallel_link_name == "Infinity Fabric"
    assert GPU_PRESETS["MI300X-192GB"].tensor_parallel_link_bytes_per_s == pytest.approx(448e9)
    assert GPU_PRESETS["H100-PCIe-80GB"].tensor_parallel_link_name == "NVLink"
    assert GPU_PRESETS["RTX-PRO-6000-96GB"].tensor_parallel_link_name == "PCIe"
    assert GPU_PRESETS["RTX-PRO-6000-96GB"].tensor_parallel_link_bytes_per_s == pytest.approx(64e9)
    # removing the base's peer link falls back to PCIe, whatever the link was called
    no_fabric = resolve_gpu({"base": "MI300X-192GB", "nvlink_gb_per_s": None})
    assert no_fabric.tensor_parallel_link_name == "PCIe"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("NVIDIA H100 PCIe", "H100-PCIe-80GB"),
        ("NVIDIA H100 NVL", "H100-NVL-94GB"),
        ("NVIDIA B200", "B200-180GB"),
        ("NVIDIA L40S", "L40S-48GB"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000-96GB"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX-PRO-6000-96GB"),
        ("rtx-pro-6000", "RTX-PRO-6000-96GB"),
        ("AMD Instinct MI300X", "MI300X-192GB"),
        ("mi300x", "MI300X-192GB"),
    ],
)
def test_resolve_newer_gpu_names(given: str, expected: str) -> None:
    assert resolve_gpu(given) is GPU_PRESETS[expected]


def test_qwen3_32b_on_two_rtx_pro_6000_against_a_vllm_log() -> None:
    """vLLM 0.28 on 2 x RTX PRO 6000 Blackwell Server Edition, Qwen/Qwen3-32B bf16, TP 2,
    gpu_memory_utilization 0.92, max_num_batched_tokens 2048, max_num_seqs 128, block 16: 28,884
    blocks, 462,144 tokens, concurrency 11.28x at 40,960 tokens (casys-kaist/LLMServingSim
    bench/examples/RTXPRO6000/Qwen3-32B/vllm/meta.json; CUDA total 101,976,440,832 B per GPU).

    Per GPU, with the CUDA total as the memory and vLLM's profiling shape (2048 tokens, 128 seqs):
      budget ceil(0.92 x 101,976,440,832) = 93,818,325,566 B
      weights 32,762,123,264 x 2 B / 2 = 32,762,123,264 B
      reserve: MLP 3 x 25600 / 2 = 38,400; qkv (64/2 + 2 x 8/2) x 128 = 5,120; 4 x 5120 = 20,480
               -> 64,000 x 2 B x 2048 = 262,144,000 + logits 128 x 151,936 x 4 = 77,791,232
               = 339,935,232 B
      available 60,716,267,070 B; per token 2 x 64 x (8/2) x 128 x 2 = 131,072 B, block 2 MiB
      -> 28,951 blocks = 463,216 tokens, 28,951 / 2,560 = 11.31x
    67 blocks (0.23 %, 140 MiB) more than vLLM, whose non-torch memory and CUDA graphs the estimate
    leaves out."""
    gpu = {"base": "RTX-PRO-6000-96GB", "memory_bytes": 101_976_440_832}
    reserve = estimate_activation_reserve("Qwen3-32B", num_tokens=2048, num_seqs=128, tensor_parallel_size=2)
    assert reserve == 339_935_232
    cap = size_kv_pool(
        "Qwen3-32B",
        gpu,
        gpu_memory_utilization=0.92,
        tensor_parallel_size=2,
        activation_reserve_bytes=reserve,
    )
    assert cap.available_kv_bytes == 60_716_267_070
    assert cap.num_gpu_blocks == 28_951
    assert cap.capacity_lines(40960)[:2] == [
        "GPU KV cache size: 463,216 tokens",
        "Maximum concurrency for 40,960 tokens per request: 11.31x",
    ]
    vllm_blocks = 28_884
    assert cap.num_gpu_blocks == pytest.approx(vllm_blocks, rel=0.003)
