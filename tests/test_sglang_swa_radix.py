"""``sglang-hybrid`` with prefix caching: SGLang's ``SWARadixCache`` over the full-attention and SWA
pools (``policies/_swa_radix_tree.py``, ``sim/kv/sglang_swa_radix.py``). The window rule of a hit,
SWA eviction tombstoning internal nodes, the locks that keep a running request's window, a small
stream's hits and pool counts, all worked by hand from SGLang's rules; random operations keep each
pool's breakdown whole; an engine run where the cache raises the hit rate; what cannot be combined
is refused, naming the key."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies._swa_radix_tree import SWANode, SWARadixTree
from policies.base import ChildSpec, OutOfKVMemory
from sim.kv.allocators import sglang_hybrid_layout
from sim.kv.sglang_swa_radix import SWARadixCoordinator
from tests.test_hybrid_runs import BREAKDOWN, refused_with, run
from tests.test_hybrid_runs import config as hybrid_config

X, Y, Z = (1, 8), (2, 4), (3, 4)  # content pieces: 8 tokens of stream 1, 4 of stream 2, 4 of stream 3


def coordinator(window: int, full: int = 100, swa: int = 100, page: int = 1) -> SWARadixCoordinator:
    return SWARadixCoordinator(full, swa, page, window, 1000, 1, ("full_attention", "sliding_window"))


def nodes(tree: SWARadixTree) -> list[SWANode]:
    found, stack = [], list(tree.root.children.values())
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(node.children.values())
    return found


def shape(tree: SWARadixTree) -> list[tuple[int, bool, int, int]]:
    """Every node as (tokens, tombstone, full locks, SWA locks), by first token."""
    return sorted(
        (n.length, n.swa_tombstone, n.full_lock_ref, n.swa_lock_ref)
        for n in sorted(nodes(tree), key=lambda n: n.key)
    )


def check_tree(tree: SWARadixTree) -> None:
    """SGLang's invariants, recounted from the nodes: the counters, both LRU lists, no tombstone leaf
    nobody holds, no SWA lock on a tombstone, full locks at least the SWA ones."""
    every = nodes(tree)
    assert tree.full_tokens == sum(n.length for n in every)
    assert tree.swa_tokens == sum(n.length for n in every if not n.swa_tombstone)
    assert tree.full_locked == sum(n.length for n in every if n.full_lock_ref)
    assert tree.full_shared == sum(n.length for n in every if n.full_lock_ref >= 2)
    assert tree.swa_locked == sum(n.length for n in every if n.swa_lock_ref)
    assert len(tree.full_lru) == len(every) and all(n in tree.full_lru for n in every)
    assert len(tree.swa_lru) == sum(not n.swa_tombstone for n in every)
    for node in every:
        assert node.full_lock_ref >= node.swa_lock_ref >= 0
        assert not (node.swa_tombstone and node.swa_lock_ref)
        assert node.children or not node.swa_tombstone or node.full_lock_ref


def check_pools(kv: SWARadixCoordinator) -> None:
    """Each pool's breakdown sums to the pool and none is negative; the totals are their sums."""
    for index, pool in enumerate(kv.pool_tokens):
        part = kv.pool_breakdown(index)
        assert sum(part) == pool and min(part) >= 0, (index, part)
    assert sum(kv.breakdown_values()) == kv.pool_slots
    check_tree(kv.tree)


# -- the tree, by hand ----------------------------------------------------------------------------------
def two_branches(window: int) -> SWARadixCoordinator:
    """Requests X+Y and X+Z (12 tokens each) admitted and finished: X (8) with children Y and Z (4
    each), nothing locked. (The second's match splits X+Y at 8.)"""
    kv = coordinator(window)
    for seq, tail in ((1, Y), (2, Z)):
        kv.admit(seq, (X, tail), 20, 100 + seq)
        kv.free(seq)
    assert shape(kv.tree) == [(4, False, 0, 0), (4, False, 0, 0), (8, False, 0, 0)]
    return kv


@pytest.mark.parametrize(("window", "hit"), [(4, 12), (6, 0)])
def test_a_tombstone_limits_the_hit_to_where_a_whole_window_follows_it(window, hit):
    """SWA eviction of 5 slots: the SWA list's least recently used is Y (X+Z's match and insertion
    refreshed X and Z after it), a leaf: deleted, 4 slots in each pool; then X, internal: tombstoned,
    its 8 SWA slots freed, its full ones kept. A prompt X+Z+1 matches 12 tokens, past the tombstone:
    served only if the 4 tokens after it (Z) cover the window: W = 4 serves 12, W = 6 nothing (no
    shorter end qualifies: the tombstone is the first node)."""
    kv = two_branches(window)
    assert kv.tree.evict(0, 5) == (4, 12)
    assert shape(kv.tree) == [(4, False, 0, 0), (8, True, 0, 0)]
    assert kv.pool_breakdown(0) == (0, 0, 0, 0, 12, 88)  # X and Z cached in full
    assert kv.pool_breakdown(1) == (0, 0, 0, 0, 4, 96)  # only Z in SWA: X's slots are free
    assert kv.lookup((X, Z, (9, 1))).cached_tokens == hit
    check_pools(kv)


def test_admitting_past_a_tombstone_takes_its_swa_slots_back():
    """W = 6, then X+Z+1 (13 tokens): no hit, 13 new slots in each pool. Its insertion walks X, a
    tombstone past its hit of 0: X takes the request's SWA slots back (SGLang's branch 1), Z is a
    duplicate (the request's copies freed), the last token a new leaf. The lock: full on all three,
    SWA from the leaf up until 6 tokens are covered (1 + 4 + 8: all three)."""
    kv = two_branches(6)
    kv.tree.evict(0, 5)
    assert kv.admit(3, (X, Z, (9, 1)), 20, 103) == 0
    assert shape(kv.tree) == [(1, False, 1, 1), (4, False, 1, 1), (8, False, 1, 1)]
    assert kv.pool_breakdown(0) == (13, 0, 0, 0, 0, 87)
    assert kv.pool_breakdown(1) == (13, 0, 0, 0, 0, 87)
    assert (kv.stats.prefix_cache_queries, kv.stats.prefix_cache_hits) == (12 + 12 + 13, 0 + 8 + 0)
    check_pools(kv)


def test_swa_eviction_tombstones_an_internal_node_a_running_request_holds_in_full_only():
    """W = 4. Request 3 (X+Z+1) runs: hit 12 (X, Z), its last token a new leaf L; its lock holds all
    13 full slots but SWA only from L up to 4 tokens: L and Z (uuid on Z). SWA eviction of 12: Y (the
    least recently used leaf) deleted, 4 + 4 slots; X, internal and SWA-unlocked, tombstoned: 8. Z
    and L, the running request's window, stay. Full eviction finds no unlocked leaf while it runs;
    once it finishes, full eviction of 5 deletes L, then Z (a leaf now), then X, a tombstone left a
    leaf (``_iteratively_delete_tombstone_leaf``): 13 full slots, 5 SWA."""
    kv = two_branches(4)
    assert kv.admit(3, (X, Z, (9, 1)), 20, 103) == 12
    assert shape(kv.tree) == [(1, False, 1, 1), (4, False, 0, 0), (4, False, 1, 1), (8, False, 1, 0)]
    assert kv.tree.evict(0, 12) == (4, 12)
    assert shape(kv.tree) == [(1, False, 1, 1), (4, False, 1, 1), (8, True, 1, 0)]
    assert kv.pool_breakdown(0) == (13, 0, 0, 0, 0, 87)
    assert kv.pool_breakdown(1) == (5, 0, 0, 0, 0, 95)
    assert kv.tree.evict(5, 0) == (0, 0)  # (everything is locked)
    check_pools(kv)
    kv.free(3)
    assert kv.pool_breakdown(0) == (0, 0, 0, 0, 13, 87)
    assert kv.pool_breakdown(1) == (0, 0, 0, 0, 5, 95)
    assert kv.tree.evict(5, 0) == (13, 5)
    assert shape(kv.tree) == [] and kv.breakdown_values() == (0, 0, 0, 0, 0, 200)


def test_a_split_moves_the_swa_lock_id_to_the_upper_half():
    """W = 4, one 12-token request locked whole (its node covers the window: uuid on it). A second
    request matching 6 of its tokens splits it at 6: the upper half takes the id, so the first
    request's unlock walks the lower half and stops at the upper one, leaving both unlocked."""
    kv = coordinator(4)
    kv.admit(1, ((1, 12),), 20, 101)
    first = kv.sequences[1]
    assert first.swa_uuid != 0 and first.last_node.swa_uuid == first.swa_uuid
    kv.admit(2, ((1, 6), (5, 3)), 20, 102)
    upper = kv.sequences[2].last_node.parent
    assert upper is not None and upper.length == 6 and upper.swa_uuid == first.swa_uuid
    kv.free(1)
    kv.free(2)
    assert kv.tree.full_locked == kv.tree.swa_locked == 0
    check_pools(kv)


# -- a small stream, by hand ------------------------------------------------------------------------------
def stream_of_one_request() -> SWARadixCoordinator:
    """W = 4, pools of 64 full and 32 SWA slots, pages of 1. Request A, a 10-token prompt P (final 20):
    no hit; the prompt goes into the tree (node N, 10 tokens) and A locks it. Six decode steps (16
    tokens): step i frees A's own SWA slots before pre_len - W when i % W == 1: step 1 (pre_len 11)
    would free before 7, inside the tree's part, which A never frees; step 5 (pre_len 15) frees before
    11: token 10, A's first output token. A finishes: its 16 tokens are inserted past N, the freed one
    as a tombstone T (1 token), the rest as a leaf L (5)."""
    kv = coordinator(4, full=64, swa=32)
    assert kv.admit(1, ((1, 10),), 20, 101) == 0
    assert kv.pool_breakdown(0) == (10, 0, 0, 0, 0, 54) and kv.pool_breakdown(1) == (10, 0, 0, 0, 0, 22)
    for _ in range(6):
        kv.grow(1, 1)
    assert kv.pool_breakdown(0) == (16, 0, 0, 0, 0, 48)
    assert kv.pool_breakdown(1) == (10 + 5, 0, 0, 0, 0, 17)
    kv.free(1)
    assert shape(kv.tree) == [(1, True, 0, 0), (5, False, 0, 0), (10, False, 0, 0)]
    assert kv.pool_breakdown(0) == (0, 0, 0, 0, 16, 48)
    assert kv.pool_breakdown(1) == (0, 0, 0, 0, 15, 17)
    check_pools(kv)
    return kv


def test_a_finished_request_leaves_the_swa_slots_it_freed_as_a_tombstone():
    stream_of_one_request()


def test_a_prompt_enters_the_tree_as_its_chunks_are_scheduled():
    """With the engine reporting chunks (``defer_prompt_keys``; SGLang's ``cache_unfinished_req`` after
    each chunk). W = 4, 64 full and 32 SWA slots, pages of 1. A's 10-token prompt is admitted: nothing
    in the tree. Its first 6 tokens scheduled enter it as a node A locks (their slots move from A's
    own to the tree: no category changes). B, sharing A's first 8 tokens, hits 6, not 8, and locks the
    node too. A, preempted, frees its 4 own tokens; the node stays. B's 12 tokens scheduled: its own
    6 enter below; its SWA lock covers its last window only, so the first node's 6 SWA slots are
    cached."""
    kv = coordinator(4, full=64, swa=32)
    assert kv.defer_prompt_keys()
    assert kv.admit(1, ((1, 10),), 20, 101) == 0
    assert shape(kv.tree) == []
    kv.prompt_scheduled(1, 6)
    assert shape(kv.tree) == [(6, False, 1, 1)]
    assert kv.pool_breakdown(0) == (10, 0, 0, 0, 0, 54) and kv.pool_breakdown(1) == (10, 0, 0, 0, 0, 22)
    b_prompt = ((1, 8), (5, 4))
    assert kv.lookup(b_prompt).cached_tokens == 6
    assert kv.admit(2, b_prompt, 20, 102) == 6
    kv.free(1, finished=False)
    assert shape(kv.tree) == [(6, False, 1, 1)]
    assert kv.pool_breakdown(0) == (12, 0, 0, 0, 0, 52) and kv.pool_breakdown(1) == (12, 0, 0, 0, 0, 20)
    kv.prompt_scheduled(2, 12)
    assert shape(kv.tree) == [(6, False, 1, 0), (6, False, 1, 1)]
    assert kv.pool_breakdown(0) == (12, 0, 0, 0, 0, 52) and kv.pool_breakdown(1) == (6, 0, 0, 0, 6, 20)
    check_pools(kv)


def test_a_finished_sequence_enters_the_tree_whole_whatever_was_reported():
    """A finished sequence computed every token: ``cache_finished_req`` inserts all of its 12 (10 of
    the prompt, 2 decoded), though only 4 were reported scheduled."""
    kv = coordinator(4, full=64, swa=32)
    kv.defer_prompt_keys()
    kv.admit(1, ((1, 10),), 12, 101)
    kv.prompt_scheduled(1, 4)
    kv.grow(1, 2)
    kv.free(1)
    assert sum(length for length, *_ in shape(kv.tree)) == 12
    assert kv.lookup(((1, 10), (101, 2), (9, 1))).cached_tokens == 12
    check_pools(kv)


@pytest.mark.parametrize(
    ("window", "hit", "full_after", "swa_after"),
    [
        (4, 16, (17, 0, 0, 0, 0, 47), (6, 0, 0, 0, 10, 16)),
        (6, 10, (17, 0, 0, 0, 0, 47), (6, 0, 0, 0, 11, 15)),
    ],
)
def test_the_next_turn_is_served_past_the_tombstone_only_with_a_window_after_it(
    window, hit, full_after, swa_after
):
    """The next turn B after the stream above: P, A's 6 output tokens, 1 new (17 tokens, key 16). Its
    match walks N (10 tokens with SWA slots), then T, a tombstone (the 10 before it serve any window),
    then L's 5. W = 4: they cover the window, 16 served; B takes one new slot in each pool, a new leaf M,
    and locks it: full all 17, SWA from M up to 4 tokens (M and L: 6); N's 10 SWA slots stay cached.
    The same tree read with W = 6: 5 tokens do not, 10 served; B's insertion walks T past its hit,
    still holding that token's SWA slot, so T takes it back (SGLang's branch 1) and L is a duplicate:
    SWA cached N and T (11), locked M and L (6 >= W)."""
    kv = stream_of_one_request()
    kv.window = kv.tree.window = window  # (the same tree, read with another window)
    turn = ((1, 10), (101, 6), (7, 1))
    assert kv.lookup(turn).cached_tokens == hit
    assert kv.admit(2, turn, 30, 102) == hit
    assert kv.pool_breakdown(0) == full_after and kv.pool_breakdown(1) == swa_after
    assert (kv.stats.prefix_cache_queries, kv.stats.prefix_cache_hits) == (10 + 17, hit)
    check_pools(kv)


# -- admission, growth, forks ---------------------------------------------------------------------------
def test_admission_evicts_the_scarcer_pools_shortfall_and_a_refusal_changes_nothing():
    """SWA pool of 20: after X+Y and X+Z finish (16 cached in each pool), a 12-token unrelated prompt
    needs 12 SWA slots, 4 free: SWA eviction takes the shortfall of 8 (Y deleted: 4 + 4; X tombstoned: 8
    more, as SGLang evicts whole nodes). A 40-token prompt then fits neither pool: refused, nothing
    changes but the counted failure."""
    kv = coordinator(4, full=100, swa=20)
    for seq, tail in ((1, Y), (2, Z)):
        kv.admit(seq, (X, tail), 20, 100 + seq)
        kv.free(seq)
    assert kv.pool_breakdown(1) == (0, 0, 0, 0, 16, 4)
    kv.admit(3, ((9, 12),), 20, 103)
    assert kv.pool_breakdown(1) == (12, 0, 0, 0, 4, 4)
    assert kv.pool_breakdown(0) == (12, 0, 0, 0, 12, 76)
    assert kv.stats.evictions == 4 + 4 + 8
    before = (kv.breakdown_values(), shape(kv.tree))
    assert not kv.can_admit(((8, 40),), 50)
    with pytest.raises(OutOfKVMemory):
        kv.admit(4, ((8, 40),), 50, 104)
    assert (kv.breakdown_values(), shape(kv.tree)) == before and kv.stats.allocation_failures == 1
    check_pools(kv)


def test_pages_reserve_and_fragment_the_last_page_and_forks_copy_it():
    """Pages of 4, W = 4: a 10-token prompt, final 11: the tree takes its 8 whole tokens, the request
    its last page (2 tokens used, 1 reserved for token 11, 1 never filled) in each pool. A fork
    inserts the parent's whole pages (nothing new) and copies that page to the child: 2 more used, 2
    more reserved (the child's final length is 12)."""
    kv = coordinator(4, full=40, swa=40, page=4)
    kv.admit(1, ((1, 10),), 11, 101)
    assert kv.pool_breakdown(0) == (8 + 2, 1, 1, 0, 0, 28)
    assert kv.pool_breakdown(1) == (8 + 2, 1, 1, 0, 0, 28)
    kv.fork(1, [ChildSpec(2, 12, 102)])
    assert kv.pool_breakdown(0) == (8 + 4, 1 + 2, 1, 0, 0, 24)
    # (Its page has room for 2 tokens, but its decode step 1, token 12, runs ``maybe_evict_swa``: an event.)
    assert kv.growth_room(2) == 1 and kv.stats.fork_copied_tokens == 2
    kv.free(2, finished=False)
    kv.free(1)
    assert kv.pool_breakdown(0) == (0, 0, 0, 0, 8, 32)
    check_pools(kv)


# -- random operations ----------------------------------------------------------------------------------
PROMPTS = [((1, 6),), ((1, 6), (2, 5)), ((1, 6), (3, 9)), ((4, 3),), ((1, 14),), ((1, 6), (2, 5), (5, 7))]


@settings(max_examples=400, deadline=None)
@given(
    window=st.integers(1, 9),
    page=st.sampled_from([1, 1, 2, 4]),
    pools=st.tuples(st.integers(24, 90), st.integers(12, 70)),
    deferred=st.booleans(),
    operations=st.lists(
        st.tuples(
            st.sampled_from(
                ["admit", "grow", "grow", "free", "preempt", "fork", "decode", "match", "schedule"]
            ),
            st.integers(0, 6),
            st.integers(0, len(PROMPTS) - 1),
            st.integers(1, 9),
        ),
        max_size=60,
    ),
)
def test_random_operations_keep_each_pool_whole(window, page, pools, deferred, operations):
    """Admissions of prompts sharing prefixes, growths, forks, finishing and preemption, decode-step
    evictions, scheduler matches and (``deferred``: prompts inserted as the engine schedules them)
    chunks scheduled: after each, each pool's breakdown sums to it, nothing is negative, the tree's
    counters recount, a refused operation changes no breakdown, and no sequence's tree path reaches
    past what it scheduled."""
    full, swa = (max(tokens, page) // page * page for tokens in pools)
    kv = coordinator(window, full=full, swa=swa, page=page)
    if deferred:
        kv.defer_prompt_keys()
    next_id = 100
    for operation, seq, prompt_index, tokens in operations:
        before = kv.breakdown_values()
        live = sorted(kv.sequences)
        try:
            if operation == "admit" and seq not in kv.sequences:
                prompt = PROMPTS[prompt_index]
                fits = kv.can_admit(prompt, 40)
                try:
                    kv.admit(seq, prompt, 40, 200 + seq)
                    assert fits
                except OutOfKVMemory:
                    assert not fits and kv.breakdown_values() == before
            elif operation == "grow" and live:
                chosen = [s for s in live if kv.seq_len(s) + tokens <= 40]
                fits = kv.fits_growth(chosen, tokens) if chosen else True
                try:
                    if chosen:
                        kv.grow_each(chosen, [tokens] * len(chosen))
                    assert fits
                except OutOfKVMemory:
                    assert not fits and kv.breakdown_values() == before
            elif operation in ("free", "preempt") and seq in kv.sequences:
                kv.free(seq, finished=operation == "free")
            elif operation == "fork" and seq in kv.sequences:
                next_id += 1
                kv.fork(seq, [ChildSpec(next_id, 40, 300 + next_id)])
            elif operation == "decode":
                kv.prepare_decode_step(len(live))
            elif operation == "match":
                kv.match(PROMPTS[prompt_index])
            elif operation == "schedule" and seq in kv.sequences:
                kv.prompt_scheduled(seq, tokens * 2)
        except OutOfKVMemory:
            assert operation == "fork"
        check_pools(kv)
        for state in kv.sequences.values():
            assert state.tree_len <= state.scheduled
    for seq in list(kv.sequences):
        kv.free(seq)
    assert kv.tree.full_locked == kv.tree.swa_locked == 0
    check_pools(kv)


# -- the layout and end to end ----------------------------------------------------------------------------
def test_the_layout_builds_the_radix_cache_only_with_prefix_caching():
    plain = sglang_hybrid_layout("gpt-oss-20b", 1_500_000_000, max_model_len=8192, prefill_tokens=8192)
    cached = sglang_hybrid_layout(
        "gpt-oss-20b", 1_500_000_000, max_model_len=8192, prefill_tokens=8192, prefix_caching=True
    )
    assert not isinstance(plain.make_coordinator(), SWARadixCoordinator)
    kv = cached.make_coordinator()
    assert isinstance(kv, SWARadixCoordinator)
    assert kv.pool_tokens == (33_907, 27_125) and kv.window == 128
    assert [group.name for group in kv.groups] == ["full", "sliding(128)"]  # (as without the cache)
    assert kv.group_entries() == (("full", "sliding(128)"), (True, True))


def shared_prefix_config(variants: list[dict]) -> dict:
    raw = hybrid_config("gpt-oss-20b", variants)
    raw["workload"] = {
        "num_requests": 80,
        "arrival": {"kind": "poisson", "rate_per_s": 8},
        "prompt_len": {"kind": "uniform", "low": 200, "high": 1500},
        "output_len": {"kind": "uniform", "low": 50, "high": 300},
        "shared_prefix": {
            "num_prefixes": 4,
            "prefix_len": {"kind": "uniform", "low": 1000, "high": 3000},
            "zipf_s": 1.1,
            "fraction": 0.9,
        },
    }
    return raw


def test_prefix_caching_raises_the_hit_rate_and_keeps_both_pools_whole(tmp_path):
    """gpt-oss-20b on 1.5e9 B of KV, 80 requests sharing 4 system prompts: with the radix cache most
    prompt tokens hit, without it none; every sample's breakdown sums to both pools."""
    off = {"name": "off", "policy": "sglang-hybrid"}
    on = {"name": "on", "policy": "sglang-hybrid", "engine": {"enable_prefix_caching": True}}
    results = run(shared_prefix_config([off, on]), tmp_path)
    assert results["on"].summary["requests_finished"] == results["off"].summary["requests_finished"] == 80
    assert not results["off"].summary.get("prefix_cache_hit_rate")
    assert results["on"].summary["prefix_cache_hit_rate"] > 0.5
    assert results["on"].summary["ttft_p50_s"] < results["off"].summary["ttft_p50_s"]
    for name in ("off", "on"):
        series = pd.read_parquet(tmp_path / "out" / name / "timeseries.parquet")
        assert (series[BREAKDOWN].sum(axis=1) == results[name].summary["kv_pool_tokens"]).all()
        assert (series[BREAKDOWN] >= 0).all().all()


CACHED = {"name": "sglang", "policy": "sglang-hybrid", "engine": {"enable_prefix_caching": True}}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"offload": {"host_memory_gib": 64}},
            "variants.0.policy: sglang-hybrid has no host tier (offload:)",
        ),
        (
            {"engine": {"preemption_mode": "swap"}},
            "variants.0.engine.preemption_mode: sglang-hybrid preempts by recompute only",
        ),
        ({"variants": [{**CACHED, "pin_shared_prefixes": True}]}, "variants.0.pin_shared_prefixes"),
    ],
)
def test_what_the_radix_cache_cannot_combine_with_is_refused(tmp_path, change, message):
    raw = hybrid_config("gpt-oss-20b", [CACHED])
    if "engine" in change:
        change = {"variants": [{**CACHED, "engine": {**CACHED["engine"], **change["engine"]}}]}
    refused_with(raw, change, message, tmp_path)


def test_a_report_for_a_decoding_sequence_inserts_nothing_until_it_finishes():
    """Found by the property test below: a sequence that decoded past its prompt (its own SWA slots
    partly freed) and is then reported scheduled must not enter the tree (its lock would reach the
    tombstone its insertion makes): SGLang inserts nothing more until it finishes."""
    kv = coordinator(3, full=24, swa=12)
    kv.defer_prompt_keys()
    kv.admit(0, PROMPTS[1], 40, 200)
    kv.grow_each([0], [5])
    kv.prompt_scheduled(0, 14)
    assert shape(kv.tree) == []
    check_pools(kv)
    kv.free(0)
    check_pools(kv)
    assert sum(length for length, *_ in shape(kv.tree)) == 16


def test_the_budget_with_a_hit_locked_takes_its_unlocked_tokens_out_of_each_pool():
    """SGLang's ``add_one_req`` checks its budget with the matched node locked. A full pool of 100
    and an SWA pool of 40 hold X, Y, Z (16 tokens, cached in both): 100 and 40 available. X+Z+1 hits
    12 (W = 4); locking it takes X and Z (12) out of the full pool's evictable tokens, but only the
    window, Z (4), out of the SWA pool's: min(100 - 12, 40 - 4) = 36."""
    kv = coordinator(4, full=100, swa=40)
    for seq, tail in ((1, Y), (2, Z)):
        kv.admit(seq, (X, tail), 20, 100 + seq)
        kv.free(seq)
    assert (kv.available_slots(), kv.lookup((X, Z, (9, 1))).cached_tokens) == (40, 12)
    assert kv.available_slots_with_hit_locked((X, Z, (9, 1))) == 36
    assert kv.available_slots_with_hit_locked(((7, 5),)) == 40  # (no hit: nothing locked)
