"""Prefix identity from block hashes: exact sharing at any block size, and the unlimited-cache bound.

The expectations are checked against an independent method: expand every prompt into explicit token
identities ``(stream, offset)`` and compare tokens one by one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from token_content import TokenContent
from workloads.content import ContentIds, common_prefix_len, hash_prompt
from workloads.stats import PrefixTrie, trace_stats

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE_FULL = ROOT / "traces" / "mooncake" / "conversation_trace.jsonl"


def tokens(content: TokenContent) -> list[tuple[int, int]]:
    """Explicit token identities: token j of segment (stream, length) is (stream, j)."""
    return [(stream, offset) for stream, length in content for offset in range(length)]


def shared_tokens(a: TokenContent, b: TokenContent) -> int:
    count = 0
    for x, y in zip(tokens(a), tokens(b), strict=False):
        if x != y:
            break
        count += 1
    return count


def shared_full_blocks(a: TokenContent, b: TokenContent, block_size: int) -> int:
    """Leading simulator blocks of ``block_size`` slots that hold identical tokens in both, full in both."""
    ta, tb = tokens(a), tokens(b)
    blocks = 0
    while True:
        lo, hi = blocks * block_size, (blocks + 1) * block_size
        if hi > len(ta) or hi > len(tb) or ta[lo:hi] != tb[lo:hi]:
            return blocks
        blocks += 1


IDS = ContentIds()
# hash chains with the 512-token blocks of Mooncake (prompt lengths chosen to end mid-block)
A = hash_prompt([10, 11, 12], 1300, 512, IDS)  # 512 + 512 + 276
B = hash_prompt([10, 11, 13], 1100, 512, IDS)  # 512 + 512 + 76: diverges in block 3
C = hash_prompt([10, 11, 12], 1200, 512, IDS)  # 512 + 512 + 176: same chain as A, shorter
D = hash_prompt([10], 300, 512, IDS)  # a partial first block
E = hash_prompt([20, 11], 1000, 512, IDS)  # a different first block


def test_segments_of_a_hash_chain() -> None:
    h = IDS.hash_block
    assert ((h(10), 512), (h(11), 512), (h(12), 276)) == A
    assert ((h(10), 300),) == D
    assert hash_prompt([10, 11, 12], 1024, 512, IDS) == (
        (h(10), 512),
        (h(11), 512),
    )  # capped: blocks it reaches
    assert hash_prompt([10], 600, 512, IDS, tail_id=99) == (
        (h(10), 512),
        (99, 88),
    )  # past the chain: unique tail
    with pytest.raises(ValueError, match="longer than its 1 hash blocks"):
        hash_prompt([10], 600, 512, IDS)
    assert (
        len({h(0), h(1), ContentIds.for_request(0, 0), ContentIds.for_request(0, 1), IDS.new_shared()}) == 5
    )
    assert IDS.hash_block("abc") == IDS.hash_block("abc") != IDS.hash_block("abd")


def _chain_tokens(hash_ids: list, prompt_len: int, block_len: int, tail_id: int | None) -> list:
    """The prompt's token identities spelled out one by one: token j is offset j % block_len of
    hash block j // block_len, and past the chain offset j - chain of the tail's stream."""
    ids = ContentIds()
    chain = len(hash_ids) * block_len
    if prompt_len > chain and tail_id is None:
        return ["error"]
    return [
        (ids.hash_block(hash_ids[j // block_len]), j % block_len) if j < chain else (tail_id, j - chain)
        for j in range(prompt_len)
    ]


hash_id = st.one_of(st.integers(0, 40), st.integers(-3, -1), st.sampled_from(["a", "b", True]))


@settings(max_examples=300, deadline=None)
@given(
    hash_ids=st.lists(hash_id, max_size=6),
    block_len=st.sampled_from([1, 3, 16]),
    extra=st.integers(-20, 20),
    tail_id=st.sampled_from([None, 99]),
    again=st.booleans(),
)
def test_hash_prompts_hold_their_chains_tokens(hash_ids, block_len, extra, tail_id, again) -> None:
    """Any chain (int, negative, string, bool ids), any length around its end, built alone or after
    the same chain one token shorter and at its own length (prompts already built are reused):
    token for token the identities spelled out independently."""
    prompt_len = max(1, len(hash_ids) * block_len + extra)
    ids = ContentIds()
    try:
        for earlier in [prompt_len - 1, prompt_len] if again and prompt_len > 1 else []:
            hash_prompt(hash_ids, earlier, block_len, ids, tail_id=tail_id)
        built = tokens(hash_prompt(hash_ids, prompt_len, block_len, ids, tail_id=tail_id))
    except ValueError:
        built = ["error"]
    assert built == _chain_tokens(hash_ids, prompt_len, block_len, tail_id)


# Which tokens two requests share, and how many full simulator blocks hold only shared tokens.
EXPECTED = {
    # pair: (shared tokens, {block size: shared full blocks})
    ("A", "B"): (1024, {16: 64, 64: 16, 500: 2, 512: 2}),
    ("A", "C"): (1200, {16: 75, 64: 18, 500: 2, 512: 2}),
    ("A", "D"): (300, {16: 18, 64: 4, 500: 0, 512: 0}),
    ("B", "C"): (1024, {16: 64, 64: 16, 500: 2, 512: 2}),
    ("C", "D"): (300, {16: 18, 64: 4, 500: 0, 512: 0}),
    ("A", "E"): (0, {16: 0, 64: 0, 500: 0, 512: 0}),
}
PROMPTS = {"A": A, "B": B, "C": C, "D": D, "E": E}


@pytest.mark.parametrize("pair", sorted(EXPECTED))
def test_sharing_at_block_sizes_16_64_500_512(pair: tuple[str, str]) -> None:
    a, b = PROMPTS[pair[0]], PROMPTS[pair[1]]
    tokens_shared, blocks = EXPECTED[pair]
    assert shared_tokens(a, b) == tokens_shared == common_prefix_len(a, b)
    for block_size, count in blocks.items():
        assert shared_full_blocks(a, b, block_size) == count


def test_partial_blocks_share_their_common_tokens() -> None:
    # A's last block at block size 500 covers tokens 1000..1299, C's 1000..1199: the 200 tokens C has
    # there are A's tokens too (the first 176 of hash block 12 after 1024 tokens), so a cache that
    # compares token content can serve all of C's 1,200 tokens from A's blocks.
    assert tokens(C)[1000:1200] == tokens(A)[1000:1200]
    assert tokens(A)[1200] == (IDS.hash_block(12), 176) and len(tokens(C)) == 1200
    # block size 64: 18 full blocks (1,152 tokens) plus 48 of the 19th, partial in C
    assert tokens(C)[1152:1200] == tokens(A)[1152:1200]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=4), st.integers(1, 4 * 40)),
        min_size=2,
        max_size=6,
    ),
    st.sampled_from([16, 40, 64]),
)
def test_sharing_matches_explicit_tokens_and_the_trie(
    chains: list[tuple[list[int], int]], block_len: int
) -> None:
    ids = ContentIds()
    prompts = []
    for hashes, length in chains:
        # hash ids are chained: make id depend on the whole prefix, as Mooncake's do
        chained = [hash(tuple(hashes[: index + 1])) & 0xFFFF for index in range(len(hashes))]
        length = min(length, block_len * len(hashes))
        prompts.append(hash_prompt(chained, length, block_len, ids, tail_id=None))
    trie = PrefixTrie()
    for index, prompt in enumerate(prompts):
        best = max((shared_tokens(prompt, earlier) for earlier in prompts[:index]), default=0)
        assert trie.match_and_insert(prompt) == best
        for earlier in prompts[:index]:
            assert common_prefix_len(prompt, earlier) == shared_tokens(prompt, earlier)


def independent_bound(path: Path, block_sizes: tuple[int, ...]) -> dict[str, float]:
    """Straight from hash_ids: leading run of already-seen ids; tokens = min(512 * run, input)."""
    seen: set[int] = set()
    total = cached = last_token = 0
    by_block = dict.fromkeys(block_sizes, 0)
    for line in path.read_text().splitlines():
        row = json.loads(line)
        run = 0
        for hash_id in row["hash_ids"]:
            if hash_id not in seen:
                break
            run += 1
        hit = min(512 * run, row["input_length"])
        total += row["input_length"]
        cached += hit
        last_token += min(hit, row["input_length"] - 1)
        for size in block_sizes:
            by_block[size] += min(hit, row["input_length"] - 1) // size * size
        seen.update(row["hash_ids"])
    out = {"token_exact": cached / total, "last_token": last_token / total}
    out.update({str(size): value / total for size, value in by_block.items()})
    return out


def test_unlimited_cache_bound_on_the_full_mooncake_trace() -> None:
    sizes = (16, 64, 500, 512)
    stats = trace_stats(MOONCAKE_FULL, block_sizes=sizes)
    reuse = stats["prefix_reuse"]
    expected = independent_bound(MOONCAKE_FULL, sizes)
    assert reuse["cached_prompt_tokens_frac"] == pytest.approx(expected["token_exact"], abs=1e-12)
    assert reuse["cached_prompt_tokens_frac_last_token_recomputed"] == pytest.approx(
        expected["last_token"], abs=1e-12
    )
    for size in sizes:
        assert reuse["cached_prompt_tokens_frac_by_block_size"][str(size)] == pytest.approx(
            expected[str(size)], abs=1e-12
        )
    assert stats["hash_blocks"]["cached_prompt_tokens_frac"] == pytest.approx(
        expected["token_exact"], abs=1e-12
    )
    # the README's "37.4 %", and the exact numbers quoted in traces/README.md
    assert round(100 * reuse["cached_prompt_tokens_frac"], 1) == 37.4
    assert round(100 * reuse["cached_prompt_tokens_frac"], 3) == 37.362
    assert [round(100 * reuse["cached_prompt_tokens_frac_by_block_size"][str(s)], 3) for s in sizes] == [
        37.362,
        37.359,
        36.791,
        37.338,
    ]
    assert (
        reuse["cached_prompt_tokens"]
        - round(reuse["cached_prompt_tokens_frac_last_token_recomputed"] * stats["prompt_tokens_total"])
        == 118
    )
