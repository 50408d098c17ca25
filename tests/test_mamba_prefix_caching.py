"""vllm-hybrid's prefix caching for a Mamba / linear-attention group: vLLM's ``mamba_cache_mode:
align`` (policies/hybrid/mamba.py), worked out by hand, then end to end from a YAML experiment, and
what vLLM would not run refused with the key and value.

The model below: a full-attention group and a Mamba group over one pool of blocks of 4 tokens, the
engine's prefill budget 8 tokens a request (2 blocks). vLLM's aligned split
(``_mamba_block_aligned_split``): a chunk ending before the prompt's last whole block is cut down to
whole blocks, the chunk crossing that block ends there, the rest follows; each chunk end writes a
state into a new block at its end's block (``cdiv(end, 4) - 1``) and reads the previous one, which the
next chunk frees (cached when full). So a request holds at most 2 state blocks.

Block ids: the free queue hands out blank blocks 0, 1, 2, ... first, then cached ones, least recently
freed first.
"""

from __future__ import annotations

import re

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import ChildSpec, PoolSpec, PrefixHit
from policies.hybrid.full import FullAttentionGroup
from policies.hybrid.mamba import MambaGroup
from policies.hybrid.prefix_pool import NO_BLOCK, PrefixCachingBlockPool
from sim.config import ConfigError, validate_experiment
from sim.kv.coordinator import KVGroup, MultiGroupCoordinator, make_coordinator
from sim.outputs.metrics import BREAKDOWN_COLUMNS
from sim.runner import prepare_experiment, run_experiment
from tests.hybrid_driver import HybridDriver

BLOCK = 4


def mamba_hybrid(
    blocks: int = 40, prefill_tokens: int = 8
) -> tuple[MultiGroupCoordinator, FullAttentionGroup, MambaGroup, PrefixCachingBlockPool]:
    pool = PrefixCachingBlockPool(blocks, BLOCK)
    spec = PoolSpec(blocks * BLOCK, BLOCK, 4096)
    full = FullAttentionGroup(spec, pool, prefill_tokens)
    mamba = MambaGroup(spec, pool, prefill_tokens)
    kv = make_coordinator([KVGroup("full", full), KVGroup("mamba", mamba)])
    assert isinstance(kv, MultiGroupCoordinator)
    return kv, full, mamba, pool


def parts(kv: MultiGroupCoordinator) -> dict[str, tuple[int, ...]]:
    """Each entry's (used, reserved, internal, external, cached, free) slots; they sum to the pool."""
    split = {name: tuple(b.as_dict().values()) for name, b in kv.group_breakdowns().items()}
    assert sum(sum(values) for values in split.values()) == kv.pool_slots
    return split


def mamba_table(mamba: MambaGroup, seq_id: int) -> list[int]:
    assert mamba.tables is not None
    return mamba.tables.by_seq[id(mamba.sequences[seq_id])].table


def cached_states(mamba: MambaGroup) -> int:
    assert mamba.tables is not None
    return mamba.tables.pool.cached_in(mamba.tables.group)


# -- which states a prompt computes, caches and holds ----------------------------------------------


@pytest.mark.parametrize(
    ("prompt_len", "hit", "passed", "held"),
    [
        # 22 tokens (not whole blocks; last whole block at 20): chunks end at 8, 16, 20 (cut there),
        # 22: states at blocks 1, 3, 4, 5; the last two held.
        (22, 0, [1, 3], [4, 5]),
        # 24 tokens (whole blocks): chunks end at 8, 16, 24: states 1, 3, 5; 3 and 5 held, null between.
        (24, 0, [1], [3, 5]),
        # 20 tokens: 8, 16, then 16 + 8 = 24 is past the prompt: 20. States 1, 3, 4.
        (20, 0, [1], [3, 4]),
        # Shorter than a block: one chunk, one state.
        (3, 0, [], [0]),
        # One whole block: one chunk, its state at block 0.
        (4, 0, [], [0]),
        # A hit of 5 blocks (20 tokens) in a 22-token prompt: the hit's state (block 4) read, the last
        # chunk's written: both held.
        (22, 5, [], [4, 5]),
        # A hit of 2 blocks in a 22-token prompt: from 8, chunks end at 16, 20, 22: the hit's state is
        # freed (cached) at the second chunk, 3 is computed and freed, 4 and 5 held.
        (22, 2, [3], [4, 5]),
        # A hit of 6 blocks (24 tokens) in a 40-token prompt: chunks end at 32, 40: hit state 5 passed
        # over (given back), 7 and 9 held.
        (40, 6, [], [7, 9]),
    ],
)
def test_the_states_a_prompt_computes_are_vllms_aligned_chunk_ends(prompt_len, hit, passed, held):
    _, _, mamba, _ = mamba_hybrid()
    assert mamba.prefill_states(prompt_len, hit) == (passed, held)


def test_a_prompt_that_is_not_a_whole_number_of_blocks():
    """22 tokens, 8 to decode: the states at 8 and 16 tokens are computed, cached and given back
    (blocks 6 and 7, to the queue's tail, cached); those at 20 (block 4 of the prompt, full, cached
    while held) and 22 (block 5, partial) are held (blocks 8, 9). The full group holds 6 blocks
    (0-5: 22 used, 2 reserved)."""
    kv, full, mamba, pool = mamba_hybrid()
    assert kv.admit(1, ((7, 22),), 30, 101) == 0
    assert mamba.held_blocks(1) == (4, 6) and mamba.held_block_count(1) == 2
    assert mamba_table(mamba, 1) == [NO_BLOCK] * 4 + [8, 9]
    assert cached_states(mamba) == 2
    # Slots of 4: mamba 2 blocks used (states, used whole), 2 cached; 40 - 6 - 2 - 2 = 30 blank.
    assert parts(kv) == {
        "full": (22, 2, 0, 0, 0, 0),
        "mamba": (8, 0, 0, 0, 8, 0),
        "shared pool": (0, 0, 0, 0, 0, 120),
    }
    # Decoding: the 23rd token's step frees the state at 20 (cached); the 25th crosses into block 6
    # and holds 5 (the state at 24, full now: cached) and 6; the 26th frees 5.
    expected = {23: (5, 6), 24: (5, 6), 25: (5, 7), 26: (6, 7)}
    for length, run in expected.items():
        kv.grow(1, 1)
        assert (kv.seq_len(1), mamba.held_blocks(1)) == (length, run)
    assert cached_states(mamba) == 4  # states at 8, 16, 20, 24
    # The 25th token's step needs a new block in both groups; its growth room stops before the
    # release at the 26th (an event of the decode clock).
    assert mamba.growth_room(1) == 2  # 26 -> 28 fills block 6
    kv.free(1)
    # Block 6 (tokens 24-27) is partial: it goes back blank. Full: blocks 0-5 cached (5 full).
    assert cached_states(mamba) == 4
    assert parts(kv)["mamba"] == (0, 0, 0, 0, 16, 0)


def test_a_prompt_that_is_a_whole_number_of_blocks_holds_two_states_apart():
    """24 tokens: states at 8 (given back, cached), 16 and 24 held: blocks 3 and 5 of its table, a null
    block between (vLLM pads the table with null blocks); 2 blocks held, not 3. The first decoded token
    frees the state at 16 and writes block 6; the next frees block 5."""
    kv, _, mamba, _ = mamba_hybrid()
    kv.admit(1, ((5, 24),), 30, 101)
    assert mamba.held_blocks(1) == (3, 6) and mamba.held_block_count(1) == 2
    assert mamba_table(mamba, 1) == [NO_BLOCK] * 3 + [7, NO_BLOCK, 8]
    assert parts(kv)["mamba"] == (8, 0, 0, 0, 4, 0)
    assert mamba.growth_room(1) == 0  # the next token frees the state at 16
    kv.grow(1, 1)
    assert mamba.held_blocks(1) == (5, 7) and mamba.held_block_count(1) == 2
    assert parts(kv)["mamba"] == (8, 0, 0, 0, 8, 0)  # states at 8 and 16 cached
    kv.grow(1, 1)
    assert mamba.held_blocks(1) == (6, 7) and parts(kv)["mamba"] == (4, 0, 0, 0, 12, 0)


def test_a_fork_shares_the_full_states_and_copies_the_partial_one():
    """At its first token a 24-token prompt holds two full states (16 and 24): a child shares both
    (a state at a block boundary is never written again); after the first decoded tokens the parent
    holds block 6 (partial) and the child copies it."""
    kv, _, mamba, pool = mamba_hybrid()
    kv.admit(1, ((5, 24),), 30, 101)
    free_before = pool.free_blocks
    kv.fork(1, [ChildSpec(2, 30, -2)])
    # The full group shares blocks 0-5 (all full): the fork takes no block at all.
    assert pool.free_blocks == free_before
    assert mamba.held_blocks(2) == (3, 6) and parts(kv)["mamba"][0] == 8  # shared: counted once
    kv.free(2)
    kv.grow(1, 2)  # 26 tokens: holds block 6 alone (tokens 24-25)
    free_before = pool.free_blocks
    kv.fork(1, [ChildSpec(3, 30, -3)])
    assert pool.free_blocks == free_before - 2  # a copy of each group's partial block
    assert parts(kv)["mamba"][0] == 8


# -- hits ------------------------------------------------------------------------------------------


def test_a_hit_is_the_right_most_cached_state_and_the_attention_group_may_serve_further():
    """After 22 tokens of content 7 (states cached at 8, 16, 20; the one at 22 is partial):
    - a prompt sharing all 22 and more: full attention serves blocks 0-4 (block 5 was partial), the
      Mamba group its state at 20: a hit exactly at that block boundary, 20 tokens;
    - a prompt sharing 14 tokens: full attention serves 3 blocks (12 tokens), the Mamba group only the
      state at 8 (no state was cached at 12): the common hit is the shorter, 8 tokens;
    - a prompt sharing 7 tokens: full attention 1 block, no Mamba state within it: no hit."""
    kv, full, mamba, _ = mamba_hybrid()
    kv.admit(1, ((7, 22),), 30, 101)
    kv.free(1)
    assert kv.lookup(((7, 22), (9, 5))) == PrefixHit(20)
    assert full.lookup(((7, 14), (9, 9))) == PrefixHit(12)
    assert mamba.lookup(((7, 14), (9, 9))) == PrefixHit(8)
    assert kv.lookup(((7, 14), (9, 9))) == PrefixHit(8)
    assert full.lookup(((7, 7), (9, 9))) == PrefixHit(4)
    assert kv.lookup(((7, 7), (9, 9))).cached_tokens == 0


def test_a_hit_whose_state_the_prefill_moves_past_is_given_back():
    """A 24-token prompt served and freed: states cached at 8, 16, 24 (blocks 6, 7, 8). A 40-token
    prompt extending it hits 24 tokens (6 blocks in full attention; the Mamba state at 24). Its chunks
    end at 32 and 40: the hit's state is read by the first and freed at the second (cached again),
    the states at 32 and 40 held. Needed: 4 new full blocks and 2 Mamba blocks; the hit's free blocks
    leave the queue (6 full ones; the Mamba one goes back)."""
    kv, full, mamba, pool = mamba_hybrid()
    kv.admit(1, ((5, 24),), 30, 101)
    kv.free(1)
    prompt = ((5, 24), (6, 16))
    assert kv.lookup(prompt) == PrefixHit(24)
    assert mamba.slots_needed_to_admit_cached(prompt, 0, 24) == 2 * BLOCK
    assert full.slots_needed_to_admit_cached(prompt, 0, 24) == (4 + 6) * BLOCK
    free_before = pool.free_blocks
    assert kv.admit(2, prompt, 44, 102) == 24
    assert pool.free_blocks == free_before - 12
    assert mamba.held_blocks(2) == (7, 10) and mamba.held_block_count(2) == 2
    assert mamba_table(mamba, 2)[5] == NO_BLOCK  # the hit's state: given back
    assert cached_states(mamba) == 3  # 8, 16, 24 (blank blocks went to the states at 32 and 40)
    assert mamba.stats.prefix_cache_hits == 24 and mamba.stats.prefix_cache_queries == 24 + 40


def test_a_hit_whose_state_is_held_counts_it_when_it_leaves_the_queue():
    """The 22-token prompt again, with its last whole block's state cached: a 22-token prompt of the
    same content hits 20 tokens (its own last token is always computed); the Mamba group reads the state
    at 20 (free: it leaves the queue) and writes one block: 2 blocks."""
    kv, _, mamba, pool = mamba_hybrid()
    kv.admit(1, ((7, 22),), 30, 101)
    kv.free(1)
    assert kv.lookup(((7, 22),)) == PrefixHit(20)
    assert mamba.slots_needed_to_admit_cached(((7, 22),), 0, 20) == 2 * BLOCK
    kv.admit(2, ((7, 22),), 30, 102)
    assert mamba.held_blocks(2) == (4, 6)
    # A third request while the second holds the state at 20: shared, it costs nothing more.
    assert mamba.slots_needed_to_admit_cached(((7, 22),), 0, 20) == 1 * BLOCK
    kv.admit(3, ((7, 22),), 30, 103)
    assert mamba.tables is not None and mamba.tables.excess == 1
    assert parts(kv)["mamba"][0] == 3 * BLOCK  # the shared state once, each request's own once


def test_an_evicted_state_is_no_longer_a_hit():
    """A pool of 12 blocks. The 24-token prompt takes 6 full blocks (0-5) and 3 Mamba ones (6: the
    state at 8, given back at once; 7, 8: held); freed, the queue is blank 9, 10, 11, then cached
    6, 5, 4, 3, 2, 1, 0 (full, tail first), 8, 7 (Mamba, tail first). A 12-token prompt of other
    content takes 3 full blocks (9-11) and 2 Mamba ones: block 6 (the state at 8 evicted) and block 5
    (full attention's block 5 evicted). The first prompt's prefix then hits 16 tokens: full attention
    serves blocks 0-4, the Mamba group its state at 16 (the one at 24 lies past the full hit)."""
    kv, full, mamba, pool = mamba_hybrid(blocks=12)
    kv.admit(1, ((5, 24),), 26, 101)
    kv.free(1)
    assert kv.lookup(((5, 24), (9, 4))) == PrefixHit(24)
    kv.admit(2, ((8, 12),), 14, 102)
    assert mamba_table(mamba, 2) == [NO_BLOCK, 6, 5]
    assert mamba.stats.evictions == 1 and full.stats.evictions == 1 and kv.evictions() == 2
    assert kv.lookup(((5, 24), (9, 4))) == PrefixHit(16)
    assert kv.lookup(((5, 9), (9, 4))).cached_tokens == 0  # the state at 8 is gone
    assert pool.free_blocks == 12 - 3 - 2


def test_a_preempted_request_is_readmitted_from_its_last_cached_state():
    """22 prompt tokens, decoded to 30: the decode steps cached the states at 24 and 28 (every block a
    decode crosses); preempted, its partial block 7 goes back blank. Re-admitted with what it had
    generated (the engine's recompute: prompt + 8 output tokens, 30 in all), it hits 28 tokens: full
    attention's 7 blocks, the Mamba state at 28; it then holds that state and writes block 7."""
    kv, _, mamba, _ = mamba_hybrid()
    kv.admit(1, ((5, 22),), 40, 105)
    for _ in range(8):
        kv.grow(1, 1)
    assert kv.seq_len(1) == 30 and mamba.held_blocks(1) == (7, 8)
    assert cached_states(mamba) == 5  # 8, 16, 20 (prefill), 24, 28 (decode)
    kv.free(1, finished=False)
    assert cached_states(mamba) == 5
    again = ((5, 22), (105, 8))
    assert kv.lookup(again) == PrefixHit(28)
    assert kv.admit(2, again, 40, 105) == 28
    assert mamba.held_blocks(2) == (6, 8) and mamba.held_block_count(2) == 2
    assert cached_states(mamba) == 4


def test_a_prompt_keyed_as_its_chunks_are_scheduled_leaves_only_those_states_and_blocks():
    """With the engine reporting chunks (``defer_prompt_keys``): the 22-token prompt holds its last two
    states (blocks 6, 7) and the full group's 6 blocks from admission, but caches nothing yet; the
    states its earlier chunks write (at 8 and 16 tokens) are taken, cached and given back as those
    chunks are scheduled. 8 tokens scheduled: the state at 8 (block 8, from the queue's head) and
    the full group's first 2 blocks, a hit of 8; 19: the state at 16, 16; 20: 20. Preempted after 8
    tokens instead: the full group keeps its 2 scheduled blocks and the Mamba group the state at 8,
    a hit of 8; what was never computed goes back blank, to the head (6, 7: the held states; 2-5:
    the full group's)."""
    probe = ((7, 22), (8, 4))
    kv, full, mamba, pool = mamba_hybrid()
    assert kv.defer_prompt_keys()
    assert kv.admit(1, ((7, 22),), 30, 101) == 0
    assert mamba_table(mamba, 1) == [NO_BLOCK] * 4 + [6, 7] and cached_states(mamba) == 0
    assert kv.lookup(probe) == PrefixHit(0)
    kv.prompt_scheduled(1, 8)
    assert (full.lookup(probe), mamba.lookup(probe)) == (PrefixHit(8), PrefixHit(8))
    assert cached_states(mamba) == 1
    kv.prompt_scheduled(1, 12)  # (the chunk writing the state at 16 is not yet scheduled)
    assert kv.lookup(probe) == PrefixHit(8) and cached_states(mamba) == 1
    kv.prompt_scheduled(1, 19)
    assert kv.lookup(probe) == PrefixHit(16) and cached_states(mamba) == 2
    kv.prompt_scheduled(1, 20)
    assert kv.lookup(probe) == PrefixHit(20)
    kv, _, mamba, pool = mamba_hybrid()
    kv.defer_prompt_keys()
    kv.admit(1, ((7, 22),), 30, 101)
    kv.prompt_scheduled(1, 8)
    kv.free(1, finished=False)
    assert parts(kv) == {
        "full": (0, 0, 0, 0, 8, 0),
        "mamba": (0, 0, 0, 0, 4, 0),
        "shared pool": (0, 0, 0, 0, 0, 148),
    }
    assert kv.lookup(probe) == PrefixHit(8)
    assert pool.queue.order()[:6] == [6, 7, 2, 3, 4, 5] and pool.queue.order()[-3:] == [8, 1, 0]


# -- the accounting identity under random operations -----------------------------------------------


KINDS = ["admit", "admit", "grow", "decode_step", "free", "preempt", "fork", "match"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 49), st.integers(0, 20)), max_size=80))
def test_the_pool_stays_whole_with_mamba_states_cached(operations):
    """Random admissions (prompts sharing 0-60 tokens), growths, decode steps, frees, preemptions,
    forks and lookups over full, sliding-window and Mamba groups with prefix caching
    (tests/hybrid_driver.py, ``vllm-hybrid-prefix-mamba``): after every one, used + reserved + internal
    fragmentation + cached + free is the pool in total and per group; each group's part is its held
    blocks (a shared one once, a Mamba prefill's two states, not the null blocks between) and its cached
    ones; reference counts are the holders; every probe's common hit is served by every group (the
    Mamba group: a cached state at its last block); a refused operation changes nothing."""
    driver = HybridDriver("vllm-hybrid-prefix-mamba")
    for kind, choice, amount in operations:
        driver.apply(kind, choice, amount)
        for seq_id in driver.final_len:
            mamba = driver.kv.groups[-1].policy
            assert isinstance(mamba, MambaGroup) and 1 <= mamba.held_block_count(seq_id) <= 2
    driver.drain()


# -- end to end ------------------------------------------------------------------------------------

BREAKDOWN = list(BREAKDOWN_COLUMNS)


def qwen3_next(enable_prefix_caching: bool, **engine) -> dict:
    """Qwen3-Next on an H200 (TP 2: block 544 tokens), 60 requests of which 9 in 10 continue one of
    two shared prefixes of 1,000-3,000 tokens; outputs cross a block or two."""
    return {
        "name": "qwen3-next-prefix",
        "seed": 5,
        "model": "Qwen3-Next-80B-A3B",
        "gpu": "H200",
        "engine": {
            "max_model_len": 16384,
            "tensor_parallel_size": 2,
            "enable_prefix_caching": enable_prefix_caching,
            **engine,
        },
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
        "variants": [{"name": "hybrid", "policy": "vllm-hybrid"}],
    }


def run(raw: dict, tmp_path):
    experiment = validate_experiment(raw)
    return {
        result.name: result
        for result in run_experiment(experiment, tmp_path / "c.yaml", out_dir=tmp_path / "out")
    }


def test_qwen3_next_with_prefix_caching_runs_in_align_mode_and_its_pool_stays_whole(tmp_path):
    """A YAML experiment with enable_prefix_caching: true on Qwen3-Next (gated delta net: vLLM's
    default mode is 'align'): it runs, hits the shared prefixes' cached states, and the breakdown sums
    to the pool at every sample, in total and per KV group; the capacity line counts 2 blocks per
    request in each state group (vLLM's align mode), the block size is unchanged (align raises it as
    'none' does)."""
    results = run(qwen3_next(True), tmp_path / "on")
    summary = results["hybrid"].summary
    assert summary["requests_finished"] == 60 and summary["block_size"] == 544
    assert summary["prefix_cache_hit_rate"] > 0.05
    series = pd.read_parquet(tmp_path / "on" / "out" / "hybrid" / "timeseries.parquet")
    assert (series[BREAKDOWN].sum(axis=1) == summary["kv_pool_tokens"]).all()
    assert (series[BREAKDOWN] >= 0).all().all()
    assert series["cached_tokens"].max() > 0
    groups = pd.read_parquet(tmp_path / "on" / "out" / "hybrid" / "kv_groups.parquet")
    entries = groups["kv_group"].nunique()
    assert entries == 5  # the full group, three gated-delta-net groups, the shared pool's blank blocks
    totals = groups[BREAKDOWN].to_numpy().reshape(-1, entries * len(BREAKDOWN)).sum(axis=1)
    assert (totals == summary["kv_pool_tokens"]).all()
    assert (groups[BREAKDOWN] >= 0).all().all()
    # Off: the same stream, no hit; the same blocks (align does not change the block size).
    off = run(qwen3_next(False), tmp_path / "off")["hybrid"].summary
    assert off["prefix_cache_hits"] == 0 and off["num_gpu_blocks"] == summary["num_gpu_blocks"]


def test_a_pool_short_of_blocks_preempts_rather_than_failing_a_flush(tmp_path):
    """A pool of 1 GB (a few dozen blocks of 544 tokens) under the same stream: decode steps run
    short and requests are preempted. A flush of decoded tokens takes a block in each state group at
    each block boundary too, so the engine's quick check that the pool holds a flush counts those
    groups (it counted the full-attention group alone, and a flush then failed with OutOfKVMemory).
    The breakdown still sums to the pool at every sample."""
    results = run(qwen3_next(True, kv_cache_memory_bytes=10**9), tmp_path)
    summary = results["hybrid"].summary
    assert summary["requests_finished"] == 60
    assert summary["preemptions"] > 0
    series = pd.read_parquet(tmp_path / "out" / "hybrid" / "timeseries.parquet")
    assert (series[BREAKDOWN].sum(axis=1) == summary["kv_pool_tokens"]).all()
    assert (series[BREAKDOWN] >= 0).all().all()


def test_the_capacity_line_counts_two_state_blocks_per_request_in_align_mode(tmp_path):
    prepared = prepare_experiment(validate_experiment(qwen3_next(True)), tmp_path / "c.yaml")
    capacity = prepared.variants[0].hybrid.capacity  # type: ignore[union-attr]
    assert capacity.block_size == capacity.mamba_block_size == 544
    states = [group for group in capacity.groups if group.kind.label != "full"]
    assert len(states) == 3 and {group.blocks_per_request for group in states} == {2}


def test_nemotron_h_runs_align_mode_when_asked(tmp_path):
    raw = qwen3_next(True)
    raw["model"] = "Nemotron-H-8B-Base-8K"
    raw["engine"] = {"max_model_len": 8192, "enable_prefix_caching": True, "kv_cache_memory_bytes": 3 * 10**9}
    raw["workload"] |= {"num_requests": 20, "prompt_len": {"kind": "uniform", "low": 200, "high": 4000}}
    raw["variants"][0]["options"] = {"mamba_cache_mode": "align"}
    summary = run(raw, tmp_path)["hybrid"].summary
    assert summary["requests_finished"] == 20 and summary["block_size"] == 1040


@pytest.mark.parametrize(
    ("model", "engine", "options", "message"),
    [
        (
            # (vLLM's default for Nemotron-H's Mamba2 layers is 'all': Marconi's states are align's)
            "Nemotron-H-8B-Base-8K",
            {"enable_prefix_caching": True},
            {"mamba_prefix_policy": "marconi"},
            "variants.0.options.mamba_prefix_policy: 'marconi' chooses among the states "
            "mamba_cache_mode 'align' writes, and Nemotron-H-8B-Base-8K runs 'all' (vLLM's default for "
            "its Mamba layers): set variants.0.options.mamba_cache_mode: align",
        ),
        (
            "Qwen3-Next-80B-A3B",
            {"enable_prefix_caching": True},
            {"mamba_cache_mode": "none"},
            "variants.0.options.mamba_cache_mode: 'none' with engine.enable_prefix_caching: true: vLLM "
            "replaces it by its default for Qwen3-Next-80B-A3B, 'align'",
        ),
        (
            "Qwen3-Next-80B-A3B",
            {"enable_prefix_caching": False},
            {"mamba_cache_mode": "align"},
            "variants.0.options.mamba_cache_mode: 'align' needs engine.enable_prefix_caching: true",
        ),
        (
            "Qwen3-Next-80B-A3B",
            {"enable_prefix_caching": True},
            {"mamba_cache_mode": "aligned"},
            "variants.0.options.mamba_cache_mode: 'aligned' is not one of vLLM's modes",
        ),
        (
            "gpt-oss-20b",
            {"enable_prefix_caching": True},
            {"mamba_cache_mode": "align"},
            "variants.0.options.mamba_cache_mode: 'align': gpt-oss-20b has no Mamba/linear-attention layers",
        ),
        (
            "Qwen3-Next-80B-A3B",
            {"enable_prefix_caching": True, "enable_chunked_prefill": False, "max_num_batched_tokens": 16384},
            {},
            "engine.enable_chunked_prefill: false: vLLM's mamba_cache_mode 'align'",
        ),
        (
            "Qwen3-Next-80B-A3B",
            {"enable_prefix_caching": True, "max_num_batched_tokens": 512},
            {},
            "engine.max_num_batched_tokens: 512 is less than the 544-token block",
        ),
    ],
)
def test_what_vllm_would_not_run_is_refused_naming_the_key_and_value(
    tmp_path, model, engine, options, message
):
    raw = qwen3_next(True)
    raw["model"] = model
    raw["engine"] |= engine
    if model != "Qwen3-Next-80B-A3B":
        raw["engine"] |= {"max_model_len": 8192, "tensor_parallel_size": 1}
    raw["variants"][0]["options"] = options
    with pytest.raises(ConfigError, match=re.escape(message)):
        prepare_experiment(validate_experiment(raw), tmp_path / "c.yaml")


def test_an_explicit_all_on_a_model_without_its_support_falls_back_to_align(tmp_path):
    """vLLM: "all" asked of a model whose Mamba layers do not support it falls back to "align"."""
    raw = qwen3_next(True)
    raw["variants"][0]["options"] = {"mamba_cache_mode": "all"}
    prepared = prepare_experiment(validate_experiment(raw), tmp_path / "c.yaml")
    capacity = prepared.variants[0].hybrid.capacity  # type: ignore[union-attr]
    assert capacity.mamba_block_size == capacity.block_size == 544
