"""Contents seen so far, as a trie of their segments: how long a prefix a new content shares with any
of them (SGLang's scheduler keeps one over its waiting queue to find requests that share a prompt
prefix, ``SchedulePolicy.waiting_queue_radix_tree``)."""

from __future__ import annotations

from collections.abc import Sequence

from token_content.segments import Segment

# A trie node: content id -> segment length -> the node after that segment.
_Node = dict[int, dict[int, "_Node"]]


class ContentPrefixes:
    def __init__(self) -> None:
        self._root: _Node = {}

    def longest_shared(self, content: Sequence[Segment], num_tokens: int) -> int:
        """The most leading tokens of ``content``'s first ``num_tokens`` that one added content shares."""
        node = self._root
        shared = 0
        for content_id, length in _leading(content, num_tokens):
            by_length = node.get(content_id)
            if by_length is None:
                return shared
            child = by_length.get(length)
            if child is None:
                # The same stream, cut at another length: they share the shorter cut. What follows
                # cannot match any more: one goes on in this stream, the other starts a new one.
                return shared + max(min(length, other) for other in by_length)
            shared += length
            node = child
        return shared

    def add(self, content: Sequence[Segment], num_tokens: int) -> None:
        """Add ``content``'s first ``num_tokens`` tokens."""
        node = self._root
        for content_id, length in _leading(content, num_tokens):
            node = node.setdefault(content_id, {}).setdefault(length, {})


def _leading(content: Sequence[Segment], num_tokens: int) -> list[Segment]:
    """The segments of ``content``'s first ``num_tokens`` tokens, empty ones left out (a stream named
    for no token shares nothing)."""
    leading: list[Segment] = []
    left = num_tokens
    for content_id, length in content:
        if left <= 0:
            break
        if length > 0:
            leading.append((content_id, min(length, left)))
            left -= length
    return leading
