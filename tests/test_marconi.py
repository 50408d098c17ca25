"""Marconi's admission and eviction of Mamba states (``policies/hybrid/marconi.py``, vllm-hybrid's
option ``mamba_prefix_policy: marconi``), worked out by hand against vLLM's align mode, the pool's
accounting under random operations, end to end on Qwen3-Next, and the refusals.

The hand-worked model is tests/test_mamba_prefix_caching.py's: a full-attention group and a Mamba
group over one pool of blocks of 4 tokens, prompts computed 8 tokens (2 blocks) a step; the states
align mode writes are at its chunk ends (cut to whole blocks; the chunk crossing the prompt's last
whole block ends there) and at every block boundary a decode crosses.
"""

from __future__ import annotations

import re

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import ChildSpec, PolicyInputError, PolicyStats, PoolSpec, PrefixHit
from policies.hybrid.full import FullAttentionGroup
from policies.hybrid.mamba import MambaGroup
from policies.hybrid.marconi import (
    MarconiBlockPool,
    MarconiCosts,
    MarconiEvictor,
    MarconiMambaGroup,
    normalized,
)
from policies.hybrid.prefix_pool import NO_BLOCK, PrefixCachingBlockPool
from sim.config import ConfigError, validate_experiment
from sim.kv.coordinator import KVGroup, MultiGroupCoordinator, make_coordinator
from sim.outputs.metrics import BREAKDOWN_COLUMNS
from sim.runner import prepare_experiment, run_experiment
from tests.hybrid_driver import HybridDriver

BLOCK = 4
# 10 FLOPs a token, 1 per pair: a prefix of d blocks saves 40 d + 8 d^2 FLOPs and holds 1 + d blocks
# (its state, its KV): efficiency 24 at 1 block, 37.33 at 2, 57.6 at 4.
COSTS = MarconiCosts(10.0, 1.0, 1, 1, BLOCK)


def hybrid(
    marconi: bool, blocks: int = 40, alpha: float = 1.0
) -> tuple[MultiGroupCoordinator, MambaGroup, PrefixCachingBlockPool]:
    pool: PrefixCachingBlockPool = (
        MarconiBlockPool(blocks, BLOCK) if marconi else PrefixCachingBlockPool(blocks, BLOCK)
    )
    spec = PoolSpec(blocks * BLOCK, BLOCK, 4096)
    full = FullAttentionGroup(spec, pool, 8)
    mamba = (
        MarconiMambaGroup(spec, pool, 8, MarconiEvictor(COSTS, alpha))
        if marconi
        else MambaGroup(spec, pool, 8)
    )
    kv = make_coordinator([KVGroup("full", full), KVGroup("mamba", mamba)])
    assert isinstance(kv, MultiGroupCoordinator)
    return kv, mamba, pool


def cached_states(mamba: MambaGroup) -> int:
    assert mamba.tables is not None
    return mamba.tables.pool.cached_in(mamba.tables.group)


def table(mamba: MambaGroup, seq_id: int) -> list[int]:
    assert mamba.tables is not None
    return mamba.tables.by_seq[id(mamba.sequences[seq_id])].table


def parts(kv: MultiGroupCoordinator) -> dict[str, tuple[int, ...]]:
    split = {name: tuple(b.as_dict().values()) for name, b in kv.group_breakdowns().items()}
    assert sum(sum(values) for values in split.values()) == kv.pool_slots
    return split


# -- admission ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("marconi", [False, True])
def test_a_conversation_turn_caches_every_boundary_in_align_and_only_its_last_in_marconi(marconi):
    """22 prompt tokens decoded to 30. Align caches the states at 8 (an earlier chunk's end), 16 (the
    next), 20 (the prompt's last whole block), 24 and 28 (decode boundaries): 5 states. Marconi: no
    prefix was seen before (no branch point), so only the state at the last boundary the sequence
    reaches, 28 (``30 // 4`` blocks): 1 state; the earlier chunk ends take no block, the states the
    prefill holds (20, 22) and the decode's at 24 go back blank. The next turn (the 30 tokens and
    5 more) hits 28 tokens either way."""
    kv, mamba, pool = hybrid(marconi)
    kv.admit(1, ((7, 22),), 30, 101)
    assert table(mamba, 1) == [NO_BLOCK] * 4 + [6, 7] if marconi else [NO_BLOCK] * 4 + [8, 9]
    assert cached_states(mamba) == (0 if marconi else 2)
    for _ in range(8):
        kv.grow(1, 1)
    kv.free(1)
    assert cached_states(mamba) == (1 if marconi else 5)
    assert parts(kv)["mamba"][4] == cached_states(mamba) * BLOCK
    assert kv.lookup(((7, 22), (101, 8), (9, 5))) == PrefixHit(28)
    # A prompt that stops at 20 shared tokens: align's state at 20 serves it, Marconi has none there.
    assert kv.lookup(((7, 22), (9, 5))) == (PrefixHit(0) if marconi else PrefixHit(20))


@pytest.mark.parametrize("marconi", [False, True])
def test_a_shared_prefix_is_checkpointed_at_its_branch_point(marconi):
    """A system prompt of 13 tokens (content 5) before each user's part. The first request (19
    tokens, 21 in all) caches, under Marconi, only its last boundary's state (20); under align 8, 16
    and 20. The second (13 + 10 tokens) shares 3 whole blocks with it (12 tokens; the 4th block
    mixes the system prompt's last token with the user's): align's hit is its state at 8; Marconi's
    is nothing (no state within 12), but 3 blocks are shared past the hit, so its prefill ends a
    chunk at 12 (chunks 0-8, 8-12, 12-20, 20-23) and that state is cached (the one at 8 takes no
    block). A third request then hits 12 tokens under Marconi, 8 under align."""
    kv, mamba, pool = hybrid(marconi)
    kv.admit(1, ((5, 13), (8, 6)), 21, 101)
    kv.grow(1, 1)
    kv.grow(1, 1)
    kv.free(1)
    assert cached_states(mamba) == (1 if marconi else 3)
    second = ((5, 13), (9, 10))
    assert kv.lookup(second) == (PrefixHit(0) if marconi else PrefixHit(8))
    if marconi:
        assert isinstance(mamba, MarconiMambaGroup) and mamba.branch_blocks(second, 0, 0) == 3
        assert mamba.prefill_states(23, 0, 3) == ([1, 2], [4, 5])
    kv.admit(2, second, 25, 102)
    # Marconi: the first's 20 and the second's 12; align: the first's 8 (the hit, read and given
    # back), 16 and 20, and the second's 16 (its first chunk's end).
    assert cached_states(mamba) == (2 if marconi else 4)
    third = ((5, 13), (10, 7))
    assert kv.lookup(third) == (PrefixHit(12) if marconi else PrefixHit(8))


def test_align_mode_never_splits_a_chunk_at_a_branch_point():
    _, mamba, _ = hybrid(False)
    assert mamba.branch_blocks(((5, 13), (9, 10)), 0, 0) == 0
    assert mamba.prefill_states(23, 0) == mamba.prefill_states(23, 0, 0) == ([1, 3], [4, 5])


def test_a_fork_child_keeps_its_own_last_boundary():
    """A 10-token prompt forked into a child of 17 tokens in all: the parent (final 12) caches its state
    at 12; the child, its own at 16 (``17 // 4`` blocks), not the parent's."""
    kv, mamba, _ = hybrid(True)
    kv.admit(1, ((5, 10),), 12, 101)
    kv.fork(1, [ChildSpec(2, 17, -2)])
    kv.grow(1, 2)
    kv.free(1)
    assert cached_states(mamba) == 1  # the parent's state at 12
    for _ in range(7):
        kv.grow(2, 1)
    kv.free(2)
    assert cached_states(mamba) == 2  # and the child's at 16
    assert kv.lookup(((5, 10), (-2, 7), (9, 3))) == PrefixHit(16)


# -- eviction ----------------------------------------------------------------------------------------


def test_normalisation_is_min_max_and_one_when_all_equal():
    assert normalized([2.0, 4.0, 3.0]) == [0.0, 1.0, 0.5]
    assert normalized([3.0, 3.0]) == [1.0, 1.0] and normalized([5.0]) == [1.0]


def test_flop_efficiency_counts_the_prefix_flops_per_block_held():
    assert COSTS.flops(4) == 48.0 and COSTS.blocks(1) == 2
    assert [COSTS.efficiency(d) for d in (1, 2, 4)] == [24.0, 112.0 / 3, 57.6]


def governed_pool(alpha: float) -> tuple[MarconiBlockPool, MarconiEvictor, PolicyStats]:
    """A pool of 4 blocks, group 0 (attention, LRU) and group 1 (states, Marconi's). Cached and freed
    in this order: block 2 (a state of 4 blocks), block 1 (an attention block), block 3 (a state of 2
    blocks), block 0 (a state of 1 block): stamps 1, 2, 3, 4; the queue's head is block 2."""
    pool = MarconiBlockPool(4, BLOCK)
    pool.add_group(PolicyStats())
    states = PolicyStats()
    group = pool.add_group(states)
    evictor = MarconiEvictor(COSTS, alpha)
    pool.govern(group, evictor)
    assert pool.take_blocks(4, "test") == [0, 1, 2, 3]
    for block, (owner, depth) in {2: (1, 4), 1: (0, 0), 3: (1, 2), 0: (1, 1)}.items():
        chain = pool.chains.intern_new((None, block, 0))
        pool.cache_block(owner, block, chain)
        pool.chains.release(chain)
        if owner == 1:
            evictor.depth[block] = depth
        pool.release(block)
    assert evictor.stamp == {2: 1, 3: 3, 0: 4} and pool.clock == 4
    return pool, evictor, states


def test_eviction_takes_the_state_of_least_utility_not_the_least_recent():
    """At now = 5: recency 1/4, 1/2, 1/1 for blocks 2, 3, 0 -> normalised 0, 1/3, 1; efficiency 57.6,
    37.33, 24 -> 1, 0.397, 0. With alpha 1: utilities 1, 0.730, 1: the LRU head (block 2) stays and
    block 3 goes. Next: blocks 2 and 0 score 1 each, a tie: the older (block 2) goes. Then the head is
    the attention block 1, taken as vLLM takes it; then block 0."""
    pool, evictor, states = governed_pool(alpha=1.0)
    scores = evictor.utilities(5)
    assert scores[2] == 1.0 and scores[0] == 1.0
    assert scores[3] == pytest.approx(1 / 3 + (112 / 3 - 24) / (57.6 - 24))
    assert pool.take_blocks(1, "test") == [3]
    assert pool.take_blocks(1, "test") == [2]  # the tie
    assert pool.take_blocks(2, "test") == [1, 0]
    assert states.evictions == 3 and pool.cached_blocks == 0
    assert evictor.stamp == {} and evictor.depth == {}


def test_with_alpha_zero_eviction_is_lru():
    pool, _, _ = governed_pool(alpha=0.0)
    assert pool.take_blocks(4, "test") == [2, 1, 3, 0]


def test_a_hit_takes_a_state_out_of_the_candidates_until_released():
    pool, evictor, _ = governed_pool(alpha=1.0)
    pool.touch(3)
    assert set(evictor.stamp) == {2, 0}
    pool.release(3)
    assert evictor.stamp[3] == 5 == pool.clock


def test_marconi_needs_its_pool():
    spec = PoolSpec(40 * BLOCK, BLOCK, 4096)
    with pytest.raises(PolicyInputError, match="MarconiBlockPool"):
        MarconiMambaGroup(spec, PrefixCachingBlockPool(40, BLOCK), 8, MarconiEvictor(COSTS))
    with pytest.raises(PolicyInputError, match="alpha must be >= 0"):
        MarconiEvictor(COSTS, -0.5)


# -- the accounting identity under random operations -------------------------------------------------

KINDS = ["admit", "admit", "grow", "decode_step", "free", "preempt", "fork", "match"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 49), st.integers(0, 20)), max_size=80))
def test_the_pool_stays_whole_under_marconi(operations):
    """Random operations over full, sliding-window and Marconi Mamba groups (tests/hybrid_driver.py,
    ``vllm-hybrid-prefix-marconi``): after every one the pool is whole in total and per group, the
    reference counts are the holders, every probe's common hit is served by every group, Marconi's
    candidates are exactly the group's free cached states, and a refused operation changes nothing."""
    driver = HybridDriver("vllm-hybrid-prefix-marconi")
    for kind, choice, amount in operations:
        driver.apply(kind, choice, amount)
    driver.drain()


# -- end to end --------------------------------------------------------------------------------------

BREAKDOWN = list(BREAKDOWN_COLUMNS)


def qwen3_next(**options) -> dict:
    """Qwen3-Next (TP 2: blocks of 544 tokens), 60 requests, 9 in 10 after one of 2 shared prefixes."""
    return {
        "name": "qwen3-next-marconi",
        "seed": 5,
        "model": "Qwen3-Next-80B-A3B",
        "gpu": "H200",
        "engine": {"max_model_len": 16384, "tensor_parallel_size": 2, "enable_prefix_caching": True},
        "cost_model": "analytic",
        "workload": {
            "num_requests": 60,
            "arrival": {"kind": "poisson", "rate_per_s": 4},
            "prompt_len": {"kind": "uniform", "low": 200, "high": 5000},
            "output_len": {"kind": "uniform", "low": 50, "high": 1200},
            "shared_prefix": {
                "num_prefixes": 2,
                "prefix_len": {"kind": "uniform", "low": 1000, "high": 3000},
                "fraction": 0.9,
            },
        },
        "variants": [
            {"name": "align", "policy": "vllm-hybrid"},
            {
                "name": "marconi",
                "policy": "vllm-hybrid",
                "options": {"mamba_prefix_policy": "marconi", **options},
            },
        ],
    }


def test_qwen3_next_under_marconi_hits_the_shared_prefixes_and_its_pool_stays_whole(tmp_path):
    """The same stream under align and Marconi: Marconi checkpoints each shared prefix's state at its
    branch point, which align caches only where some chunk happened to end, so it hits more prompt
    tokens while caching fewer states; the breakdown sums to the pool at every sample, per group too."""
    experiment = validate_experiment(qwen3_next())
    results = {r.name: r for r in run_experiment(experiment, tmp_path / "c.yaml", out_dir=tmp_path / "out")}
    align, marconi = results["align"].summary, results["marconi"].summary
    assert marconi["requests_finished"] == align["requests_finished"] == 60
    assert marconi["prefix_cache_hit_rate"] > align["prefix_cache_hit_rate"]
    assert marconi["mean_cached_frac"] < align["mean_cached_frac"]
    series = pd.read_parquet(tmp_path / "out" / "marconi" / "timeseries.parquet")
    assert (series[BREAKDOWN].sum(axis=1) == marconi["kv_pool_tokens"]).all()
    groups = pd.read_parquet(tmp_path / "out" / "marconi" / "kv_groups.parquet")
    entries = groups["kv_group"].nunique()
    totals = groups[BREAKDOWN].to_numpy().reshape(-1, entries * len(BREAKDOWN)).sum(axis=1)
    assert (totals == marconi["kv_pool_tokens"]).all() and (groups[BREAKDOWN] >= 0).all().all()


def test_the_layout_takes_its_flops_from_the_model(tmp_path):
    """Qwen3-Next: 3 gated-delta-net groups and 1 full-attention group; per token ``2 x active params``
    plus the scan, per pair ``4 x 12 attention layers x width``; alpha as set."""
    prepared = prepare_experiment(validate_experiment(qwen3_next(marconi_alpha=0.5)), tmp_path / "c.yaml")
    align, marconi = (variant.hybrid for variant in prepared.variants)
    assert align is not None and align.marconi is None  # type: ignore[union-attr]
    settings_ = marconi.marconi  # type: ignore[union-attr]
    assert settings_ is not None and settings_.alpha == 0.5
    costs = settings_.costs
    assert (costs.state_groups, costs.attention_groups, costs.block_size) == (3, 1, 544)
    assert costs.pair_flops == 4.0 * 12 * 16 * 256
    assert costs.token_flops > 2.0 * 3e9


@pytest.mark.parametrize(
    ("model", "engine", "options", "message"),
    [
        (
            "gpt-oss-20b",
            {},
            {"mamba_prefix_policy": "marconi"},
            "variants.1.options.mamba_prefix_policy: 'marconi': gpt-oss-20b has no Mamba/linear-attention layers",
        ),
        (
            "Qwen3-Next-80B-A3B",
            {"enable_prefix_caching": False},
            {"mamba_prefix_policy": "marconi"},
            "variants.1.options.mamba_prefix_policy: 'marconi' needs engine.enable_prefix_caching: true",
        ),
        (
            "Qwen3-Next-80B-A3B",
            {},
            {"mamba_prefix_policy": "lfu"},
            "variants.1.options.mamba_prefix_policy: 'lfu' is not one of 'vllm', 'marconi'",
        ),
        (
            "Qwen3-Next-80B-A3B",
            {},
            {"mamba_prefix_policy": "marconi", "marconi_alpha": -1},
            "variants.1.options.marconi_alpha: -1 must be a number >= 0",
        ),
        (
            "Qwen3-Next-80B-A3B",
            {},
            {"marconi_alpha": 0.5},
            "variants.1.options.marconi_alpha: 0.5 is Marconi's weight: set "
            "variants.1.options.mamba_prefix_policy: marconi",
        ),
    ],
)
def test_what_marconi_cannot_run_is_refused_naming_the_key_and_value(
    tmp_path, model, engine, options, message
):
    raw = qwen3_next()
    raw["model"] = model
    raw["engine"] |= engine
    if model != "Qwen3-Next-80B-A3B":
        raw["engine"] |= {"max_model_len": 8192, "tensor_parallel_size": 1}
    raw["variants"][1]["options"] = options
    with pytest.raises(ConfigError, match=re.escape(message)):
        prepare_experiment(validate_experiment(raw), tmp_path / "c.yaml")


def test_the_prefix_cache_gain_by_hand():
    """Claim m1's two figures: hit rates 60 % against 20 % give 3.0x; P95 TTFTs of 21 finished
    requests 0, 0.5, ..., 10 s against 0, 1, ..., 20 s (pandas' linear quantile: the 20th of 21 sorted,
    9.5 s against 19 s) give a cut of 1 - 9.5 / 19 = 50 %. Runs that finished different requests, or
    a baseline without a hit, are refused."""
    import pandas as pd

    from sim.validation.checks_hybrid import prefix_cache_gain

    def summary(hit_rate: float, finished: int = 21) -> dict:
        return {"prefix_cache_hit_rate": hit_rate, "requests_finished": finished}

    baseline_ttft = pd.Series([float(i) for i in range(21)])
    ttft = baseline_ttft / 2
    ratio, cut = prefix_cache_gain(summary(0.6), ttft, summary(0.2), baseline_ttft)
    assert (ratio, cut) == (pytest.approx(3.0), pytest.approx(0.5))
    with pytest.raises(ValueError, match="finished different requests"):
        prefix_cache_gain(summary(0.6, finished=20), ttft, summary(0.2), baseline_ttft)
    with pytest.raises(ValueError, match="hit no prompt token"):
        prefix_cache_gain(summary(0.6), ttft, summary(0.0), baseline_ttft)
