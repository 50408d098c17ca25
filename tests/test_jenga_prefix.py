"""``policy: jenga`` with prefix caching (``sim/kv/jenga_prefix.py``, ``policies/hybrid/jenga_cache.py``):
hits, the pages a sliding window needs, eviction of a whole large page first, and the pool's counts
after a small stream, all worked out by hand; the identity per type under random operations; a run
where caching raises the hit rate; what cannot be combined, refused."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import ChildSpec, OutOfKVMemory, PolicyStats
from policies.hybrid.jenga_cache import (
    SKIPPED_AGE,
    EvictionClock,
    JengaPageCache,
    LargePageEvictor,
    WholeQueue,
    WholeRuns,
    stamp_parts,
)
from policies.hybrid.jenga_pages import LargePagePool, SmallPageAllocator
from policies.prefix import ContentChains
from sim.hardware.jenga_capacity import JengaCapacity, JengaGroupSpec
from sim.hardware.layers import FullAttention, SlidingWindow
from sim.kv.jenga_prefix import JengaPrefixCoordinator
from tests.test_hybrid_runs import BREAKDOWN, refused_with, run
from tests.test_hybrid_runs import config as hybrid_config
from tests.test_jenga import config as jenga_config


def tiny(large_pages: int = 6) -> JengaPrefixCoordinator:
    """tests/test_jenga.py's two types, one slot a byte: blocks of 4 tokens; full attention in 2 layers
    (small page 8 B), a sliding window of 8 tokens in 3 layers (small page 12 B); a large page of
    lcm(8, 12) = 24 B holds 3 full or 2 sliding small pages."""
    groups = (
        JengaGroupSpec(FullAttention(), 2, 8, 3, 16),
        JengaGroupSpec(SlidingWindow(8), 3, 12, 2, 17),
    )
    capacity = JengaCapacity("tiny", 64, 4, 24, groups, large_pages, 1, 24 * large_pages, 24)
    return JengaPrefixCoordinator(capacity, ["full", "sliding"])


def entries(kv: JengaPrefixCoordinator) -> list[tuple[int, ...]]:
    values = kv.group_breakdown_values()
    return [tuple(values[index : index + 6]) for index in range(0, len(values), 6)]


def table(kv: JengaPrefixCoordinator, group: int, seq_id: int) -> list[int]:
    """The small pages of ``seq_id``'s held run in ``group`` (-1: released)."""
    manager = kv.managers[group]
    tables = manager.tables
    assert tables is not None
    _, end = manager.held_blocks(seq_id)
    return tables.by_seq[id(manager.sequences[seq_id])].table[:end]


def check_identity(kv: JengaPrefixCoordinator) -> None:
    """Per type: used + reserved + internal + external + cached = its large pages; with the free large
    pages, the pool. And every small page of a large page a type holds is held (its reference count
    the tables naming it), blank free, or cached (no holder, an identity), exactly one of them."""
    groups = entries(kv)
    for allocator, values in zip(kv.allocators, groups, strict=False):
        assert sum(values) == allocator.held_large * kv.large_slots
        assert min(values) >= 0
    assert groups[-1][5] == kv.large_pages.free * kv.large_slots
    assert sum(kv.breakdown_values()) == kv.pool_slots
    held_large = sum(allocator.held_large for allocator in kv.allocators)
    assert held_large + kv.large_pages.free == kv.capacity.num_blocks
    for manager, cache, allocator in zip(kv.managers, kv.caches, kv.allocators, strict=True):
        tables = manager.tables
        assert tables is not None
        references: dict[int, int] = {}
        for seq_id, seq in manager.sequences.items():
            row = tables.by_seq[id(seq)].table
            for position in range(seq.first_block, seq.end_block):
                references[row[position]] = references.get(row[position], 0) + 1
            assert all(page == -1 for page in row[: seq.first_block]), seq_id
        blank = [page for pages in allocator.preferred.values() for page in pages] + list(allocator.unowned)
        cached = list(cache.cached_stamps())
        carved = {
            large * allocator.ratio + i for large in allocator.free_counts() for i in range(allocator.ratio)
        }
        every = list(references) + blank + cached
        assert len(every) == len(set(every)) and set(every) == carved
        for page in carved:
            assert cache.ref_count[page] == references.get(page, 0)
        for page in cached:
            assert cache.has_identity(page)
        for large, free in allocator.free_counts().items():
            assert free == sum(1 for page in blank if page // allocator.ratio == large) < allocator.ratio
        whole = {
            large
            for large in allocator.free_counts()
            if all(cache.stamps[large * allocator.ratio + i] is not None for i in range(allocator.ratio))
        }
        assert set(cache.whole_stamps()) == whole
        assert cache.cached_in(tables.group) == len(cached)


def system(tokens: int, rest: int, rest_id: int):
    """A prompt: ``tokens`` of a shared system prompt (content 1), then ``rest`` of its own."""
    return ((1, tokens), (rest_id, rest)) if rest else ((1, tokens),)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 40), st.integers(0, 30), st.integers(0, 3)), max_size=60
    )
)
def test_the_identity_holds_per_type_and_in_total_under_random_operations(operations):
    """Admissions sharing prefixes (so hits and cached pages), growth of one sequence (exact: it fits
    when fits_growth says so, else nothing changes) and of several (only what is sure to fit), frees
    and forks, in a pool small enough to evict whole large pages and single small pages."""
    kv = tiny(large_pages=8)
    live: dict[int, int] = {}
    next_id = 0
    for kind, a, b, shared in operations:
        try:
            if kind == 0:
                prompt = system(4 * shared + 1 + a % 8, b % 9, 100 + next_id % 3)
                length = sum(tokens for _, tokens in prompt)
                final = min(64, length + 1 + b)
                kv.admit(next_id, prompt, final, 9)
                live[next_id] = final
                next_id += 1
            elif kind == 1 and live:
                seq_id = sorted(live)[a % len(live)]
                room = live[seq_id] - kv.seq_len(seq_id)
                if room:
                    tokens = 1 + b % room
                    fits = kv.fits_growth([seq_id], tokens)
                    before = entries(kv)
                    try:
                        kv.grow(seq_id, tokens)
                        assert fits
                    except OutOfKVMemory:
                        assert not fits and entries(kv) == before
            elif kind == 2 and live:
                grow = [seq_id for seq_id in sorted(live) if kv.seq_len(seq_id) < live[seq_id]]
                if grow and kv.fits_growth(grow, 1):
                    kv.grow_each(grow, [1] * len(grow))
            elif kind == 3 and live:
                seq_id = sorted(live)[a % len(live)]
                kv.free(seq_id, finished=bool(b % 2))
                del live[seq_id]
            elif kind == 4 and live:
                parent = sorted(live)[a % len(live)]
                kv.fork(parent, [ChildSpec(next_id, live[parent], 9)])
                live[next_id] = live[parent]
                next_id += 1
        except OutOfKVMemory:
            pass
        check_identity(kv)
    for seq_id in list(live):
        kv.free(seq_id)
    check_identity(kv)
    assert all(values[:3] == (0, 0, 0) for values in entries(kv))


def test_a_fork_s_copied_tail_filled_by_a_growth_goes_back_cached():
    """Found by the property test above in CI. A (15 tokens of the system prompt and 8 of its own) is
    forked twice and preempted: each child holds A's full pages shared and its own copy of the
    partly filled last one. A child's growth fills that copy before its window lets it go, so the
    page gains an identity and goes back cached, not blank: its large page is not freed. The check
    counted it blank, said a growth of 13 tokens fits, and the growth then found no quota (an
    assertion). For every growth the check and the growth itself must agree, and a refused one
    changes nothing."""

    def forked():
        kv = tiny(large_pages=8)
        kv.admit(0, ((1, 15), (100, 8)), 50, 9)
        kv.admit(1, ((1, 1),), 2, 9)
        kv.fork(0, [ChildSpec(2, 50, 9)])
        kv.fork(0, [ChildSpec(3, 50, 9)])
        kv.free(0, finished=False)
        kv.free(1, finished=False)
        return kv

    outcomes = {}
    for tokens in range(1, 28):
        kv = forked()
        fits, before = kv.fits_growth([2], tokens), entries(kv)
        try:
            kv.grow(2, tokens)
            outcomes[tokens] = True
        except OutOfKVMemory:
            assert entries(kv) == before
            outcomes[tokens] = False
        assert fits == outcomes[tokens]
        check_identity(kv)
    assert outcomes[9] and not outcomes[13]


# -- by hand --------------------------------------------------------------------------------------------
SYSTEM = ((1, 20),)  # 20 tokens of a system prompt: 5 full blocks of 4
AFTER_SYSTEM = ((1, 20), (7, 4))  # that prompt and 4 tokens more: a hit of at most 5 blocks
SHORT = ((1, 8), (7, 8))  # 8 tokens of it and 8 more: at most 3 blocks, 2 of them the system prompt's


def served(kv: JengaPrefixCoordinator, prompt, max_blocks: int) -> list[int]:
    """The blocks each type alone would serve (full attention, sliding window)."""
    hits = []
    for manager in kv.managers:
        assert manager.tables is not None
        hits.append(
            manager.longest_cache_hit(manager.tables.prompt_chains(prompt, 0, max_blocks), max_blocks)
        )
    return hits


def stream_one(kv: JengaPrefixCoordinator) -> None:
    """A (the system prompt, final 24) admitted, grown to 21 tokens, freed; then B, 8 other tokens."""
    kv.admit(1, SYSTEM, 24, 9)
    kv.grow(1, 1)
    kv.free(1)
    kv.admit(2, ((99, 8),), 12, 9)


def test_the_pool_after_a_small_stream_by_hand():
    kv = tiny()
    # A: 20 tokens, 5 blocks in each type (a prompt is allocated whole, the window's blocks too). Quotas
    # at most: full ceil(5/3) = 2, sliding ceil(5/2) = 3; 5 <= 6 free large pages. Full carves large
    # pages 0 and 1 (small pages 0-5: takes 0-4, page 5 its own free one); sliding large pages 2, 3, 4
    # (small pages 4-9: takes 4-8, page 9 its own).
    kv.admit(1, SYSTEM, 24, 9)
    assert table(kv, 0, 1) == [0, 1, 2, 3, 4] and table(kv, 1, 1) == [4, 5, 6, 7, 8]
    assert list(kv.large_pages.free_ids) == [5]
    # Full: 20 tokens x 2 slots used, page 5 free (8 slots external); sliding 20 x 3, page 9 (12).
    assert entries(kv) == [(40, 0, 0, 8, 0, 0), (60, 0, 0, 12, 0, 0), (0, 0, 0, 0, 0, 24)]
    check_identity(kv)
    # To 21 tokens: full takes its own page 5 for block 5. The window (8) now starts in block
    # (21 - 8) // 4 = 3: blocks 0-2 (pages 4, 5, 6) go back, full, so cached (stamped 200 older);
    # block 5 takes page 9. Full: 21 x 2 used, 3 x 2 reserved; sliding: tokens 12-20 (9 x 3) used,
    # 3 x 3 reserved, 3 pages cached (36 slots). Large page 2 (pages 4, 5) is wholly cached.
    kv.grow(1, 1)
    assert table(kv, 1, 1) == [-1, -1, -1, 7, 8, 9]
    assert entries(kv) == [(42, 6, 0, 0, 0, 0), (27, 9, 0, 0, 36, 0), (0, 0, 0, 0, 0, 24)]
    assert set(kv.caches[1].whole_stamps()) == {2}
    # A ends: pages go back tail first; block 5 (one token) is blank, the full blocks cached. Full:
    # pages 0-4 cached (40), page 5 blank (8); sliding: pages 4-8 cached (60), page 9 blank (12).
    # Wholly cached: full large page 0 (pages 0-2), sliding 2 (4, 5) and 3 (6, 7).
    kv.free(1)
    assert entries(kv) == [(0, 0, 0, 8, 40, 0), (0, 0, 0, 12, 60, 0), (0, 0, 0, 0, 0, 24)]
    assert set(kv.caches[0].whole_stamps()) == {0} and set(kv.caches[1].whole_stamps()) == {2, 3}
    assert kv.available_slots() == (1 + 3) // 2 * 4  # (free and wholly cached large pages, both types)
    check_identity(kv)
    # B: 8 tokens of its own (no hit), 2 blocks per type. Quotas at most 1 + 1 <= 1 free + 3 wholly
    # cached. Full carves the free large page 5 (takes 15, 16; 17 its own). Sliding: no free large
    # page; A's blank page 9 first (its request is gone), then the oldest wholly cached large page
    # is evicted, sliding's 2 (its pages released out of the window: 200 older), and carved: page 4.
    kv.admit(2, ((99, 8),), 12, 9)
    assert table(kv, 0, 2) == [15, 16] and table(kv, 1, 2) == [9, 4]
    assert kv.stats.evictions == 2 and list(kv.large_pages.free_ids) == []
    # Full: B's 8 x 2 used, pages 5 and 17 blank (16), pages 0-4 cached (40); sliding: 8 x 3 used,
    # page 5 blank (12), pages 6, 7, 8 cached (36). Every type's entry is its 3 large pages.
    assert entries(kv) == [(16, 0, 0, 16, 40, 0), (24, 0, 0, 12, 36, 0), (0, 0, 0, 0, 0, 0)]
    check_identity(kv)
    assert kv.stats.prefix_cache_queries == 28 and kv.stats.prefix_cache_hits == 0


def test_a_sliding_window_needs_only_the_pages_of_its_last_window():
    kv = tiny()
    stream_one(kv)
    # Sliding lost blocks 0 and 1 (large page 2, evicted for B), but a hit of 5 blocks needs only the
    # window before token 20: tokens 13-19, blocks 3 and 4 (cdiv(8 - 1, 4) = 2 in a row), cached.
    assert served(kv, AFTER_SYSTEM, 5) == [5, 5]
    assert kv.lookup(AFTER_SYSTEM).cached_tokens == 20
    # The hit is held in each type from the window on: full blocks 0-4, sliding 3-4 only.
    assert kv.admit(3, AFTER_SYSTEM, 28, 9) == 20
    assert table(kv, 0, 3)[:5] == [0, 1, 2, 3, 4] and table(kv, 1, 3)[:5] == [-1, -1, -1, 7, 8]
    check_identity(kv)


def test_a_hit_is_the_longest_prefix_every_type_serves():
    kv = tiny()
    stream_one(kv)
    # A hit of 2 blocks (8 tokens): full attention serves it (blocks 0, 1), the window would need
    # blocks 0 and 1 as well (a hit shorter than its 2 blocks is a leading run), evicted: none.
    assert served(kv, SHORT, 3) == [2, 0] and kv.lookup(SHORT).cached_tokens == 0
    # A second stream: A grows to 24 tokens before it ends, so the window gives back blocks 0-3
    # (large pages 2 and 3, wholly cached, 200 older), and B's new large page evicts the one whose
    # latest page went back first: sliding 3 (blocks 3, 2, in that order, given back before 1, 0).
    kv = tiny()
    kv.admit(1, SYSTEM, 24, 9)
    kv.grow(1, 4)
    kv.free(1)
    kv.admit(2, ((99, 8),), 12, 9)
    assert table(kv, 1, 2) == [6, 7]
    # Full attention serves 5 blocks; the window, holding blocks 0, 1 and 4, ends a hit at most at
    # block 2 (blocks 0-1 in a row): the hit is 2 blocks, the type that holds the least.
    assert served(kv, AFTER_SYSTEM, 5) == [5, 2]
    assert kv.lookup(AFTER_SYSTEM).cached_tokens == 8
    check_identity(kv)


def test_eviction_frees_a_whole_large_page_first_then_a_single_page():
    kv = tiny()
    stream_one(kv)
    # C: 12 tokens, 3 blocks per type. At most 1 + 2 large pages > 0 free + 2 wholly cached (full 0,
    # sliding 3), so the least: full ceil(max(0, 3 - 4) / 3) = 0 (pages 5 and 17 blank, 3 and 4
    # evictable), sliding ceil((3 - 2) / 2) = 1 (page 5 blank, 8 evictable).
    kv.admit(3, ((97, 12),), 16, 9)
    # Full, no quota: A's blank page 5, then B's own 17, then a single cached page, the type's
    # oldest outside a wholly cached large page: block 4 of A's prompt (page 4: A's pages went back
    # tail first, the deepest first).
    assert table(kv, 0, 3) == [5, 17, 4] and kv.caches[0].stamps[4] is None
    # Sliding, a new large page in its quota and none free: the wholly cached large page whose latest
    # page went back first, whatever its type: full's 0 (A's full pages went back before its sliding
    # ones). Sliding carves it (pages 0, 1), then takes B's own 5.
    assert table(kv, 1, 3) == [0, 1, 5]
    assert kv.stats.evictions == 2 + 1 + 3
    # Full attention lost blocks 0-2, the window still serves 5 blocks: no hit.
    assert served(kv, AFTER_SYSTEM, 5) == [0, 5] and kv.lookup(AFTER_SYSTEM).cached_tokens == 0
    check_identity(kv)


# -- end to end ------------------------------------------------------------------------------------------
def shared_prompts_config(variants: list[dict], **engine) -> dict:
    """Gemma-3-27B on 6 GB of KV (176 large pages), prompts sharing 4 system prompts."""
    raw = jenga_config(variants, **engine)
    raw["workload"] = {
        "num_requests": 60,
        "arrival": {"kind": "poisson", "rate_per_s": 4},
        "prompt_len": {"kind": "uniform", "low": 200, "high": 1500},
        "output_len": {"kind": "uniform", "low": 20, "high": 120},
        "shared_prefix": {"num_prefixes": 4, "prefix_len": {"kind": "uniform", "low": 1000, "high": 3000}},
    }
    return raw


def test_prefix_caching_raises_the_hit_rate_and_the_pool_stays_whole(tmp_path):
    off = {"name": "jenga", "policy": "jenga"}
    on = {"name": "jenga-prefix", "policy": "jenga", "engine": {"enable_prefix_caching": True}}
    results = run(shared_prompts_config([off, on]), tmp_path)
    without, with_caching = results["jenga"].summary, results["jenga-prefix"].summary
    # (Without caching nothing is looked up; with it, 38 % of prompt tokens hit, evicting as it goes.)
    assert without["prefix_cache_hit_rate"] is None and without["evictions"] == 0
    assert with_caching["prefix_cache_hit_rate"] > 0.3 and with_caching["evictions"] > 0
    assert with_caching["requests_finished"] == without["requests_finished"] == 60
    assert with_caching["ttft_p50_s"] < without["ttft_p50_s"] / 2
    pool = with_caching["kv_pool_tokens"]
    series = pd.read_parquet(tmp_path / "out" / "jenga-prefix" / "timeseries.parquet")
    assert (series[BREAKDOWN].sum(axis=1) == pool).all() and (series[BREAKDOWN] >= 0).all().all()
    assert series["cached_tokens"].max() > 0
    groups = pd.read_parquet(tmp_path / "out" / "jenga-prefix" / "kv_groups.parquet")
    totals = groups[BREAKDOWN].to_numpy().reshape(-1, 3 * len(BREAKDOWN)).sum(axis=1)
    assert (totals == pool).all()


def test_what_cannot_be_combined_is_refused_naming_the_key(tmp_path):
    caching = {"name": "jenga", "policy": "jenga", "engine": {"enable_prefix_caching": True}}
    raw = hybrid_config(
        "Nemotron-H-8B-Base-8K", [caching], kv_cache_memory_bytes=3_000_000_000, max_model_len=8192
    )
    refused_with(
        raw,
        {},
        "variants.0.engine.enable_prefix_caching: jenga's prefix caching has no rule for Nemotron-H-8B-Base-8K's "
        "Mamba / linear-attention layers",
        tmp_path,
    )


def test_a_windows_released_pages_go_before_an_older_requests():
    kv = tiny(large_pages=8)
    # A: the system prompt, final 28 (full large pages 0, 1; sliding 2, 3, 4); B: 8 tokens of its own,
    # both types at most 1 (full carves 5: pages 15, 16; sliding carves 6: pages 12, 13).
    kv.admit(1, SYSTEM, 28, 9)
    kv.admit(2, ((99, 8),), 12, 9)
    assert table(kv, 1, 2) == [12, 13]
    # B ends at time 3: its sliding large page 6 is wholly cached. Then A grows at time 4: its window
    # gives back blocks 0-2, and large page 2 (blocks 0, 1) is wholly cached, stamped 4 - 200.
    kv.free(2)
    kv.grow(1, 1)
    assert {large: stamp_parts(stamp) for large, stamp in kv.caches[1].whole_stamps().items()} == {
        6: (3, 1, 4),
        2: (-196, 0, 7),
    }
    # C needs a sliding large page and none is free: A's window's, though B's went back earlier (only
    # the last window of a prompt is needed for a hit). Full carves the free large page 7.
    kv.admit(3, ((98, 8),), 12, 9)
    assert table(kv, 0, 3) == [21, 22] and table(kv, 1, 3) == [4, 5]
    # So B's prompt is still served in both types, and A's (running, its window's pages held).
    assert kv.lookup(((99, 8), (5, 4))).cached_tokens == 8 and kv.lookup(AFTER_SYSTEM).cached_tokens == 20
    # Full: A 21 x 2 and C 8 x 2 used, A (24 - 21) x 2 reserved, pages 17 and 23 blank, B's 15 and 16
    # cached; sliding: A's tokens 12-20 (9 x 3) and C's 8 x 3 used, 3 x 3 reserved, pages 6, 12, 13
    # cached. Each type's 4 large pages (96 slots); none free.
    assert entries(kv) == [(58, 6, 0, 16, 16, 0), (51, 9, 0, 0, 36, 0), (0, 0, 0, 0, 0, 0)]
    check_identity(kv)


def test_pages_are_stamped_with_the_scheduler_step_so_both_step_modes_agree(tmp_path):
    """The eviction order reads page stamps. Stamped with the engine's iteration (the artifact stamps
    with its scheduler step's time), they do not depend on how the engine groups its operations, so
    event skipping gives exactly what single steps give; stamped per operation, they did not (skip
    mode makes fewer operations). 4.5 GB of KV (131 large pages): evictions all along."""
    caching = {"enable_prefix_caching": True}
    variants = [
        {"name": "single", "policy": "jenga", "engine": {**caching, "step_mode": "single"}},
        {"name": "skip", "policy": "jenga", "engine": caching},
    ]
    results = run(shared_prompts_config(variants, kv_cache_memory_bytes=4_500_000_000), tmp_path)
    single, skip = results["single"].summary, results["skip"].summary
    assert single["evictions"] > 0 and single["engine_wakeups"] > skip["engine_wakeups"]
    for key, value in single.items():
        if key in ("engine_wakeups", "wall_s", "engine_build") or not isinstance(value, (int, float)):
            continue
        assert skip[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


@pytest.mark.parametrize("large_pages", [60, 200])
@pytest.mark.parametrize("seed", [1, 2])
def test_every_cached_page_has_the_same_stamp_in_both_step_modes(large_pages, seed):
    """The same requests on the tiny two-type pool, stepped one iteration at a time and with event
    skipping: every cached page's stamp agrees at the end, those of pages a window gave back inside a
    jump included (stamped with the iteration the flush fell in, not the jump's first)."""
    from sim.engine.core import Engine
    from sim.engine.knobs import EngineKnobs
    from tests.test_engine import EQUIVALENCE_COSTS, random_requests

    requests = random_requests(seed, 40, gap=0.2, forks=False)
    pools = []
    for mode in ("single", "skip"):
        kv = tiny(large_pages)
        engine = Engine(
            kv, EQUIVALENCE_COSTS, EngineKnobs(max_model_len=64, step_mode=mode), iter(requests), block_size=4
        )
        engine.run()
        pools.append(kv)
    single, skip = pools
    assert any(cache.cached_stamps() for cache in single.caches)
    assert [cache.cached_stamps() for cache in single.caches] == [
        cache.cached_stamps() for cache in skip.caches
    ]
    assert [cache.whole_stamps() for cache in single.caches] == [
        cache.whole_stamps() for cache in skip.caches
    ]


def test_a_prompt_is_cached_in_every_type_as_far_as_it_was_scheduled():
    """With the engine reporting chunks (``defer_prompt_keys``): A's 14 tokens hold small pages 0-3 of
    the full type (large pages 0 and 1) and 4-7 of the window's (large pages 2 and 3), nothing cached
    until a chunk is scheduled. 6 tokens scheduled: B, sharing A's 12 system tokens, hits 4; 9
    tokens: 8. A preempted then: pages 0, 1 (full) and 4, 5 (window) stay cached, 2, 3, 6, 7 were
    never computed and go back blank. The full type keeps large page 0 (pages 0, 1 cached, 2 blank:
    16 + 8 bytes), the window large page 2 (24 cached); large pages 1 and 3 are free again."""
    kv = tiny()
    assert kv.defer_prompt_keys()
    a_prompt, b_prompt = system(12, 2, 2), system(12, 5, 3)
    assert kv.admit(1, a_prompt, 16, 101) == 0
    assert (table(kv, 0, 1), table(kv, 1, 1)) == ([0, 1, 2, 3], [4, 5, 6, 7])
    assert kv.lookup(b_prompt).cached_tokens == 0
    kv.prompt_scheduled(1, 6)
    assert kv.lookup(b_prompt).cached_tokens == 4
    kv.prompt_scheduled(1, 9)
    assert kv.lookup(b_prompt).cached_tokens == 8
    check_identity(kv)
    kv.free(1, finished=False)
    check_identity(kv)
    assert entries(kv) == [(0, 0, 0, 8, 16, 0), (0, 0, 0, 0, 24, 0), (0, 0, 0, 0, 0, 96)]
    assert kv.lookup(b_prompt).cached_tokens == 8


def test_whole_runs_by_hand():
    """Pages 5, 6, 7 given back with consecutive stamps 10-12 are one run; 3 at 4 another, older. A
    hit on 6 leaves 5 then 7; a run emptied and dropped is not the one a later stamp extends."""
    runs = WholeRuns()
    whole: list[int | None] = [None] * 10
    for stamp, page in ((10, 5), (11, 6), (12, 7), (4, 3)):
        whole[page] = stamp
        runs.push(stamp, page)
    assert len(runs.runs) == 2 and runs.runs[10].pages == [5, 6, 7]
    whole[6] = None  # (a hit)
    evicted = []
    while runs.oldest(whole) is not None:
        page = runs.pop_oldest(whole)
        evicted.append(page)
        whole[page] = None
    assert evicted == [3, 5, 7] and runs.runs == {} and runs.tail is None
    whole[8] = 13
    runs.push(13, 8)
    assert runs.oldest(whole) == 13 and runs.pop_oldest(whole) == 8


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["cache", "hit", "evict"]), st.integers(0, 11), st.integers(0, 3)),
        max_size=120,
    )
)
def test_whole_runs_evict_in_the_heaps_order(operations):
    """Whole pages given fresh stamps (a few request-time prefixes, one order counter, as
    ``EvictionClock`` gives them), hit and evicted at random: the runs evict the pages the heap of
    entries evicts, in the same order."""
    runs, heap = WholeRuns(), WholeQueue()
    whole: list[int | None] = [None] * 12
    order = 0
    for kind, page, prefix in operations:
        if kind == "cache" and whole[page] is None:
            order += 1
            whole[page] = (prefix << 20) + order
            runs.push(whole[page], page)
            heap.push(whole[page], page)
        elif kind == "hit":
            whole[page] = None
        elif kind == "evict":
            oldest = heap.oldest(whole)
            assert runs.oldest(whole) == oldest
            if oldest is not None:
                evicted = heap.pop_oldest(whole)
                assert runs.pop_oldest(whole) == evicted
                whole[evicted] = None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["cache", "hit", "evict"]),
            st.integers(0, 11),
            st.integers(0, 1),  # (two request-time prefixes: runs of consecutive stamps are common)
            st.integers(1, 5),
            st.one_of(st.none(), st.integers(0, 200)),  # the bound: a stamp given so far, by rank
        ),
        max_size=120,
    )
)
def test_whole_runs_evict_batches_in_the_heaps_order(operations):
    """As above, each eviction a batch: at most ``most`` pages while their stamps stay below a bound
    (None: any; else one of the stamps given, often inside a run). The runs' batch and the heap's are
    the pages the heap evicts one at a time while they qualify, each then wholly cached no more."""
    queues = {"runs": WholeRuns(), "heap": WholeQueue(), "one by one": WholeQueue()}
    wholes: dict[str, list[int | None]] = {name: [None] * 12 for name in queues}
    given_stamps: list[int] = []
    for kind, page, prefix, most, rank in operations:
        if kind == "cache" and wholes["one by one"][page] is None:
            stamp = (prefix << 20) + len(given_stamps) + 1
            given_stamps.append(stamp)
            for name, queue in queues.items():
                wholes[name][page] = stamp
                queue.push(stamp, page)
        elif kind == "hit":
            for whole in wholes.values():
                whole[page] = None
        elif kind == "evict":
            before = (
                None if rank is None or not given_stamps else sorted(given_stamps)[rank % len(given_stamps)]
            )
            one_by_one, whole = queues["one by one"], wholes["one by one"]
            expected = []
            while len(expected) < most:
                oldest = one_by_one.oldest(whole)
                if oldest is None or (before is not None and oldest >= before):
                    break
                expected.append(one_by_one.pop_oldest(whole))
                whole[expected[-1]] = None
            assert queues["heap"].pop_oldest_before(wholes["heap"], most, before) == expected
            assert queues["runs"].pop_oldest_before(wholes["runs"], most, before) == expected
            assert wholes["runs"] == wholes["heap"] == whole


def test_a_batch_stops_inside_a_run_at_its_bound():
    """Pages 1, 2, 3 given back with stamps 10-12 are one run; a batch below 12 takes 1 and 2, leaving 3
    the oldest; a batch of at most one page then takes it."""
    runs = WholeRuns()
    whole: list[int | None] = [None] * 4
    for stamp, page in ((10, 1), (11, 2), (12, 3)):
        whole[page] = stamp
        runs.push(stamp, page)
    assert runs.pop_oldest_before(whole, 5, 12) == [1, 2]
    assert whole == [None, None, None, 12] and runs.oldest(whole) == 12
    assert runs.pop_oldest_before(whole, 1, None) == [3] and runs.oldest(whole) is None


def test_a_batch_takes_a_large_page_made_whole_twice_with_one_stamp_once():
    """Large page 2 made whole at stamp 9, a page of it hit and cached again with an older stamp (a
    window's): whole again, still at 9, a second entry. A batch evicts it once, then page 4."""
    queue = WholeQueue()
    whole: list[int | None] = [None] * 6
    whole[2] = 9
    queue.push(9, 2)
    queue.push(9, 2)
    whole[4] = 11
    queue.push(11, 4)
    assert queue.pop_oldest_before(whole, 3, None) == [2, 4]
    assert whole == [None] * 6 and queue.oldest(whole) is None


def test_whole_pages_are_evicted_in_stamp_order_across_types():
    """Two types of whole pages (ratio 1) over 8 large pages: type A holds 0-3, type B 4-7, each
    cached and given back alternately (A0 B4 A1 B5 ...). Three pages for type A evict the three
    oldest of either type, A0, B4, A1, and A carves those large pages in that order."""
    large_pages = LargePagePool(8)
    clock, evictor, chains = EvictionClock(), LargePageEvictor(), ContentChains()
    kinds = [JengaPageCache(SmallPageAllocator(large_pages, 1), 4, chains, clock, evictor) for _ in range(2)]
    for kind in kinds:
        kind.add_group(PolicyStats())
        kind.allocator.add_request(1)
        kind.serve(1, 4)
    held = [kind.take_blocks(4, "the test") for kind in kinds]
    assert held == [[0, 1, 2, 3], [4, 5, 6, 7]]
    for kind, pages in zip(kinds, held, strict=True):
        for page in pages:
            kind.cache_block(0, page, chains.acquire((None, page, 0, 4, 0)))
    clock.serve(1)
    for a_page, b_page in zip(*held, strict=True):
        assert not kinds[0].release(a_page) and not kinds[1].release(b_page)
    assert evictor.whole_large_pages() == 8 and large_pages.free == 0
    kinds[0].allocator.add_request(2)
    kinds[0].serve(2, 3)
    assert kinds[0].take_blocks(3, "the test") == [0, 4, 1]
    assert [kind.whole_count for kind in kinds] == [2, 3]
    assert kinds[0].oldest_whole() == kinds[0].whole[2] and kinds[1].oldest_whole() == kinds[1].whole[5]


def test_the_eviction_clock_stamps_time_request_and_order():
    """Driven without an engine, each operation is a step: stamps carry the step (less the age
    served), the request, and a count of stamps given, whichever of tick() and serve() came last."""
    clock = EvictionClock()
    clock.serve(3)
    assert stamp_parts(clock.stamp()) == (0, 3, 1)
    clock.tick()
    assert stamp_parts(clock.stamp()) == (1, 3, 2)
    clock.tick()
    clock.serve(5, SKIPPED_AGE)
    assert stamp_parts(clock.stamp() + (SKIPPED_AGE << 80)) == (2, 5, 3)
    clock.serve(4)
    assert stamp_parts(clock.stamp()) == (2, 4, 4)
