"""What every policy inherits from ``KVCachePolicy`` (policies/base.py) and does not override: the
checks of ``grow_each``, the hit of a policy without a cache, lookahead slots, capped admission, the
sharing and host-tier figures. Worked by hand on ``contiguous`` (reserves ``max_model_len`` a
sequence) and ``radix`` (one-token pages, a prefix cache), the policies that inherit them."""

from __future__ import annotations

import pytest

from policies import OutOfKVMemory, PolicyInputError, PoolSpec, make_policy
from policies.base import ABSTRACT_METHODS, NO_HIT, KVCachePolicy, PrefixHit


def test_grow_each_grows_in_order_and_returns_the_rooms_by_hand():
    # 64 slots, 16 reserved a sequence. Sequence 1: prompt 4, final 10; 2: prompt 4, final 12.
    # used 8; reserved (10 - 4) + (12 - 4) = 14; internal (16 - 10) + (16 - 12) = 10; free 32.
    policy = make_policy("contiguous", PoolSpec(64, 4, 16))
    policy.admit(1, ((1, 4),), 10, output_content_id=9)
    policy.admit(2, ((2, 4),), 12, output_content_id=9)
    assert policy.breakdown_values() == (8, 14, 10, 0, 0, 32)
    # +3 and +5: rooms 10 - 7 = 3 and 12 - 9 = 3; used 16, reserved 6.
    assert policy.grow_each([1, 2], [3, 5]) == [3, 3]
    assert policy.breakdown_values() == (16, 6, 10, 0, 0, 32)
    # Nothing shared: physical = logical = used + reserved + internal = 32. No host tier: (0, 0).
    assert policy.sharing_slots() == (32, 32)
    assert policy.host_breakdown_values() == (0, 0)


@pytest.mark.parametrize(
    ("seq_ids", "tokens", "message"),
    [
        (
            [1, 1],
            [1, 1],
            r"^grow_each needs distinct sequence ids, one token count each: \[1, 1\], \[1, 1\]$",
        ),
        ([1], [1, 2], r"^grow_each needs distinct sequence ids, one token count each: \[1\], \[1, 2\]$"),
        ([1, 3], [1, 1], r"^unknown sequence 3 \(never admitted, or already freed\)$"),
        ([2, 1], [1, 4], r"^sequence 1: growing 7 by 4 tokens passes its final length 10$"),
    ],
)
def test_grow_each_refuses_bad_arguments_whole(seq_ids, tokens, message):
    policy = make_policy("contiguous", PoolSpec(64, 4, 16))
    policy.admit(1, ((1, 4),), 10, output_content_id=9)
    policy.admit(2, ((2, 4),), 12, output_content_id=9)
    policy.grow_each([1, 2], [3, 5])
    before = policy.breakdown_values()
    with pytest.raises(PolicyInputError, match=message):
        policy.grow_each(seq_ids, tokens)
    assert policy.breakdown_values() == before and (policy.seq_len(1), policy.seq_len(2)) == (7, 9)


def test_grow_each_that_does_not_fit_changes_nothing():
    """16 one-token slots; two sequences of 6 leave 4 free: 3 + 3 tokens need 6, refused whole (the
    first would have fitted alone); 2 + 2 fit and fill the pool."""
    policy = make_policy("radix", PoolSpec(16, 1, 32))
    policy.admit(1, ((1, 6),), 12, output_content_id=91)
    policy.admit(2, ((2, 6),), 12, output_content_id=92)
    with pytest.raises(
        OutOfKVMemory, match=r"^growing sequences \[1, 2\] needs 6 slots, 4 available$"
    ) as error:
        policy.grow_each([1, 2], [3, 3])
    assert (error.value.needed_slots, error.value.free_slots) == (6, 4)
    assert (policy.seq_len(1), policy.seq_len(2), policy.breakdown_values()) == (6, 6, (12, 0, 0, 0, 0, 4))
    assert policy.stats.allocation_failures == 1
    assert policy.grow_each([1, 2], [2, 2]) == [0, 0]
    assert policy.breakdown_values() == (16, 0, 0, 0, 0, 0)


def test_a_policy_without_a_cache_never_hits_but_checks_the_prompt():
    policy = make_policy("contiguous", PoolSpec(64, 4, 16))
    policy.admit(1, ((5, 4),), 8, output_content_id=9)
    assert policy.lookup(((5, 3),)) == NO_HIT and policy.match(((5, 3),), namespace=2) == NO_HIT
    for method in (policy.lookup, policy.match):
        with pytest.raises(PolicyInputError, match=r"^looked-up prompt: segment 0 is \(5, -1\); expected"):
            method(((5, -1),))


@pytest.mark.parametrize("slots", [0, 3])
def test_lookahead_slots_of_zero_or_more_are_held(slots):
    policy = make_policy("contiguous", PoolSpec(64, 4, 16))
    policy.hold_lookahead(slots)
    assert policy.lookahead_slots == slots


def test_negative_lookahead_and_a_policy_that_cannot_hold_any_are_refused():
    with pytest.raises(PolicyInputError, match=r"^lookahead slots must be >= 0, got -1$"):
        make_policy("contiguous", PoolSpec(64, 4, 16)).hold_lookahead(-1)
    with pytest.raises(
        PolicyInputError, match=r"^RadixPolicy cannot hold lookahead slots for speculative decoding$"
    ):
        make_policy("radix", PoolSpec(64, 1, 16)).hold_lookahead(1)


def test_capped_admission_serves_no_more_than_the_cap_or_refuses():
    """Sequence 1 (prompt 6 of content 1, 2 decoded tokens of content 91) ends: its 8 tokens stay
    cached. A prompt of 6 tokens of content 1 then 2 of content 3 hits 6. With a cap of 5 (another
    KV group holds only 5) radix cannot shorten its hit: refused, nothing changes; with 6 it admits,
    serving 6 from cache and evicting 2 cached slots for its 2 new tokens."""
    policy = make_policy("radix", PoolSpec(16, 1, 32))
    policy.admit(1, ((1, 6),), 12, output_content_id=91)
    policy.admit(2, ((2, 6),), 12, output_content_id=92)
    policy.grow_each([1, 2], [2, 2])
    policy.free(1)
    prompt = ((1, 6), (3, 2))
    assert policy.breakdown_values() == (8, 0, 0, 0, 8, 0)
    assert policy.lookup(prompt).cached_tokens == 6
    assert not policy.can_admit_capped(prompt, 10, 0, 5)
    assert policy.can_admit_capped(prompt, 10, 0, 6)
    assert policy.can_admit_capped(prompt, 10, 1, 0)  # another namespace: no hit, 8 evictable slots
    assert not policy.can_admit_capped(((4, 9),), 10, 0, 0)  # no hit, but 9 tokens > 8 slots
    message = (
        r"^policy 'radix' cannot serve a prefix hit shorter than its own \(6 tokens\) to match the "
        r"other KV groups' 5$"
    )
    with pytest.raises(PolicyInputError, match=message):
        policy.admit_capped(3, prompt, 10, 93, 0, 5)
    assert policy.breakdown_values() == (8, 0, 0, 0, 8, 0)
    assert policy.admit_capped(3, prompt, 10, 93, 0, 6) == 6
    assert policy.breakdown_values() == (16, 0, 0, 0, 0, 0) and policy.seq_len(3) == 8


def test_a_final_length_may_pass_max_model_len_by_the_lookahead_slots_only():
    """max_model_len 16 and 3 lookahead slots: a final length of 19 is admitted, 20 refused, the
    message naming both; without lookahead 17 is refused with no lookahead in the message."""
    policy = make_policy("contiguous", PoolSpec(64, 4, 16))
    policy.hold_lookahead(3)
    policy.admit(1, ((1, 4),), 19, output_content_id=9)
    with pytest.raises(
        PolicyInputError, match=r"^sequence 2: final_len=20 exceeds max_model_len=16 \+ 3 lookahead slots$"
    ):
        policy.admit(2, ((1, 4),), 20, output_content_id=9)
    with pytest.raises(PolicyInputError, match=r"^sequence 2: final_len=17 exceeds max_model_len=16$"):
        make_policy("contiguous", PoolSpec(64, 4, 16)).admit(2, ((1, 4),), 17, output_content_id=9)


def test_match_looks_up_in_the_prompts_namespace():
    """The scheduler's match (inherited by the prefix policy) is the lookup in the request's own
    namespace: blocks cached in namespace 0 serve namespace 0 only."""
    policy = make_policy("prefix", PoolSpec(64, 4, 64))
    policy.admit(1, ((1, 9),), 9, output_content_id=9)
    policy.free(1)
    assert policy.match(((1, 9),)).cached_tokens == 8  # two whole blocks, never the last token
    assert policy.match(((1, 9),), namespace=1) == NO_HIT


def test_an_out_of_memory_error_rebuilt_from_its_args_keeps_its_hit():
    """SimPy re-raises a process's exception as ``type(e)(*e.args)``: every field must survive."""
    error = OutOfKVMemory("no room", 12, 4, PrefixHit(8, (0, 1)))
    copy = type(error)(*error.args)
    assert (str(copy), copy.needed_slots, copy.free_slots, copy.prefix_hit) == (
        "no room",
        12,
        4,
        PrefixHit(8, (0, 1)),
    )


def test_without_sharing_physical_and_logical_slots_are_what_sequences_hold():
    """The default sharing figures: used + reserved + internal, twice (5 + 3 + 2 = 10)."""

    def stub(self, *args, **kwargs):
        return 0

    methods = {name: stub for name in ABSTRACT_METHODS}
    methods["breakdown_values"] = lambda self: (5, 3, 2, 7, 1, 20)
    policy = type("Unshared", (KVCachePolicy,), methods)(PoolSpec(64, 4, 16))
    assert policy.sharing_slots() == (10, 10)


def test_capped_admission_checks_the_final_length_and_keeps_the_namespace():
    """contiguous with oracle reservation (a sequence reserves its final length), 24 slots: after 16
    reserved for sequence 1, 8 are left: a prompt of 4 with final length 8 fits, 12 does not."""
    policy = make_policy("contiguous", PoolSpec(24, 4, 16), reservation="oracle")
    policy.admit(1, ((1, 4),), 16, output_content_id=9)
    assert policy.can_admit_capped(((2, 4),), 8, 0, 0)
    assert not policy.can_admit_capped(((2, 4),), 12, 0, 0)


def test_capped_admission_admits_in_the_requests_namespace_with_its_output_stream():
    """radix: the 8 tokens of sequence 1 (content 1 then its output 91) are cached in namespace 0.
    In namespace 1 the same prompt hits nothing, so a cap of 0 admits it, serving 0; its 2 decoded
    tokens are of output stream 93, so once it ends, prompt + 93 hits 7 in namespace 1 (never the
    last token) and nothing of 93 in namespace 0."""
    policy = make_policy("radix", PoolSpec(32, 1, 32))
    policy.admit(1, ((1, 6),), 12, output_content_id=91)
    policy.grow_each([1], [2])
    policy.free(1)
    assert policy.admit_capped(3, ((1, 6),), 10, 93, 1, 0) == 0
    policy.grow_each([3], [2])
    policy.free(3)
    assert policy.lookup(((1, 6), (93, 2)), namespace=1).cached_tokens == 7
    assert policy.lookup(((1, 6), (93, 2)), namespace=0).cached_tokens == 6
