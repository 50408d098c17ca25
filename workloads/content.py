"""Stream ids for one workload, and prompts built from 512-token block hashes.

Every token stream a workload names (a system prompt, a few-shot example, a request's unique prompt
remainder, a request's generated output, a trace's hash block) gets an id from the workload's single
:class:`ContentIds` object, so no two different streams ever share an id.

Ids are non-negative ints whose two low bits name a namespace:

====  =====================================================================================
bits  streams
====  =====================================================================================
0     shared content (system prompts, templates, few-shot examples), numbered in creation order
1     per-request streams: ``(request_id * 2 + slot) << 2 | 1``; slot 0 = the new prompt tokens of
      the request (unique remainder, new user turn), slot 1 = its output stream. A request's ids
      depend only on its request id, so closed-loop workloads give identical ids whatever order
      the engine finishes requests in.
2     trace hash blocks: hash id ``h`` (a non-negative int) is stream ``h << 2 | 2``
3     hash ids that are not non-negative ints (hex strings, negative numbers), interned in order
====  =====================================================================================

Negative ids are never used by workloads: the engine may use them for streams it creates itself
(the outputs of forked children in parallel sampling and beam search).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Final, cast

from token_content import Segment, TokenContent

PROMPT_SLOT: Final = 0
OUTPUT_SLOT: Final = 1

_SHARED, _REQUEST, _HASH, _INTERNED = 0, 1, 2, 3
CHAIN_PROMPTS = 4096  # prompts kept for reuse: a trace of unique chains must not hold them all


class ContentIds:
    """The one allocator of stream ids of a workload (see the module docstring)."""

    def __init__(self) -> None:
        self._next_shared = 0
        self._interned: dict[Hashable, int] = {}
        # Prompts :func:`hash_prompt` built, by length and int hash chain (at most CHAIN_PROMPTS).
        self.chain_prompts: dict[tuple[int, ...], TokenContent] = {}

    def new_shared(self) -> int:
        """A fresh id for a stream shared by many requests (system prompt, template...)."""
        value = self._next_shared
        self._next_shared += 1
        return value << 2 | _SHARED

    @staticmethod
    def for_request(request_id: int, slot: int) -> int:
        """The id of a request's own stream: ``slot`` is :data:`PROMPT_SLOT` or :data:`OUTPUT_SLOT`."""
        if request_id < 0 or slot not in (PROMPT_SLOT, OUTPUT_SLOT):
            raise ValueError(f"bad request stream: request_id={request_id}, slot={slot}")
        return (request_id * 2 + slot) << 2 | _REQUEST

    def hash_block(self, hash_id: Hashable) -> int:
        """The stream of a trace's block hash ``hash_id`` (equal hash ids -> equal streams)."""
        if isinstance(hash_id, int) and not isinstance(hash_id, bool) and hash_id >= 0:
            return hash_id << 2 | _HASH
        interned = self._interned.get(hash_id)
        if interned is None:
            interned = len(self._interned) << 2 | _INTERNED
            self._interned[hash_id] = interned
        return interned

    @property
    def interned_hashes(self) -> int:
        return len(self._interned)


def hash_prompt(
    hash_ids: Sequence[Hashable],
    prompt_len: int,
    block_len: int,
    ids: ContentIds,
    tail_id: int | None = None,
) -> TokenContent:
    """The first ``prompt_len`` tokens of a chain of hashed blocks, as segments.

    Block ``i`` of the chain is the stream ``ids.hash_block(hash_ids[i])`` of ``block_len`` tokens;
    the last block the prompt reaches is cut to what is left, so a prompt of ``k`` hash ids and
    ``512 * (k - 1) < prompt_len <= 512 * k`` tokens is ``k - 1`` full blocks and one block of
    ``prompt_len - 512 * (k - 1)`` tokens. Two prompts then share exactly their common leading hash
    ids' tokens (and, where both end in the same block, the shorter one's part of it), at any
    simulator block size.

    A prompt shorter than the chain uses only the blocks it reaches (a capped prompt); a prompt longer
    than the chain continues with ``prompt_len - block_len * k`` tokens of the stream ``tail_id``
    (required then), which nothing else shares.
    """
    if block_len <= 0:
        raise ValueError(f"block_len must be positive, got {block_len}")
    if prompt_len <= 0:
        raise ValueError(f"prompt_len must be positive, got {prompt_len}")
    reached = hash_ids[: -(-prompt_len // block_len)]  # the hash blocks the prompt reaches
    # Non-negative int ids (nearly every trace): their streams computed in one pass, not one method
    # call per block (337,000 of them for a 9,000-request replay); a prompt inside its chain is
    # built once per chain and length (traces repeat prompts: their requests share one tuple).
    if _non_negative_ints(reached):
        int_ids = cast("Sequence[int]", reached)
        if len(reached) * block_len < prompt_len:
            return _chain_prompt(int_ids, prompt_len, block_len, tail_id)
        key = (prompt_len, block_len, *int_ids)
        prompt = ids.chain_prompts.get(key)
        if prompt is None:
            prompt = _chain_prompt(int_ids, prompt_len, block_len, None)
            if len(ids.chain_prompts) >= CHAIN_PROMPTS:
                ids.chain_prompts.clear()
            ids.chain_prompts[key] = prompt
        return prompt
    segments: list[Segment] = []
    left = prompt_len
    for hash_id in reached:
        length = block_len if left >= block_len else left
        segments.append((ids.hash_block(hash_id), length))
        left -= length
    return _with_tail(segments, left, tail_id, len(hash_ids), block_len)


def _non_negative_ints(hash_ids: Sequence[Hashable]) -> bool:
    """Are all ``hash_ids`` non-negative ints (bool, a subclass of int, is not a hash id)? (Compiled,
    a comparison of types per id; a set of their types would cost a call per id.)"""
    return all(type(hash_id) is int and hash_id >= 0 for hash_id in hash_ids)


def _chain_prompt(
    hash_ids: Sequence[int], prompt_len: int, block_len: int, tail_id: int | None
) -> TokenContent:
    """:func:`hash_prompt` of non-negative int hash ids, each at most the prompt reaches."""
    stream = _HASH  # (a local: read once, not once per block)
    segments = [(hash_id << 2 | stream, block_len) for hash_id in hash_ids]
    left = prompt_len - len(segments) * block_len
    if left < 0:  # the last block the prompt reaches, cut
        segments[-1] = (segments[-1][0], block_len + left)
    return _with_tail(segments, left, tail_id, len(hash_ids), block_len)


def _with_tail(
    segments: list[Segment], left: int, tail_id: int | None, chain: int, block_len: int
) -> TokenContent:
    """``segments`` continued by ``left`` tokens of the prompt's own stream ``tail_id``, if any are left."""
    if left > 0:
        if tail_id is None:
            raise ValueError(
                f"prompt_len={chain * block_len + left} is longer than its {chain} hash blocks of {block_len} tokens"
            )
        segments.append((tail_id, left))
    return tuple(segments)


def hash_blocks_for_len(prompt_len: int, block_len: int) -> int:
    """How many hash ids a prompt of ``prompt_len`` tokens has: ``ceil(prompt_len / block_len)``."""
    return -(-prompt_len // block_len)


def common_prefix_len(a: Sequence[Segment], b: Sequence[Segment]) -> int:
    """Tokens two contents share from their start (same streams at the same offsets)."""
    shared = 0
    for (id_a, len_a), (id_b, len_b) in zip(a, b, strict=False):
        if id_a != id_b:
            break
        shared += min(len_a, len_b)
        if len_a != len_b:
            break
    return shared
