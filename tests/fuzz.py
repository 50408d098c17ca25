"""``make fuzz``: millions of random admit / grow / fork / free / evict operations per policy, every
invariant checked after every one (not part of ``make test``: it takes minutes).

The operations go through :class:`tests.test_policy_properties.Driver`, the same driver and checks as
the hypothesis property test, drawn here from a seeded generator instead of hypothesis. A failure prints
the variant, seed and operation index, and ``--variant NAME --seed S --ops N`` replays it.

    python -m tests.fuzz [--ops 1000000] [--seed 0] [--jobs 2] [--variant NAME]
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from tests.hybrid_driver import LAYOUTS, HybridDriver
from tests.test_host_tier import TierDriver
from tests.test_policy_properties import VARIANTS, Driver

# Operation mix: admissions and growth dominate, as in a server; forks and evictions are rarer.
WEIGHTS = {"admit": 0.25, "grow": 0.25, "fork": 0.05, "free": 0.15, "preempt": 0.05, "match": 0.05}
WEIGHTS |= {"decode_step": 0.05, "evict": 0.1, "schedule": 0.05}
DRAIN_EVERY = 20_000
"""Free everything now and then (and check the empty pool), so runs do not sit in one full state."""

NAMES = ["paged", "prefix", "prefix-pinned", "prefix-deferred-keys"]
NAMES += ["contiguous-max-first_fit", "contiguous-pow2-best_fit"]
NAMES += ["contiguous-oracle-buddy", "radix-page-1", "radix-page-3", "radix-page-3-deferred-inserts"]
NAMES += ["radix-hicache-31-write_through", "radix-page-3-hicache-32-write_back"]
NAMES += ["radix-hicache-40-write_through_selective"]
assert len(NAMES) == len(VARIANTS)
NAMES += ["prefix-host-tier-8"]  # the prefix policy with an 8-block host tier (tests/test_host_tier.py)
HYBRID = list(LAYOUTS)  # hybrid allocators' KV groups behind their coordinator (tests/hybrid_driver.py)
NAMES += HYBRID


@dataclass
class Outcome:
    name: str
    operations: int
    done: dict[str, int]
    failed: dict[str, int]
    evicted_blocks: int
    seconds: float
    error: str = ""


def driver_for(index: int) -> Driver | HybridDriver:
    if index < len(VARIANTS):
        name, options = VARIANTS[index]
        return Driver(name, options)
    if NAMES[index] in HYBRID:
        return HybridDriver(NAMES[index])
    return TierDriver(host_blocks=8)


def fuzz(index: int, operations: int, seed: int) -> Outcome:
    driver = driver_for(index)
    rng = np.random.default_rng([seed, index])
    kinds = list(WEIGHTS)
    # Drawn in chunks: one numpy call per 10k operations instead of three per operation.
    started = time.perf_counter()
    performed = 0
    try:
        while performed < operations:
            count = min(10_000, operations - performed)
            picks = rng.choice(len(kinds), size=count, p=list(WEIGHTS.values()))
            choices = rng.integers(0, 50, size=count)
            amounts = rng.integers(0, 21, size=count)
            for pick, choice, amount in zip(picks.tolist(), choices.tolist(), amounts.tolist(), strict=True):
                driver.apply(kinds[pick], choice, amount)
                performed += 1
                if performed % DRAIN_EVERY == 0:
                    driver.drain()
    except Exception:
        error = f"operation {performed} (seed {seed}):\n{traceback.format_exc()}"
    else:
        error = ""
    return Outcome(
        NAMES[index],
        performed,
        dict(driver.done),
        dict(driver.failed),
        driver.policy.stats.evictions,
        time.perf_counter() - started,
        error,
    )


def report(outcomes: list[Outcome]) -> str:
    header = f"{'variant':<26}{'operations':>12}" + "".join(f"{kind:>16}" for kind in WEIGHTS)
    header += f"{'evictions':>16}{'seconds':>9}  result"
    lines = [header]
    for item in outcomes:
        cells = "".join(f"{item.done.get(kind, 0):>9,}/{item.failed.get(kind, 0):<6,}" for kind in WEIGHTS)
        result = "FAILED" if item.error else "ok: no invariant violated"
        lines.append(
            f"{item.name:<26}{item.operations:>12,}{cells}{item.evicted_blocks:>16,}{item.seconds:>9.0f}  {result}"
        )
    lines.append(
        "per kind: operations applied / refused with OutOfKVMemory (the rest were no-ops: nothing live, "
        "or a sequence already at its final length); every operation was followed by the full check"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--ops", type=int, default=1_000_000, help="operations per policy variant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="processes (one variant each at a time)")
    parser.add_argument("--variant", choices=NAMES, action="append", help="only these (repeatable)")
    args = parser.parse_args(argv)
    chosen = [NAMES.index(name) for name in args.variant] if args.variant else list(range(len(NAMES)))
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = list(pool.map(fuzz, chosen, [args.ops] * len(chosen), [args.seed] * len(chosen)))
    print(report(outcomes))
    failures = [item for item in outcomes if item.error]
    for item in failures:
        print(f"\n{item.name}: {item.error}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
