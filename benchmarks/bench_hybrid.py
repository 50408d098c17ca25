"""A hybrid model's replay against the same stream with uniform allocation (issue 39's goal: a
10,000-request hybrid replay costs at most 1.5x the full-attention one):
``python -m benchmarks.bench_hybrid [--requests 10000]``.

gpt-oss-20b on an H100 with 8 GB of KV memory, 2,000-8,000-token prompts at 8 req/s: ``paged``
holds every attention layer's K/V, ``vllm-hybrid`` runs vLLM's hybrid manager (its sliding-window
group releases blocks as the window moves), ``sglang-hybrid`` SGLang's two token pools, ``jenga``
Jenga's two-level pages (``--policies`` picks some). Each variant runs in a fresh interpreter; the
engine's wall time (``wall_s``) is compared.

``--prefix-caching`` turns ``engine.enable_prefix_caching`` on (vLLM's default) and compares each
hybrid allocator with its own server's full-attention cache on the same stream: ``vllm-hybrid`` and
``jenga`` with ``prefix``, ``sglang-hybrid`` with ``radix``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from benchmarks.fresh import ROOT

_RUN = """
import json, sys, tempfile
from pathlib import Path
from sim.config import validate_experiment
from sim.runner import run_variant
config = validate_experiment(json.loads(sys.argv[1]))
with tempfile.TemporaryDirectory() as folder:
    result = run_variant(config, config.variants[0], Path.cwd(), out_dir=Path(folder))
print(json.dumps({key: result.summary[key] for key in ("wall_s", "engine_wakeups", "peak_running")}))
"""


HYBRID_POLICIES = ("vllm-hybrid", "sglang-hybrid", "jenga")


def full_attention_policy(policy: str, prefix_caching: bool) -> str:
    """The full-attention policy a hybrid allocator's replay is compared with."""
    if not prefix_caching:
        return "paged"
    return "radix" if policy == "sglang-hybrid" else "prefix"


def experiment(policy: str, requests: int, prefix_caching: bool = False) -> dict:
    return {
        "name": "bench-hybrid",
        "seed": 7,
        "model": "gpt-oss-20b",
        "gpu": "H100-80GB",
        "engine": {
            "block_size": 16,
            "max_model_len": 16384,
            "max_num_batched_tokens": 8192,
            "enable_prefix_caching": prefix_caching,
            "kv_cache_memory_bytes": 8_000_000_000,
        },
        "cost_model": "analytic",
        "workload": {
            "num_requests": requests,
            "arrival": {"kind": "poisson", "rate_per_s": 8},
            "prompt_len": {"kind": "uniform", "low": 2000, "high": 8000},
            "output_len": {"kind": "uniform", "low": 50, "high": 500},
        },
        "variants": [{"name": policy, "policy": policy}],
    }


def run_once(policy: str, requests: int, root: str = str(ROOT), prefix_caching: bool = False) -> dict:
    output = subprocess.run(
        [sys.executable, "-c", _RUN, json.dumps(experiment(policy, requests, prefix_caching))],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(output.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--policies",
        nargs="+",
        default=list(HYBRID_POLICIES),
        choices=HYBRID_POLICIES,
        help="hybrid allocators to time against paged (default: all)",
    )
    parser.add_argument(
        "--prefix-caching",
        action="store_true",
        help="prefix caching on, each allocator against its server's full-attention cache",
    )
    args = parser.parse_args(argv)
    baselines = {policy: full_attention_policy(policy, args.prefix_caching) for policy in args.policies}
    walls: dict[str, list[float]] = {
        policy: [] for policy in (*dict.fromkeys(baselines.values()), *args.policies)
    }
    for _ in range(args.rounds):
        for policy in walls:
            row = run_once(policy, args.requests, prefix_caching=args.prefix_caching)
            walls[policy].append(row["wall_s"])
            print(
                f"  {policy:<14} {row['wall_s']:.2f} s engine wall, {row['engine_wakeups']:,} wake-ups, "
                f"peak {row['peak_running']} running"
            )
    best = {policy: min(values) for policy, values in walls.items()}
    for policy, baseline in baselines.items():
        print(f"{policy} / {baseline} (best of {args.rounds}): {best[policy] / best[baseline]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
