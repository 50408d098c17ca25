"""How ``sim/runner/`` prepares a hybrid allocator's pool, a disaggregated variant's pools, a host tier
and the single-group policies: what each key of the config changes in the prepared pools (sizes worked
out by hand), and the messages that name the key a user must change."""

from __future__ import annotations

import re
import shutil
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from policies.base import PoolSpec
from sim.config import ConfigError, ConfigWarning, VariantConfig, validate_experiment
from sim.hardware.layers import ChunkedLocal, FullAttention, SlidingWindow
from sim.hardware.models import resolve_model
from sim.outputs.metrics import BREAKDOWN_COLUMNS
from sim.runner import prepare_experiment, run_experiment
from sim.runner.hybrid import _warn_of_windows_past_max_model_len

ROOT = Path(__file__).resolve().parents[1]
BREAKDOWN = list(BREAKDOWN_COLUMNS)


def prepared(raw: dict, tmp_path: Path):
    return prepare_experiment(validate_experiment(raw), tmp_path / "c.yaml")


def refused(raw: dict, tmp_path: Path) -> list[str]:
    """The problems ``prepare_experiment`` lists for ``raw``, one per line, less the variant's label."""
    with pytest.raises(ConfigError) as error:
        prepared(raw, tmp_path)
    lines = str(error.value).split("\n  ")[1:]
    return [line.split(": ", 1)[1] for line in lines]


# ------------------------------------------------------------------------------ disaggregated pools
def disaggregated(prefill: dict | None = None, decode: dict | None = None, **variant) -> dict:
    """Llama-3.1-8B (131,072 B of KV per token) on an H100, 2,000 blocks of 16 tokens a replica."""
    pools = {"prefill": prefill or {}, "decode": decode or {}}
    return {
        "name": "pd",
        "seed": 1,
        "model": "Llama-3.1-8B",
        "gpu": "H100-80GB",
        "cost_model": "analytic",
        "engine": {"max_model_len": 4096, "max_num_batched_tokens": 2048, "num_gpu_blocks_override": 2000},
        "workload": {
            "num_requests": 4,
            "arrival": {"kind": "poisson", "rate_per_s": 8},
            "prompt_len": 100,
            "output_len": 5,
        },
        "variants": [{"name": "pd", "policy": "prefix", "cluster": {"disaggregation": pools}, **variant}],
    }


POOL = "variants.0.cluster.disaggregation"


def test_each_pool_runs_its_own_policy_options_and_size_and_the_prefill_pool_is_named_apart(tmp_path):
    """A prefill pool of radix (pages of 16) with 300 blocks, two decode replicas of prefix with the
    engine's 2,000: the prefill replica's summary carries the variant's name with "-prefill", its policy
    and options; each replica's memory rows sum to its own pool (300 x 16 = 4,800 and 2,000 x 16 =
    32,000 slots), so no replica runs another pool's policy instance."""
    raw = disaggregated(
        {"policy": "radix", "options": {"page_size": 16}, "engine": {"num_gpu_blocks_override": 300}},
        {"replicas": 2},
    )
    (result,) = run_experiment(validate_experiment(raw), tmp_path / "c.yaml", out_dir=tmp_path / "out")
    assert result.name == "pd" and result.summary["variant"] == "pd"
    rows = result.replica_summaries
    assert [row["variant"] for row in rows] == ["pd-prefill", "pd", "pd"]
    assert [row["role"] for row in rows] == ["prefill", "decode", "decode"]
    assert [row["policy"] for row in rows] == ["radix", "prefix", "prefix"]
    assert [row["policy_options"] for row in rows] == [{"page_size": 16}, {}, {}]
    series = result.replica_timeseries
    totals = series[BREAKDOWN].sum(axis=1).groupby(series["replica"]).unique()
    assert {replica: list(values) for replica, values in totals.items()} == {
        0: [4_800],
        1: [32_000],
        2: [32_000],
    }


@pytest.mark.parametrize(
    ("variant_engine", "prefill_engine", "key"),
    [
        # the pool's own override is named by the pool's key...
        ({}, {"enable_chunked_prefill": False, "max_num_batched_tokens": 1024}, f"{POOL}.prefill.engine"),
        # ...the variant's by the variant's, the engine section's by its own
        ({"max_num_batched_tokens": 1024}, {"enable_chunked_prefill": False}, "variants.0.engine"),
        ({}, {"enable_chunked_prefill": False}, "engine"),
    ],
)
def test_a_pools_engine_problem_names_the_key_that_set_the_value(
    tmp_path, variant_engine, prefill_engine, key
):
    """max_num_batched_tokens under max_model_len (4,096) with chunked prefill off, in the prefill pool
    only: 1,024 where the pool or the variant sets it, else the engine section's 2,048."""
    raw = disaggregated({"engine": prefill_engine}, engine=variant_engine)
    tokens = "1,024" if "max_num_batched_tokens" in {**variant_engine, **prefill_engine} else "2,048"
    assert refused(raw, tmp_path) == [
        f"{key}.max_num_batched_tokens: {tokens} is smaller than max_model_len (4,096) with "
        "enable_chunked_prefill: false, which vLLM refuses (longer prompts could never be prefilled). "
        "Raise max_num_batched_tokens, lower max_model_len, or enable chunked prefill"
    ]


def test_a_pools_unknown_gpu_and_bad_engine_value_are_named_by_the_pools_keys(tmp_path):
    (gpu,) = refused(disaggregated({"gpu": "NoSuchGPU"}), tmp_path)
    assert gpu.startswith(f"{POOL}.prefill.gpu: unknown GPU 'NoSuchGPU'; presets: T4-16GB, ")
    assert refused(disaggregated(decode={"engine": {"block_size": "big"}}), tmp_path) == [
        f"{POOL}.decode.engine: Input should be a valid integer, unable to parse string as an integer"
    ]


def test_both_pools_read_a_cost_profile_beside_the_config_and_pin_the_shared_prefixes(tmp_path):
    """A profile named relative to the config's folder is found for both pools; two shared prefixes of
    100 tokens pin their full blocks in each pool: 2 x (100 // 16) x 16 = 192 slots."""
    shutil.copy(
        ROOT / "configs" / "profiles" / "analytic-llama-3.1-8b-h100-80gb.yaml", tmp_path / "mine.yaml"
    )
    raw = disaggregated(pin_shared_prefixes=True)
    raw["cost_model"] = {"profile": "mine.yaml"}
    raw["workload"]["shared_prefix"] = {"num_prefixes": 2, "prefix_len": 100, "fraction": 1.0}
    (decode,) = prepared(raw, tmp_path).variants
    prefill = decode.prefill_pool
    for pool in (prefill, decode):
        assert pool.costs.label == "analytic profile: H100-80GB (analytic, bfloat16), Llama-3.1-8B"
        assert pool.pinned_tokens == 192
        assert pool.policy.breakdown().cached == 192


# ---------------------------------------------------------------------- single-group pools, host tier
def single(variant: dict, **top) -> dict:
    """Llama-3.1-8B: 16-token blocks of 131,072 B per token, 2 MiB each; 2,000 of them."""
    return {
        "name": "one",
        "seed": 1,
        "model": "Llama-3.1-8B",
        "gpu": "H100-80GB",
        "engine": {"max_model_len": 4096, "num_gpu_blocks_override": 2000},
        "workload": {
            "num_requests": 4,
            "arrival": {"kind": "poisson", "rate_per_s": 8},
            "prompt_len": 100,
            "output_len": 5,
        },
        "variants": [variant],
        **top,
    }


def test_an_option_value_the_policy_refuses_is_named_by_the_variants_options_key(tmp_path):
    raw = single({"name": "c", "policy": "contiguous", "options": {"reservation": "bogus"}})
    assert refused(raw, tmp_path) == [
        "variants.0.options: contiguous: unknown reservation 'bogus'; valid values: max, pow2, oracle"
    ]


def test_a_host_tier_of_exactly_one_block_is_accepted_and_a_hair_less_is_refused(tmp_path):
    """A block is 16 x 131,072 B = 2 MiB = 2 / 1,024 GiB = 0.001953125 GiB: that much holds one block;
    0.00195 GiB holds none."""
    (variant,) = prepared(
        single({"name": "p", "policy": "prefix"}, offload={"host_memory_gib": 0.001953125}), tmp_path
    ).variants
    assert variant.policy.host_tier.capacity_blocks == 1
    raw = single({"name": "p", "policy": "prefix"}, offload={"host_memory_gib": 0.00195})
    assert refused(raw, tmp_path) == [
        "offload.host_memory_gib: 0.00195 GiB holds no KV block (2,097,152 bytes each)"
    ]


# ---------------------------------------------------------------------- windows that free nothing
def mixed_model():
    """Mistral-7B-v0.1's 32 layers re-cut: 10 sliding over 4,096 tokens, 10 chunked by 8,192, 12 full."""
    mistral = resolve_model("Mistral-7B-v0.1")
    kinds = (SlidingWindow(4096), ChunkedLocal(8192), FullAttention()) * 10 + (FullAttention(),) * 2
    return replace(mistral, name="Mixed-7B", layer_kinds=kinds)


def test_every_window_and_chunk_no_request_outgrows_is_named_in_one_warning():
    """At max_model_len 4,096 neither the window (4,096 >= 4,096) nor the chunk frees anything: both
    are named, in sorted order; at 4,097 a request can outgrow the window, so only the chunk is."""
    variant = VariantConfig(name="h", policy="vllm-hybrid")
    with pytest.warns(ConfigWarning) as caught:
        _warn_of_windows_past_max_model_len(variant, mixed_model(), 4096)
    assert [str(item.message) for item in caught] == [
        "variant h: Mixed-7B's chunked(8192), sliding(4096) layers never release a block: no request is "
        "longer than max_model_len (4,096 tokens), so they hold every token, as full attention would"
    ]
    with pytest.warns(ConfigWarning, match=re.escape("Mixed-7B's chunked(8192) layers never release")):
        _warn_of_windows_past_max_model_len(variant, mixed_model(), 4097)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_of_windows_past_max_model_len(variant, mixed_model(), 8193)


# ------------------------------------------------------------------------------ hybrid allocators
LARGE = 34_078_720
"""Gemma-3-27B's large page under jenga at block_size 16: 8,192 B per token per layer (16 KV heads x
128 x 2 (K, V) x 2 B), so a layer's block is 131,072 B; the sliding type's 52 layers make a small page
of 6,815,744 B, the full type's 10 one of 1,310,720 B; their LCM is 5 x 6,815,744 = 26 x 1,310,720."""


def hybrid(model: str, policy: str, options: dict | None = None, **engine) -> dict:
    return {
        "name": "hybrid",
        "seed": 1,
        "model": model,
        "gpu": "H100-80GB",
        "cost_model": "analytic",
        "engine": {
            "block_size": 16,
            "max_model_len": 16384,
            "max_num_batched_tokens": 2048,
            "enable_prefix_caching": False,
            "kv_cache_memory_bytes": 301 * LARGE,
            **engine,
        },
        "workload": {
            "num_requests": 4,
            "arrival": {"kind": "poisson", "rate_per_s": 8},
            "prompt_len": 100,
            "output_len": 5,
        },
        "variants": [{"name": "h", "policy": policy, "options": options or {}}],
    }


def layout(raw: dict, tmp_path: Path):
    (variant,) = prepared(raw, tmp_path).variants
    return variant


JENGA_PAGES = "sliding(1024): 52 layers, 6,815,744 B x 5, full: 10 layers, 1,310,720 B x 26"


@pytest.mark.parametrize(
    ("engine", "concurrency", "caching"),
    [
        # A request's sliding pages: cdiv(min(1,023 + in-flight tokens, 16,384), 16) + 1; its full ones
        # 16,384 / 16 = 1,024. Per large page: sliding / 5 + 1,024 / 26 (39.3846); 300 large pages.
        # Async scheduling (the default) keeps two batches of 2,048 in flight: cdiv(5,119, 16) + 1 =
        # 321 -> 300 / (64.2 + 39.3846) = 2.90
        ({}, "2.90", False),
        # one batch: cdiv(3,071, 16) + 1 = 193 -> 300 / (38.6 + 39.3846) = 3.85
        ({"async_scheduling": False}, "3.85", False),
        # with prefix caching a prompt is allocated whole: 16,384 in flight, 1,025 -> 300 / 244.3846 = 1.23
        ({"enable_prefix_caching": True}, "1.23", True),
    ],
)
def test_jenga_sizes_a_request_by_the_tokens_in_flight(tmp_path, engine, concurrency, caching):
    """301 large pages of KV memory give 300 (jenga keeps one back), 4,160 slots of 8,192 B each."""
    variant = layout(hybrid("Gemma-3-27B", "jenga", **engine), tmp_path)
    assert variant.capacity_lines() == [
        f"Jenga: 300 large pages of 34,078,720 B (the LCM of the small pages; {JENGA_PAGES})",
        f"Maximum concurrency for 16,384 tokens per request: {concurrency}x",
    ]
    assert variant.pool == PoolSpec(300 * 4_160, 16, 16384, 8_192)
    assert (variant.hybrid.prefill_tokens, variant.hybrid.prefix_caching) == (2048, caching)


def test_jenga_takes_the_engines_block_dtype_and_tensor_parallelism_and_its_large_page_option(tmp_path):
    """fp8 halves a layer's bytes per token and TP 2 halves its KV heads (2,048 B); blocks of 32
    tokens double them back: 65,536 B a layer's block, small pages of 3,407,872 and 655,360 B, a large
    page of 17,039,360 B; 301 x 34,078,720 B hold 602 - 1 = 601. A request: full 16,384 / 32 = 512
    pages, sliding cdiv(5,119, 32) + 1 = 161: 601 / (161 / 5 + 512 / 26) = 11.58."""
    engine = {"kv_cache_dtype": "fp8", "tensor_parallel_size": 2, "block_size": 32}
    assert layout(hybrid("Gemma-3-27B", "jenga", **engine), tmp_path).capacity_lines() == [
        "Jenga: 601 large pages of 17,039,360 B (the LCM of the small pages; sliding(1024): 52 layers, "
        "3,407,872 B x 5, full: 10 layers, 655,360 B x 26)",
        "Maximum concurrency for 16,384 tokens per request: 11.58x",
    ]
    # A large page of twice the LCM: 150 of them (cdiv(301, 2) - 1), ten and 52 small pages each.
    doubled = layout(hybrid("Gemma-3-27B", "jenga", {"large_page_bytes": 2 * LARGE}), tmp_path)
    assert doubled.capacity_lines()[0] == (
        "Jenga: 150 large pages of 68,157,440 B (large_page_bytes; sliding(1024): 52 layers, 6,815,744 B x 10, "
        "full: 10 layers, 1,310,720 B x 52)"
    )


def test_what_jenga_cannot_do_is_listed_at_once_each_line_naming_its_key(tmp_path):
    raw = hybrid("Gemma-3-27B", "jenga", preemption_mode="swap", num_gpu_blocks_override=800)
    raw["engine"]["kv_cache_memory_bytes"] = None
    raw["offload"] = {"host_memory_gib": 4}
    raw["variants"][0]["pin_shared_prefixes"] = True
    assert refused(raw, tmp_path) == [
        "variants.0.policy: jenga has no host tier (offload:); use policy prefix or radix",
        "variants.0.pin_shared_prefixes: jenga has no prefix cache to pin into",
        "engine.preemption_mode: jenga preempts by recompute only",
        "engine.num_gpu_blocks_override: jenga sizes its large pages from the KV memory",
    ]


def test_jenga_refuses_prefix_caching_on_a_model_with_mamba_layers_naming_the_key(tmp_path):
    raw = hybrid("Nemotron-H-8B-Base-8K", "jenga", max_model_len=8192)
    raw["variants"][0]["engine"] = {"enable_prefix_caching": True}
    assert refused(raw, tmp_path) == [
        "variants.0.engine.enable_prefix_caching: jenga's prefix caching has no rule for "
        "Nemotron-H-8B-Base-8K's Mamba / linear-attention layers (sim/kv/jenga_prefix.py); set it false, "
        "or use policy vllm-hybrid"
    ]


@pytest.mark.parametrize(
    ("engine", "full", "swa", "overlap"),
    [
        # gpt-oss-20b: 12 full and 12 sliding layers of 8 KV heads x 64 x 2 (K, V) x 2 B = 2,048 B per
        # token: a cell of 49,152 B; 49,152,000 B hold 1,000 cells; SGLang's split at its default
        # swa_full_tokens_ratio 0.8: full = int(1,000 x 49,152 / (24,576 x 1.8)) = 1,111, swa =
        # int(1,111 x 0.8) = 888. Async scheduling (the default) is SGLang's overlap scheduler.
        ({}, 1111, 888, True),
        # fp8 and TP 2 (4 KV heads a GPU) quarter the cell: 4,000 cells, full int(4,444.4), swa
        # int(3,555.2); without async scheduling, no overlap
        ({"kv_cache_dtype": "fp8", "tensor_parallel_size": 2, "async_scheduling": False}, 4444, 3555, False),
    ],
)
def test_sglang_hybrid_splits_the_kv_memory_with_the_engines_dtype_parallelism_and_overlap(
    tmp_path, engine, full, swa, overlap
):
    raw = hybrid(
        "gpt-oss-20b", "sglang-hybrid", kv_cache_memory_bytes=49_152_000, max_model_len=1024, **engine
    )
    variant = layout(raw, tmp_path)
    assert variant.capacity_lines()[0] == (
        f"Use sliding window memory pool. full_layer_tokens={full}, swa_layer_tokens={swa}"
    )
    assert variant.hybrid.overlap is overlap


GPT_OSS = {"kv_cache_memory_bytes": 1_500_000_000}
"""gpt-oss-20b under vllm-hybrid: two groups of 12 layers (full, sliding over 128 tokens), a slot of 12
layers x 2,048 B = 24,576 B per token."""


@pytest.mark.parametrize(
    ("engine", "pool", "lines"),
    [
        # Blocks of 16 x 24,576 B: 1.5e9 B hold 3,814. A request: 16,384 / 16 = 1,024 full blocks and
        # cdiv(min(127 + 2 x 2,048, 16,384), 16) + 1 = 265 sliding (two batches in flight: async
        # scheduling); 3,814 / 1,289 = 2.959, x 16,384 = 48,478 tokens.
        (
            {},
            PoolSpec(3814 * 16, 16, 16384, 24_576),
            ["GPU KV cache size: 48,478 tokens", "Maximum concurrency for 16,384 tokens per request: 2.96x"],
        ),
        # fp8 and TP 2 quarter a slot (6,144 B); blocks of 32: 1.5e9 / 196,608 = 7,629 blocks. A request
        # of 4,096: 128 full blocks and cdiv(127 + 1,024, 32) + 1 = 37 sliding (one batch in flight):
        # 7,629 / 165 = 46.24, x 4,096 = 189,384 tokens.
        (
            {
                "block_size": 32,
                "kv_cache_dtype": "fp8",
                "tensor_parallel_size": 2,
                "async_scheduling": False,
                "max_num_batched_tokens": 1024,
                "max_model_len": 4096,
            },
            PoolSpec(7629 * 32, 32, 4096, 6_144),
            ["GPU KV cache size: 189,384 tokens", "Maximum concurrency for 4,096 tokens per request: 46.24x"],
        ),
        # 500 blocks as asked: 8,000 slots; 500 / 1,289 = 0.39
        (
            {"num_gpu_blocks_override": 500, "kv_cache_memory_bytes": None},
            PoolSpec(500 * 16, 16, 16384, 24_576),
            ["GPU KV cache size: 6,355 tokens", "Maximum concurrency for 16,384 tokens per request: 0.39x"],
        ),
    ],
)
def test_vllm_hybrid_sizes_its_pool_from_the_engine_section(tmp_path, engine, pool, lines):
    variant = layout(hybrid("gpt-oss-20b", "vllm-hybrid", **{**GPT_OSS, **engine}), tmp_path)
    assert variant.pool == pool
    assert variant.capacity_lines() == lines
    # (chunked prefill: an iteration computes max_num_batched_tokens of a prompt at most)
    assert variant.hybrid.prefill_tokens == (1024 if "max_num_batched_tokens" in engine else 2048)


NEMOTRON = {"kv_cache_memory_bytes": 3_000_000_000, "max_model_len": 8192}
QWEN3_NEXT = {"tensor_parallel_size": 2, "kv_cache_memory_bytes": None, "enable_prefix_caching": True}
"""Qwen3-Next on an H200 at TP 2: blocks of 544 tokens; prefix caching runs mamba_cache_mode 'align'."""


def qwen3_next(options: dict | None = None, **engine) -> dict:
    return hybrid("Qwen3-Next-80B-A3B", "vllm-hybrid", options, **{**QWEN3_NEXT, **engine}) | {"gpu": "H200"}


@pytest.mark.parametrize(
    ("caching", "block", "mode"),
    [
        # vLLM's 1,040-token block for Nemotron-H without prefix caching ...
        (False, 1040, "none"),
        # ... and with it mode 'all', its block a multiple of the Mamba2 chunk (128): 9 x 128
        (True, 1152, "all"),
    ],
)
def test_nemotron_h_runs_a_prefill_budget_under_its_block_outside_align_mode(tmp_path, caching, block, mode):
    """512 tokens of prefill budget, less than a block: only mamba_cache_mode 'align' needs a whole
    block per chunk."""
    raw = hybrid("Nemotron-H-8B-Base-8K", "vllm-hybrid", max_num_batched_tokens=512, **NEMOTRON)
    raw["engine"]["enable_prefix_caching"] = caching
    variant = layout(raw, tmp_path)
    assert variant.pool.block_size == block
    assert variant.pool.max_model_len == 8192
    hybrid_layout = variant.hybrid
    assert (hybrid_layout.mamba_cache_mode, hybrid_layout.prefix_caching) == (mode, caching)
    assert hybrid_layout.prefill_tokens == 512


ALIGN = (
    "engine.max_num_batched_tokens: 512 is less than the 544-token block Qwen3-Next-80B-A3B takes with "
    "Mamba layers: vLLM's mamba_cache_mode 'align' cuts every prefill chunk down to whole blocks, so a "
    "prefill budget smaller than a block never schedules a prompt past its first block"
)


@pytest.mark.parametrize(
    ("engine", "refusal"),
    [
        ({"max_num_batched_tokens": 544}, None),  # a whole block per chunk
        ({"max_num_batched_tokens": 512}, ALIGN),
        ({"max_num_batched_tokens": 512, "max_model_len": 544}, ALIGN),  # a request may fill a block
        ({"max_num_batched_tokens": 512, "max_model_len": 543}, None),  # no request fills one
    ],
)
def test_align_mode_needs_a_prefill_budget_of_a_block_where_a_request_can_fill_one(tmp_path, engine, refusal):
    raw = qwen3_next(**engine)
    if refusal is not None:
        assert refused(raw, tmp_path) == [refusal]
        return
    hybrid_layout = layout(raw, tmp_path).hybrid
    assert (hybrid_layout.mamba_cache_mode, hybrid_layout.prefix_caching) == ("align", True)
    assert hybrid_layout.capacity.block_size == 544
    assert hybrid_layout.prefill_tokens == engine["max_num_batched_tokens"]  # (under max_model_len)


def test_marconi_takes_the_mamba_states_of_align_mode_and_names_the_caching_key(tmp_path):
    hybrid_layout = layout(qwen3_next({"mamba_prefix_policy": "marconi"}), tmp_path).hybrid
    assert hybrid_layout.marconi is not None and hybrid_layout.mamba_cache_mode == "align"
    assert layout(qwen3_next(), tmp_path).hybrid.marconi is None
    raw = qwen3_next({"mamba_prefix_policy": "marconi"})
    raw["variants"][0]["engine"] = {"enable_prefix_caching": False}
    assert refused(raw, tmp_path) == [
        "variants.0.options.mamba_prefix_policy: 'marconi' needs variants.0.engine.enable_prefix_caching: "
        "true (Marconi chooses which Mamba states vLLM's prefix caching, mamba_cache_mode 'align', keeps)"
    ]


@pytest.mark.parametrize(
    ("large_page_bytes", "message"),
    [
        (-3, "must be a positive integer, got -3"),
        (
            1_000_000,
            "1,000,000 is not a multiple of the sliding(1024) small page (52 layers x 131,072 B = 6,815,744 B, "
            "block_size 16); the LCM of the small pages is 34,078,720 B",
        ),
    ],
)
def test_a_large_page_jenga_cannot_use_is_named_by_its_option_key(tmp_path, large_page_bytes, message):
    raw = hybrid("Gemma-3-27B", "jenga", {"large_page_bytes": large_page_bytes})
    assert refused(raw, tmp_path) == [f"variants.0.options.large_page_bytes: {message}"]


def test_a_vllm_hybrid_pool_short_of_one_request_is_named_by_the_variants_policy_key(tmp_path):
    """One request of 16,384 tokens takes 1,024 + 265 = 1,289 blocks (see above) of 16 x 24,576 =
    393,216 B: 506,855,424 B."""
    raw = hybrid("gpt-oss-20b", "vllm-hybrid", kv_cache_memory_bytes=10_000_000)
    assert refused(raw, tmp_path) == [
        "variants.0.policy: vllm-hybrid: gpt-oss-20b: one request of max_model_len 16,384 tokens needs "
        "506,855,424 bytes of KV cache (1289 blocks of 393,216 bytes), more than the 10,000,000 available; "
        "vLLM refuses to start. Lower max_model_len or give the KV cache more memory"
    ]
