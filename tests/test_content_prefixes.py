"""``token_content.prefixes.ContentPrefixes``: the longest prefix a content shares with those added
(SGLang's in-batch prefix check over its waiting queue), by hand and against explicit tokens."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from token_content.prefixes import ContentPrefixes


def test_shared_prefixes_by_hand():
    prefixes = ContentPrefixes()
    assert prefixes.longest_shared(((1, 40),), 40) == 0  # nothing added yet
    prefixes.add(((1, 40), (2, 10)), 50)
    assert prefixes.longest_shared(((1, 40), (2, 10)), 50) == 50
    assert prefixes.longest_shared(((1, 40), (3, 10)), 50) == 40  # a new stream after the shared one
    assert prefixes.longest_shared(((1, 25), (2, 10)), 35) == 25  # stream 1 cut shorter: 2 starts anew
    assert prefixes.longest_shared(((1, 60),), 60) == 40  # cut longer: the added one went on in 2
    assert prefixes.longest_shared(((1, 40), (2, 10)), 45) == 45  # only the first 45 tokens asked
    assert prefixes.longest_shared(((2, 10),), 10) == 0
    assert prefixes.longest_shared(((1, 0), (1, 40), (2, 4)), 44) == 44  # an empty segment names nothing
    prefixes.add(((1, 30),), 30)
    assert prefixes.longest_shared(((1, 35),), 35) == 35  # 40 of stream 1 added too: the longer cut
    prefixes.add(((4, 8), (5, 8)), 12)  # only its first 12 tokens: (4, 8), (5, 4)
    assert prefixes.longest_shared(((4, 8), (5, 8)), 16) == 12


def _tokens(content, num_tokens):
    """The content's first ``num_tokens`` tokens, each as (stream, offset)."""
    tokens = [(stream, offset) for stream, length in content for offset in range(length)]
    return tokens[:num_tokens]


def _common(a, b):
    shared = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        shared += 1
    return shared


segments = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), max_size=5)


@given(
    added=st.lists(st.tuples(segments, st.integers(0, 30)), max_size=6),
    query=segments,
    cut=st.integers(0, 30),
)
@settings(max_examples=300, deadline=None)
def test_shared_prefix_is_the_longest_over_explicit_tokens(added, query, cut):
    prefixes = ContentPrefixes()
    for content, num_tokens in added:
        prefixes.add(tuple(content), num_tokens)
    expected = max(
        (_common(_tokens(query, cut), _tokens(content, num_tokens)) for content, num_tokens in added),
        default=0,
    )
    assert prefixes.longest_shared(tuple(query), cut) == expected
