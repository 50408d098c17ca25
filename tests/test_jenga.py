"""``policy: jenga``: Jenga's two-level allocator. Large and small page tables worked out by hand
from the artifact's rules (``policies/hybrid/jenga_pages.py``: a request's own free small pages
first, then a new large page within its quota, then pages whose request is gone, then another
request's), the LCM sizing of Gemma 3 by hand, the accounting identity under random operations, a
run beside paged and vllm-hybrid whose breakdown stays whole, and the bad inputs refused before
anything runs."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import ChildSpec, OutOfKVMemory, PolicyInputError
from policies.hybrid.jenga_pages import (
    NamedHoldings,
    SmallPageAllocator,
    TypeHoldings,
    TypePages,
    WholeHoldings,
    quotas,
)
from sim.config import validate_experiment
from sim.hardware.jenga_capacity import JengaCapacity, JengaGroupSpec, jenga_kv_capacity
from sim.hardware.layers import FullAttention, Mamba2State, SlidingWindow
from sim.kv.jenga import JengaCoordinator
from sim.runner import run_experiment
from tests.test_hybrid_runs import BREAKDOWN, refused_with
from tests.test_hybrid_runs import config as hybrid_config


def prompt(tokens: int):
    return ((1, tokens),)


def test_a_single_sliding_window_type_releases_while_decoding():
    """Mistral-7B-v0.1: every layer a 4,096-token window, so one layer type. Its blocks leave the
    window as it decodes, which lets a refused request in: the jump planner must stop at those
    releases (the step-mode fuzzer, seed 3001 case 339, found skipping ran past them). A type of
    full attention alone never releases."""
    window = JengaGroupSpec(SlidingWindow(8), 3, 12, 1, 6)
    full = JengaGroupSpec(FullAttention(), 2, 12, 1, 16)
    for spec, releases in ((window, True), (full, False)):
        capacity = JengaCapacity("one type", 64, 4, 12, (spec,), 4, 1, 48, 12)
        assert JengaCoordinator(capacity, ["only"], 64).releases_while_decoding() is releases
    assert tiny().releases_while_decoding()


def tiny(large_pages: int = 4, prefill_tokens: int = 64) -> JengaCoordinator:
    """Two layer types with different page bytes, one slot a byte (a token in one layer): blocks of 4
    tokens; full attention in 2 layers (small page 8 B), a sliding window of 8 tokens in 3 layers
    (small page 12 B). Large page lcm(8, 12) = 24 B: 3 full or 2 sliding small pages."""
    groups = (
        JengaGroupSpec(FullAttention(), 2, 8, 3, 16),
        JengaGroupSpec(SlidingWindow(8), 3, 12, 2, 6),
    )
    capacity = JengaCapacity("tiny", 64, 4, 24, groups, large_pages, 1, 24 * large_pages, 24)
    return JengaCoordinator(capacity, ["full", "sliding"], prefill_tokens)


def pages(kv: JengaCoordinator, seq_id: int) -> list[list[int]]:
    return [list(named(holdings).held[seq_id]) for holdings in kv.holdings]


def named(holdings: TypeHoldings) -> NamedHoldings:
    assert isinstance(holdings, NamedHoldings), "these tests' types have several small pages a large one"
    return holdings


def allocators(kv: JengaCoordinator) -> list[SmallPageAllocator]:
    return [named(holdings).allocator for holdings in kv.holdings]


def entries(kv: JengaCoordinator) -> list[tuple[int, ...]]:
    values = kv.group_breakdown_values()
    return [tuple(values[index : index + 6]) for index in range(0, len(values), 6)]


def check_identity(kv: JengaCoordinator) -> None:
    """Per group: used + reserved + internal + external = its large pages; with the free large pages,
    the pool. And the page tables agree with the kinds' runs."""
    groups = entries(kv)
    for allocator, values in zip(kv.allocators, groups, strict=False):
        assert sum(values) == allocator.held_large * kv.large_slots
        assert min(values) >= 0
    assert groups[-1][5] == kv.large_pages.free * kv.large_slots
    assert sum(kv.breakdown_values()) == kv.pool_slots
    used, reserved, internal, _, _, _ = kv.breakdown_values()
    assert kv.sharing_slots() == (used + reserved + internal,) * 2  # (read from the identity)
    held = sum(allocator.held_large for allocator in kv.allocators)
    assert held + kv.large_pages.free == kv.capacity.num_blocks
    for manager, holdings in zip(kv.managers, kv.holdings, strict=True):
        runs = 0
        for seq_id in kv._requests:
            first, end = manager.held_blocks(seq_id)
            assert holdings.held_count(seq_id) == end - first
            runs += end - first
        # The count the type's runs are kept over holds what they hold.
        assert manager.shared_pool.num_blocks - manager.shared_pool.free_blocks == runs
        if isinstance(holdings, WholeHoldings):  # (whole pages: counts, every held one a sequence's)
            assert holdings.pages.free_small == 0
            assert sum(holdings.held_count(seq_id) for seq_id in kv._requests) == holdings.pages.held_large
            continue
        table, allocator = named(holdings).held, named(holdings).allocator
        assert sum(allocator.free_counts().values()) == allocator.free_small
        # Every small page of a large page the type holds is held by one sequence or free, never both.
        held_ids = [page for pages in table.values() for page in pages]
        free_ids = [page for pages in allocator.preferred.values() for page in pages] + list(
            allocator.unowned
        )
        carved = {
            large * allocator.ratio + i for large in allocator.free_counts() for i in range(allocator.ratio)
        }
        assert len(held_ids) + len(free_ids) == len(carved) and set(held_ids) | set(free_ids) == carved
        for large, free in allocator.free_counts().items():
            assert free == sum(1 for page in free_ids if page // allocator.ratio == large) < allocator.ratio


def test_quota_is_the_most_when_every_type_gets_it_else_the_least():
    # Needs (small pages, ratio, free small pages): (2, 3, 0) and (1, 2, 5): most 1 + 1, least 1 + 0.
    assert quotas(2, [(2, 3, 0), (1, 2, 5)]) == [1, 1]
    assert quotas(1, [(2, 3, 0), (1, 2, 5)]) == [1, 0]
    assert quotas(0, [(2, 3, 0), (1, 2, 5)]) is None


def test_admit_grow_past_the_window_share_and_free_by_hand():
    kv = tiny()
    assert kv.pool_slots == 96 and kv.slots_per_token == 2 + 3
    # A: prompt 6 tokens, final 20. Full: blocks 0-1 (2 small pages); sliding: chunked prefill holds
    # cdiv(8 - 1 + 6, 4) + 1 = 5 blocks at most, so the whole prompt, blocks 0-1. Quotas: most
    # ceil(2/3) = 1 and ceil(2/2) = 1, 2 <= 4 free large pages: full carves large page 0 (small
    # pages 0, 1, 2), sliding large page 1 (small pages 2, 3).
    kv.admit(1, prompt(6), 20, 9)
    assert pages(kv, 1) == [[0, 1], [2, 3]]
    assert list(kv.large_pages.free_ids) == [2, 3]
    # Full: used 6 tokens x 2 slots, reserved (8 - 6) x 2, its free small page 2 external (8 slots);
    # sliding: used 6 x 3, reserved 2 x 3; free: 2 large pages of 24.
    assert entries(kv) == [(12, 4, 0, 8, 0, 0), (18, 6, 0, 0, 0, 0), (0, 0, 0, 0, 0, 48)]
    check_identity(kv)
    # To 9 tokens: a block more in each. Full takes its own free small page 2; sliding's own are none,
    # and 1 + 1 <= 2 free large: it carves large page 2 (small pages 4, 5) and takes 4.
    kv.grow(1, 3)
    assert pages(kv, 1) == [[0, 1, 2], [2, 3, 4]]
    assert entries(kv) == [(18, 6, 0, 0, 0, 0), (27, 9, 0, 12, 0, 0), (0, 0, 0, 0, 0, 24)]
    # To 13 tokens: the window (8) leaves block 0, so sliding frees small page 2 (back to A: large
    # page 1 is A's) before it takes block 3. Most 1 + 1 > 1 free large: the least, full
    # ceil((1 - 0) / 3) = 1, sliding ceil(max(0, 1 - 2) / 2) = 0. Full carves large page 3 (small
    # pages 9, 10, 11); sliding takes its oldest own free small page, 5.
    kv.grow(1, 4)
    assert pages(kv, 1) == [[0, 1, 2, 9], [3, 4, 5]]
    assert kv.large_pages.free == 0
    assert allocators(kv)[1].preferred[kv._requests[1]] == {2: None}
    # Full: 2 large pages; used 13 x 2, reserved (16 - 13) x 2, small pages 10 and 11 free (16 slots).
    # Sliding: blocks 1-3 hold tokens 4..12 (9 x 3), reserved 3 x 3, small page 2 free (12).
    assert entries(kv) == [(26, 6, 0, 16, 0, 0), (27, 9, 0, 12, 0, 0), (0, 0, 0, 0, 0, 0)]
    check_identity(kv)
    # B: prompt 4, final 10; no free large page, but each type's free small pages hold a block
    # (quotas 0, 0): B takes A's free ones, full 10 and sliding 2.
    kv.admit(2, prompt(4), 10, 9)
    assert pages(kv, 2) == [[10], [2]]
    # A prompt needing a new large page now does not fit, and nothing changes.
    before = entries(kv)
    with pytest.raises(OutOfKVMemory):
        kv.admit(3, prompt(12), 16, 9)
    assert entries(kv) == before and kv.stats.allocation_failures == 1
    # A ends. Full: large page 0 (0, 1, 2) is all free and goes back; large page 3 keeps B's 10.
    # Sliding: large page 2 (4, 5) goes back; large page 1 keeps B's 2 (3 is free again).
    kv.free(1)
    assert list(kv.large_pages.free_ids) == [0, 2]
    full, sliding = allocators(kv)
    assert full.free_counts() == {3: 2} and sliding.free_counts() == {1: 1}
    assert full.unowned == {9: None, 11: None}  # A's, whose request is gone
    assert entries(kv) == [(8, 0, 0, 16, 0, 0), (12, 0, 0, 12, 0, 0), (0, 0, 0, 0, 0, 48)]
    check_identity(kv)
    kv.free(2)
    assert kv.large_pages.free == 4 and entries(kv)[-1] == (0, 0, 0, 0, 0, 96)


def test_unowned_small_pages_go_to_the_request_that_takes_one():
    """With no free large page, a request takes a free small page whose request is gone, and that
    page's free siblings become its own (``allocate_block_id``'s no-prefer branch)."""
    kv = tiny(large_pages=3)
    kv.admit(1, prompt(4), 8, 9)  # full carves large page 0, sliding large page 1
    kv.free(1)  # both whole again: free large pages 2, 0, 1
    assert list(kv.large_pages.free_ids) == [2, 0, 1]
    # Again: full carves large page 2 (takes 6; 7, 8 its own), sliding large page 0 (0; 1 its own).
    kv.admit(1, prompt(4), 8, 9)
    # B: most 1 + 1 > 1 free large page, least 0 + 0: it takes A's free ones, full 7 and sliding 1.
    kv.admit(2, prompt(4), 8, 9)
    assert pages(kv, 2) == [[7], [1]]
    kv.free(1)  # full 6 and 8 (large page 2, B holds 7) and sliding 0 (large page 0) are nobody's
    full, sliding = allocators(kv)
    assert full.unowned == {8: None, 6: None} and sliding.unowned == {0: None}
    # C (prompt 4, final 12): least 0 + 0 again. Full takes 8 from the unowned list, and its sibling 6
    # becomes C's own; sliding takes 0.
    kv.admit(3, prompt(4), 12, 9)
    assert pages(kv, 3) == [[8], [0]]
    request = kv._requests[3]
    assert full.owner[2] == request and full.preferred[request] == {6: None}
    # C to 8 tokens: a block more in each. Sliding has no free small page: most 1 + 1 > 1, least
    # 0 + 1; full takes its own 6, sliding carves the last large page, 1 (small pages 2, 3).
    kv.grow(3, 4)
    assert pages(kv, 3) == [[8, 6], [0, 2]] and kv.large_pages.free == 0
    check_identity(kv)


def test_fork_copies_the_parents_pages_into_large_pages_of_each_child():
    kv = tiny()
    kv.admit(1, prompt(6), 20, 9)
    kv.fork(1, [ChildSpec(2, 20, 9)])
    # The child needs 2 + 2 small pages: quotas 1 + 1 of the 2 free large pages.
    assert pages(kv, 2) == [[6, 7], [6, 7]] and kv.large_pages.free == 0
    with pytest.raises(OutOfKVMemory):
        kv.fork(1, [ChildSpec(3, 20, 9)])
    check_identity(kv)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 40), st.integers(0, 30)), max_size=60))
def test_the_identity_holds_per_group_and_in_total_under_random_operations(operations):
    kv = tiny(large_pages=6, prefill_tokens=8)
    live: dict[int, int] = {}
    for kind, a, b in operations:
        try:
            if kind == 0:
                final = min(64, a + b + 1)
                seq_id = min(set(range(len(live) + 1)) - set(live))  # (ids of freed sequences come back)
                kv.admit(seq_id, prompt(a), final, 9)
                live[seq_id] = final
            elif kind == 1 and live:
                seq_id = sorted(live)[a % len(live)]
                room = live[seq_id] - kv.seq_len(seq_id)
                if room:
                    tokens = 1 + b % room
                    fits = kv.fits_growth([seq_id], tokens)  # one sequence: exact
                    before = entries(kv)
                    try:
                        kv.grow(seq_id, tokens)
                        assert fits
                    except OutOfKVMemory:
                        assert not fits and entries(kv) == before  # refused whole
            elif kind == 2 and live:
                ids = sorted(live)
                grow = [seq_id for seq_id in ids if kv.seq_len(seq_id) < live[seq_id]]
                if grow and kv.fits_growth(grow, 1):  # several: only what is sure to fit, then it does
                    kv.grow_each(grow, [1] * len(grow))
            elif kind == 3 and live:
                seq_id = sorted(live)[a % len(live)]
                kv.free(seq_id)
                del live[seq_id]
            elif kind == 4 and live:
                parent = sorted(live)[a % len(live)]
                child = max(live) + 1
                kv.fork(parent, [ChildSpec(child, live[parent], 9)])
                live[child] = live[parent]
        except OutOfKVMemory:
            pass
        check_identity(kv)


def _named_everywhere(capacity: JengaCapacity, names: list[str]) -> JengaCoordinator:
    """The same coordinator with every type's pages kept by id, whole ones too: the reference the
    counted whole pages must agree with."""

    class Named(JengaCoordinator):
        def _type_pages(self, ratio: int) -> TypePages:
            holdings = NamedHoldings(SmallPageAllocator(self.large_pages, ratio))
            self.holdings.append(holdings)
            return holdings.pages

    return Named(capacity, names, 8)


def _whole_page_capacities() -> list[tuple[JengaCapacity, list[str]]]:
    """Two types whose small pages are whole large pages (equal layer counts, as gpt-oss's); a Mamba
    state of a whole large page beside full attention of two small pages a large page; and a window
    of whole pages (it gives pages back as it decodes) beside such full attention."""
    equal = (JengaGroupSpec(FullAttention(), 2, 8, 1, 16), JengaGroupSpec(SlidingWindow(8), 2, 8, 1, 4))
    state = Mamba2State(8, 1, 2, 4, 16, 4)
    mixed = (JengaGroupSpec(state, 1, 16, 1, 1), JengaGroupSpec(FullAttention(), 2, 8, 2, 16))
    window = (JengaGroupSpec(FullAttention(), 2, 8, 2, 16), JengaGroupSpec(SlidingWindow(8), 4, 16, 1, 4))
    return [
        (JengaCapacity("equal", 64, 4, 8, equal, 12, 1, 8 * 12, 8), ["full", "sliding"]),
        (JengaCapacity("mixed", 64, 4, 16, mixed, 8, 1, 16 * 8, 16), ["mamba2", "full"]),
        (JengaCapacity("window", 64, 4, 16, window, 8, 1, 16 * 8, 16), ["full", "sliding"]),
    ]


def _fourteen_whole_pages() -> JengaCapacity:
    """Two types of whole pages (full attention, an 8-token window; 4-token blocks), 14 large pages."""
    equal = (JengaGroupSpec(FullAttention(), 2, 8, 1, 16), JengaGroupSpec(SlidingWindow(8), 2, 8, 1, 4))
    return JengaCapacity("equal", 64, 4, 8, equal, 14, 1, 8 * 14, 8)


def _two_sequences_of_twelve_tokens() -> list[JengaCoordinator]:
    """Over :func:`_fourteen_whole_pages`, pages counted and pages kept by id (the general path), each
    with two 12-token sequences (0 and 1) admitted: 3 pages of each type each, 2 large pages free."""
    capacity = _fourteen_whole_pages()
    coordinators = [
        JengaCoordinator(capacity, ["full", "sliding"], 8),
        _named_everywhere(capacity, ["full", "sliding"]),
    ]
    for kv in coordinators:
        for seq_id in (0, 1):
            kv.admit(seq_id, prompt(12), 64, 9)
    return coordinators


def test_a_flush_over_whole_pages_follows_jengas_rule_for_several_sequences():
    """Two types of whole pages (full attention, an 8-token window; 4-token blocks), 14 large pages,
    two sequences of 12 tokens: each holds 3 pages of each type, 2 are free. The next token takes a
    full-attention page and a window page for each and gives back each one's oldest window page.
    Together (an engine flush) Jenga's rule needs the 2 free pages to hold the 4 new ones: refused,
    nothing changed. One sequence alone fits: 2 free + 1 given back hold its 2, 1 left free. Pages
    kept by id (the general path) agree at each step."""
    for kv in _two_sequences_of_twelve_tokens():
        assert [kv.managers[1].held_blocks(seq_id) for seq_id in (0, 1)] == [(0, 3), (0, 3)]
        assert kv.large_pages.free == 2
        before = kv.group_breakdown_values()
        with pytest.raises(OutOfKVMemory, match="needs 32 slots"):
            kv.grow_each([0, 1], [1, 1])
        assert kv.group_breakdown_values() == before and kv.large_pages.free == 2
        kv.grow_each([0], [1])
        assert kv.large_pages.free == 1
        assert [manager.held_blocks(0) for manager in kv.managers] == [(0, 4), (1, 4)]
        check_identity(kv)


def test_a_new_request_over_whole_pages_may_take_the_last_free_ones():
    """Two types of whole pages, 14 large pages; two 12-token sequences hold 3 of each type: 2 free. A
    4-token prompt needs one page of each type, exactly the 2 free: it fits, and none is left. A
    5-token prompt needs two of each (4) and does not."""
    for kv in _two_sequences_of_twelve_tokens():
        assert kv.large_pages.free == 2
        assert not kv.can_admit(prompt(5), 64)
        assert kv.can_admit(prompt(4), 64)
        kv.admit(2, prompt(4), 64, 9)
        assert kv.large_pages.free == 0
        assert [manager.held_blocks(2) for manager in kv.managers] == [(0, 1), (0, 1)]
        check_identity(kv)


@pytest.mark.parametrize(
    ("seq_ids", "tokens", "message"),
    [
        ([0], [53], "passes its final length 64"),
        ([0, 7], [1, 1], "unknown sequence id 7"),
        ([0, 0], [1, 1], "distinct sequence ids"),
        ([0], [0], "cannot grow by 0 tokens"),
    ],
)
def test_a_bad_growth_over_whole_pages_is_refused_with_nothing_changed(seq_ids, tokens, message):
    """The growth over whole pages checks what every growth checks, before any type moves a page."""
    kv = JengaCoordinator(_fourteen_whole_pages(), ["full", "sliding"], 8)
    assert kv._whole_pages
    kv.admit(0, prompt(12), 64, 9)
    before = (kv.group_breakdown_values(), kv.large_pages.free)
    with pytest.raises(PolicyInputError, match=re.escape(message)):
        kv.grow_each(seq_ids, tokens)
    assert (kv.group_breakdown_values(), kv.large_pages.free) == before
    check_identity(kv)


def test_a_growth_past_a_window_gives_back_only_the_pages_it_held():
    """A 12-token sequence holds window blocks 0-2; growing it by 12 tokens at once (a flush), its
    window is blocks 4-5: it gives back its 3 pages (not 4: block 3 was never held) and takes 2,
    and full attention takes 3. 14 large pages: 6 held, then 6 - 3 + 5 = 8."""
    capacity = _fourteen_whole_pages()
    for kv in (
        JengaCoordinator(capacity, ["full", "sliding"], 8),
        _named_everywhere(capacity, ["full", "sliding"]),
    ):
        kv.admit(0, prompt(12), 64, 9)
        kv.grow_each([0], [12])
        assert [manager.held_blocks(0) for manager in kv.managers] == [(0, 6), (4, 6)]
        assert kv.large_pages.free == 14 - 8
        check_identity(kv)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from([0, 1, 2]),
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40), st.integers(0, 30)), max_size=60),
)
def test_whole_pages_kept_as_counts_agree_with_pages_kept_by_id(which, operations):
    """A type whose small page is a whole large page keeps counts (``WholeHoldings``): every breakdown,
    fit and refusal equals the same operations over pages kept by id."""
    capacity, names = _whole_page_capacities()[which]
    counted, named_kv = JengaCoordinator(capacity, names, 8), _named_everywhere(capacity, names)
    assert any(isinstance(h, WholeHoldings) for h in counted.holdings)
    assert not any(isinstance(h, WholeHoldings) for h in named_kv.holdings)
    live: dict[int, int] = {}
    for kind, a, b in operations:
        outcomes = []
        for kv in (counted, named_kv):
            try:
                if kind == 0:
                    seq_id = min(set(range(len(live) + 1)) - set(live))
                    outcomes.append(kv.can_admit(prompt(a), min(64, a + b + 1)))
                    kv.admit(seq_id, prompt(a), min(64, a + b + 1), 9)
                elif kind == 1 and live:
                    seq_id = sorted(live)[a % len(live)]
                    tokens = min(1 + b, live[seq_id] - kv.seq_len(seq_id))
                    if tokens:
                        outcomes.append(kv.fits_growth([seq_id], tokens))
                        kv.grow(seq_id, tokens)
                elif kind == 2 and live:
                    grow = [seq_id for seq_id in sorted(live) if kv.seq_len(seq_id) < live[seq_id]]
                    if grow:  # (tried whatever fits_growth says: a refusal must agree too)
                        outcomes.append(kv.fits_growth(grow, 1))
                        kv.grow_each(grow, [1] * len(grow))
                elif kind == 3 and live:
                    kv.free(sorted(live)[a % len(live)])
                outcomes.append("done")
            except OutOfKVMemory:
                outcomes.append("refused")
            outcomes.append(kv.group_breakdown_values())
            outcomes.append(kv.available_slots())
        assert outcomes[: len(outcomes) // 2] == outcomes[len(outcomes) // 2 :]
        if kind == 0 and outcomes[1] == "done":
            live[min(set(range(len(live) + 1)) - set(live))] = min(64, a + b + 1)
        elif kind == 3 and live:
            del live[sorted(live)[a % len(live)]]
        check_identity(counted)
        check_identity(named_kv)


# -- sizing ---------------------------------------------------------------------------------------------
def test_gemma3_large_page_is_the_lcm_of_its_two_small_pages():
    """Gemma-3-27B: a token in one layer is K and V of 16 heads of 128 at 2 B = 8,192 B; a block of 16
    tokens 131,072 B. Sliding: 52 layers, 6,815,744 B; full: 10 layers, 1,310,720 B. Large page:
    lcm(52, 10) = 260 layer-blocks = 34,078,720 B, 5 sliding or 26 full small pages. 40 GiB =
    42,949,672,960 B: cdiv(.., 34,078,720) - 1 = 1,261 - 1 = 1,260 large pages. A request of 8,192
    tokens: sliding cdiv(1,023 + 8,192 -> 8,192, 16) + 1 = 513 blocks, full 512: 513 / 5 + 512 / 26
    = 122.29 large pages; 1,260 / 122.29 = 10.30x."""
    capacity = jenga_kv_capacity("Gemma-3-27B", 40 * 2**30, max_model_len=8192)
    assert capacity.large_page_bytes == 34_078_720 == capacity.lcm_bytes
    assert [(g.layers, g.page_bytes, g.ratio, g.blocks_per_request) for g in capacity.groups] == [
        (52, 6_815_744, 5, 513),
        (10, 1_310_720, 26, 512),
    ]
    assert capacity.num_blocks == 1260 and capacity.slot_bytes == 8192 and capacity.large_page_slots == 4160
    assert capacity.capacity_lines()[1] == "Maximum concurrency for 8,192 tokens per request: 10.30x"


def test_a_large_page_a_small_page_does_not_divide_is_refused():
    with pytest.raises(
        ValueError, match=re.escape("large_page_bytes: 1,000,000 is not a multiple of the sliding(1024)")
    ):
        jenga_kv_capacity("Gemma-3-27B", 40 * 2**30, max_model_len=8192, large_page_bytes=1_000_000)


# -- end to end ------------------------------------------------------------------------------------------
PAGED = {"name": "paged", "policy": "paged"}
VLLM = {"name": "vllm", "policy": "vllm-hybrid"}
JENGA = {"name": "jenga", "policy": "jenga"}


def config(variants: list[dict], **engine) -> dict:
    """The hybrid runs' experiment (tests/test_hybrid_runs.py) on Gemma-3-27B, 6 GB of KV, 8,192 tokens."""
    settings = {"kv_cache_memory_bytes": 6_000_000_000, "max_model_len": 8192, **engine}
    return hybrid_config("Gemma-3-27B", variants, **settings)


def test_beside_paged_and_vllm_hybrid_its_pool_stays_whole(tmp_path):
    experiment = validate_experiment(config([PAGED, VLLM, JENGA]))
    results = {
        result.name: result
        for result in run_experiment(experiment, tmp_path / "c.yaml", out_dir=tmp_path / "out")
    }
    summary = results["jenga"].summary
    # 6e9 B: cdiv(6e9, 34,078,720) - 1 = 177 - 1 = 176 large pages of 4,160 slots (a token in one layer).
    assert summary["num_gpu_blocks"] == 176 and summary["kv_pool_tokens"] == 176 * 4160
    assert summary["kv_bytes_per_token"] == 8192 and summary["kv_groups"] == 2
    assert summary["requests_finished"] == 120
    # No padded layers: more requests at once than vLLM's groups (60 layers' pages for 52).
    assert summary["mean_running"] > results["vllm"].summary["mean_running"]
    series = pd.read_parquet(tmp_path / "out" / "jenga" / "timeseries.parquet")
    assert (series[BREAKDOWN].sum(axis=1) == summary["kv_pool_tokens"]).all()
    assert (series[BREAKDOWN] >= 0).all().all()
    groups = pd.read_parquet(tmp_path / "out" / "jenga" / "kv_groups.parquet")
    # One row per entry (sliding, full, the free large pages) at each change: every change sums to the pool.
    assert list(groups["kv_group"][:3]) == ["sliding(1024)", "full", "shared pool (large pages)"]
    totals = groups[BREAKDOWN].to_numpy().reshape(-1, 3 * len(BREAKDOWN)).sum(axis=1)
    assert (totals == summary["kv_pool_tokens"]).all()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"variants": [PAGED, {**JENGA, "options": {"large_page_bytes": 1_000_000}}]},
            "variants.1.options.large_page_bytes: 1,000,000 is not a multiple of the sliding(1024) small page "
            "(52 layers x 131,072 B = 6,815,744 B, block_size 16)",
        ),
        (
            {"variants": [PAGED, {**JENGA, "options": {"large_page_bytes": -3}}]},
            "variants.1.options.large_page_bytes: must be a positive integer, got -3",
        ),
        # Sliding: cdiv(min(1,023 + 16,384, 8,192), 16) + 1 = 513 blocks, 103 large pages; full: 512
        # blocks, 20; 2e8 B hold cdiv(2e8, 34,078,720) - 1 = 5.
        (
            {"engine": {"kv_cache_memory_bytes": 200_000_000}},
            "jenga: Gemma-3-27B: one request of max_model_len 8,192 tokens needs 123 large pages of "
            "34,078,720 B, the 200,000,000 B of KV memory hold 5",
        ),
        (
            {"engine": {"num_gpu_blocks_override": 800, "kv_cache_memory_bytes": None}},
            "jenga sizes its large pages from the KV memory",
        ),
        ({"engine": {"preemption_mode": "swap"}}, "jenga preempts by recompute only"),
        ({"engine": {"scheduler": "sglang"}}, "engine.scheduler: jenga runs with vLLM's scheduler"),
    ],
)
def test_what_it_cannot_do_is_refused_before_anything_runs(tmp_path, change, message):
    raw = config([PAGED, JENGA])
    refused_with(raw, change, message, tmp_path)


# -- kvsim validate j1 -----------------------------------------------------------------------------------
def test_uniform_waste_by_hand():
    """Shares of the pool held (used + reserved + internal): sliding 0.2 + 0.05, full 0.5. Uniform
    paging would hold the full group's 0.5 in each of 62 layers instead of 10: 3.1; needed 0.75;
    waste 1 - 0.75 / 3.1 = 0.7581; full attention 0.5 / 0.75 of what is needed."""
    from sim.validation.checks_hybrid import uniform_waste

    means = {
        "sliding": {"used": 0.2, "reserved": 0.05, "internal_fragmentation": 0.0},
        "full": {"used": 0.45, "reserved": 0.03, "internal_fragmentation": 0.02},
        "shared pool (large pages)": {"used": 0.0, "reserved": 0.0, "internal_fragmentation": 0.0},
    }
    waste, full_share = uniform_waste(means, 62, 10)
    assert waste == pytest.approx(1 - 0.75 / 3.1) and full_share == pytest.approx(0.5 / 0.75)


def test_claim_j1_runs_and_gives_its_verdicts(tmp_path):
    from sim import validation as v

    (claim,) = v.load_claims(names=["j1"])
    result = v.run_claim(claim, v.RunContext(tmp_path, fast=True))
    verdicts = {target.target.id: target.verdict for target in result.targets}
    assert verdicts == {
        "waste/jenga": v.HOLDS,
        "waste/vllm-hybrid": v.HOLDS,
        "waste/llama-3.2-vision": v.NOT_REPRODUCIBLE,
    }
    jenga = next(target for target in result.targets if target.target.id == "waste/jenga")
    assert 0.70 < jenga.measured.value < 0.80


def test_a_mamba_state_is_a_small_page_of_its_own_type_by_hand():
    """Qwen3-Next-80B-A3B, one GPU: full attention 2 KV heads of 256 at 2 B, K and V: 2,048 B per
    token and layer; 12 layers x 16 tokens: small page 393,216 B = 2^17 x 3. A gated-delta-net state
    is 1,097,728 B = 2^14 x 67 per layer; 36 layers: 39,518,208 B = 2^16 x 603. Large page: lcm =
    2^17 x 603 = 79,036,416 B, 201 full or 2 state small pages. A slot: gcd(2,048, 39,518,208) =
    2,048 B (one token of one layer): large page 38,592 slots, state page 19,296, full page 192. 40 GiB:
    cdiv(42,949,672,960, 79,036,416) - 1 = 544 - 1 = 543 large pages."""
    from sim.kv.jenga_layout import JengaLayout

    capacity = jenga_kv_capacity("Qwen3-Next-80B-A3B", 40 * 2**30, max_model_len=8192)
    assert [(g.kind.label, g.page_bytes, g.ratio) for g in capacity.groups] == [
        ("gdn", 39_518_208, 2),
        ("full", 393_216, 201),
    ]
    assert capacity.large_page_bytes == 79_036_416 and capacity.num_blocks == 543
    assert capacity.slot_bytes == 2048 and capacity.large_page_slots == 38_592
    kv = JengaLayout(capacity, 8192, 8192).make_coordinator()
    assert kv.slots_per_token == 12  # a token fills a slot in each full-attention layer, none in a state
    # A prompt of 20 tokens (final 40): a state page and 2 full blocks. Most 1 + 1 of 543 free: each
    # type carves a large page. State: 1 page used (19,296 slots), its sibling external; full: 20 x 12
    # used, (32 - 20) x 12 reserved, 199 free small pages x 192 external.
    kv.admit(1, prompt(20), 40, 9)
    assert entries(kv) == [
        (19_296, 0, 0, 19_296, 0, 0),
        (240, 144, 0, 199 * 192, 0, 0),
        (0, 0, 0, 0, 0, 541 * 38_592),
    ]
    # A second request carves two large pages of its own too (its own pages first, the quota allows):
    # the first request's free state page stays free, the fragmentation Jenga's request-aware order
    # accepts while memory is plentiful.
    kv.admit(2, prompt(20), 40, 9)
    assert entries(kv)[0] == (2 * 19_296, 0, 0, 2 * 19_296, 0, 0) and kv.large_pages.free == 539
    check_identity(kv)
    kv.free(1)
    kv.free(2)
    assert kv.large_pages.free == 543


# -- kvsim validate j2 -----------------------------------------------------------------------------------
def test_throughput_gain_by_hand():
    """Offline throughput of the same requests, all finished: 1,200 output tokens/s against 800 is
    1.5x. Runs that finished different requests, or left one unfinished, are not compared."""
    from sim.validation.checks_hybrid import throughput_gain

    def run(tokens_per_s: float, finished: int = 100, unfinished: int = 0) -> dict:
        return {
            "output_tokens_per_s": tokens_per_s,
            "requests_finished": finished,
            "requests_unfinished": unfinished,
        }

    assert throughput_gain(run(1200.0), run(800.0)) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="the runs finished different requests \\(99 against 100\\)"):
        throughput_gain(run(1200.0, finished=99), run(800.0))
    with pytest.raises(ValueError, match="the baseline run left 2 request\\(s\\) unfinished"):
        throughput_gain(run(1200.0), run(800.0, unfinished=2))


def test_claim_j2_runs_and_reports_that_the_average_gain_does_not_hold(tmp_path):
    from sim import validation as v

    (claim,) = v.load_claims(names=["j2"])
    result = v.run_claim(claim, v.RunContext(tmp_path, fast=True))
    verdicts = {target.target.id: target.verdict for target in result.targets}
    assert verdicts == {"gain/jenga": v.DOES_NOT_HOLD, "gain/vllm-hybrid": v.DOES_NOT_HOLD}
    jenga = next(target for target in result.targets if target.target.id == "gain/jenga")
    # More requests fit, so it is faster; prefill-bound Mooncake keeps it well under 1.80x.
    assert 1.2 < jenga.measured.value < 1.45
