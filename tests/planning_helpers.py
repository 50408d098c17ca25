"""Small sweep and plan files for the planning tests (each point simulates in well under a second)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

# A short chat-like experiment: Llama-3.1-8B on an A100 with a tiny KV pool (96 blocks of 16), so that
# memory, not only compute, shapes the results.
TINY_EXPERIMENT: dict[str, Any] = {
    "name": "tiny",
    "seed": 3,
    "model": "Llama-3.1-8B",
    "gpu": "A100-80GB",
    "engine": {"num_gpu_blocks_override": 96, "max_model_len": 1024},
    "workload": {
        "num_requests": 40,
        "arrival": {"kind": "poisson", "rate_per_s": 4.0},
        "prompt_len": {"kind": "uniform", "low": 32, "high": 256},
        "output_len": {"kind": "uniform", "low": 16, "high": 128},
    },
    "variants": [{"name": "paged", "policy": "paged"}],
}


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sweep_file(tmp_path: Path, **changes: Any) -> Path:
    data: dict[str, Any] = {
        "name": "tiny-sweep",
        "experiment": TINY_EXPERIMENT,
        "axes": {"engine.block_size": [16, 32], "workload.arrival.rate_per_s": [2.0, 8.0]},
    }
    data |= changes
    return write_yaml(tmp_path / "sweep.yaml", data)


def plan_data(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "tiny-plan",
        "models": ["Llama-3.1-8B"],
        "gpus": [{"gpu": "A100-80GB", "price_per_hour": 2.0}],
        "engine": {"num_gpu_blocks_override": 64, "max_model_len": 1024},
        "workload": {
            "arrival": {"kind": "poisson", "rate_per_s": 1.0},
            "prompt_len": {"kind": "uniform", "low": 64, "high": 256},
            "output_len": {"kind": "uniform", "low": 32, "high": 128},
        },
        "slos": {"ttft_p99_s": 1.0},
        "target_rate_per_s": 20,
        "candidates": {
            "policies": [{"name": "paged", "policy": "paged"}],
            "block_sizes": [16],
            "engine": {"max_num_seqs": [2, 64]},
        },
        "search": {"start_rate_per_s": 2, "seeds": [1, 2], "min_requests": 120, "rel_tolerance": 0.1},
    }
    data |= changes
    return data
