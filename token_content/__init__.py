"""Token content without tokens: the vocabulary workloads, the engine and the policies share.

A request's prompt, a sequence's tokens and a system prompt are all *token content*: a sequence of
segments ``(content_id, length)`` naming stretches of token streams (see :mod:`token_content.segments`).
Workloads produce it and policies store it; neither side's concepts (requests, memory) belong here,
so both import this package and neither imports the other.
"""

import sim  # noqa: F401, I001  (first: it activates the compiled build of token_content.segments, if any)
from token_content.segments import (
    ContentError,
    Segment,
    TokenContent,
    content_length,
    token_ids,
    validate_content,
)

__all__ = [
    "ContentError",
    "Segment",
    "TokenContent",
    "content_length",
    "token_ids",
    "validate_content",
]
