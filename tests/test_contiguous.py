"""Tests for the contiguous-reservation policy (Orca-Max / Pow2 / Oracle; first fit, best fit, buddy).

Expected values are worked out by hand in the comments: a region is written [start, end)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import (
    ChildSpec,
    MemoryBreakdown,
    OutOfKVMemory,
    PolicyInputError,
    PoolSpec,
    make_policy,
    policy_names,
)
from policies.contiguous import PLACEMENTS, RESERVATIONS, ContiguousPolicy
from token_content import token_ids


def tokens(n: int, stream: int = 1) -> tuple[tuple[int, int], ...]:
    """A prompt of ``n`` tokens (the first ``n`` of stream ``stream``)."""
    return ((stream, n),)


def bd(used: int, reserved: int, internal: int, external: int, free: int) -> MemoryBreakdown:
    return MemoryBreakdown(used, reserved, internal, external, 0, free)


def policy(pool: int, max_model_len: int, reservation: str, placement: str = "first_fit") -> ContiguousPolicy:
    return ContiguousPolicy(PoolSpec(pool, 1, max_model_len), reservation=reservation, placement=placement)


# --------------------------------------------------------------------------------------------------
# Registration and options
# --------------------------------------------------------------------------------------------------


def test_registered_and_built_by_name() -> None:
    assert "contiguous" in policy_names()
    p = make_policy("contiguous", PoolSpec(64, 16, 32), reservation="pow2", placement="buddy")
    assert isinstance(p, ContiguousPolicy)
    assert (p.reservation, p.placement) == ("pow2", "buddy")
    default = make_policy("contiguous", PoolSpec(64, 16, 32))
    assert (default.reservation, default.placement) == ("max", "first_fit")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"reservation": "min"}, "contiguous: unknown reservation 'min'; valid values: max, pow2, oracle"),
        (
            {"placement": "worst_fit"},
            "contiguous: unknown placement 'worst_fit'; valid values: first_fit, best_fit, buddy",
        ),
    ],
)
def test_unknown_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(PolicyInputError) as error:
        ContiguousPolicy(PoolSpec(64, 16, 32), **options)
    assert str(error.value) == message


@pytest.mark.parametrize(
    ("reservation", "placement", "reference"),
    [
        ("max", "first_fit", 20 + 4),  # the longest reservation grows by the lookahead slots
        ("max", "buddy", 64),  # 30 + 4 = 34 rounds up to 64 (without them: 32)
        ("pow2", "first_fit", 1),  # the smallest region until a request is seen
        ("oracle", "buddy", 1),
    ],
)
def test_lookahead_slots_widen_the_reference_of_the_max_reservation(
    reservation: str, placement: str, reference: int
) -> None:
    """Before any request, the external-fragmentation reference is the region a request of the
    longest reservation takes: ``max_model_len`` plus the speculative lookahead slots each sequence
    holds (``hold_lookahead``). The other reservations size regions by the request: no change."""
    max_model_len = 30 if placement == "buddy" else 20
    p = ContiguousPolicy(PoolSpec(128, 1, max_model_len), reservation=reservation, placement=placement)
    p.hold_lookahead(4)
    assert p.reference_size == reference


# --------------------------------------------------------------------------------------------------
# Reservation rules
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reservation", "prompt_len", "final_len", "expected"),
    [
        ("max", 10, 35, 64),
        ("max", 64, 64, 64),
        ("oracle", 10, 35, 35),
        ("oracle", 7, 7, 7),
        ("pow2", 10, 35, 42),  # the paper's example: output 25 -> 32 output slots
        ("pow2", 10, 10, 10),  # output 0: just the prompt
        ("pow2", 10, 11, 11),  # output 1 -> 1
        ("pow2", 10, 12, 12),  # output 2 -> 2
        ("pow2", 10, 13, 14),  # output 3 -> 4
        ("pow2", 1, 33, 33),  # output 32 is already a power of two
        ("pow2", 40, 60, 64),  # output 20 -> 32: 72, capped at max_model_len 64
    ],
)
def test_reservation_sizes(reservation: str, prompt_len: int, final_len: int, expected: int) -> None:
    p = policy(200, 64, reservation)
    assert p.reservation_size(prompt_len, final_len) == expected
    p.admit(1, tokens(prompt_len), final_len, 101)
    assert p.region(1) == (0, expected)
    # internal fragmentation is exactly the reservation beyond the final length
    assert p.breakdown().internal_fragmentation == expected - final_len


def test_buddy_rounds_the_reservation_up_to_a_power_of_two() -> None:
    p = policy(256, 64, "pow2", "buddy")
    p.admit(1, tokens(10), 35, 101)  # reservation 42 -> chunk 64
    assert p.region(1) == (0, 64)
    assert p.breakdown() == bd(used=10, reserved=25, internal=64 - 35, external=0, free=192)


# --------------------------------------------------------------------------------------------------
# A scripted scenario, breakdown after every step
# --------------------------------------------------------------------------------------------------


def test_scripted_max_reservation_breakdown() -> None:
    p = policy(100, 40, "max")
    # reference before any request: max_model_len = 40; one hole of 100 >= 40
    assert p.breakdown() == bd(0, 0, 0, 0, 100)

    p.admit(1, tokens(10), 25, 101)  # [0, 40): 10 used, 15 to come, 15 never used
    assert p.region(1) == (0, 40)
    assert p.breakdown() == bd(used=10, reserved=15, internal=15, external=0, free=60)

    p.admit(2, tokens(5), 40, 102)  # [40, 80); the tail [80, 100) of 20 < 40 is stranded: external
    assert p.region(2) == (40, 40)
    assert p.breakdown() == bd(used=15, reserved=50, internal=15, external=20, free=0)

    p.grow(1, 5)
    assert p.seq_len(1) == 15
    assert p.breakdown() == bd(used=20, reserved=45, internal=15, external=20, free=0)

    assert not p.can_admit(tokens(5), 10)  # needs 40, the only hole is 20
    assert p.available_slots() == 20

    p.free(1)  # holes [0, 40) and [80, 100): the reference (40) fits the first: nothing is blocked
    assert p.free_pieces() == [(0, 40), (80, 20)]
    assert p.breakdown() == bd(used=5, reserved=35, internal=0, external=0, free=60)

    p.grow(2, 35)  # seq 2 reaches its final length
    assert p.breakdown() == bd(used=40, reserved=0, internal=0, external=0, free=60)

    p.free(2)  # everything merges back into one hole
    assert p.free_pieces() == [(0, 100)]
    assert p.breakdown() == bd(0, 0, 0, 0, 100)
    assert list(p.live_sequences()) == []


def test_grow_never_allocates_and_accepts_explicit_content() -> None:
    p = policy(50, 20, "oracle")
    p.admit(1, token_ids([5, 6, 7]), 6, 101)
    assert p.growth_room(1) == p.final_len(1) - p.seq_len(1)
    p.grow(1, 2, token_ids([8, 9]))
    p.grow(1, 1)
    assert p.seq_len(1) == 6
    assert p.breakdown() == bd(used=6, reserved=0, internal=0, external=0, free=44)


# --------------------------------------------------------------------------------------------------
# External fragmentation and its reversal
# --------------------------------------------------------------------------------------------------


def test_external_fragmentation_blocks_a_request_until_a_neighbour_frees() -> None:
    p = policy(100, 100, "oracle")
    for seq_id in (1, 2, 3):  # [0, 30), [30, 60), [60, 90); hole [90, 100)
        p.admit(seq_id, tokens(30, seq_id), 30, 100 + seq_id)
    p.free(2)  # holes [30, 60) and [90, 100): 40 slots free in total
    assert p.free_pieces() == [(30, 30), (90, 10)]
    # reference is the last request (30): it fits the 30-slot hole, so nothing is external yet
    assert p.breakdown() == bd(used=60, reserved=0, internal=0, external=0, free=40)

    # A reading (the engine's report of what holds the queue back) leaves the reference as it is.
    assert not p.can_admit_quietly(tokens(35), 35)
    assert p.breakdown() == bd(used=60, reserved=0, internal=0, external=0, free=40)
    assert not p.can_admit(tokens(35), 35)  # 35 <= 40 free, but no hole holds 35
    # the reference is now the waiting request of 35: no hole holds it, so all 40 free slots are external
    assert p.breakdown() == bd(used=60, reserved=0, internal=0, external=40, free=0)
    with pytest.raises(OutOfKVMemory) as error:
        p.admit(4, tokens(35), 35, 104)
    assert (error.value.needed_slots, error.value.free_slots) == (35, 40)
    assert p.stats.allocation_failures == 1
    assert not p._has_sequence(4)
    assert p.breakdown() == bd(used=60, reserved=0, internal=0, external=40, free=0)  # unchanged
    assert p.can_admit_quietly(tokens(30), 30)  # (the 30-slot hole holds it; the reference stays 35)
    assert p.breakdown() == bd(used=60, reserved=0, internal=0, external=40, free=0)

    p.free(3)  # [60, 90) merges with both neighbours: one hole [30, 100)
    assert p.free_pieces() == [(30, 70)]
    assert p.breakdown() == bd(used=30, reserved=0, internal=0, external=0, free=70)
    assert p.can_admit(tokens(35), 35)
    p.admit(4, tokens(35), 35, 104)
    assert p.region(4) == (30, 35)
    assert p.breakdown() == bd(used=65, reserved=0, internal=0, external=0, free=35)


# --------------------------------------------------------------------------------------------------
# First fit vs best fit
# --------------------------------------------------------------------------------------------------


def _holes_20_at_0_and_10_at_40(placement: str) -> ContiguousPolicy:
    p = policy(100, 100, "oracle", placement)
    for seq_id, size in ((1, 20), (2, 10), (3, 10), (4, 10), (5, 50)):
        p.admit(seq_id, tokens(size, seq_id), size, 100 + seq_id)
    # 1: [0, 20), 2: [20, 30), 3: [30, 40), 4: [40, 50), 5: [50, 100)
    p.free(1)
    p.free(4)
    assert p.free_pieces() == [(0, 20), (40, 10)]
    return p


def test_first_fit_takes_the_lowest_address_hole() -> None:
    p = _holes_20_at_0_and_10_at_40("first_fit")
    p.admit(6, tokens(8), 8, 106)
    assert p.region(6) == (0, 8)
    assert p.free_pieces() == [(8, 12), (40, 10)]
    p.admit(7, tokens(11), 11, 107)  # only [8, 20) holds 11
    assert p.region(7) == (8, 11)


@pytest.mark.parametrize("placement", ["first_fit", "best_fit"])
def test_a_hole_of_exactly_the_requested_size_is_used_and_disappears(placement: str) -> None:
    # Holes [0, 20) and [40, 50). A 20-slot request fits the first hole exactly: it takes [0, 20)
    # (first fit: the lowest hole that holds 20; best fit: the smallest), and the hole is gone.
    p = _holes_20_at_0_and_10_at_40(placement)
    p.admit(6, tokens(20), 20, 106)
    assert p.region(6) == (0, 20)
    assert p.free_pieces() == [(40, 10)]
    # Then a 10-slot request fits the last hole exactly: [40, 50); nothing is free.
    p.admit(7, tokens(10), 10, 107)
    assert p.region(7) == (40, 10)
    assert p.free_pieces() == []
    assert p.breakdown() == bd(used=100, reserved=0, internal=0, external=0, free=0)
    # And a 1-slot request no longer fits anywhere.
    assert not p.can_admit(tokens(1), 1)


def test_first_fit_skips_a_smaller_hole_for_an_exact_one() -> None:
    # Holes [0, 5) and [20, 30) (10 slots): a 10-slot request skips the 5-slot hole and takes the
    # 10-slot one exactly; the 5-slot hole is left as it was.
    p = policy(100, 100, "oracle", "first_fit")
    for seq_id, size in ((1, 5), (2, 15), (3, 10), (4, 70)):
        p.admit(seq_id, tokens(size, seq_id), size, 100 + seq_id)
    # 1: [0, 5), 2: [5, 20), 3: [20, 30), 4: [30, 100)
    p.free(1)
    p.free(3)
    assert p.free_pieces() == [(0, 5), (20, 10)]
    p.admit(5, tokens(10), 10, 105)
    assert p.region(5) == (20, 10)
    assert p.free_pieces() == [(0, 5)]
    # The 5 free slots cannot hold the latest reservation (10): they count as external fragmentation.
    assert p.breakdown() == bd(used=95, reserved=0, internal=0, external=5, free=0)


def test_best_fit_takes_the_smallest_hole() -> None:
    p = _holes_20_at_0_and_10_at_40("best_fit")
    p.admit(6, tokens(8), 8, 106)
    assert p.region(6) == (40, 8)
    assert p.free_pieces() == [(0, 20), (48, 2)]
    p.admit(7, tokens(2), 2, 107)  # exact fit at 48 beats the 20-slot hole
    assert p.region(7) == (48, 2)
    assert p.free_pieces() == [(0, 20)]


def test_best_fit_breaks_ties_by_lowest_address() -> None:
    p = policy(100, 100, "oracle", "best_fit")
    for seq_id, size in ((1, 10), (2, 10), (3, 10), (4, 10), (5, 60)):
        p.admit(seq_id, tokens(size, seq_id), size, 100 + seq_id)
    p.free(3)  # [20, 30)
    p.free(1)  # [0, 10)
    assert p.free_pieces() == [(0, 10), (20, 10)]
    p.admit(6, tokens(5), 5, 106)
    assert p.region(6) == (0, 5)


# --------------------------------------------------------------------------------------------------
# Buddy
# --------------------------------------------------------------------------------------------------


def test_buddy_splits_and_merges_with_exact_addresses() -> None:
    p = policy(64, 64, "oracle", "buddy")
    assert p.free_pieces() == [(0, 64)]
    p.admit(1, tokens(10), 10, 101)  # chunk 16: 64 -> 32 + 32 -> 16 + 16; takes [0, 16)
    assert p.region(1) == (0, 16)
    assert p.free_pieces() == [(16, 16), (32, 32)]
    p.admit(2, tokens(5), 5, 102)  # chunk 8: smallest free order that fits is 16 @16 -> 8 + 8
    assert p.region(2) == (16, 8)
    assert p.free_pieces() == [(24, 8), (32, 32)]
    p.admit(3, tokens(20), 20, 103)  # chunk 32 @32, no split
    assert p.region(3) == (32, 32)
    p.admit(4, tokens(3), 3, 104)  # chunk 4: splits 8 @24
    assert p.region(4) == (24, 4)
    assert p.free_pieces() == [(28, 4)]
    # internal: 16-10 + 8-5 + 32-20 + 4-3 = 22; reference chunk is 4, the free 4 @28 is not below it
    assert p.breakdown() == bd(used=38, reserved=0, internal=22, external=0, free=4)

    p.free(1)  # buddy of 0/16 is 16/16, which is split: no merge
    assert p.free_pieces() == [(0, 16), (28, 4)]
    p.free(2)  # buddy of 16/8 is 24/8, split: no merge
    assert p.free_pieces() == [(0, 16), (16, 8), (28, 4)]
    p.free(4)  # 24/4 + 28/4 -> 24/8; + 16/8 -> 16/16; + 0/16 -> 0/32; 32/32 is in use
    assert p.free_pieces() == [(0, 32)]
    p.free(3)
    assert p.free_pieces() == [(0, 64)]
    assert p.breakdown() == bd(0, 0, 0, 0, 64)


def test_buddy_external_fragmentation_and_merge() -> None:
    p = policy(64, 64, "oracle", "buddy")
    for seq_id in (1, 2, 3, 4):  # four 16-chunks @0, 16, 32, 48
        p.admit(seq_id, tokens(16, seq_id), 16, 100 + seq_id)
    p.free(1)
    p.free(3)  # free 0/16 and 32/16: not buddies of each other
    assert p.free_pieces() == [(0, 16), (32, 16)]
    # reference: the last admitted chunk, 16; both free chunks fit it
    assert p.breakdown() == bd(used=32, reserved=0, internal=0, external=0, free=32)
    with pytest.raises(OutOfKVMemory) as error:
        p.admit(5, tokens(20), 20, 105)  # needs a 32-chunk: 32 free, none fits
    assert (error.value.needed_slots, error.value.free_slots) == (32, 32)
    assert p.breakdown() == bd(used=32, reserved=0, internal=0, external=0, free=32)  # unchanged
    assert not p.can_admit(tokens(20), 20)  # the scheduler asks: reference becomes 32
    assert p.breakdown() == bd(used=32, reserved=0, internal=0, external=32, free=0)

    p.free(2)  # 16/16 merges with 0/16 into 0/32: the reference fits again
    assert p.free_pieces() == [(0, 32), (32, 16)]
    assert p.breakdown() == bd(used=16, reserved=0, internal=0, external=0, free=48)
    p.admit(5, tokens(20), 20, 105)
    assert p.region(5) == (0, 32)
    # reference 32 fits no free chunk (only 32/16 is left): the 16 slots are stranded
    assert p.breakdown() == bd(used=36, reserved=0, internal=12, external=16, free=0)


def test_buddy_non_power_of_two_pool() -> None:
    p = policy(100, 64, "oracle", "buddy")
    # maximal aligned power-of-two cover of [0, 100)
    assert p.free_pieces() == [(0, 64), (64, 32), (96, 4)]
    assert p.breakdown() == bd(0, 0, 0, 0, 100)  # reference 1: nothing too small

    p.admit(1, tokens(30), 30, 101)  # chunk 32: the free 32 @64, not a split of 64 @0
    assert p.region(1) == (64, 32)
    p.admit(2, tokens(3), 3, 102)  # chunk 4 @96
    assert p.region(2) == (96, 4)
    p.admit(3, tokens(2), 2, 103)  # chunk 2: 64 @0 splits down to 2 @0
    assert p.region(3) == (0, 2)
    assert p.free_pieces() == [(2, 2), (4, 4), (8, 8), (16, 16), (32, 32)]
    # reference chunk 2: every free chunk is >= 2
    assert p.breakdown() == bd(used=35, reserved=0, internal=3, external=0, free=62)

    assert not p.can_admit(tokens(64), 64)  # chunk 64: no free chunk holds it, every free one is smaller
    assert p.breakdown() == bd(used=35, reserved=0, internal=3, external=62, free=0)

    p.free(1)  # 64/32 is free again, but it is a top-level chunk: it cannot merge with 32/32
    assert p.free_pieces() == [(2, 2), (4, 4), (8, 8), (16, 16), (32, 32), (64, 32)]
    # 94 free slots, yet no free chunk holds the 64-chunk: all 94 are external
    # (seq 2: 3 of a 4-chunk, seq 3: 2 of a 2-chunk)
    assert p.breakdown() == bd(used=5, reserved=0, internal=1, external=94, free=0)

    for seq_id in (2, 3):
        p.free(seq_id)
    # top-level chunks never merge across their boundaries; the reference fits 0/64 again
    assert p.free_pieces() == [(0, 64), (64, 32), (96, 4)]
    assert p.breakdown() == bd(used=0, reserved=0, internal=0, external=0, free=100)


def test_buddy_request_larger_than_any_top_level_chunk_fails() -> None:
    p = policy(100, 100, "oracle", "buddy")
    with pytest.raises(OutOfKVMemory) as error:
        p.admit(1, tokens(65), 65, 101)  # chunk 128 > 100
    assert (error.value.needed_slots, error.value.free_slots) == (128, 100)
    assert p.breakdown() == bd(0, 0, 0, 0, 100)
    assert not p.can_admit(tokens(65), 65)
    # The reference (128) exceeds any chunk an empty pool has: the request is rejected, not blocked,
    # so nothing is external (this empty pool was reported as 100 % external fragmentation)
    assert p.breakdown() == bd(used=0, reserved=0, internal=0, external=0, free=100)


# --------------------------------------------------------------------------------------------------
# Fork
# --------------------------------------------------------------------------------------------------


def test_fork_copies_into_new_regions_and_is_all_or_nothing() -> None:
    p = policy(100, 40, "pow2")
    p.admit(1, tokens(10), 12, 101)  # output 2 -> [0, 12)
    p.grow(1, 1)  # 11 tokens
    p.fork(1, [ChildSpec(2, 35, 102), ChildSpec(3, 11, 103)])
    # child 2: prompt 10 (the parent's original prompt) + pow2(25) = 42, capped at 40 -> [12, 52)
    # child 3: 10 + pow2(1) = 11 -> [52, 63)
    assert p.region(2) == (12, 40)
    assert p.region(3) == (52, 11)
    assert p.seq_len(2) == p.seq_len(3) == 11
    assert p.stats.fork_copied_tokens == 22
    # used 3 * 11; reserved 1 + 24 + 0; internal 0 + 5 + 0; hole 37 >= reference 11
    assert p.breakdown() == bd(used=33, reserved=25, internal=5, external=0, free=37)

    with pytest.raises(OutOfKVMemory) as error:
        # child 4 fits [63, 75), child 5 needs 40 of the 25 left: undo child 4
        p.fork(1, [ChildSpec(4, 12, 104), ChildSpec(5, 40, 105)])
    assert (error.value.needed_slots, error.value.free_slots) == (40, 37)
    assert sorted(p.live_sequences()) == [1, 2, 3]
    assert p.free_pieces() == [(63, 37)]
    assert p.stats.fork_copied_tokens == 22
    assert p.stats.allocation_failures == 1
    assert p.breakdown() == bd(used=33, reserved=25, internal=5, external=0, free=37)  # unchanged

    p.free(1)  # the children keep their own copies
    assert p.seq_len(2) == 11
    assert p.free_pieces() == [(0, 12), (63, 37)]


# --------------------------------------------------------------------------------------------------
# Bad input: PolicyInputError naming the value, state unchanged
# --------------------------------------------------------------------------------------------------


def _snapshot(p: ContiguousPolicy) -> tuple[object, ...]:
    return (
        p.breakdown(),
        p.free_pieces(),
        sorted((s, p.region(s), p.seq_len(s)) for s in p.live_sequences()),
        p.reference_size,
        p.stats.as_dict(),
    )


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_bad_input_is_rejected_and_changes_nothing(placement: str) -> None:
    p = policy(100, 40, "oracle", placement)
    p.admit(1, tokens(10), 20, 101)
    p.admit(2, tokens(5), 6, 102)
    p.free(2)
    before = _snapshot(p)

    cases = [
        (lambda: p.grow(77, 1), "sequence 77"),  # unknown id
        (lambda: p.free(2), "sequence 2"),  # double free
        (lambda: p.free(99), "sequence 99"),
        (lambda: p.seq_len(99), "sequence 99"),
        (lambda: p.final_len(99), "sequence 99"),
        (lambda: p.region(99), "sequence 99"),
        (lambda: p.growth_room(99), "sequence 99"),
        (lambda: p.grow(1, 11), "by 11 tokens"),  # 10 + 11 passes final_len 20
        (lambda: p.grow(1, 0), "by 0 tokens"),
        (lambda: p.grow(1, 2, token_ids([1])), "num_tokens=2"),  # content of 1 token for 2
        (lambda: p.admit(1, tokens(5), 10, 103), "sequence 1 is already"),
        (lambda: p.admit(3, tokens(5), 41, 103), "final_len=41"),  # beyond max_model_len
        (lambda: p.admit(3, tokens(5), 4, 103), "final_len=4"),  # below the prompt
        (lambda: p.admit(3, (), 4, 103), "prompt is empty"),
        (lambda: p.fork(99, [ChildSpec(3, 20, 103)]), "sequence 99"),
        (lambda: p.fork(1, [ChildSpec(3, 9, 103)]), "final_len=9"),  # child shorter than the parent
        (lambda: p.fork(1, [ChildSpec(1, 20, 103)]), "child id 1"),  # child id in use
    ]
    for call, value in cases:
        with pytest.raises(PolicyInputError) as error:
            call()
        assert value in str(error.value)
        assert _snapshot(p) == before


# --------------------------------------------------------------------------------------------------
# Random operation sequences
# --------------------------------------------------------------------------------------------------


def _expected_reservation(rule: str, prompt_len: int, final_len: int, max_model_len: int) -> int:
    if rule == "max":
        return max_model_len
    if rule == "oracle":
        return final_len
    output_slots = 0
    if final_len > prompt_len:
        output_slots = 1
        while output_slots < final_len - prompt_len:
            output_slots *= 2
    return min(prompt_len + output_slots, max_model_len)


def _chunk(placement: str, size: int) -> int:
    if placement != "buddy":
        return size
    chunk = 1
    while chunk < size:
        chunk *= 2
    return chunk


def _check_invariants(
    p: ContiguousPolicy, model: dict[int, list[int]], pool: int, reference: int, placement: str
) -> None:
    """``model``: seq_id -> [prompt_len, final_len, length]."""
    b = p.breakdown()
    assert b.total == pool
    assert min(b.as_dict().values()) >= 0
    assert b.cached == 0
    assert set(p.live_sequences()) == set(model)
    regions = {s: p.region(s) for s in model}
    pieces = p.free_pieces()
    # regions and free pieces tile the pool exactly: no overlap, nothing outside, nothing lost
    cursor = 0
    for start, size in sorted([*regions.values(), *pieces]):
        assert size > 0
        assert start == cursor
        cursor = start + size
    assert cursor == pool
    free_starts = {start: size for start, size in pieces}
    if placement == "buddy":
        for start, size in [*regions.values(), *pieces]:
            assert size & (size - 1) == 0 and start % size == 0  # aligned power of two
        for start, size in pieces:  # fully merged: no free buddy pair inside the pool
            parent = start & ~(2 * size - 1)
            assert not (parent + 2 * size <= pool and free_starts.get(start ^ size) == size)
    else:
        for start, size in pieces:  # holes are maximal
            assert start + size not in free_starts
    assert b.used == sum(length for _, _, length in model.values())
    assert b.reserved == sum(final - length for _, final, length in model.values())
    assert b.internal_fragmentation == sum(regions[s][1] - model[s][1] for s in model)
    assert p.reference_size == reference
    # External fragmentation: the reference fits in no free piece, yet would fit in the empty pool.
    largest = max(size for _, size in _top_level_chunks(pool)) if placement == "buddy" else pool
    blocked = reference <= largest and all(size < reference for _, size in pieces)
    assert b.external_fragmentation == (sum(size for _, size in pieces) if blocked else 0)
    assert b.external_fragmentation + b.free == sum(size for _, size in pieces) == p.available_slots()
    for s, (_, _, length) in model.items():
        assert p.seq_len(s) == length


def _top_level_chunks(pool: int) -> list[tuple[int, int]]:
    """Maximal aligned power-of-two chunks covering [0, pool): the binary digits of ``pool``."""
    chunks, start = [], 0
    for bit in reversed(range(pool.bit_length())):
        if pool & (1 << bit):
            chunks.append((start, 1 << bit))
            start += 1 << bit
    return chunks


def _expected_start(placement: str, pieces: list[tuple[int, int]], size: int) -> int | None:
    fitting = [(hole, start) for start, hole in pieces if hole >= size]
    if not fitting:
        return None
    if placement == "first_fit":
        return min(start for _, start in fitting)
    return min(fitting)[1]  # best fit, and buddy: smallest chunk that fits, lowest address


@pytest.mark.parametrize("reservation", RESERVATIONS)
@pytest.mark.parametrize("placement", PLACEMENTS)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_random_operations_keep_invariants(reservation: str, placement: str, data: st.DataObject) -> None:
    pool = data.draw(st.integers(16, 160), label="pool")
    max_model_len = data.draw(st.integers(1, 64), label="max_model_len")
    p = policy(pool, max_model_len, reservation, placement)
    initial_pieces = p.free_pieces()
    model: dict[int, list[int]] = {}
    reference = _chunk(placement, max_model_len if reservation == "max" else 1)
    next_id = 0
    _check_invariants(p, model, pool, reference, placement)

    for _ in range(data.draw(st.integers(1, 40), label="ops")):
        op = data.draw(st.sampled_from(["admit", "admit", "grow", "fork", "free", "bad"]))
        before = (p.breakdown(), p.free_pieces(), {s: p.region(s) for s in model})
        if op == "admit":
            prompt_len = data.draw(st.integers(1, max_model_len))
            final_len = data.draw(st.integers(prompt_len, max_model_len))
            size = _chunk(placement, _expected_reservation(reservation, prompt_len, final_len, max_model_len))
            expected_start = _expected_start(placement, before[1], size)
            assert p.can_admit(tokens(prompt_len), final_len) == (expected_start is not None)
            reference = size  # can_admit sets it; a failing admit must then change nothing
            _check_invariants(p, model, pool, reference, placement)
            before = (p.breakdown(), p.free_pieces(), {s: p.region(s) for s in model})
            next_id += 1
            if expected_start is None:
                with pytest.raises(OutOfKVMemory) as error:
                    p.admit(next_id, tokens(prompt_len), final_len, 1000 + next_id)
                assert error.value.needed_slots == size
            else:
                assert p.admit(next_id, tokens(prompt_len), final_len, 1000 + next_id) == 0
                assert p.region(next_id) == (expected_start, size)
                model[next_id] = [prompt_len, final_len, prompt_len]
        elif op == "grow" and model:
            seq_id = data.draw(st.sampled_from(sorted(model)))
            prompt_len, final_len, length = model[seq_id]
            if length < final_len:
                n = data.draw(st.integers(1, final_len - length))
                p.grow(seq_id, n)
                model[seq_id][2] += n
        elif op == "fork" and model:
            parent = data.draw(st.sampled_from(sorted(model)))
            prompt_len, _, length = model[parent]
            children = []
            for _ in range(data.draw(st.integers(1, 3))):
                next_id += 1
                children.append(ChildSpec(next_id, data.draw(st.integers(length, max_model_len)), next_id))
            sizes = [
                _chunk(placement, _expected_reservation(reservation, prompt_len, c.final_len, max_model_len))
                for c in children
            ]
            copied = p.stats.fork_copied_tokens
            try:
                p.fork(parent, children)
            except OutOfKVMemory as error:
                assert error.needed_slots in sizes
                assert p.stats.fork_copied_tokens == copied
            else:
                reference = sizes[-1]
                for child, size in zip(children, sizes, strict=True):
                    assert p.region(child.seq_id)[1] == size
                    model[child.seq_id] = [prompt_len, child.final_len, length]
                assert p.stats.fork_copied_tokens == copied + length * len(children)
        elif op == "free" and model:
            seq_id = data.draw(st.sampled_from(sorted(model)))
            p.free(seq_id)
            del model[seq_id]
        elif op == "bad":
            failures = p.stats.allocation_failures
            with pytest.raises(PolicyInputError):
                if model and data.draw(st.booleans()):
                    seq_id = data.draw(st.sampled_from(sorted(model)))
                    p.grow(seq_id, model[seq_id][1] - model[seq_id][2] + 1)  # one past final_len
                else:
                    p.free(next_id + 1)  # never admitted
            assert (p.breakdown(), p.free_pieces()) == before[:2]
            assert p.stats.allocation_failures == failures

        after = p.breakdown()
        if set(model) == set(before[2]) and op in ("admit", "fork"):
            # a failed request (or a fork with no live parent) changes nothing
            assert after == before[0]
            assert p.free_pieces() == before[1]
            assert {s: p.region(s) for s in model} == before[2]
        _check_invariants(p, model, pool, reference, placement)

    for seq_id in data.draw(st.permutations(sorted(model))):
        p.free(seq_id)
        del model[seq_id]
        _check_invariants(p, model, pool, reference, placement)
    assert p.free_pieces() == initial_pieces
    assert initial_pieces == ([(0, pool)] if placement != "buddy" else _top_level_chunks(pool))
    b = p.breakdown()
    assert (b.used, b.reserved, b.internal_fragmentation, b.cached) == (0, 0, 0, 0)
    # An empty pool is never fragmented, whatever the last request asked for (it was reported as 100 %
    # external fragmentation when that request was larger than the pool could ever place).
    assert (b.external_fragmentation, b.free) == (0, pool)


# --------------------------------------------------------------------------------------------------
# Messages, counters and the first reference size
# --------------------------------------------------------------------------------------------------


def test_an_empty_pool_is_never_fragmented_whatever_the_reservation() -> None:
    # Buddy pool of 100 slots: free chunks 64 @0, 32 @64, 4 @96. "max" expects max_model_len = 40 ->
    # 64-slot regions, and one fits: no request is blocked, so nothing counts as external
    # fragmentation (the rule of issue 12: fragmentation exists only relative to a request that
    # cannot be placed).
    assert policy(100, 40, "max", "buddy").breakdown() == bd(0, 0, 0, 0, 100)
    assert policy(100, 40, "oracle", "buddy").breakdown() == bd(0, 0, 0, 0, 100)
    # Buddy pool of 7 slots: chunks 4, 2, 1. A 1-slot reference leaves the 1-slot chunk usable.
    assert policy(7, 4, "pow2", "buddy").breakdown() == bd(0, 0, 0, 0, 7)


def test_out_of_memory_messages_and_counters() -> None:
    p = policy(50, 40, "max")
    p.admit(1, tokens(10), 12, 101)
    # [0, 40) taken: 10 slots free, a second 40-slot region does not fit.
    with pytest.raises(OutOfKVMemory) as error:
        p.admit(2, tokens(10), 12, 102)
    assert (
        str(error.value) == "admit sequence 2: no free contiguous region of 40 slots (10 slots free in total)"
    )
    assert (error.value.needed_slots, error.value.free_slots) == (40, 10)
    with pytest.raises(OutOfKVMemory) as error:
        p.fork(1, [ChildSpec(3, 12, 103)])
    assert (
        str(error.value)
        == "fork of 1: child 3: no free contiguous region of 40 slots (10 slots free in total)"
    )
    assert p.stats.allocation_failures == 2
    assert p.slots_needed_to_grow(1, 2) == 0


def test_input_error_messages_name_the_sequence() -> None:
    p = policy(100, 40, "oracle")
    p.admit(1, tokens(10), 12, 101)
    with pytest.raises(
        PolicyInputError, match="^sequence 1: growing 10 by 3 tokens passes its final length 12$"
    ):
        p.grow(1, 3)
    with pytest.raises(PolicyInputError, match=r"^growth of sequence 1: segment 0 is \(5, -1\)"):
        p.grow(1, 1, ((5, -1),))
    with pytest.raises(PolicyInputError, match="^fork of 1: child 2 final_len=5 must be between"):
        p.fork(1, [ChildSpec(2, 5, 102)])
    with pytest.raises(PolicyInputError, match="^fork of 1: child id 4 is already in use$"):
        p.fork(1, [ChildSpec(4, 12, 104), ChildSpec(4, 12, 105)])


def test_fork_copies_add_up_and_sharing_counts_every_allocated_slot() -> None:
    p = policy(100, 40, "oracle")
    p.admit(1, tokens(10), 12, 101)
    p.fork(1, [ChildSpec(2, 12, 102)])
    p.fork(1, [ChildSpec(3, 12, 103), ChildSpec(4, 14, 104)])
    assert p.stats.fork_copied_tokens == 3 * 10
    # Nothing is shared: physical = logical = used 40 + reserved 2 + 2 + 2 + 4 (+ no internal).
    assert p.breakdown() == bd(40, 10, 0, 0, 50)
    assert p.sharing_slots() == (50, 50)
    # pow2: output 3 -> reservation 10 + 4 = 14 for a final length of 13: 1 slot of internal
    # fragmentation, which the live sequence holds too.
    q = policy(100, 40, "pow2")
    q.admit(1, tokens(10), 13, 101)
    assert q.breakdown() == bd(10, 3, 1, 0, 86)
    assert q.sharing_slots() == (14, 14)


def test_region_size_rounds_only_for_the_buddy() -> None:
    assert policy(64, 64, "oracle", "first_fit").region_size(5) == 5
    assert policy(64, 64, "oracle", "buddy").region_size(5) == 8


def test_an_out_of_memory_error_survives_being_raised_again_from_its_args() -> None:
    """SimPy re-raises an exception that ends a process as ``type(e)(*e.args)``: an OutOfKVMemory
    that escapes the engine must come out as itself, message and figures intact, not a TypeError."""
    policy = ContiguousPolicy(PoolSpec(64, 16, 64), reservation="max", placement="first_fit")
    policy.admit(0, ((1, 10),), 64, 100)
    with pytest.raises(OutOfKVMemory) as caught:
        policy.admit(1, ((2, 10),), 64, 101)
    again = type(caught.value)(*caught.value.args)
    assert str(again) == str(caught.value) and "64" in str(again)
    assert (again.needed_slots, again.free_slots) == (caught.value.needed_slots, caught.value.free_slots)
    assert again.prefix_hit == caught.value.prefix_hit
