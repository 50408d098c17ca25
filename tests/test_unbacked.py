"""Decode growth a token-granular pool does not back (``sim/engine/unbacked.py``, ``RadixPolicy``'s
``defer_unbacked``): the pending tokens take free slots and evict exactly what SGLang's decode
allocation evicts token by token, by hand and against a pool told of every token; the engine tells
the pool of a request's tokens only when it leaves, and goes back to token by token when the pool
runs short."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import PolicyInputError, PoolSpec, make_policy
from policies.radix import RadixPolicy
from sim.engine.unbacked import UnbackedGrowth
from sim.kv.allocators import sglang_hybrid_layout
from tests.test_engine import (
    EQUIVALENCE_COSTS,
    SCENARIOS,
    assert_physical_slots_are_the_held_ones,
    assert_same_results,
    random_requests,
    run,
)
from tests.test_hicache import hicache
from tests.test_radix import breakdown, radix_pool
from workloads.request import Request


class Pending:
    """What the engine's decode clock answers: decoded tokens no slot holds yet."""

    def __init__(self) -> None:
        self.tokens = 0

    def __call__(self) -> int:
        return self.tokens


def cached_leaf_and_b(slots: int = 12) -> RadixPolicy:
    """A (6 tokens) finished: a 6-token leaf, cached. B: 4 prompt tokens of its own, to reach 10."""
    policy = radix_pool(slots, max_model_len=16)
    policy.admit(1, ((1, 6),), 6, output_content_id=501)
    policy.free(1)
    policy.admit(2, ((2, 4),), 10, output_content_id=502)
    assert breakdown(policy) == (4, 0, 0, 0, 6, 2)
    return policy


def test_pending_tokens_take_free_slots_then_evict_the_leaf_whole_at_the_third():
    """Pool of 12: used 4, cached 6, free 2. B's first two decoded tokens take the two free slots
    (counted reserved: the engine moves its pending tokens from reserved to used). The third finds
    none free: the cached leaf is evicted whole (6 one-token pages) when the pool is next read, and
    B then holds 4 + 3, with 12 - 7 = 5 free. Told of its 3 tokens, B holds them itself."""
    policy = cached_leaf_and_b()
    pending = Pending()
    policy.defer_unbacked(pending)
    assert policy.growth_room(2) == 6  # to its end: the pool never asks for a flush
    pending.tokens = 2
    assert breakdown(policy) == (4, 2, 0, 0, 6, 0)
    assert policy.available_slots() == 6
    assert policy.stats.evictions == 0
    pending.tokens = 3
    assert breakdown(policy) == (4, 3, 0, 0, 0, 5)
    assert policy.stats.evictions == 6
    assert policy.sharing_slots() == (7, 7)
    pending.tokens = 0  # the engine stops counting them before it tells the pool
    policy.grow(2, 3)
    assert breakdown(policy) == (7, 0, 0, 0, 0, 5)
    assert policy.stats.evictions == 6


def test_the_same_tokens_told_one_at_a_time_evict_at_the_same_token():
    """The reference: before each decode step SGLang frees a page per decoding request, evicting the
    shortfall, then the token takes it. The leaf goes at the third token, as above."""
    policy = cached_leaf_and_b()
    for token, evictions in ((1, 0), (2, 0), (3, 6)):
        policy.prepare_decode_step(1)
        policy.grow(2, 1)
        assert policy.stats.evictions == evictions, token
    assert breakdown(policy) == (7, 0, 0, 0, 0, 5)


def test_evictions_ahead_of_the_pending_tokens_for_a_jump():
    """Two pending tokens fill the free slots; one more ahead (a jump's next iteration) evicts the
    leaf. The answer is the free slots the pending tokens leave, the ahead ones not counted."""
    policy = cached_leaf_and_b()
    pending = Pending()
    policy.defer_unbacked(pending)
    pending.tokens = 2
    assert policy.evict_for_unbacked(0) == 0
    assert policy.stats.evictions == 0
    assert policy.evict_for_unbacked(1) == 6
    assert policy.stats.evictions == 6


def test_a_lookup_sees_the_tree_after_the_pending_tokens_evicted():
    """A lookup is a read of the tree: the leaf the pending tokens evicted is no hit."""
    policy = cached_leaf_and_b()
    pending = Pending()
    policy.defer_unbacked(pending)
    assert policy.lookup(((1, 6), (9, 1))).cached_tokens == 6
    pending.tokens = 3
    assert policy.lookup(((1, 6), (9, 1))).cached_tokens == 0


def test_only_pages_of_one_token_defer():
    """Pages of one token, with or without a host tier; not pages of several, nor a block policy."""
    assert radix_pool(12).can_defer_unbacked()
    assert hicache(64).can_defer_unbacked()
    assert not radix_pool(12, page_size=4).can_defer_unbacked()
    paged = make_policy("paged", PoolSpec(64, 16, 64))
    assert not paged.can_defer_unbacked()
    for policy in (radix_pool(12, page_size=4), paged):
        with pytest.raises(PolicyInputError, match="cannot defer decode growth"):
            policy.defer_unbacked(Pending())
        with pytest.raises(PolicyInputError, match="cannot defer decode growth"):
            policy.evict_for_unbacked(0)


# ---------------------------------------------------------------------------------------- properties
OPERATION = st.one_of(
    st.tuples(st.just("admit"), st.integers(0, 3), st.integers(1, 12), st.integers(1, 12)),
    st.tuples(st.just("decode"), st.integers(1, 9)),
    st.tuples(st.just("finish"), st.integers(0, 7)),
    st.tuples(st.just("lookup"), st.integers(0, 3), st.integers(1, 12)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(OPERATION, min_size=1, max_size=40), st.integers(24, 64))
def test_unbacked_growth_equals_growth_told_token_by_token(operations, pool_slots):
    """Two pools on one random stream: one told of every decoded token after SGLang's per-step
    eviction, one with the tokens pending, told at each finish. After every operation the pools'
    breakdowns (pending moved from reserved to used), evictions, hits and sharing agree. Decode
    steps run only while the pool holds them (the engine's rule)."""
    eager, lazy = radix_pool(pool_slots, max_model_len=64), radix_pool(pool_slots, max_model_len=64)
    pending = Pending()
    lazy.defer_unbacked(pending)
    untold: dict[int, int] = {}  # sequence -> its tokens the lazy pool has not heard of
    next_id = 0
    for operation in operations:
        kind = operation[0]
        if kind == "admit":
            _, system, own, output = operation
            prompt = ((10 + system, 4 * system), (100 + next_id, own))
            final = 4 * system + own + output
            if eager.can_admit(prompt, final) != lazy.can_admit(prompt, final):
                raise AssertionError("the pools disagree on an admission")
            if eager.can_admit(prompt, final):
                hits = eager.admit(next_id, prompt, final, 1000 + next_id)
                assert lazy.admit(next_id, prompt, final, 1000 + next_id) == hits
                untold[next_id] = 0
            next_id += 1
        elif kind == "decode":
            for _ in range(operation[1]):
                decoding = [seq for seq in untold if eager.seq_len(seq) < eager.final_len(seq)]
                if not decoding or eager.available_slots() < len(decoding):
                    break
                eager.prepare_decode_step(len(decoding))
                for seq in decoding:
                    eager.grow(seq, 1)
                    untold[seq] += 1
                pending.tokens += len(decoding)
                lazy.prepare_decode_step(len(decoding))
        elif kind == "finish" and untold:
            seq = sorted(untold)[operation[1] % len(untold)]
            told = untold.pop(seq)
            pending.tokens -= told
            if told:
                lazy.grow(seq, told)
            eager.free(seq)
            lazy.free(seq)
        elif kind == "lookup":
            prompt = ((10 + operation[1], 4 * operation[1]), (7, operation[2]))
            assert eager.lookup(prompt) == lazy.lookup(prompt)
        used, reserved, *rest = lazy.breakdown_values()
        assert (used + pending.tokens, reserved - pending.tokens, *rest) == eager.breakdown_values()
        assert lazy.stats == eager.stats
        assert lazy.sharing_slots() == eager.sharing_slots()
        assert lazy.available_slots() == eager.available_slots()


# ------------------------------------------------------------------------------------------- engine
def counting_grows(policy: RadixPolicy) -> list[int]:
    calls: list[int] = []
    grow = policy.grow

    def counted(seq_id, num_tokens, content=None):
        calls.append(num_tokens)
        return grow(seq_id, num_tokens, content)

    policy.grow = counted  # type: ignore[method-assign]
    return calls


@pytest.mark.python_sources  # (it wraps the policy's grow: compiled, the engine calls it natively)
def test_a_roomy_pool_hears_of_each_request_twice():
    """Ten requests of 8 prompt and 40 output tokens in a pool of 4,096 slots: each sequence's first
    token (sampled by its prefill, before it decodes) and then its other 39 tokens at its end, in one
    call: 20 grows for 400 tokens. Deferred once, never back."""
    requests = [Request(index, index * 0.01, ((index, 8),), 40, 1000 + index) for index in range(10)]
    policy = make_policy("radix", PoolSpec(4096, 16, 64))
    calls = counting_grows(policy)
    from sim.engine.core import Engine
    from sim.engine.knobs import EngineKnobs

    engine = Engine(policy, EQUIVALENCE_COSTS, EngineKnobs(max_model_len=64), iter(requests), block_size=16)
    engine.run()
    assert sorted(calls) == [1] * 10 + [39] * 10
    assert engine.counters.output_tokens == 400
    assert engine.unbacked is not None and engine.unbacked.switches == 1


def test_a_tight_pool_goes_back_to_token_by_token_and_equals_single_steps():
    """Ten slots a sequence (tight): the pool runs short, so growth goes back to being told token by
    token (preemptions happen there) and is deferred again once it has room; every outcome equals
    single stepping."""
    pool, knobs, shape = SCENARIOS["tight"]
    requests = random_requests(3, 50, **shape)
    single = run("radix", pool, requests, "single", costs=EQUIVALENCE_COSTS, **knobs)
    skip = run("radix", pool, requests, "skip", costs=EQUIVALENCE_COSTS, **knobs)
    assert_same_results(single, skip)
    assert skip.counters.preemptions > 0
    assert skip.unbacked is not None and skip.unbacked.switches >= 3
    assert single.unbacked is None  # (single steps tell the pool of every token: the reference)


# ---------------------------------------------------------------------- SGLang's SWA and full pools
def sglang_swa_pools(full_tokens: int, swa_tokens: int, window: int):
    from policies.hybrid.block_pool import SharedBlockPool
    from policies.hybrid.full import FullAttentionGroup
    from policies.hybrid.sglang_sliding_window import SGLangSlidingWindowGroup
    from sim.kv.coordinator import KVGroup, make_coordinator

    spec = PoolSpec(full_tokens + swa_tokens, 1, 160)
    full = FullAttentionGroup(spec, SharedBlockPool(full_tokens, 1), 64)
    swa = SGLangSlidingWindowGroup(spec, SharedBlockPool(swa_tokens, 1), 64, window)
    return make_coordinator([KVGroup("full", full, 1), KVGroup("sliding", swa, 1)])


def run_pools(requests, step_mode, pools, block_size=1, until_s=None, **knobs):
    from sim.engine.core import Engine
    from sim.engine.knobs import EngineKnobs

    engine = Engine(
        pools,
        EQUIVALENCE_COSTS,
        EngineKnobs(max_model_len=160, step_mode=step_mode, **knobs),
        iter(requests),
        block_size=block_size,
    )
    engine.run(until_s)
    return engine


@pytest.mark.parametrize(
    ("full_tokens", "swa_tokens", "window", "gap"),
    [(4000, 4000, 8, 0.4), (400, 120, 8, 0.1), (200, 400, 16, 0.1), (160, 60, 4, 0.05)],
)
@pytest.mark.parametrize("seed", [1, 2])
def test_sglang_swa_pools_defer_growth_and_equal_single_steps(full_tokens, swa_tokens, window, gap, seed):
    """SGLang's two token pools without the radix cache (``sglang-hybrid``): decoded tokens take a
    free slot of each pool unbacked; the SWA pool's bulk frees every window stay events of their
    own. Every outcome, the breakdown's time averages and each group's equal single stepping."""
    requests = random_requests(seed, 50, gap=gap)
    single = run_pools(requests, "single", sglang_swa_pools(full_tokens, swa_tokens, window))
    skip = run_pools(requests, "skip", sglang_swa_pools(full_tokens, swa_tokens, window))
    assert skip.unbacked is not None and skip.unbacked.switches >= 1
    assert_same_results(single, skip)
    assert_physical_slots_are_the_held_ones(single)
    assert_physical_slots_are_the_held_ones(skip)
    assert_same_group_means(single, skip)
    assert skip.wakeups < single.wakeups


def assert_same_group_means(single, skip) -> None:
    """Each group's time-averaged breakdown equal, up to float rounding."""
    end = single.env.now
    pool_slots = single.kv.pool_slots
    groups_single = single.group_series.time_averages(end, pool_slots)
    groups_skip = skip.group_series.time_averages(end, pool_slots)
    for name, means in groups_single.items():
        for category, value in means.items():
            assert groups_skip[name][category] == pytest.approx(value, rel=1e-9, abs=1e-12), (name, category)


def vllm_hybrid_pool(blocks: int, window: int):
    """vLLM's hybrid manager: a full-attention and a sliding-window group on one pool of 4-token blocks."""
    from policies.hybrid.block_pool import SharedBlockPool
    from policies.hybrid.full import FullAttentionGroup
    from policies.hybrid.sliding_window import SlidingWindowGroup
    from sim.kv.coordinator import KVGroup, make_coordinator

    spec = PoolSpec(blocks * 4, 4, 160)
    shared = SharedBlockPool(blocks, 4)
    full = FullAttentionGroup(spec, shared, 64)
    swa = SlidingWindowGroup(spec, shared, 64, window)
    return make_coordinator([KVGroup("full", full, 1), KVGroup("sliding", swa, 1)])


@pytest.mark.parametrize(("blocks", "window", "gap"), [(400, 8, 0.1), (90, 8, 0.1), (60, 16, 0.05)])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_window_moving_on_inside_a_jump_lets_the_waiting_head_in_as_single_steps_do(
    blocks, window, gap, seed
):
    """A head that did not fit may fit once a sliding window gives blocks back: a jump stops before
    a flush while the head waits for memory, so event skipping admits it at the iteration single
    steps do (vLLM's hybrid manager; it grows in blocks of 4, told at block boundaries)."""
    requests = random_requests(seed, 50, gap=gap)
    single = run_pools(requests, "single", vllm_hybrid_pool(blocks, window), block_size=4)
    skip = run_pools(requests, "skip", vllm_hybrid_pool(blocks, window), block_size=4)
    assert skip.unbacked is None
    assert_same_results(single, skip)


@pytest.mark.parametrize("scenario", ["roomy", "tight"])
@pytest.mark.parametrize("until_s", [0.7, 2.35, 6.0])
def test_a_radix_run_stopped_inside_a_jump_equals_single_stepping(scenario, until_s):
    """``until_s`` inside a jump of unbacked growth: the tokens of the iterations begun by then took
    free slots, and the evictions they made are in, as single steps had them."""
    pool, knobs, shape = SCENARIOS[scenario]
    requests = random_requests(3, 50, **(shape | {"forks": False}))
    both = [
        run("radix", pool, requests, mode, costs=EQUIVALENCE_COSTS, until_s=until_s, **knobs)
        for mode in ("single", "skip")
    ]
    assert both[0].env.now == both[1].env.now == until_s
    assert_same_results(*both)


# ------------------------------------------------------------ SGLang's SWA radix cache over both pools
def sglang_swa_radix(full_tokens: int, swa_tokens: int, window: int):
    from sim.kv.sglang_swa_radix import SWARadixCoordinator

    return SWARadixCoordinator(full_tokens, swa_tokens, 1, window, 160, 1, ("full", "sliding"))


def swa_cached_leaf_and_b() -> object:
    """SGLang's SWA radix cache, both pools of 12 slots, window 4: A (6 tokens) finished, a 6-token
    leaf cached in both pools; B holds 4 prompt tokens of its own in each, to reach 10."""
    kv = sglang_swa_radix(12, 12, 4)
    kv.admit(1, ((1, 6),), 6, output_content_id=501)
    kv.free(1)
    kv.admit(2, ((2, 4),), 10, output_content_id=502)
    assert kv.pool_breakdown(0) == kv.pool_breakdown(1) == (4, 0, 0, 0, 6, 2)
    return kv


def test_swa_radix_pending_tokens_take_a_free_slot_of_each_pool_then_evict_the_leaf_at_the_third():
    """B's first two decoded tokens take the two free slots of each pool (counted reserved). The
    third finds none: the leaf is evicted whole, from both pools (6 + 6 one-token pages), when the
    cache is next read, leaving 12 - 7 = 5 free in each. Told of its 3 tokens, B holds them."""
    kv = swa_cached_leaf_and_b()
    pending = Pending()
    kv.defer_unbacked(pending)
    assert kv.growth_room(2) == 1  # (its first decode eviction, SGLang's step 1: an event of its own)
    pending.tokens = 2
    assert kv.pool_breakdown(0) == kv.pool_breakdown(1) == (4, 2, 0, 0, 6, 0)
    assert kv.available_slots() == 6
    assert kv.stats.evictions == 0
    pending.tokens = 3
    assert kv.pool_breakdown(0) == kv.pool_breakdown(1) == (4, 3, 0, 0, 0, 5)
    assert kv.stats.evictions == 12
    assert kv.sharing_slots() == (14, 14)
    assert kv.evict_for_unbacked(5) == 5  # (five more ahead fit: nothing evicted; the free slots)
    pending.tokens = 0  # the engine stops counting them before it tells the pool
    kv.grow(2, 3)
    assert kv.pool_breakdown(0) == (7, 0, 0, 0, 0, 5)
    assert kv.stats.evictions == 12


def test_swa_radix_tokens_told_one_at_a_time_evict_at_the_same_token():
    """The reference: a page per decoding request free in each pool before each decode step."""
    kv = swa_cached_leaf_and_b()
    for token, evictions in ((1, 0), (2, 0), (3, 12)):
        kv.prepare_decode_step(1)
        kv.grow(2, 1)
        assert kv.stats.evictions == evictions, token
    assert kv.pool_breakdown(0) == (7, 0, 0, 0, 0, 5)


@pytest.mark.parametrize("read", ["lookup", "match"])
def test_a_swa_radix_lookup_or_match_sees_the_tree_after_the_pending_tokens_evicted(read):
    """Each read of the tree first takes the pending tokens: the leaf they evicted is no hit."""
    kv = swa_cached_leaf_and_b()
    pending = Pending()
    kv.defer_unbacked(pending)
    assert getattr(kv, read)(((1, 6), (9, 1))).cached_tokens == 6
    pending.tokens = 3
    assert getattr(kv, read)(((1, 6), (9, 1))).cached_tokens == 0


def test_only_swa_radix_pages_of_one_token_defer():
    assert sglang_swa_radix(12, 12, 4).can_defer_unbacked()
    from sim.kv.sglang_swa_radix import SWARadixCoordinator

    paged = SWARadixCoordinator(64, 64, 4, 8, 160, 1, ("full", "sliding"))
    assert not paged.can_defer_unbacked()
    with pytest.raises(PolicyInputError, match="pages of 4 tokens"):
        paged.defer_unbacked(Pending())


SWA_RADIX_POOLS = [
    (4000, 4000, 8, 0.4),
    (400, 120, 8, 0.1),
    (200, 400, 16, 0.1),
    (160, 60, 4, 0.05),
    (300, 200, 8, 0.05),
]


@pytest.mark.parametrize(("full_tokens", "swa_tokens", "window", "gap"), SWA_RADIX_POOLS)
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("scheduler", ["vllm", "sglang"])
def test_sglang_swa_radix_cache_defers_growth_and_equals_single_steps(
    full_tokens, swa_tokens, window, gap, seed, scheduler
):
    """SGLang's SWA radix cache (``sglang-hybrid`` with prefix caching): decoded tokens take a free
    slot of each pool unbacked, and evict from the tree at the steps SGLang's decode allocation
    would, each step's shortfall in both pools at once; a sequence's SWA frees every window stay
    events of their own. Every outcome, the evictions and the time averages (pool-wide and per
    pool) equal single stepping, where the cache hears of every token, under either scheduler."""
    requests = random_requests(seed, 60, gap=gap)
    single = run_pools(
        requests, "single", sglang_swa_radix(full_tokens, swa_tokens, window), scheduler=scheduler
    )
    skip = run_pools(requests, "skip", sglang_swa_radix(full_tokens, swa_tokens, window), scheduler=scheduler)
    assert single.unbacked is None
    assert skip.unbacked is not None and skip.unbacked.switches >= 1
    assert_same_results(single, skip)
    assert_same_group_means(single, skip)
    assert skip.wakeups < single.wakeups


def test_tight_swa_radix_pools_evict_inside_jumps_as_single_steps_do():
    """The tight cases of the test above do what it is for: the tree evicts while growth is
    deferred (inside jumps), and growth goes back to token by token when the pools run short."""
    requests = random_requests(1, 60, gap=0.05)
    skip = run_pools(requests, "skip", sglang_swa_radix(160, 60, 4))
    single = run_pools(requests, "single", sglang_swa_radix(160, 60, 4))
    assert_same_results(single, skip)
    assert skip.kv.stats.evictions > 0
    assert skip.unbacked is not None and skip.unbacked.switches >= 2


@pytest.mark.parametrize("until_s", [0.7, 2.35, 6.0])
@pytest.mark.parametrize("radix_cache", [False, True])
def test_sglang_swa_pools_stopped_inside_a_jump_equal_single_stepping(until_s, radix_cache):
    """The same for SGLang's two token pools, with its SWA radix cache or without: a pending token
    took a free slot of each (and, with the cache, made the evictions of the steps begun by then)."""
    requests = random_requests(3, 50, gap=0.1, forks=False)
    pools = sglang_swa_radix if radix_cache else sglang_swa_pools
    both = [run_pools(requests, mode, pools(400, 160, 8), until_s=until_s) for mode in ("single", "skip")]
    assert both[0].env.now == both[1].env.now == until_s
    assert_same_results(*both)


def hicache_radix(pool: PoolSpec, host_blocks: int, write_policy: str) -> RadixPolicy:
    policy = make_policy("radix", pool)
    policy.enable_host_tier(host_blocks, write_policy)
    return policy


@pytest.mark.parametrize("write_policy", ["write_through", "write_back", "write_through_selective"])
@pytest.mark.parametrize("scenario", ["roomy", "tight", "swap"])
@pytest.mark.parametrize("seed", [1, 2])
def test_hicache_radix_defers_growth_and_equals_single_stepping(write_policy, scenario, seed):
    """SGLang's HiCache under the radix tree: the evictions the pending tokens make move backed-up
    nodes to the host pool (or write them back first), in the order token-by-token growth makes
    them; later admissions load them back. Every outcome and host-tier count equals single steps."""
    pool, knobs, shape = SCENARIOS[scenario]
    requests = random_requests(seed, 50, **shape)
    engines = []
    for mode in ("single", "skip"):
        policy = hicache_radix(pool, 4 * pool.kv_pool_tokens // pool.block_size, write_policy)
        from sim.engine.core import Engine
        from sim.engine.knobs import EngineKnobs

        engine = Engine(
            policy,
            EQUIVALENCE_COSTS,
            EngineKnobs(max_model_len=pool.max_model_len, step_mode=mode, beam_reparent_prob=0.2, **knobs),
            iter(requests),
            block_size=pool.block_size,
        )
        engine.run()
        engines.append(engine)
    single, skip = engines
    assert skip.unbacked is not None and skip.unbacked.switches >= 1
    assert_same_results(single, skip)
    assert single.policy.host_tier.stats == skip.policy.host_tier.stats


# ------------------------------------------------------------------ when growth goes from one way to the other
class _Pool:
    """A stand-in pool: its free slots as set, and every ``defer_unbacked`` it is told."""

    def __init__(self):
        self.available = 0
        self.told = []

    def available_slots(self):
        return self.available

    def defer_unbacked(self, pending_tokens):
        self.told.append(pending_tokens)


class _Clock:
    sequences = 3
    now = 10

    def __init__(self):
        self.pending = 5

    def pending_tokens(self):
        return self.pending


class _Batch:
    running = ()


@pytest.mark.python_sources  # stand-ins: the compiled class takes only the engine's own parts
def test_growth_defers_with_four_iterations_of_room_and_goes_back_when_the_pool_is_short():
    """Three decoding sequences with 5 pending tokens: growth is deferred once the free slots hold the
    pending tokens and 4 more iterations (5 + 4 x 3 = 17), not at 16; it stays deferred while the
    pool holds this iteration's tokens (0 slots left) and goes back to token by token at -1, the
    pool counting only the tokens before this iteration while the sequences are told of them."""
    pool, clock = _Pool(), _Clock()
    growth = UnbackedGrowth(pool, clock, _Batch())
    assert growth.active is False and growth.switches == 0
    pool.available = 16
    growth.at_iteration_start()
    assert not growth.active and pool.told == []
    pool.available = 17
    growth.at_iteration_start()
    assert growth.active and growth.switches == 1 and pool.told == [clock.pending_tokens]
    assert growth.jump_limit(10) == 17 // 3 and growth.jump_limit(4) == 4
    pool.available = 0
    growth.at_iteration_start()
    assert growth.active and growth.switches == 1
    pool.available = -1
    growth.at_iteration_start()
    assert growth.active is False and growth.switches == 2
    before_this_iteration, after = pool.told[1:]
    assert before_this_iteration() == 5 - 3 and after is None
    assert growth.jump_limit(10) == 10  # (told token by token: no limit of its own)


def test_a_token_pool_counts_its_pending_tokens_once_in_the_slots_its_sequences_hold():
    """SGLang's two token pools for gpt-oss without the radix cache: a 100-token prompt holds 100
    slots in each (200); 5 decoded tokens the pools have not been told of fill one free slot each
    in both (10 more, counted reserved): the sequences hold 210 slots, nothing shared. (The groups
    once added their pending tokens to that count a second time: 220.)"""
    kv = sglang_hybrid_layout(
        "gpt-oss-20b", 2_000_000_000, max_model_len=4096, prefill_tokens=1024
    ).make_coordinator()
    kv.admit(1, ((1, 100),), 300, output_content_id=9)
    pending = [0]
    kv.defer_unbacked(lambda: pending[0])
    pending[0] = 5
    used, reserved, internal, *_ = kv.breakdown_values()
    assert (used, reserved, internal) == (200, 10, 0)
    assert kv.sharing_slots() == (210, 210)
