"""Lazy keys on vllm-hybrid's prefix-caching pool and on Jenga's type pools (``policies/hybrid/
prefix_pool.py``) change nothing: random operation streams applied in lockstep to pools with lazy keys
and to the eager reference (every full block of every group keyed at once) leave both with the same
block tables, free queue order (Jenga: page stamps and wholly cached large pages), reference counts,
per-group breakdowns, statistics and prefix hits after every operation; at the end, with every lazy
run keyed, both caches hold the same blocks under the same content in every group, and every chain
has as many holders."""

from __future__ import annotations

from dataclasses import astuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.hybrid.group import GroupManager
from policies.hybrid.jenga_cache import JengaPageCache
from policies.hybrid.prefix_pool import LAZY, PrefixCachingBlockPool
from tests import test_jenga, test_jenga_prefix  # noqa: F401  (the Jenga checks' modules, imported here: not inside @given)
from tests.hybrid_driver import BLOCK, PROBES, SHARED, HybridDriver, vllm_prefix_groups


class RepeatingDriver(HybridDriver):
    """The fuzz driver, plus prompts that repeat an earlier one (a lazy run reached by a sequence of
    the same group) and lookups of an earlier prompt (reached by a lookup)."""

    def __init__(self, layout: str):
        super().__init__(layout)
        self.prompts: list[tuple[tuple[int, int], ...]] = []

    def _apply(self, kind: str, choice: int, amount: int) -> bool:
        if kind == "repeat" and self.prompts:
            prompt = self.prompts[choice % len(self.prompts)]
            seq_id, self.next_id = self.next_id, self.next_id + 1
            final_len = sum(length for _, length in prompt) + 1 + amount
            self.scheduled[seq_id] = self.kv.admit(seq_id, prompt, final_len, 1000 + seq_id)
            self.final_len[seq_id] = final_len
            return True
        if kind == "lookup" and self.prompts:
            self.kv.lookup(self.prompts[choice % len(self.prompts)] + ((7, 1 + amount),))
            return True
        if kind == "admit":
            # (The driver's prompt for this id, as it builds it: kept to repeat and look up.)
            seq_id, prompt_len = self.next_id, 1 + amount * 3
            self.prompts.append(((SHARED, 3 * (choice % 21)), (seq_id, prompt_len)))
        return super()._apply(kind, choice, amount)


KINDS = [
    "admit",
    "admit",
    "repeat",
    "grow",
    "decode_step",
    "decode_step",
    "free",
    "preempt",
    "fork",
    "match",
    "lookup",
    "schedule",
]


def managers(driver: HybridDriver) -> list[GroupManager]:
    found = [group.policy for group in driver.kv.groups]
    assert all(isinstance(manager, GroupManager) and manager.tables is not None for manager in found)
    return found  # type: ignore[return-value]


def pools_of(driver: HybridDriver) -> list[PrefixCachingBlockPool]:
    """The pools, once each: vllm-hybrid's one, or Jenga's one per type."""
    pools: dict[int, PrefixCachingBlockPool] = {}
    for manager in managers(driver):
        assert isinstance(manager.shared_pool, PrefixCachingBlockPool)
        pools.setdefault(id(manager.shared_pool), manager.shared_pool)
    return list(pools.values())


def pool_of(driver: HybridDriver) -> PrefixCachingBlockPool:
    return pools_of(driver)[0]


def observed(driver: HybridDriver) -> tuple:
    """What a lazy key may not change: every group's block tables and statistics, each pool's order of
    eviction (vLLM's free queue; Jenga's stamps and wholly cached large pages), reference counts and
    which blocks keep an identity (cached or held), the breakdowns, the operations done and refused."""
    groups = []
    for manager in managers(driver):
        tables = manager.tables
        assert tables is not None
        held = [tables.by_seq[id(manager.sequences[seq])].table for seq in sorted(driver.final_len)]
        groups.append((held, astuple(manager.stats), tables.pool.cached_in(tables.group)))
    pools = []
    for pool in pools_of(driver):
        order = (
            (pool.cached_stamps(), pool.whole_stamps())
            if isinstance(pool, JengaPageCache)
            else pool.queue.order()
        )
        identities = [(pool.has_identity(block), pool.group_of(block)) for block in range(pool.num_blocks)]
        pools.append((order, list(pool.ref_count), identities, pool.free_blocks, pool.cached_blocks))
    return (
        groups,
        pools,
        driver.kv.group_breakdown_values(),
        dict(driver.done),
        dict(driver.failed),
    )


def cached_contents(driver: HybridDriver) -> list[object]:
    """Per group, the blocks cached under each content (a chain spelled out to the root); then every
    live chain with its holders."""
    pools = pools_of(driver)
    entries = pools[0].chains._entry_of

    def spelled(chain: int) -> tuple:
        path = []
        while chain is not None:
            key = entries[chain].key
            path.append(key[1:])
            chain = key[0]
        return tuple(reversed(path))

    caches = [
        {spelled(chain): list(blocks) for chain, blocks in cache.items()}
        for pool in pools
        for cache in pool._caches
    ]
    # Every chain alive, with how many hold it: a lazy run holds what its first key would have held.
    holders = {spelled(chain): entry.holders for chain, entry in entries.items()}
    return [*caches, holders]


LAYOUTS = {  # lazy, eager
    "vllm-hybrid": ("vllm-hybrid-prefix-lazy", "vllm-hybrid-prefix"),
    "jenga": ("jenga-prefix", "jenga-prefix-eager"),
    "jenga-whole-pages": ("jenga-prefix-whole", "jenga-prefix-whole-eager"),
}


def lockstep(allocator: str, layout_suffix: str) -> tuple[RepeatingDriver, RepeatingDriver]:
    lazy_layout, eager_layout = LAYOUTS[allocator]
    lazy = RepeatingDriver(lazy_layout + layout_suffix)
    eager = RepeatingDriver(eager_layout + layout_suffix)
    assert all(pool.lazy_keys for pool in pools_of(lazy))
    assert not any(pool.lazy_keys for pool in pools_of(eager))
    return lazy, eager


def key_every_run(driver: HybridDriver) -> None:
    pool = pool_of(driver)
    for key in list(pool.lazy_runs):
        if key in pool.lazy_runs:
            pool.key_runs(key)
    assert all(not other.lazy_runs and LAZY not in other.block_chain for other in pools_of(driver))


operation = st.tuples(st.sampled_from(KINDS), st.integers(0, 49), st.integers(0, 20))


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(sorted(LAYOUTS)), st.sampled_from(["", "-deferred"]), st.lists(operation, max_size=90))
def test_lazy_keys_match_eager_keys(allocator, deferral, operations):
    lazy, eager = lockstep(allocator, deferral)
    for kind, choice, amount in operations:
        lazy.apply(kind, choice, amount)
        eager.apply(kind, choice, amount)
        assert observed(lazy) == observed(eager), kind
        for probe in PROBES:
            assert lazy.kv.lookup(probe) == eager.kv.lookup(probe)
    key_every_run(lazy)
    assert cached_contents(lazy) == cached_contents(eager)
    lazy.drain()
    eager.drain()
    assert observed(lazy) == observed(eager)
    assert cached_contents(lazy) == cached_contents(eager)


@pytest.mark.parametrize("allocator", sorted(LAYOUTS))
def test_lazy_keys_match_eager_keys_over_a_long_stream(allocator):
    """3,000 seeded operations of the mix, with memory binding: the same checks as above."""
    import numpy as np

    for deferral in ("", "-deferred"):
        lazy, eager = lockstep(allocator, deferral)
        rng = np.random.default_rng(11)
        for pick in rng.choice(len(KINDS), size=3000):
            choice, amount = int(rng.integers(0, 50)), int(rng.integers(0, 21))
            lazy.apply(KINDS[pick], choice, amount)
            eager.apply(KINDS[pick], choice, amount)
            assert observed(lazy) == observed(eager), KINDS[pick]
        assert lazy.failed["admit"] > 0 and pool_of(lazy).lazy_runs
        assert sum(manager.stats.evictions for manager in managers(lazy)) > 0
        key_every_run(lazy)
        assert cached_contents(lazy) == cached_contents(eager)


def two_groups(blocks: int = 12):
    kv = vllm_prefix_groups(blocks, prefill_tokens=4096, lazy_keys=True)
    return kv, kv.groups[0].policy.shared_pool


def test_a_prompt_past_its_hit_is_marked_not_keyed_until_a_lookup_reaches_it():
    """A (12 tokens: 3 blocks, nothing cached) finishes: its blocks are cached in every group but no
    chain is made for them; the pool files one run per group under A's first key. A lookup of A's
    prompt reaches that key: the runs are keyed, and the hit is what eager keys give (2 blocks: the
    last token is computed)."""
    kv, pool = two_groups()
    prompt = ((5, 12),)
    kv.admit(1, prompt, 12, 101)
    kv.free(1)
    assert len(pool.chains) == 0
    assert pool.block_chain.count(LAZY) == pool.cached_blocks > 0
    (runs,) = pool.lazy_runs.values()
    assert sorted(run.group for run in runs) == sorted(group.policy.tables.group for group in kv.groups)
    assert kv.lookup(prompt).cached_tokens == 8
    assert not pool.lazy_runs and LAZY not in pool.block_chain
    assert len(pool.chains) == 3


def test_an_evicted_lazy_run_leaves_nothing_behind():
    """A's cached blocks are all taken by B (12 blocks, 3 groups of 4 each): A's runs are forgotten
    with their last block; B's own runs, filed under B's first key, are all that is left, and no
    chain was ever made."""
    kv, pool = two_groups()
    kv.admit(1, ((5, 12),), 12, 101)
    kv.free(1)
    kv.admit(2, ((6, 4 * BLOCK),), 4 * BLOCK, 102)
    assert pool.cached_blocks == 0
    assert list(pool.lazy_runs) == [(None, 6, 0, BLOCK, 0)]
    assert pool.block_run.count(None) == pool.num_blocks - pool.block_chain.count(LAZY)
    assert len(pool.chains) == 0


def test_a_sequence_reaching_a_run_of_its_own_group_keys_it_first():
    """Z caches content 5's first block (keyed by A's lookup). A (blocks: 5, then 6) starts its runs at
    block 1 and finishes. B has A's prompt: its lookup stops at block 0 (the last block is computed),
    so B itself reaches A's key when its blocks fill: A's runs are keyed, and B's blocks cached under
    the same chains after A's (duplicates, the earliest hit first, as eager keys have them)."""
    kv, pool = two_groups(blocks=40)
    kv.admit(1, ((5, 4), (7, 1)), 5, 100)
    kv.free(1)
    prompt = ((5, 4), (6, 4))
    assert kv.lookup(prompt).cached_tokens == 4  # (keys Z's run)
    kv.admit(2, prompt, 8, 101)
    kv.free(2)
    (key,) = pool.lazy_runs
    assert key[2:4] == (0, BLOCK) and key[1] == 6  # A's block 1
    kv.admit(3, prompt, 8, 102)
    assert not pool.lazy_runs and LAZY not in pool.block_chain
    full = kv.groups[0].policy.tables
    chain = pool.find_chains([(5, 4), (6, 4)], [4, 8], 2, 0)[1]
    a_block, b_block = pool._caches[full.group][chain]
    assert pool.ref_count[a_block] == 0 and pool.ref_count[b_block] == 1
    assert pool.cached_block(full.group, chain) == a_block
