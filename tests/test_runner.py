"""``sim/runner/``: the summary of a variant from a hand-made requests table, the policy name
rules, prefix pinning and a small run of one variant end to end. Every expected value is worked out
by hand in the comments."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from policies import PoolSpec, make_policy
from policies.base import PolicyStats
from sim.config import ConfigError, EngineConfig, VariantConfig, validate_experiment
from sim.native import engine_build
from sim.outputs.metrics import Counters
from sim.outputs.sinks import MemorySink
from sim.runner import pin_prefixes, policy_name_for, prepare_experiment, run_variant, summarize
from sim.runner.engines import make_engine

NAN = math.nan


def fake_engine(now: float, queries: int):
    """What ``summarize`` reads from an engine, with distinct numbers everywhere."""
    return SimpleNamespace(
        env=SimpleNamespace(now=now),
        counters=Counters(preemptions=3, swapped_out_blocks=4, iterations=9),
        wakeups=2,
        kv=SimpleNamespace(
            stats=PolicyStats(
                prefix_cache_queries=queries,
                prefix_cache_hits=25,
                evictions=6,
                cow_copies=7,
                fork_copied_tokens=8,
            )
        ),
        recorder=SimpleNamespace(
            peak_running=5, time_averages=lambda end: {"mean_used_frac": end / 16, "mean_running": 1.5}
        ),
    )


def summary_for(table: pd.DataFrame, now: float = 8.0, queries: int = 100, engine=None) -> dict:
    """A hand-made summary: a pool of 160 slots in blocks of 16, 3 bytes a token (``engine``: another
    stand-in than ``fake_engine(now, queries)``)."""
    return summarize(
        engine or fake_engine(now, queries),
        table,
        VariantConfig(name="v", policy="prefix", options={"k": 1}),
        "prefix",
        PoolSpec(160, 16, 64, kv_bytes_per_token=3),
        SimpleNamespace(
            num_gpu_blocks=10, tensor_parallel_size=1, data_parallel_size=1, expert_parallel_size=1
        ),
        "hand",
        0.5,
        64,
    )


def test_summary_of_a_hand_made_table():
    # Four finished requests (widths max(n, beam) = 1, 2, 3, 1), one of each other outcome.
    table = pd.DataFrame(
        {
            "outcome": ["finished"] * 4 + ["rejected", "failed_oom", "unfinished"],
            "n": [1, 2, 1, 1, 1, 1, 1],
            "beam_width": [1, 1, 3, 1, 1, 1, 1],
            "output_tokens": [10, 5, 4, 1, 7, 7, 7],
            # all samples/beams together (here every sample runs output_tokens): output x width
            "sample_output_tokens": [10, 10, 12, 1, 7, 7, 7],
            "ttft_s": [1.0, 2.0, 4.0, 3.0, NAN, NAN, 0.5],
            "tpot_s": [0.5, 0.25, 1.0, NAN, NAN, NAN, 9.0],
            "e2e_s": [6.0, 3.0, 7.0, 3.0, NAN, NAN, NAN],
            # decode steps and their tokens (speculative decoding: several tokens a step)
            "decode_steps": [9, 2, 3, 0, 0, 0, 4],
            "decode_step_tokens": [9, 4, 3, 0, 0, 0, 6],
        }
    )
    # Tokens per decode step of the finished ones: (9 + 4 + 3) / (9 + 2 + 3) = 16 / 14.
    # Output tokens of finished requests: 10 x 1 + 5 x 2 + 4 x 3 + 1 x 1 = 33, over 8 s: 4.125/s.
    # TTFT 1, 2, 3, 4: p50 at rank 1.5 -> 2.5; p99 at rank 2.97 -> 3 + 0.97 = 3.97.
    # TPOT 0.25, 0.5, 1.0 (the 1-token request has none): p50 0.5.
    # e2e 3, 3, 6, 7: p50 at rank 1.5 -> 3 + 0.5 x 3 = 4.5; p99 at rank 2.97 -> 6 + 0.97 = 6.97.
    # (The unfinished request's TTFT and TPOT are not counted.)
    summary = summary_for(table)
    expected = {
        "variant": "v",
        "policy": "prefix",
        "policy_options": {"k": 1},
        "block_size": 16,
        "tensor_parallel_size": 1,
        "data_parallel_size": 1,
        "expert_parallel_size": 1,
        "max_model_len": 64,
        "kv_pool_tokens": 160,
        "kv_context_tokens": 160,
        "kv_pool_bytes": 480,
        "kv_bytes_per_token": 3,
        "num_gpu_blocks": 10,
        "cost_model": "hand",
        "kv_groups": 1,  # (a single-group policy)
        "requests_total": 7,
        "requests_finished": 4,
        "requests_rejected": 1,
        "requests_failed_oom": 1,
        "requests_unfinished": 1,
        "preemptions": 3,
        "swapped_out_blocks": 4,
        "peak_running": 5,
        "cow_copies": 7,
        "fork_copied_tokens": 8,
        "evictions": 6,
        "prefix_cache_queries": 100,
        "prefix_cache_hits": 25,
        "prefix_cache_hit_rate": 0.25,
        "output_tokens_per_s": 4.125,
        "ttft_p50_s": 2.5,
        "ttft_p99_s": pytest.approx(3.97, rel=1e-12),
        "tpot_p50_s": 0.5,
        "tokens_per_decode_step": 16 / 14,
        "e2e_p50_s": 4.5,
        "e2e_p99_s": pytest.approx(6.97, rel=1e-12),
        "iterations": 9,
        "engine_wakeups": 2,
        "simulated_s": 8.0,
        "wall_s": 0.5,
        "engine_build": engine_build(),  # python, or native under the compiled build
        # the recorder's time averages, merged in as they come
        "mean_used_frac": 0.5,
        "mean_running": 1.5,
    }
    # The memory-wait counters and the cost model's error band come from the engine and the cost model,
    # not from this table: compared only for presence here.
    assert {key: summary[key] for key in expected} == expected
    assert set(summary) - set(expected) <= {
        "admission_waits",
        "oom_failures",
        "cost_model_error_band",
    }


def test_summary_with_nothing_finished_and_no_prefix_queries():
    table = pd.DataFrame(
        {
            "outcome": ["rejected", "unfinished"],
            "n": [1, 1],
            "beam_width": [1, 1],
            "output_tokens": [3, 3],
            "sample_output_tokens": [3, 3],
            "ttft_s": [NAN, 1.0],
            "tpot_s": [NAN, NAN],
            "e2e_s": [NAN, NAN],
        }
    )
    summary = summary_for(table, now=0.0, queries=0)
    assert summary["requests_finished"] == 0 and summary["requests_total"] == 2
    assert summary["output_tokens_per_s"] == 0.0
    assert summary_for(table, now=4.0)["output_tokens_per_s"] == 0.0  # time passed, nothing finished
    assert summary["prefix_cache_hit_rate"] is None
    for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "e2e_p50_s", "e2e_p99_s"):
        assert summary[key] is None, key


@pytest.mark.parametrize(
    ("caching", "policy", "expected"),
    [
        (None, "paged", "paged"),
        (None, "prefix", "prefix"),
        (None, "contiguous", "contiguous"),
        (True, "paged", "prefix"),
        (True, "prefix", "prefix"),
        (False, "paged", "paged"),
        (False, "contiguous", "contiguous"),
    ],
)
def test_policy_name_follows_enable_prefix_caching(caching, policy, expected):
    engine = EngineConfig(enable_prefix_caching=caching)
    assert policy_name_for(VariantConfig(name="v", policy=policy), engine) == expected


@pytest.mark.parametrize(
    ("caching", "policy", "message"),
    [
        (False, "prefix", "variant 'v': policy 'prefix' contradicts enable_prefix_caching: false"),
        (True, "contiguous", "variant 'v': the contiguous policy has no prefix cache"),
    ],
)
def test_policy_name_contradictions_are_errors(caching, policy, message):
    with pytest.raises(ConfigError) as error:
        policy_name_for(VariantConfig(name="v", policy=policy), EngineConfig(enable_prefix_caching=caching))
    assert str(error.value) == message


def test_pin_prefixes_returns_the_slots_pinned_and_turns_errors_into_config_errors():
    # Block 4: a 10-token prefix pins its 2 full blocks (8 slots), a 4-token one its 1 block: 12.
    policy = make_policy("prefix", PoolSpec(40, 4, 32))
    assert pin_prefixes(policy, [((1, 10),), ((2, 4),)]) == 12
    with pytest.raises(ConfigError, match="pin_shared_prefixes: policy 'paged' has no prefix cache"):
        pin_prefixes(make_policy("paged", PoolSpec(40, 4, 32)), [((1, 10),)])
    with pytest.raises(ConfigError, match="pin_shared_prefixes"):
        pin_prefixes(make_policy("prefix", PoolSpec(8, 4, 32)), [((3, 40),)])


@pytest.mark.parametrize("cluster", [None, {"replicas": 2, "router": "round_robin"}])
def test_the_progress_bar_counts_requests_as_they_arrive(monkeypatch, cluster):
    """The engine (or a cluster) reads its stream in batches of up to 1,024 requests; the bar still
    advances with the simulated arrivals (1 request every 0.5 s here), not all at once when read."""
    import sim.outputs.progress
    import sim.runner

    bars: list[dict] = []

    class FakeBar:
        def __init__(self, **options):
            self.options, self.updates = options, []
            bars.append({"bar": self})

        def update(self, count):
            self.updates.append((count, self.engine.env.now if hasattr(self, "engine") else None))

        def close(self):
            pass

        def __iter__(self):  # the variants' bar of run_experiment
            return iter(self.options.get("iterable", ()))

    monkeypatch.setattr(sim.runner.run, "tqdm", lambda *args, **options: FakeBar(**options))
    monkeypatch.setattr(sim.outputs.progress, "tqdm", lambda *args, **options: FakeBar(**options))
    make_engine = sim.runner.run.make_engine

    def engine_seen_by_the_bar(*args, **options):
        engine = make_engine(*args, **options)
        bars[-1]["bar"].engine = engine  # each update records the simulated time it came at
        return engine

    # (A single engine is made in sim/runner/run.py, a cluster's replicas in sim/runner/clusters.py.)
    monkeypatch.setattr(sim.runner.run, "make_engine", engine_seen_by_the_bar)
    monkeypatch.setattr(sim.runner.clusters, "make_engine", engine_seen_by_the_bar)
    data = {
        "name": "bar",
        "model": "Llama-3.1-8B",
        "gpu": "A100-80GB",
        "engine": {"max_model_len": 1024},
        "workload": {
            "num_requests": 5,
            "arrival": {"kind": "constant", "rate_per_s": 2.0},
            "prompt_len": 64,
            "output_len": 4,
        },
        "variants": [{"name": "paged", "policy": "paged"}],
    }
    if cluster is not None:
        data["cluster"] = cluster
    config = validate_experiment(data)
    run_variant(config, config.variants[0], Path("."), progress=True)
    (bar,) = [entry["bar"] for entry in bars]
    # Constant rate 2/s: arrivals at 0, 0.5, 1.0, 1.5 and 2.0 s, one update each, at that time.
    assert bar.options["total"] == 5 and bar.updates == [(1, 0.5 * index) for index in range(5)]
    bars.clear()
    run_variant(config, config.variants[0], Path("."), progress=False)
    assert bars[0]["bar"].updates == []  # no bar: the engine is given no progress hook


def test_one_small_variant_end_to_end():
    """Llama-3.1-8B on an A100-80GB (458,096 KV tokens, test_capacity.py), 12 requests of a fixed
    128-token prompt and 16 output tokens arriving together, max_num_seqs 4 and a 256-token budget:
    everything finishes, at most 4 run at once, and the knobs reach the engine."""
    data = {
        "name": "tiny",
        "seed": 3,
        "model": "Llama-3.1-8B",
        "gpu": "A100-80GB",
        "cost_model": "analytic",  # the roofline, whose times the expectations below were worked with
        "engine": {
            "block_size": 32,
            "max_model_len": 1024,
            "max_num_seqs": 4,
            "max_num_batched_tokens": 256,
        },
        "workload": {
            "num_requests": 12,
            "arrival": {"kind": "batch"},
            "prompt_len": 128,
            "output_len": 16,
        },
        "variants": [{"name": "paged", "policy": "paged"}],
    }
    config = validate_experiment(data)
    result = run_variant(config, config.variants[0], Path("."))
    summary = result.summary
    # Block 32: 60,043,812,864 // (32 x 131,072) = 14,315 blocks = 458,080 tokens.
    assert (summary["block_size"], summary["kv_pool_tokens"], summary["num_gpu_blocks"]) == (
        32,
        458_080,
        14_315,
    )
    assert summary["max_model_len"] == 1024
    assert summary["kv_bytes_per_token"] == 131_072
    assert result.capacity_lines == [
        "GPU KV cache size: 458,080 tokens",
        "Maximum concurrency for 1,024 tokens per request: 447.34x",
    ]
    assert summary["requests_total"] == summary["requests_finished"] == 12
    assert summary["peak_running"] == 4  # max_num_seqs reached the engine
    assert summary["policy"] == "paged" and summary["cost_model"].startswith("analytic roofline")
    requests = result.requests
    # Two prompts of 128 per 256-token budget (then decode takes 4 of it): the first two requests are
    # admitted at 0; nobody waits for memory.
    admitted = sorted(requests["admitted_s"])
    assert admitted[:2] == [0.0, 0.0] and admitted[2] > 0.0
    assert summary["preemptions"] == 0
    # 12 x 16 output tokens.
    assert summary["output_tokens_per_s"] * summary["simulated_s"] == pytest.approx(192)


def tiny_experiment(engine: dict | None = None, variants: list[dict] | None = None, **top) -> dict:
    return {
        "name": "tiny",
        "seed": 3,
        "model": "Llama-3.1-8B",
        "gpu": "A100-80GB",
        "engine": {"max_model_len": 1024, **(engine or {})},
        "workload": {"num_requests": 4, "arrival": {"kind": "batch"}, "prompt_len": 64, "output_len": 4},
        "variants": variants or [{"name": "v", "policy": "paged"}],
        **top,
    }


def run_tiny(data: dict, base_dir: Path = Path(".")):
    config = validate_experiment(data)
    return run_variant(config, config.variants[0], base_dir)


@pytest.mark.parametrize(
    ("engine", "top", "blocks", "kv_bytes_per_token"),
    [
        # Hand-worked in test_capacity.py (Llama-3.1-8B, A100-80GB, block 16 unless said):
        ({}, {}, 28_631, 131_072),
        ({"num_gpu_blocks_override": 100}, {}, 100, 131_072),
        ({"kv_cache_memory_bytes": 10 * 2**30}, {}, 5_120, 131_072),
        ({"activation_reserve_bytes": 0}, {}, 29_205, 131_072),
        ({"gpu_memory_utilization": 1.0}, {}, 32_727, 131_072),
        ({"kv_cache_dtype": "fp8"}, {}, 57_262, 65_536),
        ({"tensor_parallel_size": 4}, {"model": "Llama-3.1-70B", "gpu": "H100-80GB"}, 31_257, 81_920),
    ],
)
def test_every_pool_knob_reaches_the_sizing(engine, top, blocks, kv_bytes_per_token):
    summary = run_tiny(tiny_experiment(engine, **top)).summary
    assert (summary["num_gpu_blocks"], summary["kv_bytes_per_token"]) == (blocks, kv_bytes_per_token)
    assert summary["kv_pool_tokens"] == blocks * 16
    assert summary["kv_pool_bytes"] == blocks * 16 * kv_bytes_per_token


@pytest.mark.python_sources  # subclasses Engine
def test_every_engine_knob_reaches_the_engine(monkeypatch):
    import sim.runner
    from sim.engine.core import Engine, EngineKnobs

    built = {}

    class Recording(Engine):
        def __init__(self, policy, costs, knobs, requests, **kwargs):
            built.update(knobs=knobs, costs=costs, policy=policy, **kwargs)
            super().__init__(policy, costs, knobs, requests, **kwargs)

    monkeypatch.setattr(sim.runner.engines, "Engine", Recording)
    engine = {
        "block_size": 32,
        "max_num_seqs": 7,
        "max_num_batched_tokens": 1100,  # chunked prefill off: vLLM needs it >= max_model_len
        "enable_chunked_prefill": False,
        "preemption_mode": "swap",
        "swap_space": 1.5,
        "watermark": 0.02,
        "on_oom": "fail",
        "beam_reparent_prob": 0.3,
        "step_mode": "single",
        "kv_cache_dtype": "fp8",
        "client_overhead_s": 0.25,
        "async_scheduling": False,  # (on by default)
    }
    run_tiny(tiny_experiment(engine, seed=11))
    # fp8 KV: 65,536 B per token; a block of 32 is 2 MiB: 60,043,812,864 // 2 MiB = 28,631 blocks.
    # Swap space: 1.5 GiB / 2 MiB per block = 768 blocks.
    assert built["knobs"] == EngineKnobs(
        max_model_len=1024,
        max_num_seqs=7,
        max_num_batched_tokens=1100,
        enable_chunked_prefill=False,
        preemption_mode="swap",
        swap_space_blocks=768,
        watermark=0.02,
        on_oom="fail",
        beam_reparent_prob=0.3,
        step_mode="single",
        client_overhead_s=0.25,
        async_scheduling=False,
    )
    assert (built["seed"], built["block_size"]) == (11, 32)
    assert built["policy"].pool == PoolSpec(28_631 * 32, 32, 1024, 65_536)
    assert built["costs"].block_size == 32 and built["costs"].kv_cache_dtype == "fp8"


def test_model_from_a_config_json_next_to_the_experiment(tmp_path):
    # A HuggingFace config.json named relative to the experiment's folder is read from there.
    source = Path(__file__).parent / "data" / "hf_configs" / "llama-3.1-8b.json"
    (tmp_path / "my-model.json").write_text(source.read_text())
    summary = run_tiny(tiny_experiment(model="my-model.json"), base_dir=tmp_path).summary
    assert (summary["num_gpu_blocks"], summary["kv_bytes_per_token"]) == (28_631, 131_072)
    with pytest.raises(ConfigError, match=f"^{tmp_path}: .*missing-model"):
        run_tiny(tiny_experiment(model="missing-model"), base_dir=tmp_path)


def test_bad_policy_options_and_a_model_that_does_not_fit_are_config_errors():
    data = tiny_experiment()
    data["variants"] = [{"name": "v", "policy": "contiguous", "options": {"colour": "red"}}]
    with pytest.raises(
        ConfigError,
        match=r"^variants\.0\.options: unknown option\(s\) 'colour' for policy 'contiguous' "
        r"\(valid: reservation, placement\)$",
    ):
        run_tiny(data)
    with pytest.raises(ConfigError, match="^model, gpu: Llama-2-70B on T4-16GB does not fit"):
        run_tiny(tiny_experiment(model="Llama-2-70B", gpu="T4-16GB"))


def test_contiguous_options_reach_the_policy_and_pinning_is_counted():
    data = tiny_experiment()
    data["variants"] = [{"name": "v", "policy": "contiguous", "options": {"reservation": "oracle"}}]
    # Oracle reserves exactly 64 + 4 tokens: no internal fragmentation at all.
    assert run_tiny(data).summary["mean_internal_frag_frac"] == 0.0
    data = tiny_experiment()
    data["workload"]["shared_prefix"] = {"num_prefixes": 2, "prefix_len": 48}
    data["variants"] = [{"name": "v", "policy": "prefix", "pin_shared_prefixes": True}]
    # Two system prompts of 48 tokens = 3 full blocks of 16 each: 96 slots pinned.
    assert run_tiny(data).summary["pinned_tokens"] == 96
    data["variants"] = [{"name": "v", "policy": "prefix"}]
    assert run_tiny(data).summary["pinned_tokens"] == 0


def test_outputs_stream_to_the_folder_and_the_result_carries_its_name(tmp_path):
    import time

    data = tiny_experiment(output={"timeseries_format": "csv"})
    config = validate_experiment(data)
    before = time.perf_counter()
    result = run_variant(config, config.variants[0], Path("."), out_dir=tmp_path)
    elapsed = time.perf_counter() - before
    assert result.name == "v"
    assert sorted(path.name for path in (tmp_path / "v").iterdir()) == ["requests.csv", "timeseries.csv"]
    assert len(result.requests) == 4
    # The engine's wall time is measured inside the call.
    assert 0.0 <= result.summary["wall_s"] <= elapsed


def test_files_named_by_the_experiment_are_read_next_to_it(tmp_path):
    # A cost profile and a length table that exist only in the experiment's folder.
    source = Path(__file__).parents[1] / "configs" / "profiles" / "analytic-llama-3.1-8b-a100-80gb.yaml"
    (tmp_path / "only-here.yaml").write_text(source.read_text())
    (tmp_path / "lengths.csv").write_text("tokens\n40\n40\n")
    data = tiny_experiment(cost_model={"profile": "only-here.yaml"})
    data["workload"]["prompt_len"] = {"kind": "table", "path": "lengths.csv", "column": "tokens"}
    result = run_tiny(data, base_dir=tmp_path)
    assert "profile" in result.summary["cost_model"]
    assert set(result.requests["prompt_tokens"]) == {40}
    # A preset name that happens to be a file there is still the preset (only .json names are paths).
    (tmp_path / "Llama-3.1-8B").write_text("not a config")
    assert run_tiny(tiny_experiment(), base_dir=tmp_path).summary["num_gpu_blocks"] == 28_631


def test_closed_loop_users_send_their_next_requests_and_until_s_stops_the_run():
    # 2 users, 6 requests: each user's next request follows its previous one's finish.
    data = tiny_experiment()
    data["workload"]["arrival"] = {"kind": "closed_loop", "num_users": 2}
    data["workload"]["num_requests"] = 6
    summary = run_tiny(data).summary
    assert summary["requests_total"] == summary["requests_finished"] == 6
    # Stopped after 1 ms: the 4 requests are still in the system, unfinished.
    stopped = run_tiny(tiny_experiment(until_s=0.001)).summary
    assert (stopped["requests_unfinished"], stopped["simulated_s"]) == (4, 0.001)


def test_run_experiment_runs_every_variant_from_the_config_folder(tmp_path):
    from sim.runner import run_experiment

    source = Path(__file__).parent / "data" / "hf_configs" / "llama-3.1-8b.json"
    (tmp_path / "my-model.json").write_text(source.read_text())
    data = tiny_experiment(model="my-model.json")
    data["variants"] = [{"name": "a", "policy": "paged"}, {"name": "b", "policy": "prefix"}]
    results = run_experiment(
        validate_experiment(data), tmp_path / "experiment.yaml", out_dir=tmp_path / "out"
    )
    assert [r.name for r in results] == ["a", "b"]
    assert [r.summary["policy"] for r in results] == ["paged", "prefix"]
    assert all((tmp_path / "out" / name / "requests.parquet").is_file() for name in ("a", "b"))


@pytest.mark.parametrize(("client_overhead_s", "expected"), [(None, "cost model"), (0.0, 0.0), (0.25, 0.25)])
def test_an_explicit_client_overhead_even_zero_replaces_the_cost_models(client_overhead_s, expected):
    data = {
        "name": "overhead",
        "model": "Llama-3.1-8B",
        "gpu": "H100-80GB",
        "engine": {"max_model_len": 1024, "client_overhead_s": client_overhead_s},
        "workload": {"num_requests": 2, "arrival": {"kind": "batch"}, "prompt_len": 64, "output_len": 4},
        "variants": [{"name": "paged", "policy": "paged"}],
    }
    config = validate_experiment(data)
    (variant,) = prepare_experiment(config, Path("/nonexistent/overhead.yaml")).variants
    # The default cost model adds a serving overhead per request; 0 is a choice, not "unset".
    assert variant.costs.request_overhead_s > 0
    engine = make_engine(config, variant, variant.policy, iter([]), MemorySink())
    wanted = variant.costs.request_overhead_s if expected == "cost model" else expected
    assert engine.knobs.client_overhead_s == wanted


def test_the_in_batch_thresholds_reach_sglang_s_scheduler():
    """engine.in_batch_prefix_check_tokens / _deprioritize_tokens, from the config to the scheduler
    that orders the queue (left out: SGLang's 32 and 32)."""
    data = {
        "name": "in-batch",
        "model": "Llama-3.1-8B",
        "gpu": "H100-80GB",
        "engine": {
            "max_model_len": 1024,
            "scheduler": "sglang",
            "schedule_policy": "lpm",
            "in_batch_prefix_check_tokens": 64,
            "in_batch_prefix_deprioritize_tokens": 16,
        },
        "workload": {"num_requests": 2, "arrival": {"kind": "batch"}, "prompt_len": 64, "output_len": 4},
        "variants": [{"name": "radix", "policy": "radix"}],
    }
    for engine_keys, expected in ((data["engine"], (64, 16)), ({"scheduler": "sglang"}, (32, 32))):
        config = validate_experiment({**data, "engine": engine_keys})
        (variant,) = prepare_experiment(config, Path("/nonexistent/in-batch.yaml")).variants
        engine = make_engine(config, variant, variant.policy, iter([]), MemorySink())
        scheduler = engine.scheduler
        assert (scheduler.in_batch_check_tokens, scheduler.in_batch_deprioritize_tokens) == expected
