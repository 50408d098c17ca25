"""``KVCoordinator.context_tokens``: the tokens of context a pool holds, counting only the layers that
keep every token (full attention). A hybrid pool's slots count a token once per layer group, or once
per layer (Jenga), so the plan's steady-state probe measures the time arrivals take to fill the pool
in these tokens, not in slots: counted in slots, Jenga's pool on gpt-oss-120b looked 18 times larger
than it is, and no probe on an H200 ever ran long enough to be judged steady."""

from __future__ import annotations

import pytest

from policies import make_policy
from policies.base import PoolSpec
from policies.hybrid.block_pool import SharedBlockPool
from policies.hybrid.full import FullAttentionGroup
from policies.hybrid.sliding_window import SlidingWindowGroup
from sim.kv.coordinator import KVGroup, make_coordinator
from sim.kv.sglang_mamba_radix import MambaRadixCoordinator
from sim.kv.sglang_swa_radix import SWARadixCoordinator
from sim.planning.sweeps.pools import total_context_tokens
from sim.planning.sweeps.steady import SteadyWindow, steady_metrics
from tests.test_jenga import tiny
from tests.test_planning_search import exact_area_series, ten_requests

BLOCK = 4


def test_a_single_pool_holds_a_token_in_each_slot():
    kv = make_coordinator(make_policy("paged", PoolSpec(64, BLOCK, 256)))
    assert (kv.pool_slots, kv.context_tokens) == (64, 64)


def test_a_shared_pool_holds_a_token_once_per_full_attention_group():
    """10 blocks of 4 shared by a full-attention and a sliding-window group: 40 slots, and a token
    takes one in the full group (the window's are bounded per sequence): 40 tokens. Two full groups
    in one pool: 40 // 2 = 20."""

    def spec() -> PoolSpec:
        return PoolSpec(40, BLOCK, 4096)

    pool = SharedBlockPool(10, BLOCK)
    one_full = make_coordinator(
        [
            KVGroup("full", FullAttentionGroup(spec(), pool, prefill_tokens=4096)),
            KVGroup("sliding", SlidingWindowGroup(spec(), pool, prefill_tokens=4096, window=8)),
        ]
    )
    assert (one_full.pool_slots, one_full.slots_per_token, one_full.context_tokens) == (40, 2, 40)
    pool = SharedBlockPool(10, BLOCK)
    two_full = make_coordinator(
        [
            KVGroup("full_a", FullAttentionGroup(spec(), pool, prefill_tokens=4096)),
            KVGroup("full_b", FullAttentionGroup(spec(), pool, prefill_tokens=4096)),
        ]
    )
    assert two_full.context_tokens == 20


def test_groups_with_pools_of_their_own_fill_at_the_smaller():
    """Two plain policies, 128 and 64 slots: each keeps every token, so 64 tokens fill the pair."""
    kv = make_coordinator(
        [
            KVGroup("a", make_policy("paged", PoolSpec(128, BLOCK, 256))),
            KVGroup("b", make_policy("paged", PoolSpec(64, BLOCK, 256))),
        ]
    )
    assert (kv.pool_slots, kv.context_tokens) == (192, 64)


def test_jenga_counts_a_token_once_per_full_attention_layer():
    """tests/test_jenga.py's tiny layout: large pages of 24 slots (a slot: a token in one layer), 3
    full small pages of 2 layers x 4 tokens each. A token takes 2 full slots: 4 large pages, 96 slots,
    hold 48 tokens (4 x 3 small pages x 4 tokens)."""
    kv = tiny(large_pages=4)
    assert (kv.pool_slots, kv.context_tokens) == (96, 48)


def test_sglang_s_split_pools_fill_at_the_full_attention_pool():
    swa = SWARadixCoordinator(100, 40, 1, 8, 1000, 1, ("full_attention", "sliding_window"))
    mamba = MambaRadixCoordinator(100, 4, 1, 1000, 1000, (1, 1), ("full", "mamba2"))
    assert (swa.pool_slots, swa.context_tokens) == (140, 100)
    assert (mamba.pool_slots, mamba.context_tokens) == (104, 100)


def test_a_plan_counts_every_replica_s_context_and_falls_back_to_the_slots():
    assert total_context_tokens({"kv_pool_tokens": 200, "kv_context_tokens": 100, "replicas": 3}) == 300
    # A summary written before the key, and a disaggregated cluster's: the pools' slots.
    assert total_context_tokens({"kv_pool_tokens": 200, "replicas": 3}) == 600
    disaggregated = {
        "kv_pool_tokens": 200,
        "kv_context_tokens": 100,
        "prefill_kv_pool_tokens": 50,
        "prefill_replicas": 2,
        "decode_replicas": 1,
        "replicas": 3,
    }
    assert total_context_tokens(disaggregated) == 2 * 50 + 200


def test_the_fill_time_is_counted_in_tokens_of_context():
    """tests/test_planning_search.py's ten requests (arrivals 0..9 s: 10 / 9 per second; 20 + 10 KV
    tokens each) over its series of 100 slots: counted in slots the pool fills in 100 / (10 / 9 x 30)
    = 3 s; holding 50 tokens of context, in 1.5 s (a fill multiple of 9 / 1.5 = 6). The memory shares
    stay per slot."""
    window = SteadyWindow(0.2, 0.1)
    slots = steady_metrics(ten_requests(), exact_area_series(), 100, window)
    tokens = steady_metrics(ten_requests(), exact_area_series(), 100, window, context_tokens=50)
    assert slots["pool_fill_s"] == pytest.approx(3.0) and slots["fill_multiple"] == pytest.approx(3.0)
    assert tokens["pool_fill_s"] == pytest.approx(1.5) and tokens["fill_multiple"] == pytest.approx(6.0)
    assert tokens["mean_used_frac"] == slots["mean_used_frac"] == pytest.approx((464 - 80) / 6.1 / 100)
