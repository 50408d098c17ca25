"""``sim/runner/``'s preparing of an experiment: vLLM's start-up checks word for word (the key path,
the numbers), how problems of several variants are labelled, what a prepared variant carries (pool,
policies, cluster, pinning, speculation, lockstep, cost model), the knobs of the engine built from it,
and the acceptance histogram file. Every expected text and number is worked out by hand in the
comments."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from policies import PoolSpec, make_policy
from sim.config import ClusterConfig, ConfigError, EngineConfig, VariantConfig, validate_experiment
from sim.costs.factory import make_cost_model
from sim.engine.knobs import EngineKnobs
from sim.hardware.gpus import resolve_gpu
from sim.hardware.models import resolve_model
from sim.kv.coordinator import KVCoordinator
from sim.outputs.sinks import MemorySink
from sim.runner import (
    check_engine,
    check_parallelism,
    check_pool_holds_a_request,
    check_reservation_fits,
    policy_name_for,
    prepare_experiment,
    read_acceptance_histogram,
    resolve_hardware,
    run_variant,
    speculative_knobs,
    speculative_summary,
    unknown_options_error,
)
from sim.runner.engines import make_engine
from sim.runner.resolve import error_text
from tests.test_runner import tiny_experiment as tiny

ROOT = Path(__file__).resolve().parents[1]
SPEC = {"method": "eagle3", "num_speculative_tokens": 3, "acceptance": {"mean_acceptance_length": 2.5}}


def key(name: str) -> str:
    """A key path no default would give: the texts below must take theirs from here."""
    return f"variants.3.engine.{name}"


def prepare(data: dict, folder: Path = Path("/nonexistent")):
    return prepare_experiment(validate_experiment(data), folder / "experiment.yaml")


def refusal(data: dict, folder: Path = Path("/nonexistent")) -> list[str]:
    """The lines of the one error that refuses ``data``: the header, then one line per problem."""
    with pytest.raises(ConfigError) as error:
        prepare(data, folder)
    return str(error.value).split("\n")


def header(problems: int, folder: Path = Path("/nonexistent")) -> str:
    return f"{folder / 'experiment.yaml'}: cannot run ({problems} problem(s); nothing was simulated)"


# ------------------------------------------------------------------------------------------------
# vLLM's start-up checks, word for word
# ------------------------------------------------------------------------------------------------


def test_max_model_len_beyond_the_models_context_is_an_error_or_with_the_override_a_warning():
    beyond = (
        f"{key('max_model_len')}: 8,192 is beyond M's context length (4,096 tokens, max_position_embeddings)"
    )
    assert check_engine(EngineConfig(max_model_len=8192), "M", 4096, key) == (
        [
            f"{beyond}; vLLM refuses this too. Lower it, or set engine.allow_long_max_model_len: true "
            "(vLLM: VLLM_ALLOW_LONG_MAX_MODEL_LEN=1) if the model really handles longer contexts"
        ],
        [],
    )
    allowed = EngineConfig(max_model_len=8192, allow_long_max_model_len=True)
    assert check_engine(allowed, "M", 4096, key) == (
        [],
        [f"{beyond}; accepted (allow_long_max_model_len: true)"],
    )
    # Exactly the model's context, or none given (the model's then): nothing to say.
    assert check_engine(EngineConfig(max_model_len=4096), "M", 4096, key) == ([], [])
    assert check_engine(EngineConfig(), "M", 4096, key) == ([], [])


def test_block_size_against_max_model_len_and_vllms_sizes():
    assert check_engine(EngineConfig(max_model_len=2048, block_size=4096), "M", 4096, key) == (
        [
            f"{key('block_size')}: 4,096 is larger than max_model_len (2,048): even the longest request "
            "would leave most of its only block empty"
        ],
        [],  # (too big, so no word on vLLM's sizes)
    )
    # A block of exactly max_model_len holds the longest request: 256 is one of vLLM's sizes too.
    assert check_engine(EngineConfig(max_model_len=256, block_size=256), "M", 4096, key) == ([], [])
    assert check_engine(EngineConfig(max_model_len=2048, block_size=24), "M", 4096, key) == (
        [],
        [
            f"{key('block_size')}: 24 is not a block size vLLM accepts (1, 8, 16, 32, 64, 128, 256); "
            "simulated as given"
        ],
    )


def test_chunked_prefill_off_needs_a_budget_of_max_model_len_word_for_word():
    engine = EngineConfig(max_model_len=2048, enable_chunked_prefill=False, max_num_batched_tokens=1024)
    assert check_engine(engine, "M", 4096, key) == (
        [
            f"{key('max_num_batched_tokens')}: 1,024 is smaller than max_model_len (2,048) with "
            "enable_chunked_prefill: false, which vLLM refuses (longer prompts could never be prefilled). "
            "Raise max_num_batched_tokens, lower max_model_len, or enable chunked prefill"
        ],
        [],
    )
    # A budget of exactly max_model_len prefills the longest prompt in one go.
    fits = EngineConfig(max_model_len=2048, enable_chunked_prefill=False, max_num_batched_tokens=2048)
    assert check_engine(fits, "M", 4096, key) == ([], [])


def parallelism(engine: dict, **top) -> tuple[list[str], list[str]]:
    config = validate_experiment(tiny(engine, **top))
    return check_parallelism(
        config, 0, config.engine_for(config.variants[0]), resolve_model(config.model), key
    )


def test_data_parallelism_inside_a_cluster_is_refused_naming_the_section():
    both = (
        f"{key('data_parallel_size')}: 2 makes the server a group of ranks behind vLLM's own balancer; a "
        "{where}: section of such servers is not modelled. Use one or the other"
    )
    # Llama-3.1-8B is dense: data parallelism alone is two replicas, nothing to refuse.
    assert parallelism({"data_parallel_size": 2}) == ([], [])
    assert parallelism({"data_parallel_size": 2}, cluster={"replicas": 2}) == (
        [both.format(where="cluster")],
        [],
    )
    own = [{"name": "v", "policy": "paged", "cluster": {"router": "least_kv"}}]
    assert parallelism({"data_parallel_size": 2}, variants=own) == (
        [both.format(where="variants.0.cluster")],
        [],
    )
    # One rank in a cluster is an ordinary cluster.
    assert parallelism({"data_parallel_size": 1}, cluster={"replicas": 2}) == ([], [])


def test_expert_parallelism_on_one_gpu_warns_and_on_four_does_not():
    moe = {"model": "Qwen3-30B-A3B", "gpu": "H100-80GB"}
    assert parallelism({"enable_expert_parallel": True}, **moe) == (
        [],
        [
            f"{key('enable_expert_parallel')}: one GPU (data_parallel_size x tensor_parallel_size = 1) has "
            "every expert; nothing is dealt out, as in vLLM"
        ],
    )
    # 2 x 2 = 4 GPUs share the 128 routed experts (32 each): nothing to say.
    assert parallelism(
        {"enable_expert_parallel": True, "data_parallel_size": 2, "tensor_parallel_size": 2}, **moe
    ) == ([], [])
    assert parallelism({}, **moe) == ([], [])
    # On a dense model expert parallelism is an error, and then no word of one GPU.
    errors, warnings = parallelism({"enable_expert_parallel": True})
    assert len(errors) == 1 and errors[0].startswith(
        f"{key('enable_expert_parallel')}: Llama-3.1-8B is a dense"
    )
    assert warnings == []


def test_a_pool_that_holds_max_model_len_exactly_passes_and_one_token_more_is_refused():
    capacity = SimpleNamespace(num_gpu_blocks=300)  # 300 blocks x 16 = 4,800 tokens
    assert check_pool_holds_a_request(capacity, 16, 4800, key) == ""
    assert check_pool_holds_a_request(capacity, 16, 4801, key) == (
        "max_model_len (4,801 tokens) is larger than the KV cache holds (300 blocks x 16 = 4,800 tokens), "
        f"which vLLM refuses at start-up. Lower {key('max_model_len')} to at most 4,800, or give the KV "
        "cache more memory (gpu_memory_utilization, kv_cache_memory_bytes, num_gpu_blocks_override, a "
        "bigger GPU)"
    )


def contiguous(pool_tokens: int, max_model_len: int, **options):
    return make_policy("contiguous", PoolSpec(pool_tokens, 16, max_model_len), **options)


def test_a_max_reservation_larger_than_the_largest_region_is_refused_word_for_word():
    # First fit: the region is max_model_len itself, 5,000 slots, in a pool of 4,800.
    assert check_reservation_fits(contiguous(4800, 5000), 5000, key) == (
        "contiguous reservation 'max' reserves max_model_len = 5,000 slots per request, but the KV pool "
        f"holds 4,800 slots: no request could ever be admitted. Lower {key('max_model_len')} to at most "
        "4,800, or give the KV cache more memory"
    )
    # Buddy: 5,000 rounds up to 8,192; a pool of 6,400 = 4,096 + 2,048 + 256 has chunks of 4,096 at most.
    assert check_reservation_fits(contiguous(6400, 5000, placement="buddy"), 5000, key) == (
        "contiguous reservation 'max' reserves max_model_len = 5,000 slots per request (rounded up to 8,192 "
        "by buddy placement), but its largest buddy chunk is 4,096 slots: no request could ever be "
        f"admitted. Lower {key('max_model_len')} to at most 4,096, or give the KV cache more memory"
    )
    # A region exactly as large as the largest one fits: first fit 5,000 of 5,000; buddy 4,096 of 4,096.
    assert check_reservation_fits(contiguous(5000, 5000), 5000, key) == ""
    assert check_reservation_fits(contiguous(4096, 4096, placement="buddy"), 4096, key) == ""
    # Only reservation max is checked: pow2 and oracle reserve by the request.
    assert check_reservation_fits(contiguous(4800, 5000, reservation="pow2"), 5000, key) == ""


def test_key_errors_lose_the_quotes_their_str_adds():
    # str(KeyError("x")) is "'x'": the text is the argument itself. Anything else is its str().
    assert error_text(KeyError("unknown GPU 'H800'")) == "unknown GPU 'H800'"
    assert error_text(KeyError()) == ""
    assert error_text(ValueError("a", "b")) == "('a', 'b')"
    assert error_text(ValueError("bad")) == "bad"


# ------------------------------------------------------------------------------------------------
# Problems of every variant, together and labelled
# ------------------------------------------------------------------------------------------------


def test_the_same_problem_of_every_variant_is_one_line():
    budget = {"enable_chunked_prefill": False, "max_num_batched_tokens": 512}
    chunked = (
        "engine.max_num_batched_tokens: 512 is smaller than max_model_len (1,024) with enable_chunked_prefill: "
        "false, which vLLM refuses (longer prompts could never be prefilled). Raise max_num_batched_tokens, "
        "lower max_model_len, or enable chunked prefill"
    )
    two = [{"name": "a", "policy": "paged"}, {"name": "b", "policy": "prefix"}]
    assert refusal(tiny(budget, two)) == [header(1), f"  every variant: {chunked}"]
    # One variant is not "every variant": it is named.
    assert refusal(tiny(budget)) == [header(1), f"  variants.0 (v): {chunked}"]


def test_a_problem_of_some_variants_names_each_of_them():
    # prefix_aware routes by cached prefixes: the two paged variants cannot serve it, the prefix one can.
    three = [
        {"name": "a", "policy": "paged"},
        {"name": "b", "policy": "prefix"},
        {"name": "c", "policy": "paged"},
    ]
    routed = (
        "cluster.router: router 'prefix_aware' routes by the prefix each replica's cache would serve, but "
        "policy 'paged' has no prefix cache (no lookup). Use policy prefix or radix, or another router"
    )
    data = tiny(None, three, cluster={"replicas": 2, "router": "prefix_aware"})
    assert refusal(data) == [header(1), f"  variants.0 (a), variants.2 (c): {routed}"]
    # A variant's own router is named by its own key.
    own = [
        {"name": "a", "policy": "paged", "cluster": {"router": "prefix_aware"}},
        {"name": "b", "policy": "prefix"},
    ]
    assert refusal(tiny(None, own, cluster={"replicas": 2})) == [
        header(1),
        f"  variants.0 (a): variants.0.{routed}",
    ]


def test_a_model_that_does_not_fit_comes_first_then_the_engine_checks():
    data = tiny(
        {"enable_chunked_prefill": False, "max_num_batched_tokens": 512}, model="Llama-2-70B", gpu="T4-16GB"
    )
    lines = refusal(data)
    assert lines[0] == header(2) and len(lines) == 3
    assert lines[1].startswith("  variants.0 (v): model, gpu: Llama-2-70B on T4-16GB does not fit")
    assert lines[2] == (
        "  variants.0 (v): engine.max_num_batched_tokens: 512 is smaller than max_model_len (1,024) with "
        "enable_chunked_prefill: false, which vLLM refuses (longer prompts could never be prefilled). Raise "
        "max_num_batched_tokens, lower max_model_len, or enable chunked prefill"
    )


def test_engine_errors_and_warnings_reach_the_experiment_with_the_model_name():
    # Llama-2-7B: 4,096 tokens of context.
    long = tiny({"max_model_len": 8192}, model="Llama-2-7B")
    assert refusal(long)[1] == (
        "  variants.0 (v): engine.max_model_len: 8,192 is beyond Llama-2-7B's context length (4,096 tokens, "
        "max_position_embeddings); vLLM refuses this too. Lower it, or set engine.allow_long_max_model_len: "
        "true (vLLM: VLLM_ALLOW_LONG_MAX_MODEL_LEN=1) if the model really handles longer contexts"
    )
    odd = tiny({"block_size": 24}, [{"name": "a", "policy": "paged"}, {"name": "b", "policy": "paged"}])
    assert prepare(odd).warnings == [
        "every variant: engine.block_size: 24 is not a block size vLLM accepts (1, 8, 16, 32, 64, 128, 256); "
        "simulated as given"
    ]
    assert prepare(tiny({"block_size": 24})).warnings == [
        "variants.0 (v): engine.block_size: 24 is not a block size vLLM accepts (1, 8, 16, 32, 64, 128, 256); "
        "simulated as given"
    ]


def test_a_mamba_model_needs_the_hybrid_manager_word_for_word():
    # Nemotron-H-8B: 24 Mamba2 layers x 4,255,744 B (tests/test_layers.py) = 102,137,856 B a request.
    assert refusal(tiny(model="Nemotron-H-8B-Base-8K"))[1] == (
        "  variants.0 (v): variants.0.policy: Nemotron-H-8B-Base-8K has Mamba/linear-attention layers, a "
        "state of 102,137,856 B per request that policy 'paged' cannot hold (it keeps per-token K/V only); "
        "use policy vllm-hybrid"
    )


def test_policies_that_cannot_serve_speculative_decoding_are_named():
    radix = [{"name": "r", "policy": "radix", "engine": {"speculative": SPEC}}]
    assert refusal(tiny(None, radix))[1] == (
        "  variants.0 (r): variants.0.policy: policy 'radix' cannot hold the lookahead slots "
        "variants.0.engine.speculative needs (each decoding request's drafts); use policy paged, prefix or "
        "contiguous"
    )
    hybrid = tiny({"speculative": SPEC}, [{"name": "h", "policy": "vllm-hybrid"}], model="gpt-oss-20b")
    assert refusal(hybrid)[1] == (
        "  variants.0 (h): variants.0.policy: vllm-hybrid with engine.speculative is not modelled yet (a "
        "draft's slots in every KV group); use policy paged, prefix or contiguous"
    )


def test_pinning_problems_name_the_variant():
    data = tiny(None, [{"name": "v", "policy": "prefix", "pin_shared_prefixes": True}])
    data["workload"]["shared_prefix"] = {"num_prefixes": 2, "prefix_len": 8}
    assert refusal(data)[1] == (
        "  variants.0 (v): variants.0.pin_shared_prefixes: pinned prompt is shorter than one block (16 tokens)"
    )


# ------------------------------------------------------------------------------------------------
# What a prepared variant carries
# ------------------------------------------------------------------------------------------------


def test_a_single_engine_variant_as_prepared():
    prepared = prepare(tiny())
    assert prepared.warnings == []
    (variant,) = prepared.variants
    assert variant.variant is prepared.config.variants[0]
    assert variant.engine == EngineConfig(max_model_len=1024)
    # Llama-3.1-8B on an A100-80GB, block 16: 28,631 blocks (tests/test_capacity.py) = 458,096 tokens.
    assert variant.capacity.num_gpu_blocks == 28_631
    assert variant.pool == PoolSpec(458_096, 16, 1024, 131_072)
    assert variant.policy_name == "paged" and variant.policy.pool == variant.pool
    assert variant.max_model_len == 1024  # the engine's, not the model's 131,072
    assert variant.costs.block_size == 16 and variant.costs.model.name == "Llama-3.1-8B"
    assert (variant.cluster, variant.offload, variant.hybrid) == (None, None, None)
    assert variant.replica_policies == [variant.policy]  # one engine: its one policy
    assert (variant.pinned_tokens, variant.lockstep) == (0, False)
    assert (variant.speculative, variant.draft) == (None, None)
    assert variant.capacity_lines()[0] == "GPU KV cache size: 458,096 tokens"
    # Blocks of 32: 60,043,812,864 B // (32 x 131,072 B) = 14,315 blocks (tests/test_runner.py).
    (variant,) = prepare(tiny({"block_size": 32})).variants
    assert (variant.capacity.num_gpu_blocks, variant.pool.block_size) == (14_315, 32)


def test_a_clusters_replicas_each_get_their_own_policy():
    (variant,) = prepare(tiny(cluster={"replicas": 3})).variants
    assert variant.cluster == ClusterConfig(replicas=3)
    policies = variant.replica_policies
    assert len(policies) == 3 and len({id(policy) for policy in policies}) == 3
    assert variant.policy is policies[0]


def test_data_parallel_ranks_are_a_cluster_behind_vllms_balancer():
    (variant,) = prepare(tiny({"data_parallel_size": 2})).variants
    assert variant.cluster == ClusterConfig(replicas=2, router="vllm_dp")
    assert len(variant.replica_policies) == 2 and variant.policy is variant.replica_policies[0]


def test_a_hybrid_managers_pool_and_coordinators():
    data = tiny(None, [{"name": "h", "policy": "vllm-hybrid"}], model="gpt-oss-20b")
    (alone,) = prepare(data).variants
    assert isinstance(alone.policy, KVCoordinator) and alone.hybrid is not None
    assert alone.pool == alone.hybrid.pool and alone.pool.max_model_len == 1024
    assert (alone.replica_policies, alone.offload) == ([alone.policy], None)
    (cluster,) = prepare(data | {"cluster": {"replicas": 2}}).variants
    first, second = cluster.replica_policies
    assert first is not second and cluster.policy is first
    assert all(isinstance(policy, KVCoordinator) for policy in (first, second))


def test_expert_parallelism_over_two_gpus_steps_in_lockstep():
    data = tiny(
        {"enable_expert_parallel": True, "tensor_parallel_size": 2}, model="Qwen3-30B-A3B", gpu="H100-80GB"
    )
    (variant,) = prepare(data | {"cost_model": "derated"}).variants
    assert variant.lockstep is True


def test_speculative_decoding_is_resolved_with_its_draft():
    (variant,) = prepare(tiny({"speculative": SPEC})).variants
    speculative = variant.speculative
    # eagle3 with k = 3: 2k = 6 lookahead slots; its head's KV is one Llama layer:
    # 8 KV heads x 128 x 2 (K, V) x 2 B = 4,096 B a token (tests/test_speculative.py).
    assert (speculative.method, speculative.num_speculative_tokens, speculative.lookahead_slots) == (
        "eagle3",
        3,
        6,
    )
    assert variant.draft.kv_bytes_per_token == 4096
    assert variant.costs.label.endswith(" + speculative decoding (eagle3, k=3)")
    assert variant.costs.decode is not variant.costs.inner.decode


def test_files_a_variant_names_are_read_next_to_the_experiment(tmp_path):
    histogram = {**SPEC, "acceptance": {"histogram_file": "accepted.csv"}}
    variants = [{"name": "s", "policy": "paged", "engine": {"speculative": histogram}}]
    missing = refusal(tiny(None, variants), tmp_path)[1]
    assert missing.startswith(
        "  variants.0 (s): variants.0.engine.speculative.acceptance.histogram_file: accepted.csv: file not "
        f"found (tried {tmp_path / 'accepted.csv'}, "
    )
    (tmp_path / "accepted.csv").write_text("accepted_drafts,count\n0,1\n1,1\n2,1\n3,1\n")
    (variant,) = prepare(tiny(None, variants), tmp_path).variants
    # One step in four each of 0, 1, 2 and 3 accepted drafts.
    assert variant.speculative.acceptance.probabilities == pytest.approx((0.25, 0.25, 0.25, 0.25))
    # A cost profile that only the experiment's folder holds.
    shutil.copy(
        ROOT / "configs" / "profiles" / "analytic-llama-3.1-8b-a100-80gb.yaml", tmp_path / "here.yaml"
    )
    (variant,) = prepare(tiny(cost_model={"profile": "here.yaml"}), tmp_path).variants
    assert variant.costs.label == "analytic profile: A100-80GB (analytic, bfloat16), Llama-3.1-8B"


def test_shared_prefixes_are_pinned_in_a_prefix_cache():
    data = tiny(None, [{"name": "v", "policy": "prefix", "pin_shared_prefixes": True}])
    data["workload"]["shared_prefix"] = {"num_prefixes": 2, "prefix_len": 48}
    # Two system prompts of 48 tokens = 3 full blocks of 16 each: 96 slots pinned.
    assert prepare(data).variants[0].pinned_tokens == 96
    # In a cluster each replica pins its own copy; the count is one replica's.
    (variant,) = prepare(data | {"cluster": {"replicas": 2}}).variants
    assert variant.pinned_tokens == 96


def test_the_draft_is_sized_by_the_engine_and_speculative_keys():
    head = {**SPEC, "draft_layers": 2, "draft_vocab_size": 64_000}
    (variant,) = prepare(
        tiny({"speculative": head, "tensor_parallel_size": 2, "kv_cache_dtype": "fp8"})
    ).variants
    draft = variant.draft
    # Two Llama-3.1-8B layers, fp8 K and V of 8 / 2 = 4 KV heads x 128 per GPU: 2 x 4 x 128 x 2 x 1 B.
    assert draft.kv_bytes_per_token == 2_048
    # (2 x 218,112,128 + 64,000 x 4,096) params x 2 B / 2 GPUs = 698,368,256 B.
    assert draft.weight_bytes == 698_368_256
    assert (
        draft.description == "eagle3 head: 2 layer(s) of Llama-3.1-8B's width, own LM head of 64,000 tokens"
    )
    small = {**SPEC, "method": "draft_model", "draft_model": "Llama-3.2-1B"}
    (variant,) = prepare(tiny({"speculative": small})).variants
    # Llama-3.2-1B: 1,235,814,400 params at 2 B (tests/test_speculative.py).
    assert (variant.draft.description, variant.draft.weight_bytes) == (
        "draft model Llama-3.2-1B",
        2_471_628_800,
    )
    unknown = {**SPEC, "method": "draft_model", "draft_model": "no-such-draft"}
    assert refusal(tiny({"speculative": unknown}))[1].startswith(
        "  variants.0 (v): model, gpu: engine.speculative.draft_model: unknown model 'no-such-draft': not a preset ("
    )


# ------------------------------------------------------------------------------------------------
# The engine a prepared variant builds
# ------------------------------------------------------------------------------------------------


def built(data: dict):
    """The prepared variant of ``data`` and the engine the runner builds for it."""
    experiment = validate_experiment(data)
    (variant,) = prepare_experiment(experiment, Path("/nonexistent/experiment.yaml")).variants
    return variant, make_engine(experiment, variant, variant.policy, iter([]), MemorySink())


def test_sglangs_keys_and_the_cost_models_client_overhead_reach_the_engine():
    keys = {
        "scheduler": "sglang",
        "schedule_policy": "lpm",
        "schedule_conservativeness": 0.3,
        "chunked_prefill_size": 512,
        "max_prefill_tokens": 4096,
        "enable_mixed_chunk": True,
    }
    variant, engine = built(tiny(keys, [{"name": "r", "policy": "radix"}]))
    assert variant.costs.request_overhead_s > 0  # (a serving overhead the default cost model adds)
    # swap_space 4 GiB (the default) over blocks of 16 x 131,072 B = 2 MiB: 2,048 blocks.
    assert engine.knobs == EngineKnobs(
        max_model_len=1024,
        swap_space_blocks=2048,
        scheduler="sglang",
        schedule_policy="lpm",
        schedule_conservativeness=0.3,
        chunked_prefill_size=512,
        max_prefill_tokens=4096,
        enable_mixed_chunk=True,
        async_scheduling=True,  # engine.async_scheduling's default (the engine's is off)
        client_overhead_s=variant.costs.request_overhead_s,  # engine.client_overhead_s unset
    )
    assert engine.scheduler.mixes_batches
    _, default = built(tiny({"scheduler": "sglang"}, [{"name": "r", "policy": "radix"}]))
    assert not default.scheduler.mixes_batches  # SGLang's default: prefill batches first


def test_speculation_reaches_the_engine_and_a_lockstep_rank_steps_one_iteration_at_a_time():
    variant, engine = built(tiny({"speculative": SPEC}))
    assert engine.knobs.speculative is variant.speculative and engine.knobs.step_mode == "skip"
    ep = {"enable_expert_parallel": True, "tensor_parallel_size": 2}
    variant, engine = built(tiny(ep, model="Qwen3-30B-A3B", gpu="H100-80GB", cost_model="derated"))
    assert variant.engine.step_mode == "skip" and engine.knobs.step_mode == "single"


def test_sglangs_mamba_pool_caps_the_running_requests():
    # Nemotron-H with 3e9 B of KV at context 8,192: 13 Mamba slots, so 13 requests at most
    # (tests/test_sglang_mamba.py); fewer if max_num_seqs says so.
    engine = {"max_model_len": 8192, "kv_cache_memory_bytes": 3_000_000_000}
    data = tiny(engine, [{"name": "s", "policy": "sglang-hybrid"}], model="Nemotron-H-8B-Base-8K")
    assert built(data)[1].knobs.max_num_seqs == 13
    data["engine"]["max_num_seqs"] = 8
    assert built(data)[1].knobs.max_num_seqs == 8


# ------------------------------------------------------------------------------------------------
# The cost model of a variant's engine section
# ------------------------------------------------------------------------------------------------


def test_the_target_and_its_draft_are_priced_at_the_engines_tp_and_cache_dtype():
    engine = {"speculative": SPEC, "tensor_parallel_size": 2, "kv_cache_dtype": "fp8", "max_num_seqs": 7}
    data = tiny(engine, cost_model="analytic")
    (variant,) = prepare(data).variants
    target, step = variant.costs.inner, variant.costs.decode
    assert (target.tensor_parallel_size, target.kv_cache_dtype, target.block_size) == (2, "fp8", 16)
    assert target.label.startswith("analytic roofline")
    # Each of the k = 3 drafts is one decode step of the draft's own shapes, priced by the same cost
    # model at the same TP, cache dtype and block: the step's line is the target's plus 3 of those.
    experiment = validate_experiment(data)
    draft_costs = make_cost_model(
        experiment.cost_model,
        variant.draft.step_shapes,
        resolve_gpu("A100-80GB"),
        block_size=16,
        kv_cache_dtype="fp8",
        tensor_parallel_size=2,
    ).decode
    plain_draft = make_cost_model(
        experiment.cost_model, variant.draft.step_shapes, resolve_gpu("A100-80GB"), block_size=16
    )
    assert plain_draft.decode.per_context_token_s != draft_costs.per_context_token_s  # (the keys matter)
    assert step.intercept_s == pytest.approx(
        target.decode.intercept_s + 3 * draft_costs.intercept_s, rel=1e-12
    )
    assert step.per_context_token_s == pytest.approx(
        target.decode.per_context_token_s + 3 * draft_costs.per_context_token_s, rel=1e-12
    )
    assert len(step.batch_s) == 8  # one per batch of 0 to max_num_seqs = 7 requests
    # n-gram lookup proposes on the CPU: the step's line is the target's own.
    (ngram,) = prepare(tiny({"speculative": {**SPEC, "method": "ngram"}})).variants
    assert ngram.costs.decode.intercept_s == ngram.costs.inner.decode.intercept_s
    assert ngram.costs.label.endswith(" + speculative decoding (ngram, k=3)")


def test_a_rescaled_profile_prices_the_draft_too_read_next_to_the_experiment(tmp_path):
    shutil.copy(
        ROOT / "configs" / "profiles" / "analytic-llama-3.1-8b-a100-80gb.yaml", tmp_path / "here.yaml"
    )
    data = tiny({"speculative": SPEC}, cost_model={"profile": "here.yaml", "rescale": True})
    with pytest.warns(UserWarning, match="is rescaled to 'Llama-3.1-8B eagle3 head'"):
        (variant,) = prepare(data, tmp_path).variants
    assert variant.costs.label.endswith(" + speculative decoding (eagle3, k=3)")
    assert variant.costs.decode.intercept_s > variant.costs.inner.decode.intercept_s


def test_expert_parallel_ranks_exchange_tokens_over_the_data_parallel_group():
    ep = {"enable_expert_parallel": True, "data_parallel_size": 2}
    (variant,) = prepare(tiny(ep, model="Qwen3-30B-A3B", cost_model="derated")).variants
    # EP 2 over DP 2 x TP 1: 64 of the 128 routed experts per rank, an all-to-all over the 2 ranks.
    assert variant.costs.expert_parallel.local_experts == 64
    assert variant.costs.expert_parallel.all_to_all.data_parallel_size == 2
    # Each rank sizes its own pool, with half the experts' weights: 48 layers x 4 KV heads x 128 x 2 x 2 B
    # = 98,304 B of KV a token.
    line = variant.capacity_lines()[2]
    assert line.startswith(
        "data_parallel_size 2 (a pool per rank), routed experts dealt over 2 GPUs, per GPU: "
    )
    assert line.endswith(" (98,304 B per token)")


def test_a_single_group_policys_problems_name_the_variants_keys():
    most = [{"name": "c", "policy": "contiguous", "options": {"reservation": "most"}}]
    assert refusal(tiny(None, most))[1] == (
        "  variants.0 (c): variants.0.options: contiguous: unknown reservation 'most'; valid values: max, pow2, oracle"
    )
    # 400 blocks x 16 = 6,400 slots: buddy chunks of 4,096 at most, and 5,000 rounds up to 8,192.
    buddy = [
        {
            "name": "c",
            "policy": "contiguous",
            "options": {"placement": "buddy"},
            "engine": {"max_model_len": 5000},
        }
    ]
    assert refusal(tiny({"num_gpu_blocks_override": 400}, buddy))[1].endswith(
        "no request could ever be admitted. Lower variants.0.engine.max_model_len to at most 4,096, or give the "
        "KV cache more memory"
    )


def test_host_loads_take_the_offload_sections_bandwidth():
    data = tiny(
        {"max_model_len": 1024, "num_gpu_blocks_override": 64},
        [{"name": "tier", "policy": "prefix"}],
        offload={"host_memory_gib": 0.25, "bandwidth_gb_per_s": 8},
    )
    data["workload"] = {
        "num_requests": 40,
        "arrival": {"kind": "poisson", "rate_per_s": 2},
        "prompt_len": {"kind": "uniform", "low": 100, "high": 300},
        "output_len": 20,
        "multi_turn": {"turns": 3, "user_turn_len": 30, "think_time_s": 5},
    }
    config = validate_experiment(data)
    summary = run_variant(config, config.variants[0], Path(".")).summary
    # A block is 16 x 131,072 B = 2 MiB: 2,097,152 B / 8e9 B/s = 262.144 us a block loaded (not the
    # swap link's 2 MiB / 32 GB/s, which the engine would charge without the section's bandwidth).
    assert summary["host_loaded_blocks"] > 0
    assert summary["host_load_s"] == pytest.approx(summary["host_loaded_blocks"] * 262.144e-6, rel=1e-12)


def test_radix_contradicts_prefix_caching_off():
    engine = EngineConfig(enable_prefix_caching=False)
    with pytest.raises(ConfigError) as error:
        policy_name_for(VariantConfig(name="r", policy="radix"), engine)
    assert str(error.value) == "variant 'r': policy 'radix' contradicts enable_prefix_caching: false"


def test_the_experiment_reads_its_model_gpu_and_workload_next_to_its_file(tmp_path):
    folder = tmp_path / "here"
    folder.mkdir()
    shutil.copy(ROOT / "tests" / "data" / "hf_configs" / "llama-3.1-8b.json", folder / "my-model.json")
    (folder / "lengths.csv").write_text("tokens\n40\n40\n")
    data = tiny(model="my-model.json")
    data["workload"]["prompt_len"] = {"kind": "table", "path": "lengths.csv", "column": "tokens"}
    prepared = prepare(data, folder)
    assert (prepared.config.name, prepared.base_dir) == ("tiny", folder)
    assert [request.prompt_len for request in prepared.workload.requests()] == [40, 40, 40, 40]
    assert prepared.variants[0].capacity.num_gpu_blocks == 28_631  # as the preset's (test_runner.py)
    # An unknown GPU is named with the experiment's file.
    with pytest.raises(ConfigError) as error:
        prepare(tiny(gpu="H800"), folder)
    assert str(error.value).startswith(f"{folder / 'experiment.yaml'}: gpu: unknown GPU 'H800'; presets: ")


def test_a_histogram_file_that_cannot_be_read_or_lacks_its_header_is_named(tmp_path):
    # The OS's reason, not its "[Errno 21] ..." text.
    with pytest.raises(ConfigError) as error:
        read_acceptance_histogram(tmp_path, 3, "where")
    assert str(error.value) == f"where: cannot read {tmp_path}: Is a directory"
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ConfigError) as error:
        read_acceptance_histogram(empty, 3, "where")
    assert str(error.value) == f"where: {empty}: line 1 must be the header accepted_drafts,count"
    where = "variants.0.engine.speculative.acceptance.histogram_file"
    histogram = {**SPEC, "acceptance": {"histogram_file": "accepted.csv"}}
    data = tiny(None, [{"name": "s", "policy": "paged", "engine": {"speculative": histogram}}])
    path = tmp_path / "accepted.csv"
    path.write_text("drafts,steps\n0,1\n")
    assert refusal(data, tmp_path)[1] == (
        f"  variants.0 (s): {where}: {path}: line 1 must be the header accepted_drafts,count"
    )


def test_a_hybrid_pool_is_not_held_to_full_attentions_tokens():
    # gpt-oss-20b: 24 layers x 8 KV heads x 64 x 2 (K, V) x 2 B = 49,152 B a token with full
    # attention: 805,306,368 B hold 16,384 tokens (1,024 blocks), fewer than max_model_len 24,576. The
    # hybrid manager keeps only the 12 full layers' K/V per token (24,576 B: 32,768 slots) and a window
    # of 128 in the other 12: it holds the request (vLLM checks that per group).
    engine = {"max_model_len": 24_576, "kv_cache_memory_bytes": 805_306_368, "max_num_batched_tokens": 1024}
    data = tiny(engine, [{"name": "h", "policy": "vllm-hybrid"}], model="gpt-oss-20b", gpu="H100-80GB")
    (variant,) = prepare(data).variants
    assert (variant.capacity.num_gpu_blocks, variant.pool.kv_pool_tokens) == (1_024, 32_768)
    data["variants"] = [{"name": "p", "policy": "paged"}]
    assert refusal(data)[1].startswith(
        "  variants.0 (p): max_model_len (24,576 tokens) is larger than the KV cache holds (1,024 blocks x 16 = "
        "16,384 tokens), which vLLM refuses at start-up."
    )


def test_the_pool_takes_the_budgets_whole_blocks_to_the_byte():
    # A100-80GB: ceil(85,899,345,920 x 0.9) = 77,309,411,328 B, less Llama-3.1-8B's 16,060,522,496 B of
    # weights = 61,248,888,832 B = 29,205 blocks of 2 MiB and 1,564,672 B over. A reserve of exactly
    # that leaves 29,205 whole blocks (nothing else, no draft, takes a byte); one byte more, 29,204.
    (variant,) = prepare(tiny({"activation_reserve_bytes": 1_564_672})).variants
    assert variant.capacity.num_gpu_blocks == 29_205
    (variant,) = prepare(tiny({"activation_reserve_bytes": 1_564_673})).variants
    assert variant.capacity.num_gpu_blocks == 29_204


def test_a_disaggregated_variants_pools_read_files_next_to_the_experiment_and_pin(tmp_path):
    shutil.copy(
        ROOT / "configs" / "profiles" / "analytic-llama-3.1-8b-a100-80gb.yaml", tmp_path / "here.yaml"
    )
    pools = {"prefill": {"replicas": 1}, "decode": {"replicas": 2}}
    variants = [
        {"name": "pd", "policy": "prefix", "pin_shared_prefixes": True, "cluster": {"disaggregation": pools}}
    ]
    data = tiny(None, variants, cost_model={"profile": "here.yaml"})
    data["workload"]["shared_prefix"] = {"num_prefixes": 2, "prefix_len": 48}
    (decode,) = prepare(data, tmp_path).variants
    prefill = decode.prefill_pool
    assert (len(prefill.replica_policies), len(decode.replica_policies)) == (1, 2)
    # Two system prompts of 48 tokens = 3 full blocks of 16 each: 96 slots pinned in each pool.
    assert prefill.pinned_tokens == decode.pinned_tokens == 96
    assert (
        decode.costs.label
        == prefill.costs.label
        == "analytic profile: A100-80GB (analytic, bfloat16), Llama-3.1-8B"
    )


def test_what_speculation_adds_to_the_summary():
    (plain,) = prepare(tiny()).variants
    assert speculative_summary(plain) == {
        "speculative": "",
        "lookahead_slots": 0,
        "draft_weight_bytes": 0,
        "draft_kv_bytes_per_token": 0,
    }
    (variant,) = prepare(tiny({"speculative": SPEC})).variants
    summary = speculative_summary(variant)
    # 1 + a + a^2 + a^3 = 2.5 at a = 0.6914 (0.6914 + 0.4780 + 0.3305 = 1.4999).
    assert summary.pop("speculative") == (
        "eagle3, k=3, mean acceptance length 2.5 (mean acceptance length 2.5 (alpha 0.6914)); eagle3 head: "
        "1 layer(s) of Llama-3.1-8B's width, own LM head of 32,000 tokens"
    )
    # (218,112,128 + 32,000 x 4,096) params x 2 B; one layer's K/V: 8 x 128 x 2 x 2 B; 2k slots.
    assert summary == {
        "lookahead_slots": 6,
        "draft_weight_bytes": 698_368_256,
        "draft_kv_bytes_per_token": 4_096,
    }


def test_unknown_models_and_gpus_are_named_with_the_file_or_folder(tmp_path):
    with pytest.raises(ConfigError) as error:
        prepare(tiny(model="nope-model"), tmp_path)
    assert str(error.value).startswith(
        f"{tmp_path / 'experiment.yaml'}: model: unknown model 'nope-model': not a preset (Llama-2-7B, "
    )
    # Without a file (kvsim plan's preflight), the folder.
    with pytest.raises(ConfigError) as error:
        resolve_hardware(validate_experiment(tiny(gpu="H800")), tmp_path)
    assert str(error.value).startswith(f"{tmp_path}: gpu: unknown GPU 'H800'; presets: ")


def histogram(tmp_path: Path, text: str) -> dict[int, float]:
    path = tmp_path / "accepted.csv"
    path.write_text("accepted_drafts,count\n" + text)
    return read_acceptance_histogram(path, 3, "where")


def test_a_histogram_sums_repeated_rows_and_skips_blank_ones(tmp_path):
    # Rows of 0 accepted drafts: 1 + 2 = 3; a blank line and a line of empty cells are skipped, not the end.
    assert histogram(tmp_path, "0,1\n\n1,0\n , \n0,2\n3,0.5\n") == {0: 3.0, 1: 0.0, 3: 0.5}


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        ("0,x\n", "line 2: '0,x' is not a whole number and a count"),
        ("1,2\n4,1\n", "line 3: 4 accepted drafts is outside 0..3 (num_speculative_tokens)"),
        ("0,-1\n", "line 2: count '-1' must be >= 0"),
        ("0,nan\n", "line 2: count 'nan' must be >= 0"),
        ("0,0\n2,0\n", "no step counted (every count is 0, or no rows)"),
        ("", "no step counted (every count is 0, or no rows)"),
    ],
)
def test_a_histograms_problems_name_the_file_line_and_value(tmp_path, rows, problem):
    with pytest.raises(ConfigError) as error:
        histogram(tmp_path, rows)
    assert str(error.value) == f"where: {tmp_path / 'accepted.csv'}: {problem}"


def test_every_form_of_acceptance_gives_its_distribution(tmp_path):
    def knobs(acceptance: dict, method: str = "eagle3"):
        speculative = {"method": method, "num_speculative_tokens": 3, "acceptance": acceptance}
        return speculative_knobs(EngineConfig(speculative=speculative), tmp_path)

    # Per-position rates 0.8, 0.5, 0.2 (each draft accepted only after the ones before it): exactly
    # 0, 1, 2, 3 drafts accepted in 1 - 0.8, 0.8 - 0.5, 0.5 - 0.2 and 0.2 of the steps.
    rates = knobs({"rates": [0.8, 0.5, 0.2]})
    assert rates.acceptance.probabilities == pytest.approx((0.2, 0.3, 0.3, 0.2), abs=1e-12)
    # A histogram given inline: counts of 0, 1, 2 and 3 accepted drafts; the ones not given are 0.
    inline = knobs({"histogram": {0: 1, 3: 3}})
    assert inline.acceptance.probabilities == pytest.approx((0.25, 0.0, 0.0, 0.75), abs=1e-12)
    # eagle3 holds 2k = 6 lookahead slots; n-gram k = 3 (its proposals need no slots of their own).
    assert (inline.method, inline.num_speculative_tokens, inline.lookahead_slots) == ("eagle3", 3, 6)
    ngram = knobs({"histogram": {1: 1}}, method="ngram")
    assert (ngram.method, ngram.lookahead_slots) == ("ngram", 3)
    # Without a key function (sim/validation), a missing file is named by the engine section's key.
    with pytest.raises(ConfigError) as error:
        knobs({"histogram_file": "missing.csv"})
    assert str(error.value).startswith(
        "engine.speculative.acceptance.histogram_file: missing.csv: file not found "
        f"(tried {tmp_path / 'missing.csv'}, "
    )


def test_unknown_options_are_listed_with_the_valid_ones():
    assert unknown_options_error("contiguous", {"size": 1, "colour": 2, "reservation": "max"}) == (
        "unknown option(s) 'colour', 'size' for policy 'contiguous' (valid: reservation, placement)"
    )
    assert (
        unknown_options_error("paged", {"x": 1}) == "unknown option(s) 'x' for policy 'paged' (valid: none)"
    )
    assert unknown_options_error("contiguous", {"placement": "buddy"}) is None
