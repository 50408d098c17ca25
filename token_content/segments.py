"""Token content as segments: what two sequences share is where their segments name the same stream.

Compiled in the native build (``sim.native``): :func:`content_length` runs several times per request.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Segment = tuple[int, int]
"""``(content_id, length)``: the first ``length`` tokens of the token stream named ``content_id``.

Two sequences hold identical tokens exactly where their segments name the same stream at the same
offsets. A system prompt, a Mooncake 512-token hash block, a conversation turn, a sequence's
generated output: each is one stream. Explicit token ids are streams of length 1 (see
:func:`token_ids`), so the vLLM worked examples can be replayed token by token."""

TokenContent = tuple[Segment, ...]


class ContentError(ValueError):
    """Token content that is not a sequence of ``(content_id, length >= 0)`` segments."""


def token_ids(ids: Iterable[int]) -> TokenContent:
    """Explicit token ids as content: each id is a one-token stream."""
    return tuple((int(token), 1) for token in ids)


def content_length(content: Sequence[Segment]) -> int:
    """Tokens in ``content``: the sum of its segments' lengths."""
    # A loop, not sum() over a generator: this runs several times per request (a third of the cost).
    # (Indexed, not unpacked: compiled, an unpacked ``_`` is boxed, a new int object per segment.)
    total = 0
    for segment in content:
        total += segment[1]
    return total


def validate_content(content: Sequence[Segment], what: str, error: type[Exception] = ContentError) -> None:
    """Raise ``error`` at the first segment of ``content`` that is not ``(content_id, length >= 0)``;
    ``what`` names the content in the message. :class:`ContentError` by default; a caller with its
    own errors passes one of them (the policies raise their ``PolicyInputError``, as for every bad
    input they are given)."""
    for position, segment in enumerate(content):
        if len(segment) != 2 or segment[1] < 0:
            raise error(f"{what}: segment {position} is {segment!r}; expected (content_id, length >= 0)")
