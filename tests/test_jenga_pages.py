"""Jenga's small-page allocator against a reference that takes and frees one small page at a time,
written from the artifact's rules (``allocate_block_id`` / ``free_block_id``, policies/hybrid/
jenga_pages.py's docstring) and nothing else: the allocator takes runs of pages at once, whole large
pages at once, and has shortcuts for one small page per large page; none may change which pages a
request gets, in which order, or what is left free where."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.hybrid.jenga_pages import LargePagePool, SmallPageAllocator


class OnePageAtATime:
    """The artifact's rules, page by page."""

    def __init__(self, num_large: int, ratio: int):
        self.ratio = ratio
        self.free_large = deque(range(num_large))
        self.free_count: dict[int, int] = {}
        self.owner: dict[int, int] = {}
        self.preferred: dict[int, dict[int, None]] = {}
        self.unowned: dict[int, None] = {}

    def allocate(self, seq_id: int, needed: int, quota: int) -> list[int]:
        ratio, pages = self.ratio, []
        for _ in range(needed):
            own = self.preferred[seq_id]
            if own:
                page = next(iter(own))
                del own[page]
                self.free_count[page // ratio] -= 1
            elif quota > 0:  # a new large page: its first small page now, the others preferred
                quota -= 1
                large = self.free_large.popleft()
                page = large * ratio
                own.update(dict.fromkeys(range(page + 1, page + ratio)))
                self.free_count[large] = ratio - 1
                self.owner[large] = seq_id
            elif self.unowned:  # its large page's other free small pages become the request's
                page = next(iter(self.unowned))
                del self.unowned[page]
                large = page // ratio
                self.owner[large] = seq_id
                for sibling in range(large * ratio, large * ratio + ratio):
                    if sibling in self.unowned:
                        del self.unowned[sibling]
                        own[sibling] = None
                self.free_count[large] -= 1
            else:
                victim = next(free for free in self.preferred.values() if free)
                page = next(iter(victim))
                del victim[page]
                self.free_count[page // ratio] -= 1
            pages.append(page)
        return pages

    def release(self, pages: list[int]) -> None:
        ratio = self.ratio
        for page in pages:
            large = page // ratio
            free = self.preferred.get(self.owner[large], self.unowned)
            self.free_count[large] += 1
            if self.free_count[large] == ratio:  # the whole large page goes back
                for sibling in range(large * ratio, large * ratio + ratio):
                    free.pop(sibling, None)
                del self.free_count[large]
                del self.owner[large]
                self.free_large.append(large)
            else:
                free[page] = None

    def after_release(self, pages: list[int]) -> tuple[int, int]:
        trial = OnePageAtATime(0, self.ratio)
        trial.free_count, trial.owner = dict(self.free_count), dict(self.owner)
        trial.preferred = {request: dict(free) for request, free in self.preferred.items()}
        trial.unowned = dict(self.unowned)
        trial.release(pages)
        return len(trial.free_large), sum(trial.free_count.values())

    def state(self) -> tuple:
        return (
            list(self.free_large),
            self.free_count,
            self.owner,
            {request: list(free) for request, free in self.preferred.items()},
            list(self.unowned),
            sum(self.free_count.values()),
        )


def _state(allocator: SmallPageAllocator) -> tuple:
    return (
        list(allocator.large_pages.free_ids),
        allocator.free_counts(),
        allocator.owners(),
        {request: list(free) for request, free in allocator.preferred.items()},
        list(allocator.unowned),
        allocator.free_small,
    )


def test_a_prompt_of_whole_large_pages_and_a_part_by_hand():
    """Ratio 2, five pages with a quota of three: large pages 0 and 1 whole (small pages 0-3), then
    large page 2's first small page (4); its other (5) stays the request's preferred."""
    allocator = SmallPageAllocator(LargePagePool(4), ratio=2)
    allocator.add_request(7)
    assert allocator.allocate(7, 5, 3) == [0, 1, 2, 3, 4]
    assert (allocator.free_counts(), allocator.owners(), allocator.preferred) == (
        {0: 0, 1: 0, 2: 1},
        {0: 7, 1: 7, 2: 7},
        {7: {5: None}},
    )
    assert (allocator.free_small, list(allocator.large_pages.free_ids)) == (1, [3])
    # Releasing 0 and 1 gives large page 0 back whole; 3 leaves large page 1 with one free small page.
    assert allocator.after_release([0, 1, 3]) == (1, 2)
    allocator.release([0, 1, 3])
    assert (allocator.free_small, list(allocator.large_pages.free_ids), list(allocator.preferred[7])) == (
        2,
        [3, 0],
        [5, 3],
    )


_OPERATION = st.tuples(
    st.sampled_from(["add", "allocate", "release", "remove"]),
    st.integers(0, 3),
    st.integers(0, 9),
    st.integers(0, 3),
)


@settings(max_examples=300, deadline=None)
@given(ratio=st.integers(1, 3), num_large=st.integers(2, 10), operations=st.lists(_OPERATION, max_size=40))
def test_every_operation_matches_one_page_at_a_time(ratio, num_large, operations):
    allocator = SmallPageAllocator(LargePagePool(num_large), ratio)
    reference = OnePageAtATime(num_large, ratio)
    held: dict[int, list[int]] = {}
    # The allocators know a request by an id never used before (a large page remembers the request
    # that carved it after it is gone: sim/kv/jenga.py's _new_request); a slot re-added gets a new one.
    request_of: dict[int, int] = {}
    added = 0
    for kind, slot, amount, quota in operations:
        if kind == "add" and slot not in held:
            request = request_of[slot] = added
            added += 1
            allocator.add_request(request)
            reference.preferred[request] = {}
            held[slot] = []
        elif kind == "allocate" and slot in held:
            request = request_of[slot]
            quota = min(quota, allocator.large_pages.free)
            needed = min(amount, allocator.free_small + quota * ratio)  # what the caller checks fits
            pages = allocator.allocate(request, needed, quota)
            assert pages == reference.allocate(request, needed, quota)
            held[slot] += pages
        elif kind == "release" and slot in held:
            request = request_of[slot]
            pages, held[slot] = held[slot][:amount], held[slot][amount:]
            assert allocator.after_release(pages) == reference.after_release(pages)
            allocator.release(pages)
            reference.release(pages)
        elif kind == "remove" and slot in held:
            request = request_of[slot]
            pages = held.pop(slot)
            allocator.release(pages)
            reference.release(pages)
            allocator.remove_request(request)
            reference.unowned.update(reference.preferred.pop(request))
        assert _state(allocator) == reference.state()
