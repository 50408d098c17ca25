"""Prompt identity for a replay: chains of block ids such that two prompts share exactly their
common leading blocks, built from token ids or from a rule that says which requests repeat which
prompt.

A chain id stands for a block *and everything before it* (like vLLM's block hashes, each of which
folds in its parent's), so equal ids at position k mean equal prefixes up to block k. Ids are small
integers interned in first-seen order, which keeps them stable across runs (Python's ``hash`` of a
string is not) and cheap to store.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


class ChainInterner:
    """Assigns each distinct ``(parent id, block key)`` pair the next integer id."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, Hashable], int] = {}

    def chain(self, keys: Sequence[Hashable]) -> list[int]:
        """The chain ids of blocks whose own contents are ``keys``, in order."""
        ids: list[int] = []
        parent = -1
        for key in keys:
            pair = (parent, key)
            block_id = self._ids.get(pair)
            if block_id is None:
                block_id = self._ids[pair] = len(self._ids)
            ids.append(block_id)
            parent = block_id
        return ids

    def __len__(self) -> int:
        return len(self._ids)


def chains_from_token_ids(prompts: Sequence[Sequence[int]], block_len: int) -> list[list[int]]:
    """One chain per prompt: block k's key is its ``block_len`` token ids (the last block its
    remainder), so prompts share exactly the full and partial blocks whose tokens and prefixes match."""
    interner = ChainInterner()
    return [
        interner.chain(
            [tuple(tokens[start : start + block_len]) for start in range(0, len(tokens), block_len)]
        )
        for tokens in prompts
    ]


@dataclass(frozen=True)
class CyclingPrompts:
    """The rule of benchmark clients that cycle a fixed set of prompts: request ``i`` sends prompt
    ``i mod distinct``; prompts come in groups of ``group_size`` consecutive ids that start with the
    same ``system_prompt_tokens``-token system prompt, then a question of their own.

    Block k of a prompt lies wholly in its system prompt when ``(k + 1) x block_len <= system
    tokens``; such blocks are shared by the whole group, every later block only by requests that
    send the same prompt (a repeat of a prompt measured a few tokens shorter shares its common part)."""

    distinct: int
    group_size: int
    system_prompt_tokens: int

    def __post_init__(self) -> None:
        if self.distinct <= 0 or self.group_size <= 0 or self.system_prompt_tokens < 0:
            raise ValueError(
                f"prompt rule: distinct ({self.distinct}) and group_size ({self.group_size}) must be "
                f"positive and system_prompt_tokens ({self.system_prompt_tokens}) non-negative"
            )

    def chains(self, prompt_lens: Sequence[int], block_len: int) -> list[list[int]]:
        interner = ChainInterner()
        shared_blocks = self.system_prompt_tokens // block_len
        chains = []
        for index, prompt_len in enumerate(prompt_lens):
            prompt = index % self.distinct
            group = prompt // self.group_size
            blocks = -(-prompt_len // block_len)
            keys: list[Hashable] = [
                ("system", group, k) if k < shared_blocks else ("prompt", prompt, k) for k in range(blocks)
            ]
            chains.append(interner.chain(keys))
        return chains

    def describe(self) -> str:
        return (
            f"request i sends prompt i mod {self.distinct}; groups of {self.group_size} consecutive prompts "
            f"share a {self.system_prompt_tokens}-token system prompt"
        )
