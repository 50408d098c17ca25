"""The prefix policy's hits on the real Mooncake trace equal the bound computed from hash_ids alone.

Two independent routes to the same number: ``workloads.stats`` walks the 512-token hash-id chains;
here the trace's requests become token content (segments) and go through the prefix-caching policy's
own block hashing, with a pool large enough that nothing is ever evicted (an unlimited cache)."""

from __future__ import annotations

from itertools import islice
from pathlib import Path

import pytest

from policies import PoolSpec, make_policy
from workloads import build_workload
from workloads.stats import trace_stats

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "mooncake" / "conversation_trace.jsonl"


def policy_hit_fraction(block_size: int, max_requests: int | None) -> float:
    workload = build_workload({"source": {"kind": "mooncake", "path": str(TRACE)}}, seed=0, base_dir=ROOT)
    requests = list(islice(workload.requests(), max_requests))
    blocks = sum(-(-r.final_len // block_size) for r in requests) + 1
    longest = max(r.final_len for r in requests)
    policy = make_policy("prefix", PoolSpec(blocks * block_size, block_size, longest))
    for request in requests:
        # Admit and free at once: the prompt's full blocks stay cached, nothing is evicted.
        policy.admit(request.request_id, request.prompt, request.final_len, request.output_content_id)
        policy.free(request.request_id)
    assert policy.stats.evictions == 0
    return policy.stats.prefix_cache_hits / policy.stats.prefix_cache_queries


@pytest.mark.parametrize(("block_size", "max_requests"), [(16, 500), (64, 1500), (512, None)])
def test_unlimited_cache_hits_match_hash_id_bound(block_size, max_requests):
    stats = trace_stats(TRACE, max_requests=max_requests, block_sizes=(block_size,))
    expected = stats["prefix_reuse"]["cached_prompt_tokens_frac_by_block_size"][str(block_size)]
    assert policy_hit_fraction(block_size, max_requests) == pytest.approx(expected, abs=1e-12)


def test_whole_trace_bound_is_the_readme_figure():
    stats = trace_stats(TRACE, block_sizes=(512,))
    # traces/README.md: about 37% of prompt tokens are reusable with an unlimited cache.
    assert stats["prefix_reuse"]["cached_prompt_tokens_frac"] == pytest.approx(0.3736, abs=5e-4)
