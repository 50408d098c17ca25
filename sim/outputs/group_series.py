"""Each KV group's share of the pool over time: a hybrid allocator's memory split by layer kind.

A run whose coordinator has several KV groups (``vllm-hybrid``, ``sglang-hybrid``: full attention,
sliding window, chunked local, Mamba) gets, beside its pool-wide series, the breakdown of every group
and of every block pool the groups share (whose free blocks belong to no group): rows on change,
written as ``kv_groups.parquet`` in long form (one row per instant and entry), and time averages
in the summary (``kv_group_means``). Per category the entries sum to the pool-wide breakdown at
every instant, so the split accounts for the whole pool (tests/test_kv_group_series.py).

The time integrals are exact as the pool-wide ones are (:class:`sim.outputs.metrics.Recorder`): each
observation adds the state before it times the time since, and the tokens an event-skipping jump
decodes (no state holds them, they grow every iteration) fill one reserved slot per token in every
group whose slots hold tokens (not a Mamba group's state, nor a pool's free blocks).
"""

from __future__ import annotations

from itertools import chain
from typing import Final

import numpy as np
import pandas as pd

from policies.base import MemoryBreakdown
from sim.outputs.metrics import without_residue

CATEGORIES: Final = len(MemoryBreakdown.CATEGORIES)
TOKEN_COLUMNS = [f"{name}_tokens" for name in MemoryBreakdown.CATEGORIES]
KV_GROUP_TIMESERIES = "kv_groups"  # the per-variant table's file stem


class GroupSeries:
    """The breakdown of each entry (a KV group, or a shared pool's free blocks) over time."""

    def __init__(self, names: tuple[str, ...], holds_tokens: tuple[bool | int, ...]):
        if len(names) != len(holds_tokens):
            raise ValueError(f"{len(names)} entry names for {len(holds_tokens)} token flags")
        self.names = names
        # Offsets of (used, reserved) of every entry whose slots hold tokens, and the slots a token fills
        # there (a flag counts 1; jenga's groups say how many: sim/kv/jenga.py).
        self._token_offsets = [
            (index * CATEGORIES, int(holds)) for index, holds in enumerate(holds_tokens) if holds
        ]
        self._area = [0.0] * (len(names) * CATEGORIES)
        self._state: list[int] | None = None
        self._since = 0.0
        self._times: list[float] = []
        self._rows: list[list[int]] = []

    def record(self, time_s: float, values: list[int]) -> None:
        """``values`` (every entry's breakdown, flat, in ``names`` order; kept, so never changed after)
        hold from ``time_s`` on; a row is kept when they changed."""
        if values == self._state:
            return
        self.observe(time_s, values)
        if self._rows and self._rows[-1] == values:
            return
        self._times.append(time_s)
        self._rows.append(values)

    def observe(self, time_s: float, values: list[int]) -> None:
        """``values`` hold from ``time_s`` on, without a row (a change inside an event-skipping jump)."""
        previous = self._state
        if previous is not None:
            elapsed = time_s - self._since
            area = self._area
            for index in range(len(area)):
                count: int = previous[index]
                # (Zero adds nothing, and most entries are structurally zero: a group's free slots, a
                # pool's used ones. Skipped: each sum is a boxed float made and dropped.)
                if count:
                    area[index] = area[index] + count * elapsed
        self._state = values
        self._since = time_s

    def add_token_area(self, token_seconds: float) -> None:
        """Tokens decoded inside a jump, in token-seconds: each fills a reserved slot of every entry
        that holds tokens."""
        area = self._area
        for offset, slots in self._token_offsets:
            area[offset] = area[offset] + token_seconds * slots
            area[offset + 1] = area[offset + 1] - token_seconds * slots

    def add_unbacked_token_area(self, token_seconds: float, draws: tuple[int, ...]) -> None:
        """Tokens decoded inside a jump by unbacked growth (``sim/engine/unbacked.py``): each fills a
        used slot of every entry that holds tokens, taken from the free slots of the entries
        ``draws`` names (per entry, the slots a token takes there)."""
        area = self._area
        for offset, slots in self._token_offsets:
            area[offset] = area[offset] + token_seconds * slots
        for index, slots in enumerate(draws):
            if slots:
                free = index * CATEGORIES + 5
                area[free] = area[free] - token_seconds * slots

    def frame(self) -> pd.DataFrame:
        """The rows in long form: ``time_s``, ``kv_group``, then one column per category (slots)."""
        groups = len(self.names)
        if not self._rows:
            return pd.DataFrame.from_records([], columns=["time_s", "kv_group", *TOKEN_COLUMNS])
        # Built by column: each observation (every group's categories) is one row of the array, then
        # reshaped to a row per group. (A tuple per row and group, its ints boxed, was 2-4 % of a
        # hybrid run's time under perf; np.array's nested-list discovery two thirds of what was left:
        # fromiter reads the rows flat.)
        width = groups * CATEGORIES
        values = np.fromiter(
            chain.from_iterable(self._rows), dtype=np.int64, count=len(self._rows) * width
        ).reshape(len(self._rows) * groups, CATEGORIES)
        columns: dict[str, object] = {
            "time_s": np.repeat(np.array(self._times, dtype=np.float64), groups),
            "kv_group": np.tile(np.array(self.names, dtype=object), len(self._rows)),
        }
        for offset, column in enumerate(TOKEN_COLUMNS):
            columns[column] = values[:, offset]
        return pd.DataFrame(columns)

    def time_averages(self, end_s: float, pool_slots: int) -> dict[str, dict[str, float]]:
        """Per entry, each category's time-averaged share of the whole pool over [0, end_s]: the
        entries' shares of a category add up to the pool-wide mean of that category."""
        if end_s <= 0 or self._state is None or pool_slots <= 0:
            return {name: dict.fromkeys(MemoryBreakdown.CATEGORIES, 0.0) for name in self.names}
        tail = max(0.0, end_s - self._since)
        means = {}
        for index, name in enumerate(self.names):
            start = index * CATEGORIES
            means[name] = {
                category: without_residue(
                    (self._area[start + offset] + self._state[start + offset] * tail) / end_s / pool_slots
                )
                for offset, category in enumerate(MemoryBreakdown.CATEGORIES)
            }
        return means
