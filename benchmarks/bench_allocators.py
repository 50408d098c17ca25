"""Allocator micro-benchmarks, one core, no engine involved.

* Cycles: each admits a ~500-token prompt, grows it to its final length in 16 decode-sized steps
  and frees it, with ~200 sequences live, so block allocations and frees dominate.
* Decode flushes: what the engine asks of a block policy once per block a decoding sequence fills
  (``grow_each`` of a group of sequences, each filling its tail and taking its next block), with
  the prefix cache full of evictable blocks: microseconds per sequence, the hottest path of a
  replay. Its run-to-run noise is about 3 %, a third of a whole replay's."""

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


def decode_flush_us(name: str, sequences: int = 200, steps: int = 25, group: int = 8) -> float:
    """Microseconds per sequence of ``grow_each`` calls of ``group`` sequences that each fill a
    16-token tail and take the next block, the best of three fresh pools. The pool first holds
    freed prompts' blocks, so (with prefix caching) every new block evicts a cached one."""
    block_size = 16

    def once() -> float:
        policy = make_policy(name, PoolSpec(block_size * 8_000, block_size, 1 << 20))
        for seq_id in range(100):  # 5,000 cached blocks of finished prompts
            policy.admit(10_000 + seq_id, ((500 + seq_id, 800),), 801, output_content_id=-1 - seq_id)
        for seq_id in range(100):
            policy.free(10_000 + seq_id)
        live = list(range(sequences))
        for seq_id in live:  # each holds a full block plus one token of its next
            policy.admit(seq_id, ((1_000 + seq_id, 65),), 65 + block_size * steps, output_content_id=-seq_id)
        started = time.perf_counter()
        for _ in range(steps):
            for first in range(0, sequences, group):
                ids = live[first : first + group]
                policy.grow_each(ids, [block_size] * len(ids))
        return (time.perf_counter() - started) * 1e6 / (steps * sequences)

    return min(once() for _ in range(3))


def run_allocator_benchmarks(cycles: int) -> list[dict]:
    print(f"allocator micro-benchmark: {cycles} admit+grow+free cycles, ~200 live sequences, block 16")
    rows = [bench_policy(name, options, cycles) for name, options in VARIANTS]
    for row in rows:
        blocks = row["block_ops_per_s"]
        block_text = f"{blocks:>12,.0f} block allocs+frees/s" if blocks is not None else "(no blocks)"
        print(f"  {row['policy']:<50} {row['cycles_per_s']:>10,.0f} cycles/s  {block_text}")
    print("decode flushes: grow_each of 8 sequences, each filling its tail and taking a block, cache full")
    for name in ("paged", "prefix"):
        microseconds = decode_flush_us(name)
        rows.append({"policy": name, "decode_flush_us": microseconds})
        print(f"  {name:<50} {microseconds:>10.2f} µs per sequence")
    return rows
