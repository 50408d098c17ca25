"""vllm-hybrid's Mamba groups in vLLM's ``mamba_cache_mode: all`` (policies/hybrid/mamba.py), worked
out by hand, which mode vLLM runs for which model (sim/kv/allocators.py), the accounting under random
operations, and end to end on Nemotron-H.

The model below is tests/test_mamba_prefix_caching.py's: a full-attention group and a Mamba group over
one pool of blocks of 4 tokens, the engine's prefill budget 8 tokens a request (2 blocks). In all mode
vLLM does not cut chunks to blocks: a prompt's chunks are 8 tokens from its hit's end, the last one
shorter. A chunk from ``c`` to ``e`` reads the state in block ``(c - 1) // 4`` and writes a state into
every block up to ``cdiv(e, 4) - 1`` (one at each block boundary it crosses, and its last token's);
the next chunk frees all of them but the last; every full block is cached. kvsim holds, from admission
to the first decoded token, the blocks of the last chunk; the earlier chunks' blocks are taken from the
queue's head, cached and given back (to its tail) there and then, in block order.

Block ids: the free queue hands out blank blocks 0, 1, 2, ... first (a blank block given back goes to
the head), then cached ones, least recently freed first. The groups take and give back in their
order: full attention, then Mamba.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import ChildSpec, PolicyInputError, PoolSpec, PrefixHit
from policies.hybrid.block_pool import SharedBlockPool
from policies.hybrid.full import FullAttentionGroup
from policies.hybrid.mamba import MambaGroup
from policies.hybrid.prefix_pool import NO_BLOCK, PrefixCachingBlockPool
from sim.config import ConfigError, validate_experiment
from sim.hardware.layers import Mamba2State
from sim.hardware.models import MODEL_PRESETS, model_from_hf_config
from sim.kv.allocators import vllm_mamba_cache_mode, vllm_mamba_chunk_size
from sim.kv.coordinator import KVGroup, MultiGroupCoordinator, make_coordinator
from sim.outputs.metrics import BREAKDOWN_COLUMNS
from sim.runner import prepare_experiment, run_experiment
from tests.hybrid_driver import HybridDriver
from tests.test_layers import NEMOTRON_H_8B

BLOCK = 4
NEMOTRON = MODEL_PRESETS["Nemotron-H-8B-Base-8K"]
QWEN3_NEXT = MODEL_PRESETS["Qwen3-Next-80B-A3B"]


def all_mode(
    blocks: int = 40, prefill_tokens: int = 8
) -> tuple[MultiGroupCoordinator, FullAttentionGroup, MambaGroup, PrefixCachingBlockPool]:
    pool = PrefixCachingBlockPool(blocks, BLOCK)
    spec = PoolSpec(blocks * BLOCK, BLOCK, 4096)
    full = FullAttentionGroup(spec, pool, prefill_tokens)
    mamba = MambaGroup(spec, pool, prefill_tokens, "all")
    kv = make_coordinator([KVGroup("full", full), KVGroup("mamba", mamba)])
    assert isinstance(kv, MultiGroupCoordinator)
    return kv, full, mamba, pool


def parts(kv: MultiGroupCoordinator) -> dict[str, tuple[int, ...]]:
    """Each entry's (used, reserved, internal, external, cached, free) slots; they sum to the pool."""
    split = {name: tuple(b.as_dict().values()) for name, b in kv.group_breakdowns().items()}
    assert sum(sum(values) for values in split.values()) == kv.pool_slots
    return split


def table(group: FullAttentionGroup | MambaGroup, seq_id: int) -> list[int]:
    assert group.tables is not None
    return group.tables.by_seq[id(group.sequences[seq_id])].table


def cached_states(mamba: MambaGroup) -> int:
    assert mamba.tables is not None
    return mamba.tables.pool.cached_in(mamba.tables.group)


# -- the blocks a prompt holds at its last chunk ---------------------------------------------------


@pytest.mark.parametrize(
    ("prompt_len", "hit", "run"),
    [
        # 22 tokens: chunks 0-8, 8-16, 16-22; the last reads the state at 16 (block 3) and writes
        # blocks 4 (the state at 20) and 5 (at 22): blocks 3-5.
        (22, 0, (3, 6)),
        # 24 tokens: chunks end at 8, 16, 24: blocks 3 (state at 16) to 5 (at 24).
        (24, 0, (3, 6)),
        # 16 tokens: chunks 0-8, 8-16: blocks 1 (state at 8) to 3.
        (16, 0, (1, 4)),
        # 8 tokens or fewer: one chunk from 0, no state read: blocks 0 to the last token's.
        (8, 0, (0, 2)),
        (3, 0, (0, 1)),
        # 9 tokens: chunks 0-8, 8-9: the state at 8 (block 1) is read and written over in place.
        (9, 0, (1, 3)),
        # A hit of 3 blocks in a 23-token prompt: chunks 12-20, 20-23: blocks 4 (state at 20) and 5.
        (23, 3, (4, 6)),
        # A hit of 5 blocks in a 22-token prompt: one chunk 20-22 reads the hit's state (block 4).
        (22, 5, (4, 6)),
        # A hit of 1 block in a 14-token prompt: chunks 4-12, 12-14: blocks 2 (state at 12) and 3.
        (14, 1, (2, 4)),
    ],
)
def test_a_prompt_holds_every_block_of_its_last_chunk(prompt_len, hit, run):
    _, _, mamba, _ = all_mode()
    assert mamba.last_chunk_run(prompt_len, hit) == run


def test_a_prompt_leaves_a_cached_state_at_every_block_boundary_and_decodes_as_align_does():
    """22 tokens, 30 final. Full attention takes blocks 0-5 (22 used, 2 reserved). The Mamba group:
    the chunks 0-8 and 8-16 write the states at 4, 8, 12 (blocks 0-2 of its table): blank blocks 6, 7,
    8 taken, cached, given back (to the queue's tail); the last chunk holds blocks 3-5 of its table:
    blank 9, 10, 11 (the states at 16 and 20 full, cached while held; 22 partial). 3 blocks held (used
    whole: 12 slots), 3 cached; 40 - 6 - 3 - 3 = 28 blocks blank."""
    kv, full, mamba, pool = all_mode()
    assert kv.admit(1, ((7, 22),), 30, 101) == 0
    assert table(full, 1) == [0, 1, 2, 3, 4, 5]
    assert mamba.held_blocks(1) == (3, 6) and mamba.held_block_count(1) == 3
    assert table(mamba, 1) == [NO_BLOCK] * 3 + [9, 10, 11]
    assert cached_states(mamba) == 3
    assert parts(kv) == {
        "full": (22, 2, 0, 0, 0, 0),
        "mamba": (12, 0, 0, 0, 12, 0),
        "shared pool": (0, 0, 0, 0, 0, 28 * BLOCK),
    }
    # The first decoded token's step frees every block before the last token's (vLLM's
    # remove_skipped_blocks with num_skipped_tokens = 22 - 1): blocks 4 then 3 of the table (10, 9),
    # cached. Then as align: the 25th token's step writes block 6 (blank 13; full attention took 12
    # first), the state at 24 in block 5 is full now: cached; the 26th frees it.
    assert mamba.growth_room(1) == 0
    expected = {23: (5, 6), 24: (5, 6), 25: (5, 7), 26: (6, 7)}
    for length, run in expected.items():
        kv.grow(1, 1)
        assert (kv.seq_len(1), mamba.held_blocks(1)) == (length, run)
        assert mamba.held_block_count(1) == run[1] - run[0]
    assert table(mamba, 1)[5:] == [NO_BLOCK, 13] and table(full, 1)[6] == 12
    assert cached_states(mamba) == 6  # the states at 4, 8, 12, 16, 20 and 24
    assert parts(kv)["mamba"] == (4, 0, 0, 0, 24, 0)
    kv.free(1)
    # Block 6 (tokens 24-25) goes back blank; the states at 4-24 stay cached.
    assert cached_states(mamba) == 6 and parts(kv)["mamba"] == (0, 0, 0, 0, 24, 0)
    assert pool.free_blocks == 40


def test_a_hit_at_a_block_boundary_that_no_chunk_ended_on():
    """After the 22-token prompt of content 7 (states cached at every boundary, 4 to 24), a 23-token
    prompt sharing its first 14 tokens: full attention serves blocks 0-2 (12 tokens; block 3 differs),
    and the Mamba group holds the state at 12, which align mode never writes (its chunks end at 8 and
    16): a 12-token hit, where align's is 8 (tests/test_mamba_prefix_caching.py).

    Needed in the Mamba group: its last chunk (20-23) holds blocks 4 and 5 of its table, and the hit's
    state (block 8, free) leaves the queue: 3 blocks (vLLM's first chunk 12-20 holds blocks 2-4: 3
    too). Taken: the hit's state is touched then given back (the prefill moves past it), block 3 of
    the table (the state at 16) comes from the queue's head (blank 15), cached, given back; blocks 4
    and 5 are blank 16 and 17. Full attention took 13, 12, 14 (the blank stack after the first
    prompt's free: 13, 12 back on top) for its blocks 3-5."""
    kv, full, mamba, pool = all_mode()
    kv.admit(1, ((7, 22),), 30, 101)
    for _ in range(4):
        kv.grow(1, 1)
    kv.free(1)
    prompt = ((7, 14), (9, 9))
    assert kv.lookup(prompt) == PrefixHit(12)
    assert full.slots_needed_to_admit_cached(prompt, 0, 12) == (3 + 3) * BLOCK
    assert mamba.slots_needed_to_admit_cached(prompt, 0, 12) == 3 * BLOCK
    assert kv.admit(2, prompt, 30, 102) == 12
    assert table(full, 2) == [0, 1, 2, 13, 12, 14]
    assert table(mamba, 2) == [NO_BLOCK] * 4 + [16, 17]
    assert mamba.held_blocks(2) == (4, 6) and mamba.held_block_count(2) == 2
    # Cached: the 6 states of content 7 (the one at 12 given back again) and the new one at 16.
    assert cached_states(mamba) == 7
    assert parts(kv)["mamba"] == (8, 0, 0, 0, 28, 0)
    assert mamba.stats.prefix_cache_hits == 12 and mamba.stats.prefix_cache_queries == 22 + 23
    assert pool.free_blocks == 40 - 6 - 2
    # Decoding crosses into block 6 at the 25th token: the state at 24 (block 17) cached, then freed.
    for _ in range(3):
        kv.grow(2, 1)
    assert kv.seq_len(2) == 26 and mamba.held_blocks(2) == (6, 7)
    assert cached_states(mamba) == 9  # and the states at 20 and 24 of this prompt


def test_a_fork_at_admission_shares_the_full_states_and_copies_the_partial_one():
    """At admission the 22-token prompt holds blocks 3-5 of the Mamba table: 3 and 4 full (states at
    16 and 20, never written again), 5 partial. A child shares 3 and 4 and copies 5; full attention
    shares blocks 0-4 and copies block 5: 2 blocks in all."""
    kv, _, mamba, pool = all_mode()
    kv.admit(1, ((7, 22),), 30, 101)
    free_before = pool.free_blocks
    assert mamba.slots_needed_to_fork(1, 1) == 1 * BLOCK
    kv.fork(1, [ChildSpec(2, 30, -2)])
    assert pool.free_blocks == free_before - 2
    assert mamba.held_blocks(2) == (3, 6) and table(mamba, 2)[3:5] == [9, 10]
    assert mamba.tables is not None and mamba.tables.excess == 2
    assert parts(kv)["mamba"][0] == 4 * BLOCK  # the shared states once, each partial one once


def test_an_evicted_state_is_no_longer_a_hit():
    """A pool of 12 blocks. A 16-token prompt of content 5: full attention takes blocks 0-3; the Mamba
    group's first chunk (0-8) writes the state at 4 (table block 0: blank 4, cached, given back) and
    its last (8-16) holds blocks 1-3 of its table (blank 5, 6, 7: the states at 8, 12, 16, all full,
    cached). Freed: the queue is blank 8, 9, 10, 11, then cached 4, 3, 2, 1, 0 (full attention's, tail
    first), 7, 6, 5. Its prefix then hits at every block boundary: 4 tokens (align would need a chunk
    to have ended there).

    A 12-token prompt of other content: full attention takes blank 8, 9, 10; the Mamba group's first
    chunk writes its state at 4 into blank 11 (cached, given back), its last chunk holds blocks 1 and
    2 of its table: no blank block is left, so the two least recently freed cached blocks are evicted,
    4 (the Mamba state at 4 of content 5) and 3 (full attention's block 3 of content 5). Content 5's
    16-token prefix then hits 12 tokens (full attention serves 3 blocks, the state at 12 is cached);
    its 4-token prefix hits nothing (the state at 4 is gone)."""
    kv, full, mamba, pool = all_mode(blocks=12)
    kv.admit(1, ((5, 16),), 18, 101)
    assert table(full, 1) == [0, 1, 2, 3] and table(mamba, 1) == [NO_BLOCK, 5, 6, 7]
    assert cached_states(mamba) == 1
    kv.free(1)
    assert cached_states(mamba) == 4
    assert kv.lookup(((5, 16), (9, 4))) == PrefixHit(16)
    assert kv.lookup(((5, 5), (9, 8))) == PrefixHit(4)
    kv.admit(2, ((8, 12),), 14, 102)
    assert table(full, 2) == [8, 9, 10] and table(mamba, 2) == [NO_BLOCK, 4, 3]
    assert mamba.stats.evictions == 1 and full.stats.evictions == 1 and kv.evictions() == 2
    assert kv.lookup(((5, 16), (9, 4))) == PrefixHit(12)
    assert kv.lookup(((5, 5), (9, 8))).cached_tokens == 0
    assert pool.free_blocks == 12 - 3 - 2
    assert cached_states(mamba) == 4  # content 5's at 8, 12, 16; content 8's at 4


def test_a_budget_under_a_block_is_fine_in_all_mode():
    """No aligned split in all mode: a 3-token budget computes a 10-token prompt in chunks 0-3, 3-6,
    6-9, 9-10; the last reads the state at 9 (block 2, partial) and writes it in place: block 2 alone.
    The earlier chunks' full blocks (0, 1) are cached on the way."""
    kv, _, mamba, _ = all_mode(prefill_tokens=3)
    assert mamba.last_chunk_run(10, 0) == (2, 3)
    kv.admit(1, ((4, 10),), 12, 101)
    assert mamba.held_blocks(1) == (2, 3) and cached_states(mamba) == 2


def test_the_mode_must_match_the_pool():
    caching = PrefixCachingBlockPool(8, BLOCK)
    plain = SharedBlockPool(8, BLOCK)
    spec = PoolSpec(8 * BLOCK, BLOCK, 4096)
    assert MambaGroup(spec, plain, 8).cache_mode == "none"
    assert MambaGroup(spec, caching, 8).cache_mode == "align"
    for pool, mode in ((plain, "all"), (plain, "align"), (caching, "none"), (caching, "aligned")):
        with pytest.raises(PolicyInputError, match=re.escape(f"mamba_cache_mode {mode!r}")):
            MambaGroup(spec, pool, 8, mode)


# -- which mode vLLM runs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "option", "chunked", "mode"),
    [
        # Nemotron-H's Mamba2 layers support "all": vLLM's default with prefix caching.
        (NEMOTRON, None, True, "all"),
        (NEMOTRON, "all", True, "all"),
        (NEMOTRON, None, False, "all"),  # ("all" needs no chunked prefill)
        (NEMOTRON, "align", True, "align"),
        # Qwen3-Next's gated delta net does not: "align", and "all" asked for falls back to it.
        (QWEN3_NEXT, None, True, "align"),
        (QWEN3_NEXT, "all", True, "align"),
        (QWEN3_NEXT, "align", True, "align"),
    ],
)
def test_the_mode_vllm_runs_with_prefix_caching(model, option, chunked, mode):
    assert vllm_mamba_cache_mode(model, option, True, chunked) == mode
    assert vllm_mamba_cache_mode(model, None, False, chunked) == "none"


@pytest.mark.parametrize(
    ("model", "option", "message"),
    [
        (
            NEMOTRON,
            "none",
            "variants.0.options.mamba_cache_mode: 'none' with engine.enable_prefix_caching: true: vLLM "
            "replaces it by its default for Nemotron-H-8B-Base-8K, 'all'; leave the option unset or set 'all'",
        ),
        (
            NEMOTRON,
            "align",
            "engine.enable_chunked_prefill: false: vLLM's mamba_cache_mode 'align' (prefix caching on "
            "Nemotron-H-8B-Base-8K) requires chunked prefill",
        ),
        (
            QWEN3_NEXT,
            "all",
            "engine.enable_chunked_prefill: false: vLLM's mamba_cache_mode 'align' (prefix caching on "
            "Qwen3-Next-80B-A3B, whose Mamba layers do not support all) requires chunked prefill",
        ),
    ],
)
def test_what_vllm_would_not_run_names_the_key(model, option, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        vllm_mamba_cache_mode(
            model,
            option,
            True,
            False,
            option_key="variants.0.options.mamba_cache_mode",
            caching_key="engine.enable_prefix_caching",
            chunked_key="engine.enable_chunked_prefill",
        )


def test_the_chunk_size_all_mode_aligns_to():
    """vLLM's get_mamba_chunk_size: the config's chunk size (Nemotron-H: 128), else 2048."""
    assert vllm_mamba_chunk_size(NEMOTRON) == 128
    no_chunk = dataclasses.replace(
        NEMOTRON,
        layer_kinds=tuple(
            dataclasses.replace(kind, chunk_size=None) if isinstance(kind, Mamba2State) else kind
            for kind in NEMOTRON.layer_kinds or ()
        ),
    )
    assert vllm_mamba_chunk_size(no_chunk) == 2048
    assert vllm_mamba_chunk_size(QWEN3_NEXT) == 2048


@pytest.mark.parametrize(
    ("fields", "chunk"),
    [({}, 2048), ({"chunk_size": 128}, 128), ({"mamba_chunk_size": 256, "chunk_size": 128}, 256)],
)
def test_a_config_json_gives_its_chunk_size(tmp_path, fields, chunk):
    """vLLM reads ``mamba_chunk_size`` (Bamba, Granite), then ``chunk_size`` (Mamba2, NemotronH)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**NEMOTRON_H_8B, **fields}))
    assert vllm_mamba_chunk_size(model_from_hf_config(path, num_params=1)) == chunk


def test_a_chunk_size_must_be_a_positive_integer(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**NEMOTRON_H_8B, "chunk_size": 0}))
    with pytest.raises(ValueError, match="field 'chunk_size' must be a positive integer, got 0"):
        model_from_hf_config(path, num_params=1)


# -- the accounting identity under random operations -----------------------------------------------


KINDS = ["admit", "admit", "grow", "decode_step", "free", "preempt", "fork", "match"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 49), st.integers(0, 20)), max_size=80))
def test_the_pool_stays_whole_with_a_state_at_every_block_boundary(operations):
    """Random admissions (prompts sharing 0-60 tokens), growths, decode steps, frees, preemptions,
    forks and lookups over full, sliding-window and all-mode Mamba groups (tests/hybrid_driver.py,
    ``vllm-hybrid-prefix-mamba-all``): after every one, used + reserved + internal fragmentation +
    cached + free is the pool in total and per group; each group's part is its held blocks (a shared
    one once) and its cached ones; every probe's common hit is served by every group; a refused
    operation changes nothing. A Mamba sequence holds every block of its run (no null block in it)."""
    driver = HybridDriver("vllm-hybrid-prefix-mamba-all")
    mamba = driver.kv.groups[-1].policy
    assert isinstance(mamba, MambaGroup) and mamba.cache_mode == "all"
    for kind, choice, amount in operations:
        driver.apply(kind, choice, amount)
        for seq_id in driver.final_len:
            first, end = mamba.held_blocks(seq_id)
            assert mamba.held_block_count(seq_id) == end - first >= 1
            assert NO_BLOCK not in table(mamba, seq_id)[first:end]
    driver.drain()


def test_the_fuzz_mix_binds_memory_and_evicts_states():
    """``make fuzz``'s mix, briefly (3,000 seeded operations over the same layout): memory binds (some
    admissions and growths refused), cached states are evicted, every kind of operation runs, and the
    checks of every step hold."""
    import numpy as np

    from tests.fuzz import WEIGHTS

    driver = HybridDriver("vllm-hybrid-prefix-mamba-all")
    rng = np.random.default_rng(5)
    kinds = list(WEIGHTS)
    for pick in rng.choice(len(kinds), size=3000, p=list(WEIGHTS.values())):
        driver.apply(kinds[pick], int(rng.integers(0, 50)), int(rng.integers(0, 21)))
    driver.drain()
    assert {"admit", "grow", "fork", "free", "preempt", "decode_step", "match"} <= set(driver.done)
    assert driver.failed["admit"] > 0 and driver.failed["grow"] + driver.failed["decode_step"] > 0
    assert driver.kv.groups[-1].policy.stats.evictions > 0


# -- end to end ------------------------------------------------------------------------------------

BREAKDOWN = list(BREAKDOWN_COLUMNS)


def nemotron_h(**options) -> dict:
    """Nemotron-H-8B on an H200 with prefix caching, 40 requests of which 9 in 10 continue one of two
    shared prefixes of 1,000-3,000 tokens."""
    return {
        "name": "nemotron-h-prefix",
        "seed": 5,
        "model": "Nemotron-H-8B-Base-8K",
        "gpu": "H200",
        "engine": {"max_model_len": 8192, "enable_prefix_caching": True, "kv_cache_memory_bytes": 3 * 10**9},
        "cost_model": "analytic",
        "workload": {
            "num_requests": 40,
            "arrival": {"kind": "poisson", "rate_per_s": 4},
            "prompt_len": {"kind": "uniform", "low": 200, "high": 3000},
            "output_len": {"kind": "uniform", "low": 20, "high": 400},
            "shared_prefix": {
                "num_prefixes": 2,
                "prefix_len": {"kind": "uniform", "low": 1000, "high": 3000},
                "fraction": 0.9,
            },
        },
        "variants": [{"name": "hybrid", "policy": "vllm-hybrid", "options": options}],
    }


def test_nemotron_h_with_prefix_caching_runs_all_mode_and_its_pool_stays_whole(tmp_path):
    """Unset, Nemotron-H runs vLLM's default, "all": the block is the least multiple of its 128-token
    chunk that holds a state (1,152 tokens, tests/test_hybrid_capacity.py), each state group budgets
    cdiv(8,192, 1,152) = 8 blocks per request; it hits the shared prefixes, and the breakdown sums to
    the pool at every sample, in total and per KV group."""
    prepared = prepare_experiment(validate_experiment(nemotron_h()), tmp_path / "c.yaml")
    capacity = prepared.variants[0].hybrid.capacity  # type: ignore[union-attr]
    assert capacity.block_size == capacity.mamba_block_size == 1152
    states = [group for group in capacity.groups if group.kind.label == "mamba2"]
    assert len(states) == 6 and {group.blocks_per_request for group in states} == {8}
    experiment = validate_experiment(nemotron_h())
    (result,) = run_experiment(experiment, tmp_path / "c.yaml", out_dir=tmp_path / "out")
    summary = result.summary
    assert summary["requests_finished"] == 40 and summary["block_size"] == 1152
    assert summary["prefix_cache_hit_rate"] > 0.05
    series = pd.read_parquet(tmp_path / "out" / "hybrid" / "timeseries.parquet")
    assert (series[BREAKDOWN].sum(axis=1) == summary["kv_pool_tokens"]).all()
    assert (series[BREAKDOWN] >= 0).all().all()
    groups = pd.read_parquet(tmp_path / "out" / "hybrid" / "kv_groups.parquet")
    entries = groups["kv_group"].nunique()
    assert entries == 8  # the full group, six Mamba2 groups, the shared pool's blank blocks
    totals = groups[BREAKDOWN].to_numpy().reshape(-1, entries * len(BREAKDOWN)).sum(axis=1)
    assert (totals == summary["kv_pool_tokens"]).all()


def test_marconi_needs_align_on_a_model_that_runs_all(tmp_path):
    raw = nemotron_h(mamba_prefix_policy="marconi")
    with pytest.raises(ConfigError, match=re.escape("set variants.0.options.mamba_cache_mode: align")):
        prepare_experiment(validate_experiment(raw), tmp_path / "c.yaml")
