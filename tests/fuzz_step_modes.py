"""Event skipping against single stepping on random experiments: a differential fuzzer.

Single stepping runs every iteration; event skipping jumps over the iterations between events in
closed form. Both must give every request the same outcome, preemptions, cached tokens and times,
and the same summary (but the wake-ups and the wall time). The unit tests check this on fixed
scenarios per feature; this draws whole experiments (model, allocator and its options, engine knobs,
stream) from the space users write, runs each in both modes through the runner, and reports every
case that differs, written out as a YAML experiment that reproduces it.

    .venv/bin/python -m tests.fuzz_step_modes --cases 200 --seed 1 [--jobs 2] [--out DIR] [--case N]   # make fuzz-step-modes
    KVSIM_NATIVE=0 .venv/bin/python -m tests.fuzz_step_modes --builds ...   # make fuzz-builds

With ``--builds`` every case also runs under the compiled build (``make native``), in a worker
process, and the two builds must agree bit for bit: every summary value and a checksum of every
table, for both variants (the compiled build's step modes are compared as well).

A case the configuration checks refuse (an allocator that cannot hold the model, a pool smaller
than one request) is counted and skipped: refusing it before anything runs is the promise there.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from policies.base import MemoryBreakdown
from sim.config import ConfigError, validate_experiment
from sim.hardware.models import resolve_model
from sim.outputs.metrics import BREAKDOWN_COLUMNS
from sim.runner import run_experiment

# Summary keys that may differ between the step modes: how the engine got there, not where.
MODE_KEYS = {"engine_wakeups", "wall_s", "engine_build"}
REQUEST_KEYS = ("outcome", "preemptions", "cached_prompt_tokens")
REQUEST_TIMES = ("admitted_s", "first_token_s", "finish_s")
REL = 1e-9
ABS = 1e-9


@dataclass(frozen=True)
class ModelChoice:
    name: str
    gpu: str
    tensor_parallel_size: int
    policies: tuple[str, ...]
    max_model_len: int
    # A shipped config.json with these keys changed (small windows: many crossings per stream).
    derived_from: str | None = None
    changes: tuple[tuple[str, Any], ...] = ()


# The allocators each model runs on (those the configuration checks would refuse are not drawn:
# sglang-hybrid needs full-attention and sliding-window layers, or Mamba ones).
FULL = ("paged", "prefix", "contiguous", "radix", "vllm-hybrid", "jenga")
WINDOWED = ("paged", "vllm-hybrid", "jenga")
SWA_AND_FULL = ("paged", "vllm-hybrid", "sglang-hybrid", "jenga")
STATES = ("vllm-hybrid", "sglang-hybrid")
HYBRID = ("vllm-hybrid", "sglang-hybrid", "jenga")  # (none runs in a disaggregated cluster yet)
MODELS = (
    ModelChoice("Llama-3.1-8B", "H100-80GB", 1, FULL, 4096),
    ModelChoice("gpt-oss-20b", "H100-80GB", 1, SWA_AND_FULL, 4096),
    ModelChoice("Gemma-3-27B", "H100-80GB", 1, WINDOWED, 4096),
    ModelChoice("Mistral-7B-v0.1", "H100-80GB", 1, WINDOWED, 8192),
    ModelChoice("Llama-4-Scout-17B-16E", "H200", 2, WINDOWED, 16384),
    ModelChoice("Qwen3-Next-80B-A3B", "H200", 2, STATES, 4096),
    ModelChoice("Nemotron-H-8B-Base-8K", "H100-80GB", 1, STATES, 4096),
    ModelChoice(
        "gpt-oss-20b-window-24",
        "H100-80GB",
        1,
        SWA_AND_FULL,
        2048,
        "configs/models/gpt-oss-20b.config.json",
        (("sliding_window", 24),),
    ),
    ModelChoice(
        "llama-chunked-48",
        "H100-80GB",
        1,
        WINDOWED,
        2048,
        "tests/data/hf_configs/llama-3.1-8b.json",
        (("attention_chunk_size", 48), ("no_rope_layers", [1, 1, 1, 0] * 8)),
    ),
    ModelChoice(
        "gemma-like-window-40",
        "H100-80GB",
        1,
        ("paged", "vllm-hybrid", "jenga"),
        2048,
        "tests/data/hf_configs/gemma2-like.json",
        (
            ("sliding_window", 40),
            (
                "layer_types",
                ["full_attention" if (layer + 1) % 6 == 0 else "sliding_attention" for layer in range(26)],
            ),
        ),
    ),
    ModelChoice(
        "qwen3-next-small-state",
        "H200",
        2,
        STATES,
        4096,
        "configs/models/qwen3-next-80b-a3b.config.json",
        (("linear_num_value_heads", 4), ("linear_num_key_heads", 2), ("num_params", 79_700_000_000)),
    ),
)


def model_reference(model: ModelChoice, folder: Path) -> str:
    """What an experiment's ``model:`` says: a preset's name, or a derived config.json written into
    ``folder`` (kept beside the failing cases, which name it)."""
    if model.derived_from is None:
        return model.name
    raw = json.loads(Path(model.derived_from).read_text())
    raw.update(dict(model.changes))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{model.name}.config.json"
    path.write_text(json.dumps(raw, indent=1))
    return str(path.resolve())


def _lengths(rng: random.Random, low: int, high: int) -> dict[str, Any]:
    a, b = sorted((rng.randint(low, high), rng.randint(low, high)))
    return {"kind": "uniform", "low": a, "high": max(b, a + 1)}


def draw_case(rng: random.Random, index: int, folder: Path) -> dict[str, Any]:
    """One random experiment with two variants, ``single`` and ``skip``, identical but the step mode."""
    model = rng.choice(MODELS)
    policy = rng.choice(model.policies)
    model_name = model_reference(model, folder)
    spec = resolve_model(model_name)
    full_bytes_per_token = max(1, spec.kv_bytes_per_token() // model.tensor_parallel_size)
    scheduler = "sglang" if policy in ("radix", "sglang-hybrid") and rng.random() < 0.7 else "vllm"
    caching = rng.random() < 0.6
    engine: dict[str, Any] = {
        "block_size": 16,
        "max_model_len": model.max_model_len,
        "max_num_seqs": rng.choice([4, 8, 16, 64, 256]),
        "max_num_batched_tokens": rng.choice([256, 512, 1024, 2048, 8192]),
        "tensor_parallel_size": model.tensor_parallel_size,
        "async_scheduling": rng.random() < 0.5,
        "scheduler": scheduler,
        # Pools from about two requests' worth to roomy (in full-attention tokens; the hybrid
        # allocators hold more tokens in the same bytes).
        "kv_cache_memory_bytes": int(
            full_bytes_per_token
            * rng.choice([1.2, 2, 4, 10, 40])
            * model.max_model_len
            # (A Mamba model's few attention layers hold little; its states fill the pool.)
            * (8 if model.policies is STATES else 1)
        ),
    }
    if policy in ("prefix", "vllm-hybrid", "sglang-hybrid", "jenga"):
        engine["enable_prefix_caching"] = caching
    if policy == "prefix":
        engine["enable_prefix_caching"] = True
    if scheduler == "vllm":
        if rng.random() < 0.2 and policy in ("paged", "prefix", "contiguous"):
            engine["preemption_mode"] = "swap"
        if rng.random() < 0.15:
            engine["watermark"] = 0.02
        if rng.random() < 0.1:
            engine["enable_chunked_prefill"] = False
            engine["max_num_batched_tokens"] = model.max_model_len
    else:
        engine["schedule_policy"] = rng.choice(["fcfs", "lpm"])
        engine["chunked_prefill_size"] = rng.choice([512, 2048, 8192])
        engine["max_prefill_tokens"] = rng.choice([2048, 16384])
        if rng.random() < 0.3:
            engine["enable_mixed_chunk"] = True  # (SGLang's default: prefill batches first)
    options: dict[str, Any] = {}
    if policy == "radix" and rng.random() < 0.3:
        options = {"page_size": rng.choice([4, 16])}
    if policy == "contiguous":
        options = rng.choice(
            [
                {"reservation": "max", "placement": "first_fit"},
                {"reservation": "pow2", "placement": "buddy"},
            ]
        )
    if policy == "vllm-hybrid" and model.policies is STATES and caching and rng.random() < 0.4:
        options = {"mamba_prefix_policy": "marconi"}
    if policy == "sglang-hybrid" and model.policies is STATES and caching:
        options = {"mamba_scheduler_strategy": rng.choice(["auto", "no_buffer", "extra_buffer"])}
        if options["mamba_scheduler_strategy"] == "no_buffer":
            engine["async_scheduling"] = False
    prompt_high = rng.choice([200, 1000, 3000])
    workload: dict[str, Any] = {
        "num_requests": rng.randint(15, 50),
        "arrival": {"kind": "poisson", "rate_per_s": rng.choice([1, 5, 20, 100])},
        "prompt_len": _lengths(rng, 8, prompt_high),
        "output_len": _lengths(rng, 1, rng.choice([50, 300, 600])),
    }
    if caching and rng.random() < 0.7:
        workload["shared_prefix"] = {
            "num_prefixes": rng.randint(1, 4),
            "prefix_len": _lengths(rng, 16, 600),
            "zipf_s": 1.1,
            "fraction": 0.8,
        }
    if caching and rng.random() < 0.3:
        workload["multi_turn"] = {
            "turns": {"kind": "uniform", "low": 2, "high": 4},
            "user_turn_len": _lengths(rng, 8, 200),
            "think_time_s": {"kind": "exponential", "mean": rng.choice([0.5, 3.0])},
            "max_context_len": model.max_model_len,
        }
    _add_features(rng, policy, scheduler, engine, workload)
    config: dict[str, Any] = {
        "name": f"fuzz-{index}",
        "seed": rng.randint(0, 10_000),
        "model": model_name,
        "gpu": model.gpu,
        "engine": engine,
        "cost_model": "analytic",
        "workload": workload,
        "variants": [
            {"name": "single", "policy": policy, "options": options, "engine": {"step_mode": "single"}},
            {"name": "skip", "policy": policy, "options": options},
        ],
        "output": {"figures": False},
    }
    if rng.random() < 0.15:
        config["until_s"] = round(rng.uniform(1.0, 20.0), 3)
    if policy in ("prefix", "radix") and rng.random() < 0.25:
        config["offload"] = {"host_memory_gib": rng.choice([0.05, 1.0])}
        if policy == "radix" and rng.random() < 0.5:
            config["offload"]["write_policy"] = rng.choice(
                ["write_through", "write_back", "write_through_selective"]
            )
    if rng.random() < 0.12:
        # (prefix_aware reads a replica's prefix lookup, which the hybrid allocators do not offer.)
        caches = (engine.get("enable_prefix_caching") or policy == "radix") and policy not in HYBRID
        routers = ["round_robin", "least_kv", *(["prefix_aware"] if caches else [])]
        config["cluster"] = {"replicas": 2, "router": rng.choice(routers)}
    elif rng.random() < 0.08 and policy not in HYBRID:
        config["cluster"] = {
            "disaggregation": {"prefill": {"replicas": 1}, "decode": {"replicas": rng.randint(1, 2)}}
        }
    _add_serving_features(rng, spec.is_moe, policy, config)
    return config


def _add_serving_features(rng: random.Random, moe: bool, policy: str, config: dict[str, Any]) -> None:
    """Drawn after the rest (so that a seed's earlier draws stay as they were): the other routers, a
    data-parallel server (expert-parallel ranks in lockstep for a mixture of experts), the derated
    cost model, out-of-memory failures, client overhead, bursty or batched arrivals, few-shot
    templates, identical sample lengths, beams that re-parent, and a replayed trace."""
    engine, workload = config["engine"], config["workload"]
    cluster = config.get("cluster")
    if cluster is not None and "router" in cluster and rng.random() < 0.4:
        cluster["router"] = rng.choice(["least_requests", "session_affinity", "vllm_dp"])
    if rng.random() < 0.3:
        config["cost_model"] = "derated"
    if cluster is None and rng.random() < 0.12:
        engine["data_parallel_size"] = 2
        if moe and rng.random() < 0.6:
            engine["enable_expert_parallel"] = True
            config["cost_model"] = "derated"  # (expert parallelism is priced by the derated model only)
    if rng.random() < 0.05:
        engine["on_oom"] = "fail"
    if rng.random() < 0.08:
        engine["client_overhead_s"] = 0.05
    if engine.get("preemption_mode") == "swap" and rng.random() < 0.5:
        engine["swap_space"] = 0.01  # (GiB: a few requests' worth, so that swap space runs out)
    if workload["arrival"]["kind"] == "poisson" and rng.random() < 0.2:
        rate = workload["arrival"]["rate_per_s"]
        workload["arrival"] = rng.choice(
            [
                {"kind": "gamma", "rate_per_s": rate, "cv": 3.0},
                {"kind": "constant", "rate_per_s": rate},
                {"kind": "batch", "at_s": 0.5},
            ]
        )
    if engine.get("enable_prefix_caching") and rng.random() < 0.15:
        workload["few_shot"] = {
            "num_templates": rng.randint(1, 3),
            "instruction_len": 40,
            "num_shots": rng.randint(1, 4),
            "shot_len": _lengths(rng, 20, 200),
            "fraction": 0.7,
        }
    if "n" in workload and rng.random() < 0.3:
        workload["sample_lengths"] = "identical"
    if "beam_width" in workload:
        engine["beam_reparent_prob"] = rng.choice([0.0, 0.5, 1.0])
    if policy == "prefix" and "shared_prefix" in workload and rng.random() < 0.3:
        for variant in config["variants"]:
            variant["pin_shared_prefixes"] = True
    if policy in ("paged", "prefix") and engine["scheduler"] == "vllm" and rng.random() < 0.15:
        # SGLang's scheduler over vLLM's allocators (kvsim warns that SGLang was not built for them).
        for key in ("speculative", "preemption_mode", "watermark", "enable_chunked_prefill"):
            engine.pop(key, None)
        engine["max_num_batched_tokens"] = max(engine["max_num_batched_tokens"], engine["max_model_len"])
        engine |= {"scheduler": "sglang", "schedule_policy": rng.choice(["fcfs", "lpm"])}
        engine["schedule_conservativeness"] = rng.choice([0.3, 1.0, 2.0])
        engine["enable_mixed_chunk"] = rng.random() < 0.3
    if workload["arrival"]["kind"] == "closed_loop" and rng.random() < 0.5:
        workload["arrival"] |= {"ramp_up_s": 1.0, "send_delay_s": {"kind": "exponential", "mean": 0.05}}
    if rng.random() < 0.1:
        # Mooncake's conversations share prompt blocks by hash id (prefix hits from the trace itself).
        config["workload"] = _replayed("mooncake", rng, workload["num_requests"], engine["max_model_len"])
    elif rng.random() < 0.08:
        config["workload"] = _replayed("azure", rng, workload["num_requests"], engine["max_model_len"])
        if "n" in workload:
            config["workload"]["n"] = workload["n"]
        if rng.random() < 0.3:
            config["workload"]["max_concurrency"] = rng.randint(2, 8)


TRACES = {
    "azure": "traces/azure/AzureLLMInferenceTrace_conv.csv",
    "mooncake": "traces/mooncake/conversation_trace.jsonl",
}


def _replayed(kind: str, rng: random.Random, requests: int, max_model_len: int) -> dict[str, Any]:
    """A shipped trace's first ``requests`` replayed at a drawn rate, capped at the model's length."""
    return {
        "source": {"kind": kind, "path": TRACES[kind]},
        "num_requests": requests,
        "target_rate_per_s": rng.choice([2, 10, 50]),
        "max_model_len": max_model_len,
    }


def _add_features(
    rng: random.Random, policy: str, scheduler: str, engine: dict[str, Any], workload: dict[str, Any]
) -> None:
    """The rarer engine and stream features: speculative decoding, parallel samples and beams, swap,
    an fp8 pool, a closed loop of users."""
    if scheduler == "vllm" and policy in ("paged", "prefix", "contiguous", "radix") and rng.random() < 0.15:
        engine["speculative"] = {
            "method": rng.choice(["eagle3", "ngram"]),
            "num_speculative_tokens": rng.randint(1, 4),
            "acceptance": {"mean_acceptance_length": round(rng.uniform(1.1, 2.5), 2)},
        }
    if policy in ("paged", "prefix") and rng.random() < 0.15:
        workload["n"] = rng.choice([2, 3])
    elif policy in ("paged", "prefix") and rng.random() < 0.08:
        workload["beam_width"] = 2
    if rng.random() < 0.1:
        engine["kv_cache_dtype"] = "fp8"
    if rng.random() < 0.1:
        workload["arrival"] = {"kind": "closed_loop", "num_users": rng.randint(2, 12), "think_time_s": 0.2}


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            return False
        if math.isnan(a) and math.isnan(b):
            return True
        return math.isclose(a, b, rel_tol=REL, abs_tol=ABS)
    return bool(a == b)


def summary_values(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary's values by key, nested ones (``kv_group_means``) by a dotted path, without those
    that name the variant or describe how the engine got there (``MODE_KEYS``)."""
    values: dict[str, Any] = {}
    for key, value in summary.items():
        if key in MODE_KEYS or key == "variant":
            continue
        if isinstance(value, dict):
            for inner, inner_value in summary_values(value).items():
                values[f"{key}.{inner}"] = inner_value
        else:
            values[key] = value
    return values


def differences(single, skip) -> list[str]:
    """What differs between the two runs: summary values (nested ones and missing ones too), then
    per-request fields."""
    found = []
    a_values, b_values = summary_values(single.summary), summary_values(skip.summary)
    for key in sorted(a_values.keys() | b_values.keys()):
        value, other = a_values.get(key, "(absent)"), b_values.get(key, "(absent)")
        if not _close(value, other):
            found.append(f"summary {key}: single {value!r}, skip {other!r}")
    a = single.requests.sort_values("request_id").reset_index(drop=True)
    b = skip.requests.sort_values("request_id").reset_index(drop=True)
    if len(a) != len(b):
        return [*found, f"requests: single {len(a)}, skip {len(b)}"]
    for row_a, row_b in zip(a.itertuples(index=False), b.itertuples(index=False), strict=True):
        for key in (*REQUEST_KEYS, *REQUEST_TIMES):
            x, y = getattr(row_a, key, None), getattr(row_b, key, None)
            if not _close(x, y):
                found.append(f"request {row_a.request_id} {key}: single {x!r}, skip {y!r}")
                break
        if len(found) > 12:
            break
    return found


def accounting_errors(result, label: str, single_engine: bool) -> list[str]:
    """The pool identity at every row of a run's time series: the six categories sum to the same
    pool throughout (one engine's: ``kv_pool_tokens``), none is negative, and the slots live
    sequences hold (``physical_tokens``) are the used, reserved and internally fragmented ones."""
    series = result.timeseries
    if series.empty:
        return []
    categories = series[list(BREAKDOWN_COLUMNS)]
    totals = categories.sum(axis=1)
    found = []
    pool = result.summary["kv_pool_tokens"] if single_engine else int(totals.iloc[0])
    if (totals != pool).any():
        row = int((totals != pool).to_numpy().argmax())
        found.append(f"{label}: row {row} sums to {int(totals.iloc[row])}, not the pool's {pool}")
    if (categories < 0).to_numpy().any():
        found.append(f"{label}: a negative category: {categories.min().to_dict()}")
    held = series["used_tokens"] + series["reserved_tokens"] + series["internal_fragmentation_tokens"]
    if (series["physical_tokens"] != held).any():
        row = int((series["physical_tokens"] != held).to_numpy().argmax())
        found.append(
            f"{label}: row {row} physical {int(series['physical_tokens'].iloc[row])}, held {int(held.iloc[row])}"
        )
    return found + group_accounting_errors(result, label, pool if single_engine else None)


def group_accounting_errors(result, label: str, pool: int | None) -> list[str]:
    """A hybrid allocator's split by KV group (``kv_groups``): at every instant its entries' six
    categories sum to the pool (one engine's; a cluster's: the same throughout), none is negative,
    and the last instant's split adds up, category by category, to the pool-wide series' last row."""
    groups = getattr(result, "kv_group_timeseries", None)
    if groups is None or groups.empty:
        return []
    columns = [f"{name}_tokens" for name in MemoryBreakdown.CATEGORIES]
    entries = groups["kv_group"].nunique()
    values = groups[columns].to_numpy()
    if len(values) % entries:
        return [f"{label}: kv_groups has {len(values)} rows for {entries} entries"]
    instants = values.reshape(len(values) // entries, entries, len(columns))
    totals = instants.sum(axis=(1, 2))
    expected = pool if pool is not None else int(totals[0])
    found = []
    if (totals != expected).any():
        row = int((totals != expected).argmax())
        found.append(
            f"{label}: kv_groups instant {row} sums to {int(totals[row])}, not the pool's {expected}"
        )
    if (values < 0).any():
        found.append(f"{label}: kv_groups has a negative category")
    last_split = instants[-1].sum(axis=0).tolist()
    last_row = result.timeseries[columns].iloc[-1].tolist()
    if last_split != last_row:
        found.append(f"{label}: kv_groups' last instant {last_split}, the series' last row {last_row}")
    return found


OUTCOMES = {"finished", "rejected", "failed_oom", "unfinished"}
OUTCOME_COUNTS = {
    "finished": "requests_finished",
    "rejected": "requests_rejected",
    "failed_oom": "requests_failed_oom",
    "unfinished": "requests_unfinished",
}


def consistency_errors(result, label: str, cut_short: bool) -> list[str]:
    """The summary against the requests table it was computed from, and each request's times in
    order: counts by outcome, preemptions, cache hits within the queries, arrival <= admission <=
    first token <= finish, and the client's latencies from the engine's times."""
    summary, requests = result.summary, result.requests
    found = []
    if summary["requests_total"] != len(requests):
        found.append(f"{label}: requests_total {summary['requests_total']}, {len(requests)} rows")
    counts = requests["outcome"].value_counts()
    for outcome, key in OUTCOME_COUNTS.items():
        if summary[key] != int(counts.get(outcome, 0)):
            found.append(f"{label}: {key} {summary[key]}, {int(counts.get(outcome, 0))} rows {outcome}")
    if summary["preemptions"] != int(requests["preemptions"].sum()):
        found.append(
            f"{label}: preemptions {summary['preemptions']}, the rows' {int(requests['preemptions'].sum())}"
        )
    if summary["prefix_cache_hits"] > summary["prefix_cache_queries"]:
        found.append(
            f"{label}: {summary['prefix_cache_hits']} hits of {summary['prefix_cache_queries']} queries"
        )
    if summary["iterations"] < summary["engine_wakeups"] and not cut_short:
        # (until_s counts the wake-up whose iteration it cuts, not the iteration.)
        found.append(f"{label}: {summary['iterations']} iterations in {summary['engine_wakeups']} wake-ups")
    done = requests[requests["outcome"] == "finished"]
    order = [("arrival_s", "admitted_s"), ("admitted_s", "first_token_s"), ("first_token_s", "finish_s")]
    for early, late in order:
        wrong = done[done[late] < done[early] - 1e-12]
        if len(wrong):
            row = wrong.iloc[0]
            found.append(
                f"{label}: request {row['request_id']} {late} {row[late]!r} before {early} {row[early]!r}"
            )
    for column, start, end in (("ttft_s", "arrival_s", "first_token_s"), ("e2e_s", "arrival_s", "finish_s")):
        expected = done[end] - done[start] + done["client_overhead_s"]
        if ((done[column] - expected).abs() > 1e-9).any():
            found.append(f"{label}: {column} is not {end} - {start} + client_overhead_s")
    return found


def outcome_errors(result, label: str, config: dict[str, Any]) -> list[str]:
    """Every request of the stream has one row and one outcome; a run without ``until_s`` has every
    request (conversations may end early) and leaves none unfinished."""
    requests = result.requests
    found = []
    if requests["request_id"].duplicated().any():
        found.append(f"{label}: a request has two rows")
    unknown = set(requests["outcome"]) - OUTCOMES
    if unknown:
        found.append(f"{label}: outcomes {sorted(unknown)}")
    if config.get("until_s") is None:
        expected = config["workload"]["num_requests"]
        # (A conversation ends early when its next turn would pass max_context_len.)
        short = len(requests) < expected and "multi_turn" in config["workload"]
        if len(requests) != expected and not short:
            found.append(f"{label}: {len(requests)} requests, not {expected}")
        if (requests["outcome"] == "unfinished").any():
            found.append(f"{label}: unfinished requests without until_s")
    return found


def run_case(config: dict[str, Any]) -> tuple[str, list[str]]:
    """("refused", [why]), ("same", []), ("differs", [what]) or ("crashed", [the exception]): a run
    that raises anything but a configuration error is a bug too."""
    outcome, notes, _ = run_case_with_digest(config)
    return outcome, notes


def run_case_with_digest(config: dict[str, Any]) -> tuple[str, list[str], dict[str, Any]]:
    """:func:`run_case`, and the digest of every variant's results (:func:`digest`; empty when
    refused)."""
    with tempfile.TemporaryDirectory() as folder:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                experiment = validate_experiment(config)
                results = run_experiment(experiment, Path(folder) / "fuzz.yaml", out_dir=Path(folder) / "out")
        except ConfigError as error:
            lines = str(error).splitlines()
            return "refused", [" | ".join(line.strip() for line in lines[1:3]) or lines[0]], {}
        except Exception as error:  # (reported and kept like a difference; the next case runs)
            return "crashed", [f"{type(error).__name__}: {error}"], {}
        by_name = {result.name: result for result in results}
        found = differences(by_name["single"], by_name["skip"])
        # (A cluster's, or a data-parallel server's, series are the ranks' totals; kv_pool_tokens is one's.)
        single_engine = "cluster" not in config and config["engine"].get("data_parallel_size", 1) == 1
        for name, result in by_name.items():
            found += accounting_errors(result, name, single_engine)
            found += outcome_errors(result, name, config)
            found += consistency_errors(result, name, config.get("until_s") is not None)
        digests = {name: digest(result) for name, result in by_name.items()}
    return ("differs" if found else "same"), found, digests


# -- the compiled build against the sources, on the same draws ------------------------------------
def digest(result) -> dict[str, Any]:
    """What two builds must give bit for bit: every summary value (nested ones by path) but the wall
    time and the build's name, and a checksum of every table (requests, time series, per-group split)."""
    from tools.golden_summaries import table_checksum

    summary = summary_values(result.summary)  # (without the wall time, the build, the wake-ups)
    summary["engine_wakeups"] = result.summary["engine_wakeups"]  # the same in one step mode
    tables = {"requests": table_checksum(result.requests), "timeseries": table_checksum(result.timeseries)}
    if getattr(result, "kv_group_timeseries", None) is not None:
        tables["kv_groups"] = table_checksum(result.kv_group_timeseries)
    return {"summary": summary, "tables": tables, "build": result.summary["engine_build"]}


def digest_differences(sources: dict[str, Any], compiled: dict[str, Any]) -> list[str]:
    """What differs between the two builds' digests of one case, variant by variant (exactly: floats
    survive JSON by their shortest repr, which reads back to the same bits)."""
    found = []
    for name in sorted(sources.keys() | compiled.keys()):
        a, b = sources.get(name), compiled.get(name)
        if a is None or b is None:
            found.append(f"{name}: only the {'compiled build' if a is None else 'sources'} ran it")
            continue
        for part in ("summary", "tables"):
            for key in sorted(a[part].keys() | b[part].keys()):
                x, y = a[part].get(key, "(absent)"), b[part].get(key, "(absent)")
                same = x == y or (
                    isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)
                )
                if not same:
                    found.append(f"{name} {part} {key}: sources {x!r}, compiled {y!r}")
    return found


REPLY = "@@fuzz-digest "  # marks the worker's replies among anything else written to its stdout


def serve_digests() -> int:
    """The worker of ``--builds``: for each experiment read as a JSON line, the step-mode outcome and
    the digests, as one JSON line. Run it under the build to compare (``KVSIM_NATIVE=1``)."""
    for line in sys.stdin:
        outcome, notes, digests = run_case_with_digest(json.loads(line))
        print(REPLY + json.dumps({"outcome": outcome, "notes": notes, "digests": digests}), flush=True)
    return 0


class CompiledWorker:
    """A process running the compiled build (refusing to run without a current one), asked for the
    digests of each case the sources run here."""

    def __init__(self) -> None:
        import os
        import subprocess

        from sim.native import engine_build

        if engine_build() != "python":
            raise SystemExit(
                "--builds compares the compiled build with the sources run here: set KVSIM_NATIVE=0"
            )
        env = {**os.environ, "KVSIM_NATIVE": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz_step_modes", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )

    def ask(self, config: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(config) + "\n")
        self.process.stdin.flush()
        for line in self.process.stdout:
            if line.startswith(REPLY):
                return json.loads(line[len(REPLY) :])
        raise SystemExit(
            f"the compiled build's worker ended (exit {self.process.wait()}): see its errors above"
        )

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


def builds_differences(config: dict[str, Any], worker: CompiledWorker) -> tuple[str, list[str]]:
    """Both step-mode comparisons (the sources', the compiled build's) and the two builds' digests."""
    outcome, notes, digests = run_case_with_digest(config)
    reply = worker.ask(config)
    if "crashed" in (outcome, reply["outcome"]):
        crashes = [f"sources: {note}" for note in notes] if outcome == "crashed" else []
        crashes += [f"compiled: {note}" for note in reply["notes"]] if reply["outcome"] == "crashed" else []
        return "crashed", crashes
    found = [f"compiled: {note}" for note in reply["notes"]] if reply["outcome"] == "differs" else []
    if outcome == "refused" or reply["outcome"] == "refused":
        if outcome != reply["outcome"]:
            found.append(f"refused by one build only: sources {outcome}, compiled {reply['outcome']}")
        return ("differs", found) if found else ("refused", notes or reply["notes"])
    builds = {digest["build"] for digest in reply["digests"].values()}
    if builds == {"python"}:
        raise SystemExit("--builds: the worker ran the sources, not a compiled build (make native)")
    found += notes if outcome == "differs" else []
    found += digest_differences(digests, reply["digests"])
    return ("differs", found) if found else ("same", [])


# -- shrinking a case that differs -----------------------------------------------------------------
Simplification = Callable[[dict[str, Any]], dict[str, Any] | None]


def _without(section: str, key: str) -> Simplification:
    def simplify(config: dict[str, Any]) -> dict[str, Any] | None:
        part = config if section == "" else config.get(section)
        if not isinstance(part, dict) or key not in part:
            return None
        smaller = copy.deepcopy(config)
        del (smaller if section == "" else smaller[section])[key]
        return smaller

    return simplify


def _fewer_requests(config: dict[str, Any]) -> dict[str, Any] | None:
    requests = config["workload"].get("num_requests", 0)
    if requests <= 2:
        return None
    smaller = copy.deepcopy(config)
    smaller["workload"]["num_requests"] = max(2, requests // 2)
    return smaller


def _shorter(column: str) -> Simplification:
    def simplify(config: dict[str, Any]) -> dict[str, Any] | None:
        lengths = config["workload"].get(column)
        if not isinstance(lengths, dict) or lengths.get("high", 0) < 16:
            return None
        smaller = copy.deepcopy(config)
        high = smaller["workload"][column]["high"] // 2
        smaller["workload"][column] |= {"low": min(lengths["low"], high - 1), "high": high}
        return smaller

    return simplify


def _with(section: str, key: str, value: Any) -> Simplification:
    def simplify(config: dict[str, Any]) -> dict[str, Any] | None:
        part = config if section == "" else config.get(section, {})
        if part.get(key, None) == value or (section != "" and section not in config):
            return None
        smaller = copy.deepcopy(config)
        (smaller if section == "" else smaller[section])[key] = value
        return smaller

    return simplify


def _poisson_arrivals(config: dict[str, Any]) -> dict[str, Any] | None:
    arrival = config["workload"].get("arrival")
    if arrival is None or arrival["kind"] == "poisson":
        return None
    smaller = copy.deepcopy(config)
    smaller["workload"]["arrival"] = {"kind": "poisson", "rate_per_s": arrival.get("rate_per_s", 5)}
    return smaller


SGLANG_ONLY_KEYS = (
    "schedule_policy",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "schedule_conservativeness",
    "enable_mixed_chunk",
)


def _default_options(config: dict[str, Any]) -> dict[str, Any] | None:
    """The allocator with its default options (both variants share them)."""
    if not any(variant.get("options") for variant in config.get("variants", [])):
        return None
    smaller = copy.deepcopy(config)
    for variant in smaller["variants"]:
        variant["options"] = {}
    return smaller


def _vllm_scheduler(config: dict[str, Any]) -> dict[str, Any] | None:
    """vLLM's scheduler instead of SGLang's, without the keys only SGLang's reads."""
    if config.get("engine", {}).get("scheduler", "vllm") == "vllm":
        return None
    smaller = copy.deepcopy(config)
    smaller["engine"]["scheduler"] = "vllm"
    for key in SGLANG_ONLY_KEYS:
        smaller["engine"].pop(key, None)
    return smaller


SIMPLIFICATIONS: tuple[Simplification, ...] = (
    _fewer_requests,
    _default_options,
    _vllm_scheduler,
    *(_without("", key) for key in ("cluster", "offload", "until_s")),
    *(
        _without("workload", key)
        for key in (
            "multi_turn",
            "few_shot",
            "shared_prefix",
            "n",
            "beam_width",
            "sample_lengths",
            "max_concurrency",
        )
    ),
    _poisson_arrivals,
    *(
        _without("engine", key)
        for key in (
            "speculative",
            "preemption_mode",
            "watermark",
            "kv_cache_dtype",
            "client_overhead_s",
            "swap_space",
            "on_oom",
            "beam_reparent_prob",
            "schedule_conservativeness",
            "enable_mixed_chunk",
        )
    ),
    _with("engine", "async_scheduling", False),
    _with("", "cost_model", "analytic"),
    _shorter("prompt_len"),
    _shorter("output_len"),
)


def shrink(
    config: dict[str, Any], differs: Callable[[dict[str, Any]], bool], budget: int = 80
) -> dict[str, Any]:
    """A smaller experiment that still differs: each simplification (fewer requests, the allocator's
    default options, vLLM's scheduler, a feature left out, shorter lengths) is kept when the case
    still differs, until none helps or ``budget`` runs
    are spent. (Data-parallel servers are kept whole: their two keys go together.)"""
    runs = 0
    progress = True
    while progress and runs < budget:
        progress = False
        for simplify in SIMPLIFICATIONS:
            smaller = simplify(config)
            while smaller is not None and runs < budget:
                runs += 1
                try:
                    still = differs(smaller)
                except Exception:  # (a simplification the run cannot take: a trace too short to rescale)
                    still = False
                if not still:
                    break
                config, progress = smaller, True
                smaller = simplify(config)
    return config


class CaseRunner:
    """Draws, runs and compares the cases of one seed (in one process; ``--jobs`` starts several),
    writing those that differ (and their shrunk form) into ``out``."""

    def __init__(self, seed: int, out: Path, builds: bool, shrink_cases: bool):
        self.seed = seed
        self.out = out
        self.shrink_cases = shrink_cases
        self.worker = CompiledWorker() if builds else None

    def compare(self, config: dict[str, Any]) -> tuple[str, list[str]]:
        return run_case(config) if self.worker is None else builds_differences(config, self.worker)

    def run(self, index: int) -> tuple[str, list[str]]:
        """Case ``index``'s outcome and the lines that report it."""
        config = draw_case(random.Random(f"{self.seed}-{index}"), index, self.out)
        variant = config["variants"][1]
        label = f"case {index}: {Path(config['model']).name} {variant['policy']} {variant['options'] or ''}"
        outcome, notes = self.compare(config)
        if outcome == "refused":
            return outcome, [f"{label}: refused: {notes[0][:160]}"]
        if outcome == "same":
            return outcome, [f"{label}: same"]
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / f"case-{self.seed}-{index}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        lines = [f"{label}: {outcome.upper()} ({path})", *(f"    {note}" for note in notes)]
        if self.shrink_cases:
            # (A crash shrinks only while it raises the same exception; a difference, while it differs.)
            first_words = [note.split(":")[0:2] for note in notes] if outcome == "crashed" else None

            def same_failure(candidate: dict[str, Any]) -> bool:
                again, again_notes = self.compare(candidate)
                return again == outcome and (
                    first_words is None or [note.split(":")[0:2] for note in again_notes] == first_words
                )

            smaller = shrink(config, same_failure)
            path = path.with_name(f"{path.stem}-shrunk.yaml")
            path.write_text(yaml.safe_dump(smaller, sort_keys=False))
            lines.append(f"    shrunk: {path}")
        return outcome, lines

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


_RUNNER: CaseRunner | None = None  # each --jobs process's own


def _start_runner(seed: int, out: Path, builds: bool, shrink_cases: bool) -> None:
    global _RUNNER
    _RUNNER = CaseRunner(seed, out, builds, shrink_cases)


def _run_index(index: int) -> tuple[str, list[str]]:
    assert _RUNNER is not None, "_start_runner runs first in every process"
    return _RUNNER.run(index)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--case", type=int, default=None, help="run only this case number")
    parser.add_argument("--out", type=Path, default=Path("fuzz-step-modes"), help="where failing cases go")
    parser.add_argument("--jobs", type=int, default=1, help="processes running cases side by side")
    parser.add_argument(
        "--builds",
        action="store_true",
        help="also run every case under the compiled build (make native) and compare it with the sources",
    )
    parser.add_argument(
        "--no-shrink", action="store_true", help="write a case that differs as drawn, not shrunk first"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return serve_digests()
    indices = [args.case] if args.case is not None else list(range(args.cases))
    setup = (args.seed, args.out, args.builds, not args.no_shrink)
    counts = {"same": 0, "refused": 0, "differs": 0, "crashed": 0}
    started = time.perf_counter()
    if args.jobs > 1:
        pool = ProcessPoolExecutor(max_workers=args.jobs, initializer=_start_runner, initargs=setup)
        reports = pool.map(_run_index, indices)
    else:
        _start_runner(*setup)
        reports = map(_run_index, indices)
    for outcome, lines in reports:  # (in case order, whichever process ran each)
        counts[outcome] += 1
        print("\n".join(lines), flush=True)
    if args.jobs > 1:
        pool.shutdown()
    elif _RUNNER is not None:
        _RUNNER.close()
    print(f"{counts} in {time.perf_counter() - started:.0f} s")
    return 1 if counts["differs"] or counts["crashed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
