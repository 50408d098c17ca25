"""The host-memory tier (``offload:``): a scripted sequence worked out by hand, the load time charged
to the admitting iteration, bad input, and random operations checking both tiers' identities.

Rules the hand-worked expectations use (``policies/prefix.py``, ``policies/_host_tier.py``), in
addition to the GPU cache's (``tests/test_prefix_lookup.py``):
  H1 a cached block the GPU evicts is stored in the host tier under its key, unless the host already
     holds the key (then it is only made most recent, no bytes move); a full tier first drops its
     least recently used entry (a host eviction);
  H2 admission looks the prompt up on the GPU first; where the GPU hit ends it continues in the host
     tier, within the same cap of ``(len - 1) // block_size`` blocks;
  H3 host hits are loaded into fresh blocks taken like computed ones; their host copies stay and are
     made most recent in reverse prompt order (the prompt's first block ends most recent), before
     the admission takes its blocks.
Pool: 4 GPU blocks of 4 tokens; host tier: 4 blocks. Prompts: A = 9 tokens of stream 1 (blocks A0,
A1 full, 1 token in a third), B = 12 tokens of stream 2 (B0, B1, B2), C = 12 tokens of stream 3.
Each request generates one token (so A holds 10 tokens in 3 blocks, B and C 13 tokens in 4 blocks).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import OutOfKVMemory, PoolSpec, make_policy
from policies.base import PolicyInputError, PrefixHit
from policies.prefix import PrefixCachingPolicy, block_contents
from sim.config import ConfigError, load_experiment
from sim.engine.core import Engine, EngineKnobs
from sim.outputs.columns import SUMMARY
from sim.outputs.metrics import HOST_COLUMNS
from sim.runner import prepare_experiment, run_experiment
from tests.engine_helpers import RoundCostModel
from tests.test_policy_properties import PROMPTS, Driver
from workloads.request import Request

A, B, C = ((1, 9),), ((2, 12),), ((3, 12),)


def key(stream: int, block: int, policy: PrefixCachingPolicy, parent: tuple | None = None):
    """The cache key of block ``block`` of ``stream`` (its parent is the key before it)."""
    parent_chain = None if parent is None else policy._chains.find(parent)
    return (parent_chain, stream, 4 * block, 4 * block + 4, 0)


def tier_policy(gpu_blocks: int = 4, host_blocks: int = 4) -> PrefixCachingPolicy:
    policy = make_policy("prefix", PoolSpec(gpu_blocks * 4, 4, 16))
    assert isinstance(policy, PrefixCachingPolicy)
    policy.enable_host_tier(host_blocks)
    return policy


def host_order(policy: PrefixCachingPolicy) -> list[str]:
    """The host tier's entries, least recently used first, named ``A0``..``C2``."""
    assert policy.host_tier is not None
    names = {}
    for stream, letter in ((1, "A"), (2, "B"), (3, "C")):
        parent = None
        for block in range(3):
            this = key(stream, block, policy, parent)
            names[this] = f"{letter}{block}"
            parent = this
    return [names.get(entry, "?") for entry in policy.host_tier.keys_oldest_first()]


def run(policy: PrefixCachingPolicy, seq_id: int, prompt, final_len: int) -> int:
    """Admit, generate up to ``final_len``, free; returns the prompt tokens that needed no prefill."""
    cached = policy.admit(seq_id, prompt, final_len, output_content_id=100 + seq_id)
    if final_len > sum(length for _, length in prompt):
        policy.grow(seq_id, final_len - sum(length for _, length in prompt))
    policy.free(seq_id)
    return cached


def host_counts(policy: PrefixCachingPolicy) -> tuple[int, int, int, int]:
    assert policy.host_tier is not None
    stats = policy.host_tier.stats
    return stats.host_cache_hits, stats.host_loaded_blocks, stats.host_offloaded_blocks, stats.host_evictions


def test_scripted_sequence_evicts_to_host_hits_loads_and_drops_by_hand():
    policy = tier_policy()
    # 1. A: no hit; blocks 0, 1, 2 (the third holds 2 tokens after the output). Freed: 2 (no key) to
    #    the queue's head, then 1 (A1), 0 (A0) to its tail. Nothing evicted yet.
    assert run(policy, 1, A, 10) == 0
    assert policy.free_queue_order() == [2, 3, 1, 0]
    assert host_order(policy) == []
    # 2. B: 3 blocks for the prompt: 2, 3, then block 1 (A1) is evicted -> host [A1] (H1); its 13th
    #    token takes block 0 (A0) -> host [A1, A0]. Two GPU evictions, two blocks offloaded.
    policy.admit(2, B, 13, output_content_id=102)
    policy.grow(2, 1)
    assert policy.block_table(2) == [2, 3, 1, 0]
    assert host_order(policy) == ["A1", "A0"]
    assert (policy.stats.evictions, host_counts(policy)) == (2, (0, 0, 2, 0))
    # A looked up now: no GPU block holds A0, the host holds A0 and A1 (cap (9 - 1) // 4 = 2): 8 tokens.
    assert policy.lookup(A) == PrefixHit(0, (), 8)
    policy.free(2)  # block 0 (1 token) to the head; 1 (B2), 3 (B1), 2 (B0) to the tail
    assert policy.free_queue_order() == [0, 1, 3, 2]
    # 3. A again: 8 tokens from the host, 2 blocks loaded (H3: A1 then A0 touched: [A1, A0]). Its 3
    #    blocks: 0, then 1 (B2) and 3 (B1) are evicted -> host [A1, A0, B2, B1], full, nothing dropped.
    assert policy.admit(3, A, 10, output_content_id=103) == 8
    assert policy.block_table(3) == [0, 1, 3]
    assert host_order(policy) == ["A1", "A0", "B2", "B1"]
    assert host_counts(policy) == (8, 2, 4, 0)
    # The loaded blocks hold A's keys under the host entries' own chain ids: the chain carried over.
    assert policy._block_key[0] == key(1, 0, policy) and policy._block_key[1] == key(
        1, 1, policy, key(1, 0, policy)
    )
    policy.grow(3, 1)
    policy.free(3)  # block 3 (2 tokens) to the head; 1 (A1), 0 (A0) to the tail after 2 (B0)
    assert policy.free_queue_order() == [3, 2, 1, 0]
    # 4. B again: GPU hit B0 (block 2), then the host continues with B1 (cap (12 - 1) // 4 = 2 blocks):
    #    4 GPU + 4 host tokens. Loading B1 touches it (already newest). The 2 fresh blocks: 3, then
    #    block 1 (A1) evicted: the host holds A1 -> only touched, [A0, B2, B1, A1]. The 13th token
    #    takes block 0 (A0): touched -> [B2, B1, A1, A0]. No bytes moved for either.
    assert policy.lookup(B) == PrefixHit(4, (2,), 4)
    assert policy.admit(4, B, 13, output_content_id=104) == 8
    policy.grow(4, 1)
    assert policy.block_table(4) == [2, 3, 1, 0]
    assert host_order(policy) == ["B2", "B1", "A1", "A0"]
    assert host_counts(policy) == (12, 3, 4, 0)
    assert (policy.stats.prefix_cache_hits, policy.stats.evictions) == (4, 6)
    policy.free(4)  # block 0 to the head; 1 (B2), 3 (B1), 2 (B0) to the tail
    # 5. C: no hit. Blocks 0, then 1 (B2) and 3 (B1) evicted: both held -> touched, [A1, A0, B2, B1].
    #    Its 13th token evicts block 2 (B0): new to the host, which is full: A1, the least recently
    #    used, is dropped -> [A0, B2, B1, B0]. One host eviction; 5 blocks offloaded in all.
    assert run(policy, 5, C, 13) == 0
    assert host_order(policy) == ["A0", "B2", "B1", "B0"]
    assert host_counts(policy) == (12, 3, 5, 1)
    # A now hits A0 alone in the host; A1 is gone from both tiers.
    assert policy.lookup(A) == PrefixHit(0, (), 4)
    # The host breakdown: 4 cached blocks, none free, and cached = offloaded - dropped = 5 - 1.
    assert policy.host_breakdown_values() == (16, 0)
    # Counted in tokens: queries 9 + 12 + 9 + 12 + 12, GPU hits 4, host hits 8 + 4.
    assert policy.stats.prefix_cache_queries == 54


def test_lookup_and_failed_admission_change_nothing_in_the_host_tier():
    policy = tier_policy(gpu_blocks=4, host_blocks=2)
    run(policy, 1, A, 10)
    run(policy, 2, B, 13)  # evicts A1, A0 to the host
    order, counts = host_order(policy), host_counts(policy)
    assert policy.lookup(A) == PrefixHit(0, (), 8)
    assert (host_order(policy), host_counts(policy)) == (order, counts)
    # C takes block 0 and evicts B2, B1 (the 2-block tier drops A1, then A0); its 13th token evicts
    # B0 (dropping B2). C now holds all 4 blocks.
    policy.admit(3, C, 13, output_content_id=103)
    policy.grow(3, 1)
    assert host_order(policy) == ["B1", "B0"]
    order, counts = host_order(policy), host_counts(policy)
    # B would hit 8 tokens in the host but needs 3 fresh blocks (host hits take blocks as computed
    # ones do): out of memory, and the tier's order and counters are untouched.
    with pytest.raises(OutOfKVMemory, match="needs 3 free blocks, 0 available") as error:
        policy.admit(4, B, 13, output_content_id=104)
    assert error.value.prefix_hit == PrefixHit(0, (), 8)
    assert (host_order(policy), host_counts(policy)) == (order, counts)


def moved_to_host(prompt, namespace: int = 0) -> PrefixCachingPolicy:
    """``prompt`` (11 tokens: 2 full blocks and 3 tokens) computed, freed, then all of its cached
    blocks evicted to an 8-block host tier by a fresh 16-token prompt on the 4-block GPU pool."""
    policy = tier_policy(gpu_blocks=4, host_blocks=8)
    policy.admit(1, prompt, 11, output_content_id=101, namespace=namespace)
    policy.free(1)
    run(policy, 2, ((999, 16),), 16)
    assert policy.host_tier.cached_blocks == 2  # the GPU now caches only stream 999
    return policy


def test_host_hits_are_only_identical_content_after_the_same_prefix():
    """The GPU cache's collision tests (``tests/test_paged_prefix.py``), against the host tier: a host
    entry matches by its whole key (what the block holds, its parent's content chain, namespace)."""
    prompt = ((1, 4), (2, 7))  # blocks: stream 1 [0, 4), stream 2 [0, 4), then stream 2 [4, 7)
    policy = moved_to_host(prompt)
    assert policy.lookup(prompt) == PrefixHit(0, (), 8)  # cap (11 - 1) // 4 = 2 blocks
    # The same second block after a different first block: no hit at all.
    assert policy.lookup(((3, 4), (2, 7))) == PrefixHit(0)
    # The same first block, then a block mixing streams 2 and 4: one block.
    assert policy.lookup(((1, 4), (2, 3), (4, 4))) == PrefixHit(0, (), 4)
    # A first block mixing streams 1 and 5: no hit.
    assert policy.lookup(((1, 2), (5, 9))) == PrefixHit(0)
    # Another namespace (a LoRA adapter, a cache salt): no hit.
    assert policy.lookup(prompt, namespace=1) == PrefixHit(0)
    namespaced = moved_to_host(prompt, namespace=7)
    assert namespaced.lookup(prompt) == PrefixHit(0)
    assert namespaced.lookup(prompt, namespace=7) == PrefixHit(0, (), 8)


def test_only_the_prefix_and_radix_policies_have_a_host_tier_and_it_needs_a_block():
    for name in ("paged", "contiguous"):
        with pytest.raises(PolicyInputError, match="only the 'prefix' and 'radix' policies have a host tier"):
            make_policy(name, PoolSpec(16, 4, 16)).enable_host_tier(4)
    with pytest.raises(PolicyInputError, match="at least one block, got 0"):
        make_policy("prefix", PoolSpec(16, 4, 16)).enable_host_tier(0)
    with pytest.raises(PolicyInputError, match="writes a block back when the GPU evicts it"):
        make_policy("prefix", PoolSpec(16, 4, 16)).enable_host_tier(4, "write_through")


# --------------------------------------------------------------------------------------------------
# The engine charges the loads to the iteration that admits them
# --------------------------------------------------------------------------------------------------


def test_engine_charges_host_loads_to_the_admitting_iteration():
    """The five requests above, 10 s apart, each alone in the engine. RoundCostModel: a prefill
    iteration takes 1 s + 0.01 s per prompt token computed; a block over the host link 0.5 s.
    TTFT: A 1 + 0.09 = 1.09 s; B 1 + 0.12 = 1.12 s; A again: 8 tokens loaded from the host, 1
    computed, 2 blocks loaded: 1 + 0.01 + 2 x 0.5 = 2.01 s; B again: 4 GPU-hit tokens, 4 loaded
    (1 block), 4 computed: 1 + 0.04 + 0.5 = 1.54 s; C: 1.12 s. Loads: 3 blocks, 1.5 s."""
    prompts = [A, B, A, B, C]
    requests = [
        Request(index, 10.0 * index, prompt, 1, output_content_id=100 + index)
        for index, prompt in enumerate(prompts)
    ]
    policy = tier_policy()
    engine = Engine(policy, RoundCostModel(), EngineKnobs(max_model_len=16), iter(requests), block_size=4)
    engine.run()
    ttft = [round(record.first_token_s - record.arrival_s, 9) for record in engine.records]
    assert ttft == [1.09, 1.12, 2.01, 1.54, 1.12]
    assert engine.counters.host_load_s == pytest.approx(1.5)
    assert host_counts(policy) == (12, 3, 5, 1)
    series = engine.recorder.frame()
    last = series.iloc[-1]
    assert (last["host_cached_tokens"], last["host_free_tokens"]) == (16, 0)
    assert (last["host_cache_hits"], last["host_loaded_blocks"], last["host_evictions"]) == (12, 3, 1)
    assert (series["host_cached_tokens"] + series["host_free_tokens"] == 16).all()


def test_engine_load_time_follows_a_given_bandwidth():
    """The same third request with a link of 64 bytes/block over 1e-7 GB/s (100 B/s): a block takes
    0.64 s, 2 blocks 1.28 s: TTFT 1 + 0.01 + 1.28 = 2.29 s."""
    prompts = [A, B, A]
    requests = [Request(i, 10.0 * i, p, 1, output_content_id=100 + i) for i, p in enumerate(prompts)]
    engine = Engine(
        tier_policy(),
        RoundCostModel(),
        EngineKnobs(max_model_len=16),
        iter(requests),
        block_size=4,
        host_load_s=lambda blocks: blocks * 64 / 100,
    )
    engine.run()
    record = engine.records[2]
    assert record.first_token_s - record.arrival_s == pytest.approx(2.29)


# --------------------------------------------------------------------------------------------------
# Config: the offload section, per-variant overrides, bad input before any work
# --------------------------------------------------------------------------------------------------

SMALL = """
name: offload-test
model: Llama-3.1-8B
gpu: A100-80GB
engine: {block_size: 16, max_model_len: 4096, num_gpu_blocks_override: 512}
workload: {num_requests: 5, arrival: {kind: poisson, rate_per_s: 1}, prompt_len: 100, output_len: 10}
"""


def experiment(tmp_path, extra: str):
    path = tmp_path / "experiment.yaml"
    path.write_text(SMALL + extra)
    return path


def test_offload_section_sizes_the_host_tier_per_variant(tmp_path):
    """Llama-3.1-8B: 131,072 bytes per token (32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes), so
    a 16-token block is 2 MiB and 1 GiB holds 512 blocks."""
    path = experiment(
        tmp_path,
        """offload: {host_memory_gib: 1}
variants:
  - {name: tier, policy: prefix}
  - {name: bigger, policy: prefix, offload: {host_memory_gib: 2.5, bandwidth_gb_per_s: 50}}
  - {name: none, policy: prefix, offload: false}
""",
    )
    prepared = prepare_experiment(load_experiment(path), path)
    tiers = [item.policy.host_tier for item in prepared.variants]
    assert [None if tier is None else tier.capacity_blocks for tier in tiers] == [512, 1280, None]
    assert prepared.variants[1].offload.bandwidth_gb_per_s == 50


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "offload: {host_memory_gib: 0}\nvariants: [{name: p, policy: prefix}]\n",
            r"offload\.host_memory_gib: Input should be greater than 0 \(got 0\)",
        ),
        (
            "offload: {host_memory_gib: -4}\nvariants: [{name: p, policy: prefix}]\n",
            r"offload\.host_memory_gib: Input should be greater than 0 \(got -4\)",
        ),
        (
            "offload: {host_memory_gib: 8, bandwith_gb_per_s: 25}\nvariants: [{name: p, policy: prefix}]\n",
            r"offload\.bandwith_gb_per_s: unknown key; did you mean 'bandwidth_gb_per_s'\?",
        ),
        (
            "variants: [{name: p, policy: prefix, offload: true}]\n",
            r"variants\.0\.offload",
        ),
    ],
)
def test_bad_offload_values_are_named(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        load_experiment(experiment(tmp_path, extra))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "offload: {host_memory_gib: 8}\nvariants: [{name: p, policy: paged}, {name: q, policy: prefix}]\n",
            r"variants\.0 \(p\): offload: policy 'paged' cannot keep evicted blocks in host memory",
        ),
        (
            "variants: [{name: r, policy: radix, offload: {host_memory_gib: 0.01}}]\n",
            r"variants\.0 \(r\): variants\.0\.offload: radix: the host pool \(\d+ tokens\) must be "
            r"larger than the device pool",
        ),
        (
            "variants: [{name: p, policy: prefix, offload: {host_memory_gib: 8, write_policy: write_through}}]\n",
            r"variants\.0\.offload: write_policy 'write_through': the 'prefix' policy's host tier",
        ),
        (
            "variants: [{name: p, policy: prefix, offload: {host_memory_gib: 0.001}}]\n",
            r"variants\.0\.offload\.host_memory_gib: 0\.001 GiB holds no KV block \(2,097,152 bytes each\)",
        ),
    ],
)
def test_offload_a_policy_cannot_take_fails_before_any_run(tmp_path, extra, message):
    path = experiment(tmp_path, extra)
    with pytest.raises(ConfigError, match=message) as error:
        prepare_experiment(load_experiment(path), path)
    assert "nothing was simulated" in str(error.value)


# --------------------------------------------------------------------------------------------------
# Random operations with the tier on: both tiers' identities, and hits never return wrong content
# --------------------------------------------------------------------------------------------------


class TierDriver(Driver):
    """The property-test driver (``tests/test_policy_properties.py``) on a prefix policy with a host
    tier of ``host_blocks``; after every operation it also checks the host tier."""

    def __init__(self, host_blocks: int):
        super().__init__("prefix", {})
        self.policy.enable_host_tier(host_blocks)
        self.host_blocks = host_blocks

    def _admit(self, choice: int, amount: int) -> bool:
        policy = self.policy
        prompt = self.prompts[choice % len(self.prompts)]
        hit = policy.lookup(prompt)
        expected = self._host_hit_recomputed(prompt, len(hit.block_ids))
        assert hit.host_tokens == expected * policy.block_size
        return super()._admit(choice, amount)

    def _host_hit_recomputed(self, prompt, gpu_blocks: int) -> int:
        """The host hit worked out independently: walk the prompt's blocks after the GPU hit and,
        for each, find a host entry whose key names exactly this content after this prefix (the
        chain ids are followed through ``ContentChains.find``, not through the tier)."""
        policy = self.policy
        prompt_len = sum(length for _, length in prompt)
        segments = [segment for segment in prompt if segment[1]]
        ends = [sum(length for _, length in segments[: i + 1]) for i in range(len(segments))]
        limit = (prompt_len - 1) // policy.block_size
        parent = None
        blocks = 0
        for index, content in enumerate(block_contents(segments, ends, 0, limit, policy.block_size)):
            this = (parent, *content, 0)
            parent = policy._chains.find(this)
            if index < gpu_blocks:
                continue
            if this not in policy.host_tier or parent is None:
                break
            blocks += 1
        return blocks

    def check(self) -> None:
        super().check()  # GPU: breakdown identity, block tables, every block keyed by its own content
        policy = self.policy
        tier = policy.host_tier
        cached, free = policy.host_breakdown_values()
        assert cached + free == self.host_blocks * policy.block_size
        stats = tier.stats
        assert tier.cached_blocks == stats.host_offloaded_blocks - stats.host_evictions  # blocks conserved
        assert stats.host_offloaded_blocks <= policy.stats.evictions
        for entry in tier.keys_oldest_first():
            # Every entry is an interned content chain under its own key: hits verify on content.
            assert policy._chains.find(entry) == tier.chain_of(entry)


operation = st.tuples(st.sampled_from(Driver.KINDS), st.integers(0, 50), st.integers(0, 20))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(host_blocks=st.integers(1, 12), operations=st.lists(operation, max_size=60))
def test_random_operations_keep_both_tiers_exact(host_blocks, operations):
    driver = TierDriver(host_blocks)
    for kind, choice, amount in operations:
        driver.apply(kind, choice, amount)
    driver.drain()


def test_driver_prompts_reach_the_host_tier():
    """The random test is only worth its name if host hits happen: a fixed sequence that makes them."""
    driver = TierDriver(8)
    for index in range(len(PROMPTS)):
        driver.apply("admit", index, 3)
    for _ in range(len(PROMPTS)):
        driver.apply("free", 0, 0)
    driver.apply("evict", 2, 0)
    driver.apply("evict", 2, 0)
    for index in range(len(PROMPTS)):
        driver.apply("admit", index, 3)
    assert driver.policy.host_tier.stats.host_loaded_blocks > 0


def test_a_run_reports_the_tier_consistently(tmp_path):
    """End to end on a tiny pool (64 blocks) with conversations whose next turn comes after the pool
    turned over: the summary's bytes are its blocks x 2 MiB, the load seconds are the loaded blocks
    over the default host link (2 MiB / 25 GB/s = 83.886 us per block), the time series ends on the
    summary's counters, stepping one iteration at a time gives the same run, and a variant with
    ``offload: false`` reports no tier."""
    path = tmp_path / "experiment.yaml"
    path.write_text(
        """
name: offload-e2e
seed: 3
model: Llama-3.1-8B
gpu: A100-80GB
engine: {block_size: 16, max_model_len: 1024, num_gpu_blocks_override: 64}
workload:
  num_requests: 40
  arrival: {kind: poisson, rate_per_s: 2}
  prompt_len: {kind: uniform, low: 100, high: 300}
  output_len: 20
  multi_turn: {turns: 3, user_turn_len: 30, think_time_s: 5}
offload: {host_memory_gib: 0.25}
variants:
  - {name: tier, policy: prefix}
  - {name: none, policy: prefix, offload: false}
  - {name: single, policy: prefix, engine: {step_mode: single}}
"""
    )
    config = load_experiment(path)
    results = {result.name: result for result in run_experiment(config, path)}
    summary = results["tier"].summary
    block_bytes = 2 * 1024**2
    assert summary["host_tier_blocks"] == 128 and summary["host_tier_bytes"] == 128 * block_bytes
    assert summary["host_loaded_blocks"] > 0 and summary["host_evictions"] > 0
    assert summary["host_load_bytes"] == summary["host_loaded_blocks"] * block_bytes
    assert summary["host_offload_bytes"] == summary["host_offloaded_blocks"] * block_bytes
    # No bandwidth given: the swap link, the A100's PCIe Gen4 x16 one way (64 GB/s both ways / 2).
    assert summary["host_load_s"] == pytest.approx(summary["host_loaded_blocks"] * block_bytes / 32e9)
    queries = summary["prefix_cache_queries"]
    assert summary["total_cache_hit_rate"] == pytest.approx(
        (summary["prefix_cache_hits"] + summary["host_cache_hits"]) / queries
    )
    last = results["tier"].timeseries.iloc[-1]
    for column in ("host_cache_hits", "host_loaded_blocks", "host_offloaded_blocks", "host_evictions"):
        assert last[column] == summary[column]
    assert last["host_cached_tokens"] == summary["host_cached_tokens_end"]
    assert summary["host_cached_tokens_end"] == 16 * (
        summary["host_offloaded_blocks"] - summary["host_evictions"]
    )
    # Event skipping changes nothing: one iteration at a time gives the same hits, loads and times.
    single = results["single"].summary
    for column in SUMMARY:
        if column.startswith("host_") or column in ("prefix_cache_hits", "iterations", "evictions"):
            assert single[column] == pytest.approx(summary[column]), column
    for column in ("ttft_p50_s", "ttft_p99_s", "e2e_p99_s", "simulated_s"):
        assert single[column] == pytest.approx(summary[column], rel=1e-9), column
    none = results["none"].summary
    assert none["host_tier_blocks"] == none["host_loaded_blocks"] == none["host_load_s"] == 0
    assert (results["none"].timeseries[list(HOST_COLUMNS)] == 0).all().all()


def test_the_host_tier_alone_stores_touches_and_drops_the_least_recent_by_hand():
    """Two entries of 4-token blocks. Storing a, then b: both copied (8 tokens offloaded); storing a
    again only touches it (no bytes move: False), so b is now the least recent; storing c drops b
    (one eviction, b's chain released) and copies c: 3 blocks, 12 tokens offloaded in all."""
    from policies._host_tier import HostTier

    acquired, released = [], []

    def acquire(key):
        acquired.append(key)
        return len(acquired)

    a, b, c, d = ("a",), ("b",), ("c",), ("d",)  # (keys are content-chain tuples)
    tier = HostTier(2, acquire, released.append, block_size=4)
    assert tier.store(a) is True and tier.store(b) is True
    assert tier.store(a) is False
    assert tier.keys_oldest_first() == [b, a]
    assert tier.store(c) is True
    assert tier.keys_oldest_first() == [a, c]
    assert released == [2]  # b's chain
    stats = tier.stats
    assert (stats.host_offloaded_blocks, stats.host_offloaded_tokens, stats.host_evictions) == (3, 12, 1)
    assert tier.store(d) is True  # drops a: a second eviction counts on
    assert (stats.host_evictions, stats.host_offloaded_tokens) == (2, 16)
    assert tier.host_slots(4) == (8, 0)


# (Compiled, the argument's type is checked before the function runs: a TypeError for the last three.)
@pytest.mark.parametrize(
    "capacity",
    [0, -1, *(pytest.param(bad, marks=pytest.mark.python_sources) for bad in (2.5, True, "2"))],
)
def test_a_host_pool_needs_a_whole_positive_number_of_blocks(capacity):
    from policies._host_tier import HostPool

    with pytest.raises(ValueError, match=r"^a host tier needs at least one block, got "):
        HostPool(capacity)
