"""SGLang's SWA pool without a radix cache (``SWAChunkCache``): a sliding-window group over a pool
of its own, pages of ``page_size`` tokens (1 by default), which frees the tokens that left the
window in bulk, at the steps SGLang's scheduler frees them.

What SGLang does (``SWATokenToKVPoolAllocator.alloc`` / ``alloc_extend``: every new token takes a
slot in the full pool and one in the SWA pool; ``free_swa`` gives SWA slots back):

* **Where the frontier goes.** ``free_swa_out_of_window_slots`` (``mem_cache/common.py``, chunk
  cache): with ``pre_len`` tokens computed before a step, the SWA slots of tokens before
  ``pre_len - W`` are freed (the frontier only moves forward and is rounded down to a page).
* **When.** ``ScheduleBatch.maybe_evict_swa`` (``managers/schedule_batch.py``), called before each
  step's allocation: at every prefill chunk (``pre_len``: the prompt tokens before the chunk; with
  the overlap scheduler, not at the first two chunks and one chunk further back, as the previous
  chunk is still running) and, while decoding, only at the request's decode steps ``i`` with
  ``i % W == 1`` (``pre_len = seqlen - 1``: "evict swa every window_size tokens to reduce
  overhead"), so a decoding request holds between ``W + 1`` and ``2W`` SWA tokens, and a prompt
  keeps every SWA token of its last chunk (all of a prompt shorter than a chunk) until its second
  decode step.

In kvsim's terms (``n``: the prompt, ``N``: the tokens held after a step, ``C``: the prompt tokens
one iteration computes for one request): from admission to its first decoded token a prompt holds
the most its chunks held at once; then the run starts at the frontier of the last eviction.
Modelled without the overlap scheduler's one-token lag of ``seqlen`` while decoding.

Read at sgl-project/sglang commit 0057abea41fceae867b023fc2962c340e11990de (``mem_cache/
common.py``: ``free_swa_out_of_window_slots``); the index holds ``schedule_batch.py`` of
sgl-project only at an older commit, so ``maybe_evict_swa``'s cadence was read from a copy of
SGLang main in the public code index (the same rule as sgl-jax's port: one eviction per window).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from policies.base import ChildSpec, PolicyInputError, PoolSpec
from policies.hybrid.block_pool import SharedBlockPool
from policies.hybrid.group import NEVER, GroupManager, GroupSequence, ceil_div
from token_content import TokenContent


@lru_cache(maxsize=65536)
def prefill_hold(prompt_len: int, chunk: int, window: int, page: int, overlap: bool) -> tuple[int, int]:
    """``(most SWA tokens held at once while the prompt's chunks run, frontier after the last chunk)``,
    both in tokens and page-aligned (a held page counts whole)."""
    most = frontier = 0
    chunks = ceil_div(prompt_len, chunk)
    for index in range(chunks):
        # (Overlap: the chunk before is still running, so not at the first two, one chunk further back.)
        pre_len = ((index - 1) * chunk if index >= 2 else 0) if overlap else index * chunk
        frontier = max(frontier, max(0, pre_len - window) // page * page)
        end = ceil_div(min((index + 1) * chunk, prompt_len), page) * page
        if end - frontier > most:
            most = end - frontier
    return most, frontier


def last_decode_eviction(step: int, window: int) -> int:
    """The decode step of a sequence's latest ``maybe_evict_swa`` by its decode step ``step`` (steps
    ``i`` with ``i % W == 1``), 0 before the first (and always for ``W == 1``: ``i % 1 == 1`` never
    holds). Shared with the SWA radix cache (``sim/kv/sglang_swa_radix.py``)."""
    if step < 1 or window == 1:
        return 0
    return step - (step - 1) % window


def next_decode_eviction(step: int, window: int) -> int:
    """The decode step of a sequence's next ``maybe_evict_swa`` after its decode step ``step``
    (:data:`NEVER` for ``W == 1``)."""
    if window == 1:
        return NEVER
    return 1 if step < 1 else step - (step - 1) % window + window


class SGLangSlidingWindowGroup(GroupManager):
    kind = "sliding_window"

    def __init__(
        self,
        pool: PoolSpec,
        shared_pool: SharedBlockPool,
        prefill_tokens: int,
        window: int,
        overlap: bool = False,
    ):
        """``shared_pool``: the SWA pool, this group's alone. ``overlap``: SGLang's overlap scheduler
        (on by default there), which keeps one more prefill chunk."""
        if window <= 0:
            raise PolicyInputError(f"a sliding window must be positive, got {window}")
        super().__init__(pool, shared_pool, prefill_tokens)
        self.window = window
        self.overlap = overlap
        self._prompt: dict[int, int] = {}  # id(sequence) -> its prompt length (when decoding began)

    # -- the frontier ---------------------------------------------------------------------------
    def prefill_run(self, prompt_len: int) -> tuple[int, int]:
        page = self.block_size
        most, _ = prefill_hold(prompt_len, self.prefill_tokens, self.window, page, self.overlap)
        end = ceil_div(prompt_len, page)
        return end - most // page, end

    def frontier(self, prompt_len: int, num_tokens: int) -> int:
        """The first token whose SWA slot a sequence of ``prompt_len`` prompt tokens still holds once it
        holds ``num_tokens`` tokens (decode step ``num_tokens - prompt_len - 1`` allocated the last)."""
        page = self.block_size
        _, frontier = prefill_hold(prompt_len, self.prefill_tokens, self.window, page, self.overlap)
        last_eviction = last_decode_eviction(num_tokens - prompt_len - 1, self.window)
        if last_eviction == 0:
            return frontier
        pre_len = prompt_len + last_eviction
        return max(frontier, max(0, pre_len - self.window) // page * page)

    def held_run(self, num_tokens: int) -> tuple[int, int]:
        # A sequence's run depends on where its decoding began: see _run_after.
        raise NotImplementedError("SGLangSlidingWindowGroup keeps a run per sequence (its prompt length)")

    def _run_after(self, seq: GroupSequence, num_tokens: int) -> tuple[int, int]:
        first = self.frontier(self._prompt[id(seq)], num_tokens) // self.block_size
        end = ceil_div(num_tokens, self.block_size)
        if first < seq.first_block:
            first = seq.first_block
        if end < seq.end_block:
            end = seq.end_block
        return first, end

    def releases_while_decoding(self) -> bool:
        return True

    def next_release(self, seq: GroupSequence) -> int:
        prompt_len = self._prompt[id(seq)]
        step = seq.num_tokens - prompt_len - 1
        if step < 0:
            return prompt_len + 1  # the first decoded token drops the prompt's chunks to the frontier
        next_eviction = next_decode_eviction(step, self.window)
        return NEVER if next_eviction == NEVER else prompt_len + next_eviction + 1

    # -- sequences --------------------------------------------------------------------------------
    def admit(
        self, seq_id: int, prompt: TokenContent, final_len: int, output_content_id: int, namespace: int = 0
    ) -> int:
        cached = super().admit(seq_id, prompt, final_len, output_content_id, namespace)
        seq = self.sequences[seq_id]
        self._prompt[id(seq)] = seq.num_tokens
        return cached

    def fork(self, parent_id: int, children: Sequence[ChildSpec]) -> None:
        prompt_len = self._prompt[id(self._get(parent_id))]
        super().fork(parent_id, children)
        for child in children:
            self._prompt[id(self.sequences[child.seq_id])] = prompt_len

    def free(self, seq_id: int, finished: bool = True) -> None:
        self._prompt.pop(id(self._get(seq_id)), None)
        super().free(seq_id, finished)
