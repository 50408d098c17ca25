"""Allocator micro-benchmark: admit + grow + free cycles per second, per policy, one core.

Each cycle admits a ~500-token prompt, grows it to its final length in 16 decode-sized steps and frees
it, with ~200 sequences live, so block allocations and frees dominate (no engine involved)."""

from __future__ import annotations

import time

import numpy as np

from policies import PoolSpec, make_policy

VARIANTS = [
    ("paged", {}),
    ("prefix", {}),
    ("contiguous", {"reservation": "oracle", "placement": "first_fit"}),
    ("contiguous", {"reservation": "oracle", "placement": "best_fit"}),
    ("contiguous", {"reservation": "pow2", "placement": "buddy"}),
]


def bench_policy(name: str, options: dict, cycles: int, live: int = 200, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    block_size = 16
    pool = PoolSpec(kv_pool_tokens=block_size * 40_000, block_size=block_size, max_model_len=4096)
    policy = make_policy(name, pool, **options)
    prompts = rng.integers(300, 700, cycles + live)
    outputs = rng.integers(150, 350, cycles + live)
    queue: list[int] = []
    block_ops = 0
    started = time.perf_counter()
    for seq_id in range(cycles + live):
        prompt_len, output_len = int(prompts[seq_id]), int(outputs[seq_id])
        final_len = prompt_len + output_len
        # Half the prompts share a 256-token system prompt, so the prefix policy has hits to find.
        prompt = ((1, 256), (10 + seq_id, prompt_len - 256)) if seq_id % 2 else ((10 + seq_id, prompt_len),)
        policy.admit(seq_id, prompt, final_len, output_content_id=-1 - seq_id)
        step = -(-output_len // 16)
        grown = 0
        while grown < output_len:
            amount = min(step, output_len - grown)
            policy.grow(seq_id, amount)
            grown += amount
        block_ops += 2 * -(-final_len // block_size)  # allocations + frees of this sequence's blocks
        queue.append(seq_id)
        if len(queue) > live:
            policy.free(queue.pop(0))
    elapsed = time.perf_counter() - started
    return {
        "policy": name + (f"[{','.join(f'{k}={v}' for k, v in options.items())}]" if options else ""),
        "cycles_per_s": cycles / elapsed,
        # Block operations only mean something for the block-based policies.
        "block_ops_per_s": block_ops / elapsed if name != "contiguous" else None,
    }


def run_allocator_benchmarks(cycles: int) -> list[dict]:
    print(f"allocator micro-benchmark: {cycles} admit+grow+free cycles, ~200 live sequences, block 16")
    rows = [bench_policy(name, options, cycles) for name, options in VARIANTS]
    for row in rows:
        blocks = row["block_ops_per_s"]
        block_text = f"{blocks:>12,.0f} block allocs+frees/s" if blocks is not None else "(no blocks)"
        print(f"  {row['policy']:<50} {row['cycles_per_s']:>10,.0f} cycles/s  {block_text}")
    return rows
