"""Each policy's pool is sized in its own unit: whole blocks (vLLM), or slots (contiguous)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim.config import load_experiment
from sim.runner import run_variant

# OPT-13B with 12 GiB of KV memory (the vLLM paper's Table 1 setup). Worked out by hand:
#   bytes per token = 2 (K, V) x 5120 (hidden) x 40 (layers) x 2 B (fp16) = 819,200
#   slots = 12 x 2^30 / 819,200 = 12,884,901,888 / 819,200 = 15,728.64 -> 15,728
#   whole blocks: 15,728.64 / 16 = 983.04 -> 983 x 16 = 15,728
#                 15,728.64 / 32 = 491.52 -> 491 x 32 = 15,712
#                 15,728.64 / 256 = 61.44 ->  61 x 256 = 15,616
EXPERIMENT = {
    "name": "pool-sizing",
    "seed": 1,
    "model": "OPT-13B",
    "gpu": "A100-40GB",
    "engine": {"block_size": 16, "max_model_len": 2048, "kv_cache_memory_bytes": 12 * 2**30},
    "cost_model": "analytic",
    "workload": {
        "num_requests": 2,
        "arrival": {"kind": "poisson", "rate_per_s": 1},
        "prompt_len": {"kind": "constant", "value": 10},
        "output_len": {"kind": "constant", "value": 5},
    },
    "variants": [
        {"name": f"{policy}-{block_size}", "policy": policy, "engine": {"block_size": block_size}}
        for policy in ("contiguous", "paged")
        for block_size in (16, 32, 256)
    ],
}
EXPECTED_POOL_TOKENS = {
    "contiguous-16": 15_728,
    "contiguous-32": 15_728,
    "contiguous-256": 15_728,
    "paged-16": 15_728,
    "paged-32": 15_712,
    "paged-256": 15_616,
}


@pytest.mark.parametrize("variant_name", sorted(EXPECTED_POOL_TOKENS))
def test_block_size_never_changes_a_contiguous_pool(tmp_path: Path, variant_name: str):
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(EXPERIMENT))
    config = load_experiment(path)
    (variant,) = [v for v in config.variants if v.name == variant_name]
    result = run_variant(config, variant, tmp_path)
    assert result.summary["kv_pool_tokens"] == EXPECTED_POOL_TOKENS[variant_name]
    # vLLM's start-up line describes the paged pool, whatever the policy.
    paged_tokens = EXPECTED_POOL_TOKENS[variant_name.replace("contiguous", "paged")]
    assert result.capacity_lines[0] == f"GPU KV cache size: {paged_tokens:,} tokens"
