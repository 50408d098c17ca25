"""K/V blocks that running sequences share are read from memory once (sim/engine/shared_reads.py):
what each policy says it shares, what the GPU's cache holds of a layer, the credit, and runs."""

from __future__ import annotations

import pytest

from policies import ChildSpec, PoolSpec, make_policy
from sim.costs.core import AnalyticCostModel
from sim.costs.derated import DeratedCostModel
from sim.engine.shared_reads import SharedReads, shared_reads_for
from sim.hardware.gpus import GPU_PRESETS, L2_CACHE_MIB, resolve_gpu
from sim.hardware.models import resolve_model as get_model
from tests.engine_helpers import RoundCostModel
from tests.test_engine import POLICIES, SCENARIOS, assert_same_results, random_requests, run, times
from tests.test_hybrid_prefix_caching import SYSTEM as HYBRID_SYSTEM
from tests.test_hybrid_prefix_caching import hybrid as hybrid_pool
from tests.test_paged_prefix import ids, prefix_pool
from tests.test_radix import SYSTEM, radix_pool

MiB = 2**20


# ------------------------------------------------------------------------------- what a policy shares
def test_prefix_counts_each_block_two_sequences_hold_once():
    # Blocks of 4. Sequence 0: ids 1..10 (blocks A, B full, C partly); sequence 1 hits A and B (its
    # prompt continues differently) and takes a block of its own; a third hits them too.
    policy = prefix_pool(num_blocks=12, block_size=4)
    policy.admit(0, ids(1, 10), 12, output_content_id=500)
    assert policy.shared_slots() == 0
    assert policy.admit(1, ids(1, 8) + ids(50, 51), 12, output_content_id=501) == 8
    assert policy.shared_slots() == 8  # A and B, once each
    assert policy.admit(2, ids(1, 8) + ids(60, 61), 12, output_content_id=502) == 8
    assert policy.shared_slots() == 8  # still A and B: three holders each
    assert policy.sharing_slots() == (5 * 4, 9 * 4)  # the re-reads: 16 slots
    policy.free(0)
    assert policy.shared_slots() == 8  # sequences 1 and 2 still hold both
    policy.free(1)
    assert policy.shared_slots() == 0


def test_a_fork_shares_every_block_until_its_tail_is_copied():
    policy = prefix_pool(num_blocks=8, block_size=4)
    policy.admit(0, ids(1, 6), 12, output_content_id=500)  # one full block, a tail of 2
    policy.fork(0, [ChildSpec(1, 12, 501)])
    assert policy.shared_slots() == 8  # the full block and the shared tail
    policy.grow(1, 1)  # the child writes: its tail is copied first
    assert policy.shared_slots() == 4
    policy.free(1)
    assert policy.shared_slots() == 0


def test_plain_paging_and_contiguous_share_nothing():
    for name in ("paged", "contiguous"):
        policy = make_policy(name, PoolSpec(64, 4, 32))
        policy.admit(0, ids(1, 8), 12, output_content_id=500)
        policy.admit(1, ids(1, 8), 12, output_content_id=501)
        assert policy.shared_slots() == 0


def test_radix_counts_the_tokens_of_nodes_two_requests_lock():
    policy = radix_pool(64)
    policy.admit(0, (SYSTEM, (100, 4)), 16, output_content_id=500)  # one leaf of 14 tokens
    assert policy.shared_slots() == 0
    # The second request splits it: the 10 system tokens above, locked by both; 4 + 5 below, one each.
    assert policy.admit(1, (SYSTEM, (101, 5)), 16, output_content_id=501) == 10
    assert policy.shared_slots() == 10
    policy.free(0)
    assert policy.shared_slots() == 0


# ------------------------------------------------------------------------------- the cache, by GPU
def test_every_preset_has_its_cache():
    assert set(L2_CACHE_MIB) == set(GPU_PRESETS)
    for name, spec in GPU_PRESETS.items():
        assert spec.l2_cache_bytes == L2_CACHE_MIB[name] * MiB > 0
    assert GPU_PRESETS["H100-80GB"].l2_cache_bytes == 52_428_800  # deviceQuery's "L2 Cache Size"
    assert GPU_PRESETS["H200-141GB"].l2_cache_bytes == 60 * MiB  # all six stacks: the whole GH100 L2


def test_a_custom_gpu_names_its_cache_or_inherits_it():
    assert resolve_gpu({"base": "H100-80GB", "memory_gib": 79}).l2_cache_bytes == 50 * MiB
    assert resolve_gpu({"base": "H100-80GB", "l2_cache_mib": 0}).l2_cache_bytes == 0
    bare = {"memory_gib": 24, "hbm_bandwidth_gb_per_s": 300, "fp16_tflops": 100}
    assert resolve_gpu(bare).l2_cache_bytes == 0
    assert resolve_gpu(bare | {"l2_cache_mib": 2.5}).l2_cache_bytes == int(2.5 * MiB)
    for bad in (-1, "big", True, None, float("inf")):
        with pytest.raises(ValueError) as error:
            resolve_gpu({"base": "L4", "l2_cache_mib": bad})
        assert str(error.value) == f"custom GPU: l2_cache_mib must be a finite number >= 0, got {bad!r}"


def test_the_cache_holds_this_many_tokens_of_one_layer():
    # Llama-2-7B: 32 layers x 2 (K, V) x 4,096 x 2 bytes = 16,384 bytes per token and layer.
    llama = get_model("llama-2-7b")
    h100 = resolve_gpu("H100-80GB")
    assert DeratedCostModel(llama, h100).shared_kv_cached_tokens == 52_428_800 / 16_384 == 3_200
    # Two GPUs each hold half the heads: a layer's token takes half the bytes on each.
    assert DeratedCostModel(llama, h100, tensor_parallel_size=2).shared_kv_cached_tokens == 6_400
    assert AnalyticCostModel(llama, resolve_gpu("A100-80GB")).shared_kv_cached_tokens == 2_560
    none = resolve_gpu({"base": "H100-80GB", "l2_cache_mib": 0})
    assert DeratedCostModel(llama, none).shared_kv_cached_tokens == 0
    # gpt-oss-20b: 24 attention layers of 8 K/V heads of 64 x 2 (K, V) x 2 bytes = 2,048 bytes a token.
    assert DeratedCostModel(get_model("gpt-oss-20b"), h100).shared_kv_cached_tokens == 52_428_800 / 2_048
    # Qwen3-Next: 12 attention layers among 48 (the others gated delta net), 2 x 256 x 2 x 2 = 2,048.
    assert DeratedCostModel(get_model("Qwen3-Next-80B-A3B"), h100).shared_kv_cached_tokens == 25_600


# ------------------------------------------------------------------------------- the credit
class FakePool:
    """A pool whose sharing the test sets: physical and logical slots, and the shared ones."""

    def __init__(self, physical: int, logical: int, shared: int, may_share: bool = True):
        self.physical, self.logical, self.shared = physical, logical, shared
        self.asked = 0
        self._may_share = may_share

    def may_share(self):
        return self._may_share

    def token_sharing(self):
        self.asked += 1
        return self.logical - self.physical, self.shared


@pytest.mark.python_sources  # a stand-in pool: the compiled class takes only a KVCoordinator
def test_the_credit_by_hand():
    # 300 re-read slots over 200 shared ones; the cache holds 100 tokens of a layer: half the shared
    # blocks stay, so half the re-reads hit: 150 tokens.
    pool = FakePool(physical=1_000, logical=1_300, shared=200)
    reads = SharedReads(pool, cached_tokens_per_layer=100)
    assert reads.credit() == 150
    # All of it fits: every re-read hits.
    assert SharedReads(FakePool(1_000, 1_300, 80), 100).credit() == 300
    # Nothing shared, or shared without saying what: nothing.
    assert SharedReads(FakePool(1_000, 1_000, 0), 100).credit() == 0
    assert SharedReads(FakePool(1_000, 1_300, 0), 100).credit() == 0
    # The least sharing there is: one token re-read from one shared token, credited from the start.
    assert SharedReads(FakePool(1_000, 1_001, 1), 100).credit() == 1


@pytest.mark.python_sources  # a stand-in pool: the compiled class takes only a KVCoordinator
def test_the_credit_changes_only_when_the_sharing_does():
    pool = FakePool(physical=1_000, logical=1_300, shared=200)
    reads = SharedReads(pool, cached_tokens_per_layer=100)
    assert reads.credit() == 150
    pool.physical, pool.logical, pool.shared = 1_016, 1_316, 400  # a sequence took a private block
    assert reads.credit() == 150 and pool.asked == 2  # re-reads unchanged: the old credit stands
    pool.logical = 1_332  # someone shares one more block
    assert reads.credit() == 316 * 100 / 400


@pytest.mark.python_sources  # a stand-in pool: the compiled class takes only a KVCoordinator
def test_a_credit_only_where_the_cost_model_gives_one_and_the_pool_can_share():
    assert shared_reads_for(FakePool(0, 0, 0), 0.0) is None
    assert shared_reads_for(FakePool(0, 0, 0), 10.0) is not None
    assert shared_reads_for(FakePool(0, 0, 0), 1.0) is not None  # (a cache of one token is a cache)
    assert shared_reads_for(FakePool(0, 0, 0, may_share=False), 10.0) is None


def test_which_pools_can_share():
    from sim.kv.coordinator import make_coordinator

    pool = PoolSpec(64, 4, 32)
    sharing = {
        name: make_coordinator(make_policy(name, pool)).may_share()
        for name in ("contiguous", "paged", "prefix", "radix")
    }
    assert sharing == {"contiguous": False, "paged": False, "prefix": True, "radix": True}
    kv, _, _, _ = hybrid_pool(16)  # vllm-hybrid with prefix caching
    assert kv.may_share()


def test_a_hybrid_pool_reports_what_its_full_attention_group_shares():
    # vllm-hybrid's full-attention and 8-token sliding-window groups over one pool of 4-token blocks
    # (tests/test_hybrid_prefix_caching.py): two live requests with the same 12-token system prompt.
    # The second hits the first's three full blocks in the full group: 12 slots re-read, 12 shared.
    kv, full, window, _ = hybrid_pool(16)
    assert kv.token_sharing() == (0, 0)
    kv.admit(1, (HYBRID_SYSTEM, (2, 1)), 13, 101)
    kv.admit(2, (HYBRID_SYSTEM, (3, 1)), 13, 102)
    assert full.sharing_slots() == (20, 32) and full.shared_slots() == 12
    assert kv.token_sharing() == (12, 12)
    kv.admit(3, (HYBRID_SYSTEM, (4, 1)), 13, 103)  # a third holder: more re-reads, the same blocks
    assert kv.token_sharing() == (24, 12)
    kv.free(1)
    kv.free(2)
    assert kv.token_sharing() == (0, 0)  # one holder left


@pytest.mark.python_sources  # a bare instance of the interface: compiled, it cannot be made
def test_pools_that_do_not_track_sharing_report_none():
    from sim.kv.interface import KVCoordinator

    assert KVCoordinator.token_sharing(object.__new__(KVCoordinator)) == (0, 0)


def test_sglangs_split_pools_report_the_tree_paths_running_requests_share():
    """SGLang's SWA radix cache (window 4, pages of one token) and its Mamba radix cache: A's 10-token
    prompt enters the tree and A locks it; B's prompt is those 10 tokens and 3 more: its match (the
    prompt less its last token) is A's 10, which B locks too. The full pool's 10 tokens of that path
    are shared and read twice: 10 re-read, 10 shared. A third holder re-reads them once more; the
    Mamba states and the window's slots are each request's own (not counted)."""
    from tests.test_sglang_mamba import coordinator as mamba_coordinator
    from tests.test_sglang_swa_radix import coordinator as swa_coordinator

    for kv in (swa_coordinator(4), mamba_coordinator(full=100, mamba=12)):
        assert kv.may_share() and kv.token_sharing() == (0, 0)
        kv.admit(1, ((1, 10),), 20, 101)
        assert kv.token_sharing() == (0, 0)  # one holder
        kv.admit(2, ((1, 10), (2, 3)), 20, 102)
        assert kv.token_sharing() == (10, 10)
        kv.admit(3, ((1, 10), (3, 3)), 20, 103)
        assert kv.token_sharing() == (20, 10)
        kv.free(1)
        kv.free(2)
        assert kv.token_sharing() == (0, 0)
    assert not mamba_coordinator(radix=False).may_share()


def test_jengas_prefix_cache_reports_what_its_full_attention_pages_share():
    """Jenga's prefix caching over tests/test_jenga_prefix.py's two types (blocks of 4): A and B send
    a 12-token system prompt and one token of their own; B hits A's 3 full pages in both types. The
    full-attention type holds them once for two: 12 tokens re-read, 12 shared (the window's pages are
    not what a step reads whole)."""
    from tests.test_jenga_prefix import tiny

    kv = tiny(large_pages=8)
    assert kv.may_share() and kv.token_sharing() == (0, 0)
    kv.admit(1, ((1, 12), (2, 1)), 20, 101)
    assert kv.admit(2, ((1, 12), (3, 1)), 20, 102) == 12
    assert kv.token_sharing() == (12, 12)
    kv.free(1)
    assert kv.token_sharing() == (0, 0)


# ------------------------------------------------------------------------------- runs
class CachedRoundCosts(RoundCostModel):
    """The equivalence costs on a GPU whose cache holds ``cached`` tokens of a layer."""

    def __init__(self, cached: float):
        super().__init__(
            intercept_s=0.01, per_seq_s=0.001, per_context_token_s=1e-5, prefill_per_token_s=1e-4
        )
        self.shared_kv_cached_tokens = cached


@pytest.mark.parametrize(("policy", "options"), [p for p in POLICIES if p[0] in ("prefix", "radix")])
@pytest.mark.parametrize("scenario", ["roomy", "chunked", "tight"])
def test_both_step_modes_agree_with_the_credit(policy, options, scenario):
    pool, knobs, shape = SCENARIOS[scenario]
    requests = random_requests(3, 50, **shape)
    costs = CachedRoundCosts(cached=24)  # a cache smaller than what is shared, at times
    single = run(policy, pool, requests, "single", costs=costs, options=options, **knobs)
    skip = run(policy, pool, requests, "skip", costs=costs, options=options, **knobs)
    assert_same_results(single, skip)
    # and the credit is there: without a cache, the same run takes longer
    uncached = run(policy, pool, requests, "skip", costs=CachedRoundCosts(cached=0), options=options, **knobs)
    assert uncached.env.now > skip.env.now


def test_two_identical_prompts_decode_on_one_copy_of_their_prefix():
    # Blocks of 16; two requests send the same 64-token prompt for 20 output tokens. The second comes
    # at 0.05 s and hits 48 tokens (3 full blocks: vLLM computes the prompt's last token again), which
    # both then hold: 48 re-read tokens, all in a cache of 1,000, so each step is 48 x 1e-5 s shorter.
    # Steps of one sequence take 0.01 + 0.001 + 1e-5 x ~66 = 0.01166 s: after its first token (at
    # 0.0164 s) the first request has decoded 3 tokens when the second is admitted (0.0514 s) and
    # decodes its last 16 from that iteration on; that first iteration was priced before the admission,
    # so 15 steps get the credit.
    from tests.engine_helpers import request

    pool = PoolSpec(16 * 40, 16, 160)
    prompt = ((7, 64),)
    requests = [request(0, 0.0, 0, 20, prompt=prompt), request(1, 0.05, 0, 20, prompt=prompt)]
    cached = run("prefix", pool, requests, "single", costs=CachedRoundCosts(cached=1_000))
    plain = run("prefix", pool, requests, "single", costs=CachedRoundCosts(cached=0))
    assert [r.cached_prompt_tokens for r in cached.records] == [0, 48]
    assert plain.env.now - cached.env.now == pytest.approx(15 * 48 * 1e-5, rel=1e-9)
    # A cache of 24 tokens holds half the 48 shared ones: half the credit.
    half = run("prefix", pool, requests, "single", costs=CachedRoundCosts(cached=24))
    assert plain.env.now - half.env.now == pytest.approx(15 * 24 * 1e-5, rel=1e-9)
    # Plain paging holds two copies: no credit.
    paged = run("paged", pool, requests, "single", costs=CachedRoundCosts(cached=1_000))
    paged_plain = run("paged", pool, requests, "single", costs=CachedRoundCosts(cached=0))
    assert paged.env.now == paged_plain.env.now


def _hybrid_run(step_mode: str, cached: float, requests):
    """gpt-oss's shape in small: a full-attention and an 8-token sliding-window group over one
    prefix-caching pool of 4-token blocks; half the K/V bytes in the window layers."""
    from sim.engine.core import Engine, EngineKnobs

    kv, _, _, _ = hybrid_pool(96)
    costs = CachedRoundCosts(cached=cached)
    costs.attention_windows = ((8, 0.5),)
    engine = Engine(
        kv, costs, EngineKnobs(max_model_len=4096, step_mode=step_mode), iter(requests), block_size=4
    )
    engine.run()
    return engine


def test_a_hybrid_pool_reads_its_full_layers_shared_prefix_once():
    # Requests after the same 12-token system prompt, arriving while others decode: their hits are
    # shared blocks of the full-attention group; only that group's half of the context is credited.
    from tests.engine_helpers import request

    requests = [
        request(index, 0.02 * index, 0, 12 + index % 5, prompt=(HYBRID_SYSTEM, (200 + index, 1 + index % 3)))
        for index in range(12)
    ]
    single, skip = (_hybrid_run(mode, 40, requests) for mode in ("single", "skip"))
    assert single.counters == skip.counters
    for request_id, row in times(single).items():
        assert times(skip)[request_id][3] == row[3] == "finished"
        assert times(skip)[request_id][:3] == pytest.approx(row[:3], rel=1e-9)
    assert skip.kv.group_breakdowns() == single.kv.group_breakdowns()
    uncached = _hybrid_run("skip", 0, requests)
    assert uncached.env.now > skip.env.now
    # A cache as large as the shared prefix credits every re-read: 4 more tokens of cache change nothing.
    assert _hybrid_run("skip", 44, requests).env.now == skip.env.now


def test_with_sliding_window_layers_only_the_full_layers_share_is_credited():
    # Two requests after the same 12-token system prompt, both at 0 s; a token budget of 13 admits
    # one prompt an iteration, so the second hits the first's three full blocks an iteration later,
    # whatever the steps cost: the same iterations share, with or without windows. With half the
    # K/V bytes in 8-token window layers only the full half of each re-read is credited: the run
    # saves exactly half the time it saves when every layer is full attention.
    from sim.engine.core import Engine, EngineKnobs
    from tests.engine_helpers import request

    requests = [request(index, 0.0, 0, 10, prompt=(HYBRID_SYSTEM, (200 + index, 1))) for index in range(2)]

    def end_s(cached: float, windows) -> float:
        kv, _, _, _ = hybrid_pool(96)
        costs = CachedRoundCosts(cached=cached)
        costs.attention_windows = windows
        knobs = EngineKnobs(max_model_len=4096, step_mode="single", max_num_batched_tokens=13)
        engine = Engine(kv, costs, knobs, iter(requests), block_size=4)
        engine.run()
        return engine.env.now

    saved_full = end_s(0, ()) - end_s(1_000, ())
    saved_half = end_s(0, ((8, 0.5),)) - end_s(1_000, ((8, 0.5),))
    assert saved_full > 0
    assert saved_half == pytest.approx(saved_full / 2, rel=1e-9)


def test_kvsim_gpus_shows_each_presets_cache():
    from sim.listing import gpus_table

    lines = gpus_table().splitlines()
    assert lines[0].split()[8:10] == ["L2", "MiB"]
    column = 4  # gpu, memory, bandwidth, FLOP/s, then L2: one field each in a row
    rows = {line.split()[0]: line.split() for line in lines[1 : 1 + len(GPU_PRESETS)]}
    assert {name: row[column] for name, row in rows.items()} == {
        name: str(mib) for name, mib in L2_CACHE_MIB.items()
    }
    assert rows["H100-80GB"][column] == "50" and rows["MI300X-192GB"][column] == "256"


def _hybrid_pools(name: str):
    """A fresh pool of each hybrid prefix cache that shares what its full-attention layers hold
    (max_model_len 160 or less, pages of one token or blocks of 4)."""
    from tests.test_jenga_prefix import tiny
    from tests.test_sglang_mamba import coordinator as mamba_coordinator
    from tests.test_sglang_swa_radix import coordinator as swa_coordinator

    return {
        "sglang-swa-radix": lambda: swa_coordinator(8, full=600, swa=300),
        "sglang-mamba-radix": lambda: mamba_coordinator(full=600, mamba=40),
        "jenga-prefix": lambda: tiny(large_pages=60),
    }[name]()


@pytest.mark.parametrize("name", ["sglang-swa-radix", "sglang-mamba-radix", "jenga-prefix"])
@pytest.mark.parametrize("seed", [1, 2])
def test_hybrid_prefix_caches_get_the_credit_in_both_step_modes_alike(name, seed):
    """Requests of which half share a system prompt, on each hybrid prefix cache: event skipping
    equals single stepping with the credit on, and the credit is there (without a cache the requests
    finish later in sum)."""
    import numpy as np

    from sim.engine.core import Engine
    from sim.engine.knobs import EngineKnobs
    from tests.engine_helpers import request

    rng = np.random.default_rng(seed)
    requests = [  # (short enough for the tiny Jenga pool's 64 tokens)
        request(
            i,
            0.05 * i,
            0,
            int(rng.integers(5, 30)),
            prompt=((1, 12),) * bool(rng.random() < 0.6) + ((100 + i, int(rng.integers(1, 9))),),
        )
        for i in range(40)
    ]
    block_size = 4 if name == "jenga-prefix" else 1

    def run_pool(mode: str, cached: float) -> Engine:
        engine = Engine(
            _hybrid_pools(name),
            CachedRoundCosts(cached=cached),
            EngineKnobs(max_model_len=64, step_mode=mode),
            iter(requests),
            block_size=block_size,
        )
        engine.run()
        return engine

    skip = run_pool("skip", 24)
    assert_same_results(run_pool("single", 24), skip)
    assert skip.kv.token_sharing() == (0, 0)  # (all gone)
    uncached = run_pool("skip", 0)
    assert all(r.outcome == "finished" for r in skip.records + uncached.records)
    assert sum(r.finish_s for r in uncached.records) > sum(r.finish_s for r in skip.records)
