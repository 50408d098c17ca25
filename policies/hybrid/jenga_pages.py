"""Jenga's two-level page allocator: a pool of large pages every layer type shares, and per type a
small-page allocator that carves large pages into ``ratio`` small pages and gives a large page back
when all its small pages are free.

Followed from the paper's artifact, heheda12345/Jenga-SOSP25-AE at commit
0450354c736f503c566a395ddc1b41acc9bc247e (``vllm/core/block_v3/large_block_id_allocator.py``,
``small_block_id_allocator.py``): small page ``i`` of large page ``p`` is ``p x ratio + i``; a large
page has a *preferred* request, the one that carved it. A request's next small page comes, in this
order (``allocate_block_id``), from

1. its own preferred free small pages (oldest first), so its pages stay together and free whole;
2. a new large page, while the request's *quota* of new large pages lasts (below);
3. a free small page of a large page whose request is gone (its page's free siblings become the
   request's preferred ones);
4. another live request's preferred free small pages.

The quota (``custom_block_manager.py``, ``get_num_required_block_small_to_large`` and
``set_large_block_quota``): for ``n`` new small pages of a type, at most ``ceil(n / ratio)`` new large
pages, or, when the free large pages cannot give every type that, at least
``ceil(max(0, n - free small pages of the type) / ratio)``; fewer than that and the request does not
fit. Free small pages of a type go to their large page's preferred request while it lives, else to
a shared list (``remove_seq``). The artifact pops that shared list from a ``set``; here it is oldest
first, so runs are reproducible.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Final

from policies.base import PolicyInputError

NOT_HELD: Final = -1
"""A large page's free small pages and owner while no type (or another type) holds it."""


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def quotas(free_large: int, needs: Sequence[tuple[int, int, int]]) -> list[int] | None:
    """Jenga's new-large-page quota per type for one request's ``(small pages needed, ratio, free small
    pages)`` per type: each type's most when the free large pages give every type that, else its
    least; None when even the least does not fit."""
    most = [ceil_div(needed, ratio) for needed, ratio, _ in needs]
    if free_large >= sum(most):
        return most
    least = [ceil_div(max(0, needed - free), ratio) for needed, ratio, free in needs]
    return least if free_large >= sum(least) else None


class LargePagePool:
    """The large pages no type holds (``LargeBlockIDAllocator``): a count, and the ids not held by a
    type that names its pages, handed out oldest-freed first. A type of whole small pages takes and
    gives back by count (:class:`WholePages`): its pages need no ids, so the ids left here are only
    ever at least as many as the free pages."""

    def __init__(self, num_pages: int):
        if num_pages <= 0:
            raise PolicyInputError(f"a large-page pool needs pages, got {num_pages}")
        self.num_pages = num_pages
        self.free = num_pages
        self.free_ids: deque[int] = deque(range(num_pages))

    def take(self) -> int:
        assert self.free > 0, "a large page the caller checked was free"
        self.free -= 1
        return self.free_ids.popleft()

    def give_back(self, page: int) -> None:
        self.free += 1
        self.free_ids.append(page)

    def give_back_each(self, pages: list[int]) -> None:
        self.free += len(pages)
        self.free_ids.extend(pages)

    def take_count(self, count: int) -> None:
        assert count <= self.free, "large pages the caller checked were free"
        self.free -= count

    def give_back_count(self, count: int) -> None:
        self.free += count


class TypePages:
    """What a coordinator reads of one layer type's small pages, however they are kept."""

    def __init__(self, large_pages: LargePagePool, ratio: int):
        if ratio <= 0:
            raise PolicyInputError(f"a large page holds a positive number of small pages, got {ratio}")
        self.large_pages = large_pages
        self.ratio = ratio
        self.free_small = 0  # small pages of the type's large pages that no sequence holds

    @property
    def held_large(self) -> int:
        raise NotImplementedError

    def add_request(self, seq_id: int) -> None:
        raise NotImplementedError

    def remove_request(self, seq_id: int) -> None:
        raise NotImplementedError


class SmallPageAllocator(TypePages):
    """One layer type's small pages over the shared large pages (``SmallBlockIDAllocator``)."""

    def __init__(self, large_pages: LargePagePool, ratio: int):
        super().__init__(large_pages, ratio)
        # Per large page (ids are dense: lists, not dicts, as a page is carved and given back at every
        # page a prompt takes): its free small pages while this type holds it, else NOT_HELD; the
        # request it prefers (it may be gone).
        self.free_count: list[int] = [NOT_HELD] * large_pages.num_pages
        self.owner: list[int] = [NOT_HELD] * large_pages.num_pages
        self.preferred: dict[int, dict[int, None]] = {}  # live request -> its free small pages, in order
        self.unowned: dict[int, None] = {}  # free small pages whose large page's request is gone
        self._held = 0

    @property
    def held_large(self) -> int:
        return self._held

    def free_counts(self) -> dict[int, int]:
        """Every large page this type holds -> its free small pages, in page order."""
        return {large: free for large, free in enumerate(self.free_count) if free != NOT_HELD}

    def owners(self) -> dict[int, int]:
        """Every large page this type holds -> the request it prefers, in page order."""
        return {large: self.owner[large] for large in self.free_counts()}

    def _hold(self, large: int, free: int, seq_id: int) -> None:
        self.free_count[large] = free
        self.owner[large] = seq_id
        self._held += 1

    def _drop(self, large: int) -> None:
        self.free_count[large] = self.owner[large] = NOT_HELD
        self._held -= 1
        self.large_pages.give_back(large)

    def add_request(self, seq_id: int) -> None:
        self.preferred[seq_id] = {}

    def remove_request(self, seq_id: int) -> None:
        """The request is gone: its preferred free small pages are anyone's (``remove_seq``)."""
        self.unowned.update(self.preferred.pop(seq_id))

    def allocate(self, seq_id: int, needed: int, quota: int) -> list[int]:
        """``needed`` small pages for ``seq_id``, at most ``quota`` of them carved from new large pages.
        The caller has checked that they fit (``needed <= free_small + quota x ratio``). (Runs of pages
        from one source are taken at once: the same pages, in the same order, as one at a time.)"""
        own = self.preferred[seq_id]
        pages: list[int] = []
        while len(pages) < needed:
            left = needed - len(pages)
            if own:
                pages += self.take_own(own, left)
            elif quota > 0 and left >= self.ratio:
                # Whole large pages (a prompt's, mostly) carved at once, none left preferred.
                whole = min(quota, left // self.ratio)
                quota -= whole
                pages += self.carve_whole(seq_id, whole)
            elif quota > 0:
                quota -= 1
                pages += self.carve(seq_id, left)
            elif self.unowned:
                pages += self.adopt_unowned(seq_id)
            else:  # (from the first request with free pages until they or the need run out)
                pages += self.take_others(left)
        return pages

    # -- the sources of a small page, in the artifact's order (``allocate_block_id``) -------------------
    def take_own(self, own: dict[int, None], count: int) -> list[int]:
        """The oldest ``count`` (or all) of a request's preferred free small pages."""
        taken = _pop_first(own, count)
        for page in taken:
            self.free_count[page // self.ratio] -= 1
        self.free_small -= len(taken)
        return taken

    def carve(self, seq_id: int, count: int) -> list[int]:
        """A new large page for ``seq_id``: its first ``count`` (at most ``ratio``) small pages taken,
        the rest its preferred free ones."""
        ratio = self.ratio
        large = self.large_pages.take()
        first = large * ratio
        count = min(count, ratio)
        if count < ratio:  # (pages of one large page each, gpt-oss's: nothing left over)
            self.preferred[seq_id].update(dict.fromkeys(range(first + count, first + ratio)))
        self._hold(large, ratio - count, seq_id)
        self.free_small += ratio - count
        return list(range(first, first + count))

    def carve_whole(self, seq_id: int, count: int) -> list[int]:
        """``count`` new large pages for ``seq_id``, every small page of each taken: what ``count``
        calls of :meth:`carve` for ``ratio`` pages do, in one."""
        ratio = self.ratio
        take = self.large_pages.take
        free_count, owner = self.free_count, self.owner
        pages: list[int] = []
        for _ in range(count):
            large = take()
            free_count[large] = 0
            owner[large] = seq_id
            if ratio == 1:  # (each small page is its large page)
                pages.append(large)
            else:
                pages += range(large * ratio, large * ratio + ratio)
        self._held += count
        return pages

    def adopt_unowned(self, seq_id: int) -> list[int]:
        """One free small page whose request is gone; its large page's other free ones become
        ``seq_id``'s preferred."""
        ratio = self.ratio
        taken = _pop_first(self.unowned, 1)
        large = taken[0] // ratio
        self.owner[large] = seq_id
        own = self.preferred[seq_id]
        for sibling in range(large * ratio, large * ratio + ratio):
            if sibling in self.unowned:
                del self.unowned[sibling]
                own[sibling] = None
        self.free_count[large] -= 1
        self.free_small -= 1
        return taken

    def others_free(self) -> dict[int, None] | None:
        """The preferred free small pages of the first request that has any (None: none has)."""
        return next((free for free in self.preferred.values() if free), None)

    def take_others(self, count: int) -> list[int]:
        """Up to ``count`` of the first request's preferred free small pages that has any."""
        victim = self.others_free()
        assert victim is not None, "small pages the caller checked were free"
        return self.take_own(victim, count)

    def give_back_larges(self, larges: list[int]) -> None:
        """Large pages of this type with no blank small page, whose every small page was cached and is
        evicted now, go back to the shared pool in order (prefix caching:
        ``policies/hybrid/jenga_cache.py``)."""
        free_count, owner = self.free_count, self.owner
        for large in larges:
            assert free_count[large] == 0, "a large page with blank small pages is given back by release()"
            free_count[large] = owner[large] = NOT_HELD
        self._held -= len(larges)
        self.large_pages.give_back_each(larges)

    def release(self, pages: Iterable[int]) -> None:
        """Small pages are free again, in order: each its large page's request's, or anyone's; a large
        page whose small pages are all free goes back to the shared pool (``free_block_id``)."""
        ratio = self.ratio
        free_count, owner, preferred, unowned = self.free_count, self.owner, self.preferred, self.unowned
        if ratio == 1:  # (every layer type's pages of one size: each small page is a large page)
            for page in pages:
                self._drop(page)
            return
        for page in pages:
            large = page // ratio
            count = free_count[large] + 1
            free = preferred.get(owner[large], unowned)
            if count == ratio:
                first = large * ratio
                for sibling in range(first, first + ratio):
                    if sibling != page:
                        del free[sibling]
                self._drop(large)
                self.free_small -= ratio - 1
            else:
                free_count[large] = count
                free[page] = None
                self.free_small += 1

    def after_release(self, pages: list[int]) -> tuple[int, int]:
        """What releasing ``pages`` (distinct, held) would do, changing nothing: ``(large pages given
        back, free small pages of this type after)``."""
        if self.ratio == 1:  # each page is a large page, given back whole; no free small page moves
            return len(pages), self.free_small
        released: dict[int, int] = {}
        for page in pages:
            large = page // self.ratio
            released[large] = released.get(large, 0) + 1
        returned, free_small = 0, self.free_small
        for large, count in released.items():
            if self.free_count[large] + count == self.ratio:
                returned += 1  # its free small pages leave the type with it
                free_small -= self.free_count[large]
            else:
                free_small += count
        return returned, free_small


class WholePages(TypePages):
    """A type whose small page is a whole large page (``ratio`` 1), without a prefix cache: no page
    of it is ever free inside the type, and which large page a sequence holds changes nothing (none
    has siblings to keep together), so it keeps counts, not ids."""

    def __init__(self, large_pages: LargePagePool):
        super().__init__(large_pages, 1)
        self.held = 0

    @property
    def held_large(self) -> int:
        return self.held

    def add_request(self, seq_id: int) -> None:
        return None  # (no page is ever a request's preferred one)

    def remove_request(self, seq_id: int) -> None:
        return None

    def take(self, count: int) -> None:
        self.large_pages.take_count(count)
        self.held += count

    def give_back(self, count: int) -> None:
        self.large_pages.give_back_count(count)
        self.held -= count


class TypeHoldings:
    """One type's small pages as each sequence holds them, oldest first (a window or a chunk gives
    back from the front), for a coordinator without prefix caching (with it, the managers' block
    tables hold the pages: ``policies/hybrid/jenga_cache.py``)."""

    def __init__(self, pages: TypePages):
        self.pages = pages

    def hold(self, seq_id: int, request: int, needed: int, quota: int) -> None:
        """``needed`` more small pages for ``seq_id`` (the allocators' ``request``), at most ``quota``
        of them from new large pages; the caller checked that they fit."""
        raise NotImplementedError

    def release_oldest(self, seq_id: int, count: int) -> None:
        raise NotImplementedError

    def release_all(self, seq_id: int) -> None:
        raise NotImplementedError

    def after_release_oldest(self, seq_id: int, count: int) -> tuple[int, int]:
        """What giving back ``seq_id``'s ``count`` oldest pages would do, changing nothing: ``(large
        pages given back, free small pages of the type after)``."""
        raise NotImplementedError

    def held_count(self, seq_id: int) -> int:
        raise NotImplementedError


class NamedHoldings(TypeHoldings):
    """Small pages by id, over Jenga's small-page allocator (a type with ``ratio`` > 1, or any type
    when a test wants the ids)."""

    def __init__(self, allocator: SmallPageAllocator):
        super().__init__(allocator)
        self.allocator = allocator
        self.held: dict[int, deque[int]] = {}

    def hold(self, seq_id: int, request: int, needed: int, quota: int) -> None:
        pages = self.allocator.allocate(request, needed, quota)
        held = self.held.get(seq_id)
        if held is None:
            self.held[seq_id] = deque(pages)
        else:
            held.extend(pages)

    def release_oldest(self, seq_id: int, count: int) -> None:
        held = self.held[seq_id]
        self.allocator.release([held.popleft() for _ in range(count)])

    def release_all(self, seq_id: int) -> None:
        self.allocator.release(self.held.pop(seq_id))

    def after_release_oldest(self, seq_id: int, count: int) -> tuple[int, int]:
        held = self.held[seq_id]
        return self.allocator.after_release([held[i] for i in range(count)])

    def held_count(self, seq_id: int) -> int:
        return len(self.held[seq_id])


class WholeHoldings(TypeHoldings):
    """Counts of whole large pages (:class:`WholePages`). What a sequence holds is how many: the
    length of its run of blocks, which the type's manager keeps (``runs``, its ``held_blocks``), so it
    is not kept here a second time. A growth moves only the type's count (a coordinator may move
    several sequences' net at once)."""

    def __init__(self, pages: WholePages, runs: Callable[[int], tuple[int, int]]):
        super().__init__(pages)
        self.whole = pages
        self.runs = runs

    def hold(self, seq_id: int, request: int, needed: int, quota: int) -> None:
        assert quota == needed, "a whole page has no free small pages: its quota is what it needs"
        self.whole.take(needed)

    def release_oldest(self, seq_id: int, count: int) -> None:
        self.whole.give_back(count)

    def release_all(self, seq_id: int) -> None:
        """(Before the manager forgets the sequence's run: its length is what goes back.)"""
        self.whole.give_back(self.held_count(seq_id))

    def after_release_oldest(self, seq_id: int, count: int) -> tuple[int, int]:
        return count, 0

    def held_count(self, seq_id: int) -> int:
        first, end = self.runs(seq_id)
        return end - first


def _pop_first(pages: dict[int, None], count: int) -> list[int]:
    """The ``count`` oldest pages (or all), taken out."""
    taken = list(islice(pages, count))
    for page in taken:
        del pages[page]
    return taken
