"""Event skipping against single stepping on random experiments: a differential fuzzer.

Single stepping runs every iteration; event skipping jumps over the iterations between events in
closed form. Both must give every request the same outcome, preemptions, cached tokens and times,
and the same summary (but the wake-ups and the wall time). The unit tests check this on fixed
scenarios per feature; this draws whole experiments (model, allocator and its options, engine knobs,
stream) from the space users write, runs each in both modes through the runner, and reports every
case that differs, written out as a YAML experiment that reproduces it.

    .venv/bin/python -m tests.fuzz_step_modes --cases 200 --seed 1 [--out DIR] [--case N]   # make fuzz-step-modes

A case the configuration checks refuse (an allocator that cannot hold the model, a pool smaller
than one request) is counted and skipped: refusing it before anything runs is the promise there.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

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


FULL = ("paged", "prefix", "contiguous", "radix", "vllm-hybrid", "sglang-hybrid", "jenga")
WINDOWED = ("paged", "vllm-hybrid", "sglang-hybrid", "jenga")
STATES = ("vllm-hybrid", "sglang-hybrid")
MODELS = (
    ModelChoice("Llama-3.1-8B", "H100-80GB", 1, FULL, 4096),
    ModelChoice("gpt-oss-20b", "H100-80GB", 1, WINDOWED, 4096),
    ModelChoice("Gemma-3-27B", "H100-80GB", 1, WINDOWED, 4096),
    ModelChoice("Mistral-7B-v0.1", "H100-80GB", 1, WINDOWED, 8192),
    ModelChoice("Llama-4-Scout-17B-16E", "H200", 2, WINDOWED, 16384),
    ModelChoice("Qwen3-Next-80B-A3B", "H200", 2, STATES, 4096),
    ModelChoice("Nemotron-H-8B-Base-8K", "H100-80GB", 1, STATES, 4096),
    ModelChoice(
        "gpt-oss-20b-window-24",
        "H100-80GB",
        1,
        WINDOWED,
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
            full_bytes_per_token * rng.choice([1.2, 2, 4, 10, 40]) * model.max_model_len
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
        caches = engine.get("enable_prefix_caching") or policy == "radix"
        routers = ["round_robin", "least_kv", *(["prefix_aware"] if caches else [])]
        config["cluster"] = {"replicas": 2, "router": rng.choice(routers)}
    elif rng.random() < 0.08:
        config["cluster"] = {
            "disaggregation": {"prefill": {"replicas": 1}, "decode": {"replicas": rng.randint(1, 2)}}
        }
    return config


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
        if a is None or b is None:
            return a is b
        if math.isnan(a) and math.isnan(b):
            return True
        return math.isclose(a, b, rel_tol=REL, abs_tol=ABS)
    return bool(a == b)


def differences(single, skip) -> list[str]:
    """What differs between the two runs: summary values, then per-request fields."""
    found = []
    for key, value in single.summary.items():
        if key in MODE_KEYS or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if not _close(value, skip.summary.get(key)):
            found.append(f"summary {key}: single {value!r}, skip {skip.summary.get(key)!r}")
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
    return found


OUTCOMES = {"finished", "rejected", "failed_oom", "unfinished"}


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
    """("refused", [why]), ("same", []) or ("differs", [what])."""
    with tempfile.TemporaryDirectory() as folder:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                experiment = validate_experiment(config)
                results = run_experiment(experiment, Path(folder) / "fuzz.yaml", out_dir=Path(folder) / "out")
        except ConfigError as error:
            lines = str(error).splitlines()
            return "refused", [" | ".join(line.strip() for line in lines[1:3]) or lines[0]]
        by_name = {result.name: result for result in results}
        found = differences(by_name["single"], by_name["skip"])
        single_engine = "cluster" not in config
        for name, result in by_name.items():
            found += accounting_errors(result, name, single_engine)
            found += outcome_errors(result, name, config)
    return ("differs", found) if found else ("same", [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--case", type=int, default=None, help="run only this case number")
    parser.add_argument("--out", type=Path, default=Path("fuzz-step-modes"), help="where failing cases go")
    args = parser.parse_args(argv)
    counts = {"same": 0, "refused": 0, "differs": 0}
    started = time.perf_counter()
    for index in range(args.cases):
        config = draw_case(random.Random(f"{args.seed}-{index}"), index, args.out)
        if args.case is not None and index != args.case:
            continue
        variant = config["variants"][1]
        label = f"case {index}: {Path(config['model']).name} {variant['policy']} {variant['options'] or ''}"
        outcome, notes = run_case(config)
        counts[outcome] += 1
        if outcome == "differs":
            args.out.mkdir(parents=True, exist_ok=True)
            path = args.out / f"case-{args.seed}-{index}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            print(f"{label}: DIFFERS ({path})")
            for note in notes:
                print(f"    {note}")
        elif outcome == "refused":
            print(f"{label}: refused: {notes[0][:160]}")
        else:
            print(f"{label}: same")
        sys.stdout.flush()
    print(f"{counts} in {time.perf_counter() - started:.0f} s")
    return 1 if counts["differs"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
