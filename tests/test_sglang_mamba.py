"""``policy: sglang-hybrid`` on a model with Mamba / linear-attention layers: SGLang's full-attention
token pool and Mamba state pool, sized by hand from SGLang's formula
(``sim/hardware/sglang_mamba_capacity.py``), a stream worked by hand through the Mamba radix cache
(``sim/kv/sglang_mamba_radix.py`` over ``policies/_mamba_radix_tree.py``: a hit ends at a cached
state, the Mamba pool evicts, a request is refused for want of a Mamba slot), random operations
keeping each pool's breakdown whole, runs beside vllm-hybrid, and the options that do not apply."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies._mamba_radix_tree import MambaNode, MambaRadixTree
from policies.base import ChildSpec, OutOfKVMemory, PolicyInputError
from sim.config import validate_experiment
from sim.hardware.layers import GatedDeltaNetState, Mamba2State
from sim.hardware.models import model_from_hf_config, resolve_model
from sim.hardware.sglang_mamba_capacity import EXTRA_BUFFER_ARCHITECTURES, sglang_mamba_kv_capacity
from sim.kv.allocators import SGLangMambaLayout, sglang_hybrid_layout
from sim.kv.sglang_mamba_radix import MambaRadixCoordinator, MambaTracking
from sim.kv.sglang_tree import prompt_key
from sim.runner import prepare_experiment
from sim.runner.engines import runs_async_scheduling
from tests.test_hybrid_runs import BREAKDOWN, refused_with, run
from tests.test_hybrid_runs import config as hybrid_config

NEMOTRON = "Nemotron-H-8B-Base-8K"
ROOT = Path(__file__).resolve().parents[1]


# -- sizing -------------------------------------------------------------------------------------------
def test_nemotron_h_pools_by_hand():
    """Nemotron-H-8B, 3e9 B of KV, mamba_full_memory_ratio 0.9, context 8,192. A Mamba slot: 24 Mamba2
    layers of conv 3 x (8,192 + 2 x 8 x 128) = 30,720 elements at 2 B (bfloat16) = 61,440 B and SSM
    128 x 64 x 128 = 1,048,576 elements at 4 B (float32) = 4,194,304 B: 4,255,744 B a layer,
    102,137,856 B a request. The states take 3e9 x 0.9 / 1.9 = 1,421,052,631.6 B: int(// 102,137,856)
    = 13 slots (1,327,792,128 B); the rest, 1,672,207,872 B, over a cell of 4 attention layers x
    2 x 8 x 128 x 2 B = 16,384 B is 102,063 tokens (1,672,200,192 B). Running requests: SGLang's
    default min(max(int(102,063 / 8,192 x 512) = 6,378, 2,048), 4,096) = 4,096, capped at 13 // 1 = 13
    without the radix cache, 13 // 3 = 4 with it. Start-up lines: conv 24 x 30,720 x 2 B x 14 slots
    (one pads) = 20,643,840 B = 0.02 GB; SSM 24 x 4,194,304 B x 14 = 1.3125 GB; K (and V) of 4 layers
    x 8 x 128 x 2 B x 102,064 tokens = 836,108,288 B = 0.78 GB."""
    plain = sglang_mamba_kv_capacity(NEMOTRON, 3_000_000_000, max_model_len=8192)
    cached = sglang_mamba_kv_capacity(
        NEMOTRON, 3_000_000_000, max_model_len=8192, radix_cache=True, mamba_scheduler_strategy="no_buffer"
    )
    assert plain.mamba_cache_per_req == 102_137_856 and plain.cell_size == 16_384
    assert (plain.conv_state_bytes, plain.ssm_state_bytes) == (24 * 61_440, 24 * 4_194_304)
    assert (plain.mamba_slots, plain.full_tokens) == (13, 102_063) == (cached.mamba_slots, cached.full_tokens)
    assert (plain.max_running_requests, cached.max_running_requests) == (13, 4)
    assert plain.pool_bytes == 13 * 102_137_856 + 102_063 * 16_384 <= 3_000_000_000
    assert plain.groups == (("full", 4), ("mamba", 24)) and plain.state_label == "mamba2"
    assert cached.capacity_lines() == [
        "Mamba Cache is allocated. max_mamba_cache_size: 13, conv_state size: 0.02GB, ssm_state size: 1.31GB",
        "KV Cache is allocated. #tokens: 102063, K size: 0.78 GB, V size: 0.78 GB",
        "max_total_num_tokens=102063, max_running_requests=4, context_len=8192",
        "mamba_radix_cache_strategy='no_buffer', disable_overlap_schedule=True",
    ]
    assert len(plain.capacity_lines()) == 3  # (no radix cache: no strategy)


def test_qwen3_next_pools_by_hand_with_a_set_mamba_pool_and_ratio():
    """Qwen3-Next-80B-A3B: 36 gated-delta-net layers of conv 3 x (2 x 16 x 128 + 32 x 128) = 24,576
    elements at 2 B and SSM 32 x 128 x 128 = 524,288 at 4 B: 2,146,304 B a layer, 77,266,944 B a
    request; 12 full layers x 2 x 2 x 256 x 2 B = 24,576 B a token. 20 GiB at ratio 0.5: the states
    take 21,474,836,480 / 3 = 7,158,278,826.7 B: 92 slots (7,108,558,848 B); the rest 14,366,277,632 B
    // 24,576 = 584,565 tokens. With max_mamba_cache_size 50: 50 x 77,266,944 = 3,863,347,200 B,
    the rest 17,611,489,280 B // 24,576 = 716,613 tokens, pages of 16: 716,608."""
    ratio = sglang_mamba_kv_capacity(
        "Qwen3-Next-80B-A3B", 20 * 2**30, max_model_len=32768, mamba_full_memory_ratio=0.5
    )
    assert ratio.mamba_cache_per_req == 77_266_944 and ratio.cell_size == 24_576
    assert (ratio.mamba_slots, ratio.full_tokens, ratio.max_running_requests) == (92, 584_565, 92)
    fixed = sglang_mamba_kv_capacity(
        "Qwen3-Next-80B-A3B", 20 * 2**30, max_model_len=32768, max_mamba_cache_size=50, page_size=16
    )
    assert (fixed.mamba_slots, fixed.full_tokens) == (50, 716_608)
    # SGLang's SSM state at bfloat16 (SGLANG_MAMBA_SSM_DTYPE): 36 x (24,576 + 524,288) x 2 B (as vLLM).
    bf16 = sglang_mamba_kv_capacity(
        "Qwen3-Next-80B-A3B", 20 * 2**30, max_model_len=32768, mamba_ssm_dtype="bfloat16"
    )
    assert bf16.mamba_cache_per_req == 36 * 548_864 * 2 == 39_518_208
    # The same from a gated delta net whose config names its SSM dtype (Qwen3-Next's
    # mamba_ssm_dtype: bfloat16, which SGLang reads), the option unset; float32 when it says auto.
    qwen = resolve_model("Qwen3-Next-80B-A3B")
    named = replace(
        qwen,
        layer_kinds=tuple(
            replace(kind, ssm_dtype="bfloat16") if isinstance(kind, GatedDeltaNetState) else kind
            for kind in qwen.layer_kinds or ()
        ),
    )
    from_config = sglang_mamba_kv_capacity(named, 20 * 2**30, max_model_len=32768)
    assert from_config.ssm_state_bytes == 36 * 524_288 * 2 and from_config.conv_state_bytes == 36 * 24_576 * 2
    # A Mamba2 layer's dtype is vLLM's key (mamba_ssm_cache_dtype), which SGLang does not read: float32.
    nemotron = resolve_model(NEMOTRON)
    bf16_key = replace(
        nemotron,
        layer_kinds=tuple(
            replace(kind, ssm_dtype="bfloat16") if isinstance(kind, Mamba2State) else kind
            for kind in nemotron.layer_kinds or ()
        ),
    )
    assert (
        sglang_mamba_kv_capacity(bf16_key, 3_000_000_000, max_model_len=8192).ssm_state_bytes
        == 24 * 4_194_304
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mamba_full_memory_ratio": 0}, "option mamba_full_memory_ratio must be a positive finite number"),
        ({"mamba_full_memory_ratio": float("nan")}, "option mamba_full_memory_ratio must be"),
        ({"max_mamba_cache_size": 0}, "option max_mamba_cache_size must be a positive integer, got 0"),
        ({"mamba_ssm_dtype": "fp8"}, "option mamba_ssm_dtype must be one of SGLang's"),
        (
            {"radix_cache": True, "page_size": 16, "mamba_scheduler_strategy": "no_buffer"},
            "option page_size 16: SGLang's Mamba radix cache runs pages of one token",
        ),
        (
            {"max_mamba_cache_size": 2, "radix_cache": True, "mamba_scheduler_strategy": "no_buffer"},
            "no request can run (3 Mamba slots per running",
        ),
        (
            {"max_mamba_cache_size": 4, "radix_cache": True, "mamba_scheduler_strategy": "extra_buffer"},
            "no request can run (5 Mamba slots per running",
        ),
        (
            {"mamba_scheduler_strategy": "lazy"},
            "option mamba_scheduler_strategy must be one of auto, no_buffer, extra_buffer, extra_buffer_lazy",
        ),
        (
            {"radix_cache": True, "mamba_scheduler_strategy": "extra_buffer_lazy", "overlap": False},
            "option mamba_scheduler_strategy extra_buffer_lazy needs SGLang's overlap scheduler",
        ),
        (
            {"mamba_scheduler_strategy": "extra_buffer"},
            "option mamba_scheduler_strategy extra_buffer tracks the states SGLang's Mamba radix cache keeps",
        ),
        ({"mamba_track_interval": 128}, "option mamba_track_interval sets the extra-buffer strategy's"),
        (
            {"radix_cache": True, "mamba_scheduler_strategy": "extra_buffer", "page_size": 48},
            "option mamba_track_interval 256 must be a multiple of option page_size 48",
        ),
        (
            {
                "radix_cache": True,
                "mamba_scheduler_strategy": "extra_buffer",
                "page_size": 96,
                "mamba_track_interval": 192,
            },
            "option page_size 96: the extra-buffer strategy needs a page that divides 64 tokens",
        ),
        (
            {"radix_cache": True, "mamba_scheduler_strategy": "extra_buffer", "mamba_track_interval": 0},
            "option mamba_track_interval must be a positive integer, got 0",
        ),
    ],
)
def test_bad_pool_options_are_refused_naming_the_option(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        sglang_mamba_kv_capacity(NEMOTRON, 3_000_000_000, max_model_len=8192, **options)


def test_the_layout_takes_the_mamba_pools_for_a_mamba_model_and_refuses_the_other_kinds_options():
    layout = sglang_hybrid_layout(NEMOTRON, 3_000_000_000, max_model_len=8192, prefill_tokens=2048)
    assert isinstance(layout, SGLangMambaLayout) and layout.max_running_requests == 13
    assert layout.pool.kv_pool_tokens == 102_063 + 13
    kv = layout.make_coordinator()
    assert isinstance(kv, MambaRadixCoordinator) and not kv.radix
    assert kv.group_entries() == (("full", "mamba2"), (True, False))
    assert [group.slot_bytes for group in kv.groups] == [16_384, 102_137_856]
    with pytest.raises(ValueError, match="option swa_full_tokens_ratio sizes SGLang's sliding-window pool"):
        sglang_hybrid_layout(
            NEMOTRON, 3e9, max_model_len=8192, prefill_tokens=2048, swa_full_tokens_ratio=0.5
        )
    with pytest.raises(
        ValueError, match="option max_mamba_cache_size sizes SGLang's Mamba pool; gpt-oss-20b"
    ):
        sglang_hybrid_layout(
            "gpt-oss-20b", 1_500_000_000, max_model_len=8192, prefill_tokens=8192, max_mamba_cache_size=4
        )


# -- the coordinator ------------------------------------------------------------------------------------
def coordinator(full: int = 40, mamba: int = 4, *, radix: bool = True, chunk: int = 1000, page: int = 1):
    return MambaRadixCoordinator(full, mamba, page, 100, chunk, (1, 1), ("full", "mamba2"), radix=radix)


def pools(kv: MambaRadixCoordinator) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each pool's breakdown (used, reserved, internal, external, cached, free), checked to sum to it."""
    full, mamba = kv.pool_breakdown(0), kv.pool_breakdown(1)
    assert sum(full) == kv.pool_tokens[0] and sum(mamba) == kv.pool_tokens[1]
    assert min(full) >= 0 and min(mamba) >= 0
    assert kv.group_breakdown_values() == [*full, *mamba]
    return full, mamba


def nodes(tree: MambaRadixTree) -> list[MambaNode]:
    found, stack = [], [tree.root]
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(node.children.values())
    return found[1:]


def check_tree(tree: MambaRadixTree) -> None:
    """The tree's counts are its nodes' (SGLang's evictable / protected sizes), a leaf is never a
    tombstone, and the LRU lists hold every node and every node with a state."""
    every = nodes(tree)
    assert tree.full_tokens == sum(node.length for node in every)
    assert tree.full_locked == sum(node.length for node in every if node.full_lock_ref)
    assert tree.full_shared == sum(node.length for node in every if node.full_lock_ref >= 2)
    assert tree.states == sum(node.has_state for node in every)
    assert tree.states_locked == sum(1 for node in every if node.has_state and node.mamba_lock_ref)
    assert all(node.has_state for node in every if not node.children)
    assert all(node.full_lock_ref >= node.mamba_lock_ref >= 0 for node in every)
    assert len(tree.full_lru) == len(every) and len(tree.mamba_lru) == tree.states


A_OUT = 100  # A's output stream


def test_a_stream_by_hand():
    """40 full slots, 4 Mamba slots, pages of 1 token, no chunking."""
    kv = coordinator()
    # A: 10 prompt tokens; its prompt enters the tree with a copy of its state (n1, locked by A).
    assert kv.admit(1, ((1, 10),), 15, A_OUT) == 0
    assert pools(kv) == ((10, 0, 0, 0, 0, 30), (2, 0, 0, 0, 0, 2))
    kv.grow(1, 5)
    assert pools(kv) == ((15, 0, 0, 0, 0, 25), (2, 0, 0, 0, 0, 2))
    # A finishes: its 15 tokens enter with its own slot as the state at 15 (leaf L15 under n1).
    kv.free(1)
    assert pools(kv) == ((0, 0, 0, 0, 15, 25), (0, 0, 0, 0, 2, 2))
    # B: A's 15 tokens and 3 more: a hit of 15, ending at A's state; then its prompt's end (L18).
    b_prompt = ((1, 10), (A_OUT, 5), (2, 3))
    assert kv.lookup(b_prompt).cached_tokens == 15
    assert kv.admit(2, b_prompt, 20, 200) == 15
    assert pools(kv) == ((18, 0, 0, 0, 0, 22), (2, 0, 0, 0, 2, 0))
    # C shares 12 tokens with A: the match splits L15 at 12, but a hit must end at a state: n1's 10.
    c_prompt = ((1, 10), (A_OUT, 2), (3, 4))
    assert kv.lookup(c_prompt).cached_tokens == 10
    # Its admission needs 2 Mamba slots (its own, its prompt's cached copy): 2 evictable, 0 free,
    # and locking n1 takes one: refused, naming the Mamba pool.
    with pytest.raises(OutOfKVMemory, match=re.escape("needs 2 Mamba slots of the Mamba pool, 1 available")):
        kv.admit(3, c_prompt, 20, 300)
    assert kv.stats.allocation_failures == 1
    # B finishes: the state at 18 exists already, so its own slot goes back.
    kv.free(2)
    assert pools(kv) == ((0, 0, 0, 0, 18, 22), (0, 0, 0, 0, 3, 1))
    # C again: hit 10 (n1); its own slot is the free one; caching its prompt's end needs another:
    # evict_mamba takes the least recently used unlocked state, L15's ([12, 15)), an internal node: a
    # tombstone. C's prompt ends at a new leaf L16 under the split's upper half [10, 12).
    assert kv.admit(3, c_prompt, 20, 300) == 10
    assert kv.stats.evictions == 1
    assert pools(kv) == ((16, 0, 0, 0, 6, 18), (2, 0, 0, 0, 2, 0))
    # D, a new prompt: its own slot evicts the least recent state, L18's, a leaf: deleted, and with
    # it its tombstone parent [12, 15) (3 + 3 full slots freed, 1 state); its cached copy then
    # tombstones n1 (internal, unlocked since C's lock moved to L16).
    assert kv.admit(4, ((5, 6),), 10, 400) == 0
    assert kv.stats.evictions == 1 + (6 + 1) + 1
    assert pools(kv) == ((22, 0, 0, 0, 0, 18), (4, 0, 0, 0, 0, 0))
    check_tree(kv.tree)
    # E: every Mamba slot a running request's or locked: refused though the full pool has room.
    assert kv.can_admit(((7, 5),), 10) is False
    with pytest.raises(OutOfKVMemory, match="of the Mamba pool, 0 available"):
        kv.admit(5, ((7, 5),), 10, 500)
    # D retracted: its own slots go back; its prompt stays cached (inserted at its prefill).
    kv.free(4, finished=False)
    assert pools(kv) == ((16, 0, 0, 0, 6, 18), (2, 0, 0, 0, 1, 1))
    assert kv.stats.prefix_cache_hits == 15 + 10 + 0
    kv.free(3)
    check_tree(kv.tree)
    assert kv.tree.full_locked == kv.tree.states_locked == 0


def test_the_budget_with_a_hit_locked_leaves_out_the_hit_s_unlocked_full_tokens():
    """After A (10 + 5 tokens) finished, 15 full tokens are cached and 25 free: 40 available. A prompt
    hitting A's 15 tokens would lock them: 25 left; one hitting only the state at 10: 30."""
    kv = coordinator()
    kv.admit(1, ((1, 10),), 15, A_OUT)
    kv.grow(1, 5)
    kv.free(1)
    assert kv.available_slots() == 40
    assert kv.available_slots_with_hit_locked(((1, 10), (A_OUT, 5), (2, 3))) == 25
    assert kv.available_slots_with_hit_locked(((1, 10), (A_OUT, 2), (3, 4))) == 30
    assert coordinator(radix=False).available_slots_with_hit_locked(((1, 10),)) == 40


def test_a_long_prompt_caches_a_state_at_every_chunk():
    """Chunks of 4 tokens: a 10-token prompt is cached at 4, 8 and 10 (``cache_unfinished_req`` after
    each chunk), so a prompt sharing its first 9 tokens hits 8. Three chunks need 3 Mamba slots."""
    kv = coordinator(mamba=6, chunk=4)
    kv.admit(1, ((1, 10),), 12, 100)
    assert kv.tree.states == 3 and kv.tree.states_locked == 1
    assert kv.lookup(((1, 9), (2, 3))).cached_tokens == 8
    small = coordinator(mamba=2, chunk=4)
    assert not small.can_admit(((1, 10),), 12) and small.can_admit(((1, 4),), 12)


def test_reported_chunks_enter_the_tree_as_they_come_and_a_preempted_prompt_leaves_only_them():
    """Under the engine (``defer_prompt_keys``) ``cache_unfinished_req`` runs as each prefill chunk is
    reported, at the chunk's end, wherever the engine cut it. A's 10-token prompt (12 out, 40 full
    slots, 6 Mamba slots, pages of 1): admitted, it holds its 10 own tokens and its state, nothing in
    the tree. Its first chunk of 4 reported: 4 tokens enter with a copy of its state (locked), so a
    prompt sharing its first 9 tokens hits 4; a second chunk to 7: 7 (the state at 4 unlocked,
    cached). Preempted there, it frees its 3 own tokens and its slot: the tree keeps 7, not 10.
    Reported once more after that, or for a decoding sequence, nothing enters."""
    kv = coordinator(mamba=6, chunk=4)
    assert kv.defer_prompt_keys() and kv.scheduled_chunks_move_slots()
    kv.admit(1, ((1, 10),), 12, 100)
    assert pools(kv) == ((10, 0, 0, 0, 0, 30), (1, 0, 0, 0, 0, 5))
    assert kv.lookup(((1, 9), (2, 3))).cached_tokens == 0
    kv.prompt_scheduled(1, 4)
    assert pools(kv) == ((10, 0, 0, 0, 0, 30), (2, 0, 0, 0, 0, 4))
    assert kv.lookup(((1, 9), (2, 3))).cached_tokens == 4
    kv.prompt_scheduled(1, 7)
    kv.prompt_scheduled(1, 7)  # (already reported that far)
    assert pools(kv) == ((10, 0, 0, 0, 0, 30), (2, 0, 0, 0, 1, 3))
    assert kv.lookup(((1, 9), (2, 3))).cached_tokens == 7
    kv.free(1, finished=False)
    assert pools(kv) == ((0, 0, 0, 0, 7, 33), (0, 0, 0, 0, 2, 4))
    check_tree(kv.tree)
    # B: 3 of its 5 prompt tokens reported, then it decodes 2 (its prompt was computed): a report
    # now inserts nothing, its decoded tokens least of all (SGLang inserts them when it finishes).
    kv.admit(2, ((3, 5),), 8, 200)
    kv.prompt_scheduled(2, 3)
    kv.grow(2, 2)
    kv.prompt_scheduled(2, 7)
    assert (kv.tree.full_tokens, kv.tree.states) == (7 + 3, 3)
    check_tree(kv.tree)


def test_the_extra_buffer_tracks_a_state_in_each_reported_chunk():
    """Extra buffer (pages of 2, states on a grid of 4 from each chunk's start): a 20-token prompt
    whose chunks the engine cut at 6, 14 and 20. The first tracks the state at 4 (0 + 4), the second
    the one at 14 (6 + 8), the third, of 6 tokens, the one at 18 (14 + 4); the tree's states: 4, 14,
    18. A prompt sharing its first 17 tokens hits 14."""
    kv = MambaRadixCoordinator(
        160, 24, 2, 192, 12, (1, 1), ("full", "mamba2"), tracking=MambaTracking(2, 4, 8)
    )
    assert kv.defer_prompt_keys()
    kv.admit(1, ((1, 20),), 24, 100)
    probe = ((1, 17), (2, 5))
    for tokens, hit in ((6, 4), (14, 14), (20, 14)):
        kv.prompt_scheduled(1, tokens)
        assert kv.lookup(probe).cached_tokens == hit
    assert kv.tree.states == 3
    check_tree(kv.tree)


def run_preempted_mid_prefill(step_mode):
    from sim.engine.core import Engine
    from sim.engine.knobs import EngineKnobs
    from tests.engine_helpers import ConstantCost, request

    kv = MambaRadixCoordinator(32, 8, 1, 64, 9, (1, 1), ("full", "mamba2"))
    engine = Engine(
        kv,
        ConstantCost(1.0),
        EngineKnobs(max_model_len=64, step_mode=step_mode, max_num_batched_tokens=9),
        iter([request(0, 0.0, 4, 7, prompt=((1, 4),)), request(1, 2.5, 24, 2, prompt=((2, 24),))]),
        block_size=1,
    )
    engine.run()
    return engine


def test_a_request_preempted_mid_prefill_hits_only_the_chunks_it_computed():
    """32 full slots (pages of 1), 8 Mamba slots, 1 s an iteration, a budget of 9 tokens. R0 (4
    prompt tokens, 7 output) decodes from 1.0; R1 (24 tokens) is admitted at 3.0 with 24 of the 25
    free slots and computes a first chunk of 8 beside R0's token, which enters the tree with a state.
    At 4.0 R0's ninth token finds no slot free nor evictable: R1, the newest, is preempted, its 8
    computed tokens left in the tree. It fits again when R0 finishes at 7.0, hits those 8 and
    computes 16, 9 then 7: its first token at 9.0, its second at 10.0. Inserting a prompt's chunks
    at admission, it hit 18 tokens it had never computed (a state every 9 tokens) and finished at
    9.0. Both step modes give the same results, the chunk's state taken where it was scheduled."""
    from tests.test_engine import assert_same_results

    runs = {step_mode: run_preempted_mid_prefill(step_mode) for step_mode in ("single", "skip")}
    for engine in runs.values():
        r0, r1 = sorted(engine.records, key=lambda record: record.request_id)
        assert (r0.first_token_s, r0.finish_s, r0.preemptions) == (1.0, 7.0, 0)
        assert (r1.admitted_s, r1.first_token_s, r1.finish_s, r1.preemptions) == (3.0, 9.0, 10.0, 1)
        assert engine.kv.stats.prefix_cache_hits == 8
        check_tree(engine.kv.tree)
    assert_same_results(runs["single"], runs["skip"])


def test_without_the_radix_cache_a_request_holds_its_pages_and_one_mamba_slot():
    """ChunkCache: pages of 4, no hits; a third request finds no Mamba slot."""
    kv = coordinator(full=42, mamba=2, radix=False, page=4)
    assert kv.admit(1, ((1, 10),), 14, 100) == 0
    assert pools(kv) == ((10, 2, 0, 2, 0, 28), (1, 0, 0, 0, 0, 1))
    kv.admit(2, ((1, 10),), 11, 200)
    assert pools(kv) == ((20, 3, 1, 2, 0, 16), (2, 0, 0, 0, 0, 0))
    with pytest.raises(OutOfKVMemory, match="needs 1 Mamba slots of the Mamba pool, 0 available"):
        kv.admit(3, ((2, 3),), 5, 300)
    kv.free(1)
    assert kv.tree.full_tokens == 0 and pools(kv)[1] == (1, 0, 0, 0, 0, 1)


def test_a_hit_never_ends_at_a_split_s_upper_half():
    """A's 10 tokens are cached (state at 10); B shares 6 of them, so its match splits that node at 6:
    the upper half [0, 6) has no state. C then walks the whole upper half and no further: the deepest
    state on its way is none, so both the lookup and the match serve nothing."""
    kv = coordinator()
    kv.admit(1, ((1, 10),), 10, A_OUT)
    kv.free(1)
    kv.admit(2, ((1, 6), (2, 4)), 10, 200)
    kv.free(2)
    c_prompt = ((1, 6), (3, 4))
    assert kv.tree.longest_match(prompt_key(c_prompt, 10, 1), 0).length == 0
    assert kv.lookup(c_prompt).cached_tokens == 0 == kv.match(c_prompt).cached_tokens


def test_locking_a_node_whose_state_a_running_request_holds_takes_nothing_more():
    """A runs with its prompt's state (at 6) locked: locking that node again takes no full slot and no
    state out of the evictable cache; once A has finished it would take the path's 6 slots and the state."""
    kv = coordinator()
    kv.admit(1, ((1, 6),), 10, A_OUT)
    node = kv.sequences[1].last_node
    assert kv.tree.unlocked_by_lock(node) == (0, 0)
    kv.free(1)
    assert kv.tree.unlocked_by_lock(node) == (6, 1)


def test_an_insertion_that_revives_a_tombstone_counts_its_state():
    """Chunks of 4: A's 10-token prompt is cached at 4, 8 and 10; after A finishes, the least recently
    used state is the one at 4 (A's final insertion refreshed 4, then 8, then 10), an inner node:
    evicting one state makes it a tombstone. B's prompt, A's first 4 tokens and 2 of its own, misses
    (a hit ends at a state) and caches its first chunk's end, 4: the tombstone gets a state again.
    States: 8, 10, 4 and B's 6 = 4, B's the one locked; the Mamba pool (6 slots): used 1 + B's own 1,
    cached 3, free 6 - 4 - 1 = 1."""
    kv = coordinator(mamba=6, chunk=4)
    kv.admit(1, ((1, 10),), 10, A_OUT)
    kv.free(1)
    assert kv.tree.evict(0, 1) == (0, 1) and kv.tree.states == 2
    assert kv.admit(2, ((1, 4), (9, 2)), 8, 200) == 0
    assert kv.tree.states == 4
    assert pools(kv)[1] == (2, 0, 0, 0, 3, 1)
    check_tree(kv.tree)


def test_prefill_chunks_are_counted_from_the_hit():
    """Chunks of 4, 4 Mamba slots. A (8 tokens, running) leaves states at 4 and 8 and locks 8's. C's
    11 tokens hit 8 and need one chunk past it, so two Mamba slots: its own and its prompt's cached
    copy. Room: 4 - 2 states - A's own = 1 free, and 4's state evictable: 2, and locking 8's takes
    nothing (A holds it): C fits. Admitted, its cached copy evicts 4's state (an inner node: a
    tombstone). States: 8 (A's lock) and 11 (C's), both locked, plus the two own slots: the Mamba
    pool is full and used; the full pool holds the tree's 11 tokens, all locked."""
    kv = coordinator(mamba=4, chunk=4)
    kv.admit(1, ((1, 8),), 10, A_OUT)
    c_prompt = ((1, 8), (2, 3))
    assert kv.can_admit(c_prompt, 12)
    assert kv.admit(2, c_prompt, 12, 200) == 8
    assert kv.stats.evictions == 1
    assert pools(kv) == ((11, 0, 0, 0, 0, 29), (4, 0, 0, 0, 0, 0))
    check_tree(kv.tree)


def test_a_retracted_request_inserts_nothing():
    """A's 6-token prompt is cached at admission; it decodes 3 tokens and is retracted: its own 3
    slots and its Mamba slot go back, the tree keeps only the prompt (SGLang's ``is_insert=False``)."""
    kv = coordinator()
    kv.admit(1, ((1, 6),), 10, A_OUT)
    kv.grow(1, 3)
    kv.free(1, finished=False)
    assert (kv.tree.full_tokens, kv.tree.states) == (6, 1)
    assert pools(kv) == ((0, 0, 0, 0, 6, 34), (0, 0, 0, 0, 1, 3))


def test_a_fork_counts_the_slot_of_the_parent_s_state_cached_first():
    """4 Mamba slots: A (6 prompt tokens, cached, 2 decoded) holds its own slot and locks its prompt's
    state: 2 free, none evictable. Two children need their two slots and, first, one for A's state at
    8 cached before they copy it: 3 > 2, refused before anything changes; one child fits (2). Then A
    and the child lock the state at 8, and the one at 6 is unlocked: used 1 + 2 own slots, cached 1."""
    kv = coordinator()
    kv.admit(1, ((1, 6),), 20, A_OUT)
    kv.grow(1, 2)
    with pytest.raises(
        OutOfKVMemory,
        match=re.escape("forking sequence 1 needs 3 Mamba slots of the Mamba pool, 2 available"),
    ):
        kv.fork(1, [ChildSpec(2, 20, 200), ChildSpec(3, 20, 300)])
    assert (kv.tree.full_tokens, kv.tree.states) == (6, 1)
    kv.fork(1, [ChildSpec(2, 20, 200)])
    assert (kv.tree.full_tokens, kv.tree.states) == (8, 2)
    assert pools(kv)[1] == (3, 0, 0, 0, 1, 0)


PROMPTS = [((1, 6),), ((1, 4), (2, 5)), ((1, 6), (3, 2)), ((4, 3),), ((1, 2), (5, 7))]


@settings(max_examples=80, deadline=None)
@given(
    radix=st.sampled_from(["off", "no_buffer", "extra_buffer"]),
    chunk=st.sampled_from([3, 100]),
    operations=st.lists(
        st.tuples(
            st.sampled_from(["admit", "grow", "finish", "retract", "fork", "decode", "match"]),
            st.integers(0, len(PROMPTS) - 1),
            st.integers(1, 6),
        ),
        max_size=40,
    ),
)
def test_random_operations_keep_each_pool_whole(radix, chunk, operations):
    """Both pools stay whole, with the radix cache or without, and with the extra buffer (states kept
    at multiples of 2 tokens in a chunk and of 4 while decoding, pages of 2; a request holds 3 slots)."""
    if radix == "extra_buffer":
        kv = MambaRadixCoordinator(
            30, 8, 2, 100, chunk + chunk % 2, (1, 1), ("full", "mamba2"), tracking=MambaTracking(2, 2, 4)
        )
    else:
        kv = coordinator(full=30, mamba=5, radix=radix != "off", chunk=chunk, page=2 if radix == "off" else 1)
    next_id = 0
    for operation, index, amount in operations:
        live = list(kv.sequences)
        try:
            if operation == "admit":
                next_id += 1
                kv.admit(next_id, PROMPTS[index], 20, 1000 + next_id)
            elif operation == "grow" and live:
                seq = live[index % len(live)]
                tokens = min(amount, kv.sequences[seq].final_len - kv.seq_len(seq))
                if tokens:
                    kv.grow(seq, tokens)
            elif operation in ("finish", "retract") and live:
                kv.free(live[index % len(live)], finished=operation == "finish")
            elif operation == "fork" and live:
                next_id += 1
                kv.fork(live[index % len(live)], [ChildSpec(next_id, 25, 1000 + next_id)])
            elif operation == "decode":
                kv.prepare_decode_step(len(live))
            elif operation == "match":
                kv.match(PROMPTS[index])
        except OutOfKVMemory:
            assert operation in ("admit", "grow", "fork")
        pools(kv)
        check_tree(kv.tree)
    for seq in list(kv.sequences):
        kv.free(seq)
    assert kv.tree.full_locked == kv.tree.states_locked == 0
    full, mamba = pools(kv)
    assert full[0] == mamba[0] == 0


# -- the extra-buffer strategy (--mamba-scheduler-strategy extra_buffer) -------------------------------
def test_the_extra_buffer_strategy_caps_the_running_requests_at_a_fifth_of_the_mamba_pool():
    """Nemotron-H-8B, 3e9 B of KV: 13 Mamba slots (test_nemotron_h_pools_by_hand). A running request
    holds its state and two tracking buffers, and the tree keeps two states while it prefills: 13 // 5
    = 2 running requests, against 13 // 3 = 4 without the buffers. The pools do not change. Its states
    are kept at multiples of the model's Mamba2 scan chunk (its config's 128; FLA's 64 for a gated
    delta net, Qwen3-Next) and, while decoding, of 256 tokens; pages above one token are allowed."""
    options = {"max_model_len": 8192, "radix_cache": True}
    plain = sglang_mamba_kv_capacity(NEMOTRON, 3_000_000_000, mamba_scheduler_strategy="no_buffer", **options)
    extra = sglang_mamba_kv_capacity(
        NEMOTRON, 3_000_000_000, mamba_scheduler_strategy="extra_buffer", **options
    )
    assert (plain.max_running_requests, extra.max_running_requests) == (4, 2)
    assert (extra.mamba_slots, extra.full_tokens) == (plain.mamba_slots, plain.full_tokens) == (13, 102_063)
    assert (extra.strategy, extra.cache_chunk, extra.track_interval) == ("extra_buffer", 128, 256)
    assert (plain.strategy, plain.cache_chunk, plain.track_interval) == ("no_buffer", 0, 0)
    qwen = sglang_mamba_kv_capacity(
        "Qwen3-Next-80B-A3B", 40 * 2**30, mamba_scheduler_strategy="extra_buffer", page_size=16, **options
    )
    assert (qwen.cache_chunk, qwen.page_size) == (64, 16)
    # Two tracking buffers with the overlap scheduler, one without (SGLang's ..._RATIO_NO_OVERLAP).
    for overlap, buffers in ((True, 2), (False, 1)):
        layout = sglang_hybrid_layout(
            NEMOTRON, 3_000_000_000, max_model_len=8192, prefill_tokens=2048, prefix_caching=True,
            mamba_scheduler_strategy="extra_buffer", mamba_track_interval=512, overlap=overlap,
        )  # fmt: skip
        kv = layout.make_coordinator()
        assert isinstance(kv, MambaRadixCoordinator)
        assert (kv.own_states, kv.tracking) == (1 + buffers, MambaTracking(buffers, 128, 512))


def test_auto_resolves_the_strategy_as_sglang_does():
    """SGLang's ``auto`` (its default since 2026-07): ``extra_buffer`` for a model class it lists when
    the overlap scheduler is on or pages are above one token, else ``no_buffer``, which runs without
    the overlap scheduler. Nemotron-H-8B, 3e9 B of KV, 13 Mamba slots: running requests 13 // (3 +
    buffers), buffers 2 with overlap, 1 without (and for the lazy strategy), 0 for no_buffer."""
    nemotron = resolve_model(NEMOTRON)
    assert nemotron.architecture == "NemotronHForCausalLM"

    def capacity(model=nemotron, **options):
        return sglang_mamba_kv_capacity(model, 3_000_000_000, max_model_len=8192, radix_cache=True, **options)

    def resolved(found):
        return (found.strategy, found.track_buffers, found.max_running_requests, found.overlap)

    assert resolved(capacity()) == ("extra_buffer", 2, 2, True)
    assert resolved(capacity(overlap=False)) == ("no_buffer", 0, 4, False)
    assert resolved(capacity(overlap=False, page_size=16)) == ("extra_buffer", 1, 3, False)
    assert resolved(capacity(mamba_scheduler_strategy="extra_buffer", overlap=False)) == (
        "extra_buffer",
        1,
        3,
        False,
    )
    assert resolved(capacity(mamba_scheduler_strategy="extra_buffer_lazy")) == (
        "extra_buffer_lazy",
        1,
        3,
        True,
    )
    # no_buffer: SGLang turns the overlap scheduler off (or refuses it on); without the radix cache
    # nothing is tracked and the overlap scheduler stays.
    assert resolved(capacity(mamba_scheduler_strategy="no_buffer")) == ("no_buffer", 0, 4, False)
    plain = sglang_mamba_kv_capacity(nemotron, 3_000_000_000, max_model_len=8192)
    assert resolved(plain) == ("no_buffer", 0, 13, True)
    # A model class SGLang does not list: auto runs no_buffer, and extra_buffer is refused; a model
    # whose class is not known (a config without architectures) runs no_buffer unless told.
    jamba_like = replace(nemotron, architecture="JambaForCausalLM")
    unknown = replace(nemotron, architecture=None)
    assert resolved(capacity(jamba_like)) == resolved(capacity(unknown)) == ("no_buffer", 0, 4, False)
    assert resolved(capacity(unknown, mamba_scheduler_strategy="extra_buffer")) == (
        "extra_buffer",
        2,
        2,
        True,
    )
    with pytest.raises(
        ValueError, match="SGLang runs it only for the model classes it lists .* not JambaForCausalLM"
    ):
        capacity(jamba_like, mamba_scheduler_strategy="extra_buffer")
    with pytest.raises(
        ValueError,
        match=re.escape("with strategy no_buffer (auto: Nemotron-H-8B-Base-8K's model class is not known"),
    ):
        capacity(unknown, page_size=16)
    with pytest.raises(
        ValueError, match=re.escape("(auto: SGLang runs extra_buffer for JambaForCausalLM in no case)")
    ):
        capacity(jamba_like, page_size=16)


def test_the_strategy_edges_and_their_messages():
    """The edges of SGLang's resolution: ``auto`` takes the extra buffer for pages of 2 without the
    overlap scheduler (any page above one token), ``no_buffer`` stays allowed for a class SGLang does
    not list, the lazy strategy needs the radix cache as ``extra_buffer`` does; each refusal says
    what to do, and an explicit ``no_buffer`` in pages of 16 is refused without an ``auto`` reason."""
    nemotron = resolve_model(NEMOTRON)
    jamba_like = replace(nemotron, architecture="JambaForCausalLM")

    def capacity(model=nemotron, **options):
        return sglang_mamba_kv_capacity(model, 3_000_000_000, max_model_len=8192, **options)

    paged = capacity(radix_cache=True, overlap=False, page_size=2)
    assert (paged.strategy, paged.track_buffers, paged.max_running_requests) == ("extra_buffer", 1, 3)
    kept = capacity(jamba_like, radix_cache=True, mamba_scheduler_strategy="no_buffer")
    assert (kept.strategy, kept.overlap) == ("no_buffer", False)
    with pytest.raises(ValueError) as refused:
        capacity(mamba_scheduler_strategy="extra_buffer_lazy")
    assert str(refused.value) == (
        "option mamba_scheduler_strategy extra_buffer_lazy tracks the states SGLang's Mamba radix cache "
        "keeps: it needs engine.enable_prefix_caching: true"
    )
    with pytest.raises(ValueError) as refused:
        capacity(radix_cache=True, mamba_scheduler_strategy="extra_buffer_lazy", overlap=False)
    assert str(refused.value) == (
        "option mamba_scheduler_strategy extra_buffer_lazy needs SGLang's overlap scheduler "
        "(engine.async_scheduling: true)"
    )
    with pytest.raises(ValueError) as refused:
        capacity(jamba_like, radix_cache=True, mamba_scheduler_strategy="extra_buffer_lazy")
    listed = ", ".join(sorted(EXTRA_BUFFER_ARCHITECTURES))
    assert str(refused.value) == (
        f"option mamba_scheduler_strategy extra_buffer_lazy: SGLang runs it only for the model classes it "
        f'lists ({listed}), not JambaForCausalLM ("extra_buffer is not supported for ...; use no_buffer")'
    )
    with pytest.raises(ValueError) as refused:
        capacity(radix_cache=True, page_size=16, mamba_scheduler_strategy="no_buffer")
    assert str(refused.value) == (
        "option page_size 16: SGLang's Mamba radix cache runs pages of one token "
        '("no_buffer only supports page_size=1") with strategy no_buffer; set page_size 1, option '
        "mamba_scheduler_strategy extra_buffer for a model SGLang runs it for, or turn prefix caching off"
    )


def test_qwen3_next_pools_by_hand_on_two_gpus():
    """Tensor parallel 2 splits the gated delta net's heads and the KV heads: a layer's conv state
    3 x (2 x 8 x 128 + 16 x 128) = 12,288 elements at 2 B and SSM 16 x 128 x 128 = 262,144 at 4 B,
    1,073,152 B; 36 layers: 38,633,472 B a request. A token: 12 full layers x 2 x 1 x 256 x 2 B =
    12,288 B. 20 GiB at ratio 0.5: the states take 21,474,836,480 / 3 = 7,158,278,826.7 B: 185 slots
    (7,147,192,320 B); the rest 14,327,644,160 B // 12,288 = 1,165,986 tokens."""
    split = sglang_mamba_kv_capacity(
        "Qwen3-Next-80B-A3B",
        20 * 2**30,
        max_model_len=32768,
        mamba_full_memory_ratio=0.5,
        tensor_parallel_size=2,
    )
    assert (split.conv_state_bytes, split.ssm_state_bytes) == (36 * 24_576, 36 * 1_048_576)
    assert split.mamba_cache_per_req == 38_633_472 and split.cell_size == 12_288
    assert (split.mamba_slots, split.full_tokens, split.max_running_requests) == (185, 1_165_986, 185)


def test_a_config_json_names_its_model_class(tmp_path):
    config = tmp_path / "config.json"
    text = (ROOT / "configs/models/qwen3-next-80b-a3b.config.json").read_text()
    config.write_text(text)
    assert model_from_hf_config(config, num_params=79_674_391_296).architecture == "Qwen3NextForCausalLM"
    data = json.loads(text)
    del data["architectures"]
    config.write_text(json.dumps(data))
    assert model_from_hf_config(config, num_params=79_674_391_296).architecture is None
    data["architectures"] = "Qwen3NextForCausalLM"
    config.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="architectures must be a list of model class names"):
        model_from_hf_config(config, num_params=79_674_391_296)


def test_no_buffer_runs_the_engine_without_async_scheduling(tmp_path):
    """SGLang runs no_buffer without its overlap scheduler, so kvsim runs that variant without async
    scheduling; auto's extra_buffer keeps it, and so does a run without the radix cache."""
    auto = {**ON, "name": "auto", "options": {}}
    lazy = {**ON, "name": "lazy", "options": {"mamba_radix_cache_strategy": "extra_buffer_lazy"}}
    synchronous = {**auto, "name": "sync", "engine": {**ON["engine"], "async_scheduling": False}}
    raw = shared_prefix_config([OFF, ON, auto, lazy, synchronous])
    prepared = prepare_experiment(validate_experiment(raw), tmp_path / "c.yaml")
    capacities = [variant.hybrid.capacity for variant in prepared.variants]
    assert [(found.strategy, found.track_buffers) for found in capacities] == [
        ("no_buffer", 0),
        ("no_buffer", 0),
        ("extra_buffer", 2),
        ("extra_buffer_lazy", 1),
        ("no_buffer", 0),  # (auto without the overlap scheduler, pages of one token)
    ]
    # 13 Mamba slots: 13 without the radix cache, 13 // 3, 13 // 5, 13 // 4, 13 // 3.
    assert [variant.hybrid.max_running_requests for variant in prepared.variants] == [13, 4, 2, 3, 4]
    knobs = [runs_async_scheduling(variant) for variant in prepared.variants]
    assert knobs == [True, False, True, True, False]


def test_the_extra_buffer_refuses_what_it_cannot_track_in_whole_pages():
    for chunk, cache_chunk, interval in ((6, 4, 8), (8, 6, 8), (8, 4, 6)):  # (pages of 4 tokens)
        with pytest.raises(PolicyInputError, match="the extra-buffer strategy tracks whole pages of 4"):
            MambaRadixCoordinator(
                40,
                8,
                4,
                100,
                chunk,
                (1, 1),
                ("full", "mamba2"),
                tracking=MambaTracking(2, cache_chunk, interval),
            )
    with pytest.raises(PolicyInputError, match="radix cache False"):
        MambaRadixCoordinator(
            40, 8, 1, 100, 8, (1, 1), ("f", "m"), radix=False, tracking=MambaTracking(2, 4, 8)
        )
    # A prefill chunk as long as the longest prompt never ends inside one: any length will do.
    MambaRadixCoordinator(40, 8, 4, 100, 101, (1, 1), ("full", "mamba2"), tracking=MambaTracking(2, 4, 8))


def buffered(mamba: int = 20) -> MambaRadixCoordinator:
    """Prefill chunks of 128 tokens, states kept at multiples of 64 in a chunk and of 256 while
    decoding, pages of one token, a roomy full pool."""
    tracking = MambaTracking(2, 64, 256)
    return MambaRadixCoordinator(
        2000, mamba, 1, 1000, 128, (1, 1), ("full", "mamba2"), radix=True, tracking=tracking
    )


def test_the_extra_buffer_keeps_states_only_where_it_tracked_them_by_hand():
    """A: a 200-token prompt, 100 output tokens. Chunks [0, 128) and [128, 200): states tracked at
    0 + 2 x 64 = 128 and 128 + 1 x 64 = 192 enter the tree (no_buffer: at each chunk's end, 128 and
    200); A holds its state and two buffers (3 slots) and locks 192. Its admission needed 3 + 1 + 1 =
    5 Mamba slots. Finishing at 300 tokens (SGLang's committed KV: 299), its decoding reached 256:
    [192, 256) enters the tree with that state; its KV past 256 is freed, not cached."""
    kv = buffered()
    kv.admit(1, ((1, 200),), 300, 101)
    assert [node.length for node in sorted(nodes(kv.tree), key=lambda n: n.key)] == [128, 64]
    assert kv.tree.states == 2 and kv.sequences[1].tree_len == 192
    # Mamba: used = the locked state and A's 3 slots, cached = the state at 128, free 20 - 2 - 3.
    assert pools(kv)[1] == (4, 0, 0, 0, 1, 15)
    assert pools(kv)[0][0] == 200  # (the tree's 192 tokens locked and A's own 8)
    kv.grow(1, 100)
    kv.free(1)
    assert (kv.tree.full_tokens, kv.tree.states) == (256, 3)
    assert pools(kv)[1] == (0, 0, 0, 0, 3, 17)
    check_tree(kv.tree)

    # B: A's first 250 tokens (its prompt and 50 of its output), then 50 of its own; 10 output. The
    # tree holds 250 of B's key, its deepest state is at 192: a hit of 192, and the branching point
    # 250 // 64 x 64 = 192 is not past it. One chunk [192, 300): the state at 192 + 64 = 256 enters
    # the tree, splitting A's [192, 256) at 250 (the upper half has no state). Needs 3 + 1 slots.
    b_prompt = ((1, 200), (101, 50), (3, 50))
    assert kv.can_admit(b_prompt, 310)
    assert kv.admit(2, b_prompt, 310, 102) == 192
    assert kv.sequences[2].tree_len == 256 and kv.tree.states == 4
    kv.grow(2, 10)
    kv.free(2)  # decoding to 309 committed reached no multiple of 256 past its prompt: nothing enters
    assert (kv.tree.full_tokens, kv.tree.states) == (262, 4)

    # C: 50 tokens, no hit: one chunk shorter than 64 tracks nothing, and nothing enters the tree.
    kv.admit(3, ((5, 50),), 70, 103)
    assert kv.sequences[3].tree_len == 0 and kv.tree.states == 4
    kv.grow(3, 20)
    kv.free(3)
    assert (kv.tree.full_tokens, kv.tree.states) == (262, 4)
    full, mamba = pools(kv)
    assert full[0] == mamba[0] == 0


def test_a_prompt_that_leaves_the_tree_past_its_deepest_state_tracks_the_branching_point():
    """A's 400-token prompt in chunks of 128 leaves states at 128, 256, 384 (each chunk's last
    multiple of 64). B shares its first 330 tokens: the tree holds 330 of B's key, the deepest state
    on it is at 256 (a hit of 256), and B leaves the tree at 330: branching 330 // 64 x 64 = 320. B's
    one chunk [256, 400) tracks 320 instead of 256 + 2 x 64 = 384, so the next prompt with that
    branch hits at 320."""
    kv = buffered()
    kv.admit(1, ((1, 400),), 410, 101)
    assert kv.tree.states == 3
    kv.free(1, finished=False)
    b_prompt = ((1, 330), (2, 70))
    assert kv.admit(2, b_prompt, 410, 102) == 256
    assert kv.sequences[2].tree_len == 320
    kv.free(2, finished=False)
    assert kv.admit(3, ((1, 330), (2, 10)), 400, 103) == 320


def test_a_refused_admission_under_the_extra_buffer_counts_its_buffers():
    """A Mamba pool of 6 slots: A (a 200-token prompt) holds 3 and leaves two states in the tree, one
    locked; B (no hit) needs 3 + 1 + 1 = 5 of the 6 - 3 - 1 = 2 free or evictable: refused, nothing
    changed. Once A is gone (its states evictable), B fits."""
    kv = buffered(mamba=6)
    kv.admit(1, ((1, 200),), 210, 101)
    before = pools(kv)
    assert not kv.can_admit(((2, 200),), 210)
    with pytest.raises(OutOfKVMemory, match="needs 5 Mamba slots of the Mamba pool, 2 available"):
        kv.admit(2, ((2, 200),), 210, 102)
    assert pools(kv) == before
    kv.free(1, finished=False)
    assert kv.can_admit(((2, 200),), 210)
    kv.admit(2, ((2, 200),), 210, 102)
    pools(kv)


# -- runs -----------------------------------------------------------------------------------------------
def shared_prefix_config(variants: list[dict]) -> dict:
    raw = hybrid_config(NEMOTRON, variants, max_model_len=8192, kv_cache_memory_bytes=3_000_000_000)
    raw["workload"] = {
        "num_requests": 60,
        "arrival": {"kind": "poisson", "rate_per_s": 6},
        "prompt_len": {"kind": "uniform", "low": 200, "high": 1200},
        "output_len": {"kind": "uniform", "low": 20, "high": 200},
        "shared_prefix": {
            "num_prefixes": 3,
            "prefix_len": {"kind": "uniform", "low": 1000, "high": 3000},
            "zipf_s": 1.1,
            "fraction": 0.9,
        },
    }
    return raw


OFF = {"name": "off", "policy": "sglang-hybrid"}
ON = {
    "name": "on",
    "policy": "sglang-hybrid",
    "engine": {"enable_prefix_caching": True, "max_num_batched_tokens": 512},
    "options": {"mamba_scheduler_strategy": "no_buffer"},
}


def test_nemotron_h_runs_with_and_without_the_radix_cache_and_both_pools_stay_whole(tmp_path):
    """With chunks of 512 tokens, states are cached at every 512 past a hit, so the shared system
    prompts hit; the running requests are capped at the Mamba pool's 13 (4 with the radix cache)."""
    raw = shared_prefix_config([OFF, ON])
    prepared = prepare_experiment(validate_experiment(raw), tmp_path / "c.yaml")
    assert [variant.hybrid.max_running_requests for variant in prepared.variants] == [13, 4]
    results = run(raw, tmp_path)
    assert results["off"].summary["requests_finished"] == results["on"].summary["requests_finished"] == 60
    assert not results["off"].summary.get("prefix_cache_hit_rate")
    assert results["on"].summary["prefix_cache_hit_rate"] > 0.3
    assert results["on"].capacity_lines[0].startswith("Mamba Cache is allocated. max_mamba_cache_size: 13")
    for name, variant in zip(("off", "on"), prepared.variants, strict=True):
        # The summary's pool in bytes: the full pool's tokens at a token's bytes in the full layers
        # plus the Mamba slots at a request's states (not every slot at one token's bytes).
        capacity = variant.hybrid.capacity
        pool_bytes = (
            capacity.full_tokens * capacity.cell_size + capacity.mamba_slots * capacity.mamba_cache_per_req
        )
        assert results[name].summary["kv_pool_bytes"] == pool_bytes
        series = pd.read_parquet(tmp_path / "out" / name / "timeseries.parquet")
        assert (series[BREAKDOWN].sum(axis=1) == results[name].summary["kv_pool_tokens"]).all()
        assert (series[BREAKDOWN] >= 0).all().all()


def test_the_extra_buffer_runs_pages_of_16_beside_the_default_and_both_pools_stay_whole(tmp_path):
    """The same stream with the no-buffer strategy (pages of one token) and with the extra buffer
    in pages of 16: two running requests (13 // 5) against four, states kept at multiples of
    Nemotron-H's 128-token scan chunk, hits on the shared system prompts in both."""
    extra = {
        **ON,
        "name": "extra",
        "options": {"mamba_scheduler_strategy": "extra_buffer", "page_size": 16},
    }
    raw = shared_prefix_config([ON, extra])
    prepared = prepare_experiment(validate_experiment(raw), tmp_path / "c.yaml")
    assert [variant.hybrid.max_running_requests for variant in prepared.variants] == [4, 2]
    results = run(raw, tmp_path)
    for name in ("on", "extra"):
        summary = results[name].summary
        assert summary["requests_finished"] == 60 and summary["prefix_cache_hit_rate"] > 0.2
        series = pd.read_parquet(tmp_path / "out" / name / "timeseries.parquet")
        assert (series[BREAKDOWN].sum(axis=1) == summary["kv_pool_tokens"]).all()
        assert (series[BREAKDOWN] >= 0).all().all()
    assert results["extra"].summary["peak_running"] <= 2


@pytest.mark.parametrize(
    ("model", "options", "caching", "message"),
    [
        (
            NEMOTRON,
            {"swa_full_tokens_ratio": 0.5},
            False,
            "variants.0.policy: sglang-hybrid: option swa_full_tokens_ratio",
        ),
        (
            NEMOTRON,
            {"page_size": 16, "mamba_radix_cache_strategy": "no_buffer"},
            True,
            "variants.0.policy: sglang-hybrid: option page_size 16",
        ),
        (
            NEMOTRON,
            {"mamba_radix_cache_strategy": "no_buffer", "mamba_scheduler_strategy": "no_buffer"},
            True,
            "options mamba_scheduler_strategy and mamba_radix_cache_strategy are one setting",
        ),
        (
            NEMOTRON,
            {"mamba_radix_cache_strategy": "extra"},
            True,
            "variants.0.policy: sglang-hybrid: option mamba_radix_cache_strategy must be one of auto",
        ),
        (
            NEMOTRON,
            {"mamba_scheduler_strategy": "extra_buffer"},
            False,
            "variants.0.policy: sglang-hybrid: option mamba_scheduler_strategy extra_buffer tracks",
        ),
        (
            NEMOTRON,
            {"mamba_scheduler_strategy": "extra_buffer", "page_size": 96, "mamba_track_interval": 192},
            True,
            "option page_size 96: the extra-buffer strategy needs a page that divides 64",
        ),
        (
            "gpt-oss-20b",
            {"mamba_scheduler_strategy": "extra_buffer"},
            True,
            "option mamba_scheduler_strategy sizes SGLang's Mamba",
        ),
        (
            NEMOTRON,
            {"mamba_full_memory_ratio": -1},
            False,
            "option mamba_full_memory_ratio must be a positive",
        ),
        (
            "gpt-oss-20b",
            {"mamba_full_memory_ratio": 0.5},
            False,
            "option mamba_full_memory_ratio sizes SGLang's Mamba",
        ),
    ],
)
def test_options_that_do_not_apply_are_refused_naming_the_key(tmp_path, model, options, caching, message):
    raw = hybrid_config(
        model, [{"name": "s", "policy": "sglang-hybrid", "options": options}], max_model_len=8192
    )
    refused_with(raw, {"engine": {"enable_prefix_caching": caching}}, message, tmp_path)
