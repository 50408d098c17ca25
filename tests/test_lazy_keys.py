"""Lazy cache keys (policies/prefix.py) change nothing: random operation streams applied in lockstep to
the prefix policy and to an eager reference (every full block keyed at once, as before lazy keys) leave
both with the same hits, block tables, free queue order, statistics and breakdown after every step."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.prefix import PrefixCachingPolicy
from tests.test_policy_properties import POOL, PROMPTS, Driver, _snapshot


class EagerPrefixCachingPolicy(PrefixCachingPolicy):
    _LAZY_KEYS = False


# Prompts whose first blocks repeat only sometimes (content 10-13 in two lengths, 20-22 once each,
# after which they continue differently), so lazy runs start, get keyed by a later lookup, or are
# evicted unkeyed; PROMPTS add prompts sharing their first blocks often.
MIXED_PROMPTS = [
    *PROMPTS,
    ((10, 6),),
    ((10, 6), (30, 5)),
    ((11, 9),),
    ((12, 4), (31, 6)),
    ((12, 4), (32, 6)),
    ((13, 13),),
    ((20, 7),),
    ((21, 11),),
    ((22, 5), (33, 2)),
]


class PinningDriver(Driver):
    KINDS = (*Driver.KINDS, "pin")

    def _pin(self, choice: int, amount: int) -> bool:
        prompt = self.prompts[choice % len(self.prompts)]
        if sum(length for _, length in prompt) < self.pool.block_size or amount % 4:
            return False  # pins are rare: they never leave the pool
        self.policy.pin_prefix(prompt)
        return True


def _lockstep_drivers() -> tuple[PinningDriver, PinningDriver]:
    lazy = PinningDriver("prefix", {}, POOL, MIXED_PROMPTS)
    eager = PinningDriver("prefix", {}, POOL, MIXED_PROMPTS)
    eager.policy = EagerPrefixCachingPolicy(POOL)
    return lazy, eager


def _observed(driver: Driver) -> tuple:
    return _snapshot(driver.policy, driver.live), driver.done, driver.failed


operation = st.tuples(st.sampled_from(PinningDriver.KINDS), st.integers(0, 60), st.integers(0, 20))


@pytest.mark.python_sources  # subclasses the prefix policy
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=st.lists(operation, max_size=80))
def test_lazy_keys_match_eager_keys(operations):
    lazy, eager = _lockstep_drivers()
    for kind, choice, amount in operations:
        lazy.apply(kind, choice, amount)
        eager.apply(kind, choice, amount)
        assert _observed(lazy) == _observed(eager), f"after {kind} {choice} {amount}"
    for prompt in MIXED_PROMPTS:  # every lookup, made last: each one keys the lazy runs it reaches
        assert lazy.policy.lookup(prompt) == eager.policy.lookup(prompt)
    lazy.drain()
    eager.drain()
    assert _observed(lazy) == _observed(eager)


def test_a_lazy_run_is_keyed_when_a_lookup_reaches_its_first_key():
    """Worked example, block size 4: sequence 1 holds ((10, 8)) = 2 full blocks, lazily marked. A lookup
    of ((10, 12)) (max (12 - 1) // 4 = 2 blocks) keys them and hits both: 8 tokens, blocks [0, 1]."""
    policy = PrefixCachingPolicy(POOL)
    policy.admit(1, ((10, 8),), 8, output_content_id=100)
    assert policy._block_key[0] is policy.sequences[1] and not policy._cached_by_key
    policy.free(1)
    hit = policy.lookup(((10, 12),))
    assert (hit.cached_tokens, hit.block_ids) == (8, (0, 1))
    assert policy._block_key[0] == (None, 10, 0, 4, 0)


def test_an_evicted_lazy_run_leaves_nothing_behind():
    """A freed lazy run whose blocks are all evicted is forgotten. Pool: 30 blocks of 4. Sequence 1
    ((10, 8)) takes blocks 0-1 and frees them (cached). Sequences 2 and 3 take 12 blank blocks each
    (48 tokens), 4 blank remain; sequence 4 (24 tokens = 6 blocks) takes those 4 and evicts 1 and 0."""
    policy = PrefixCachingPolicy(POOL)
    first_key = (None, 10, 0, 4, 0)
    policy.admit(1, ((10, 8),), 8, output_content_id=100)
    policy.free(1)
    policy.admit(2, ((99, 48),), 48, output_content_id=1)
    policy.admit(3, ((98, 48),), 48, output_content_id=1)
    assert policy._lazy_runs[first_key].seq_id == 1 and policy.stats.evictions == 0
    policy.admit(4, ((97, 24),), 24, output_content_id=1)
    assert policy.stats.evictions == 2 and first_key not in policy._lazy_runs
    assert policy.lookup(((10, 12),)).cached_tokens == 0


def test_a_lazy_run_starts_past_the_prefix_hit():
    """Block size 4. Sequence 1 ((10, 8)) is a lazy run from block 0; sequence 2 ((10, 8), (11, 8))
    looks up its first block, which keys sequence 1's blocks 0-1 (a hit of 8 tokens); its own blocks
    2-3 hold new keys: a lazy run from block 2, filed under block 2's key, parented by block 1's chain."""
    policy = PrefixCachingPolicy(POOL)
    policy.admit(1, ((10, 8),), 8, output_content_id=100)
    assert policy.admit(2, ((10, 8), (11, 8)), 16, output_content_id=101) == 8
    second = policy.sequences[2]
    assert (second.lazy_from, second.block_table[:2]) == (2, [0, 1])
    parent = policy._block_chain[1]
    assert second.lazy_key == (parent, 11, 0, 4, 0) and policy._lazy_runs[second.lazy_key] is second
    assert policy._block_key[second.block_table[2]] is second
