"""The context a decode step attends over when some layers see only a window of it.

A sliding-window layer reads the K/V of a sequence's last ``W`` tokens, not all of them (gpt-oss:
half its layers, 128 tokens; Gemma 3: five layers in six, 1,024). A decode step's context term is
then ``per_context_token_s`` x the *attended* context, each sequence counting
``(1 - sum of shares) x tokens + sum of share x min(tokens, W)`` (the shares:
``CostModel.attention_windows``).

``min(tokens, W)`` is not linear in the clock, but it is piecewise: a sequence below its window
grows with the clock, one at or above it stays at ``W``. So each window keeps, like the decode
clock, a count and an offset of the sequences below it (their tokens are ``offset + count x now``)
and a count of those above; a sequence *crosses* once, at a clock known when it starts decoding,
kept in a heap. A crossing ends a jump (the attended context's growth per iteration changes), so
every aggregate stays exact and each costs O(1) per event."""

from __future__ import annotations

import heapq
from typing import Final, Protocol

NEVER: Final = 1 << 61  # (below 2**62: compiled, a native int, not a boxed one)


class WindowedRequest(Protocol):
    """What the windows read of a decoding request (``sim.engine.decoding.RequestState``)."""

    seq_ids: list[int]
    context: int
    synced_clock: int
    admission: int
    end_version: int
    decoding: bool
    windows_held: int


_Crossing = tuple[int, int, int, int, WindowedRequest]  # (clock, admission, version, window index, request)


class AttendedWindows:
    def __init__(self, windows: tuple[tuple[int, float], ...]):
        self.sizes = [window for window, _ in windows]
        self.shares = [share for _, share in windows]
        self.full_share = 1.0 - sum(self.shares)
        count = len(windows)
        self.below = [0] * count  # sequences with fewer tokens than the window
        self.below_offset = [0] * count  # Σ over them of (tokens - synced clock)
        self.above = [0] * count  # sequences holding the whole window
        self._crossings: list[_Crossing] = []

    def add(self, state: WindowedRequest, now: int) -> None:
        """``state`` starts decoding at clock ``now`` (synced there, its entry version set)."""
        width = len(state.seq_ids)
        tokens = state.context + now - state.synced_clock
        state.windows_held = 0
        for index, window in enumerate(self.sizes):
            if tokens >= window:
                self.above[index] += width
                state.windows_held |= 1 << index
            else:
                self.below[index] += width
                self.below_offset[index] += width * (state.context - state.synced_clock)
                # From the clock after the one at which it holds ``window`` tokens, it would count more.
                crossing = now + window - tokens + 1
                heapq.heappush(self._crossings, (crossing, state.admission, state.end_version, index, state))

    def remove(self, state: WindowedRequest) -> None:
        width = len(state.seq_ids)
        for index in range(len(self.sizes)):
            if state.windows_held >> index & 1:
                self.above[index] -= width
            else:
                self.below[index] -= width
                self.below_offset[index] -= width * (state.context - state.synced_clock)

    def cross(self, now: int) -> None:
        """Sequences that hold their whole window by clock ``now`` count it from now on."""
        crossings = self._crossings
        while crossings and crossings[0][0] <= now:
            _, _, version, index, state = heapq.heappop(crossings)
            if not (state.decoding and state.end_version == version) or state.windows_held >> index & 1:
                continue
            width = len(state.seq_ids)
            self.below[index] -= width
            self.below_offset[index] -= width * (state.context - state.synced_clock)
            self.above[index] += width
            state.windows_held |= 1 << index

    def next_crossing(self) -> int:
        """The clock at which the next sequence would count more than its window (NEVER: none)."""
        crossings = self._crossings
        while crossings:
            _, _, version, index, state = crossings[0]
            if state.decoding and state.end_version == version and not state.windows_held >> index & 1:
                return crossings[0][0]
            heapq.heappop(crossings)
        return NEVER

    def attended(self, offset_sum: int, sequences: int, now: int) -> float:
        """The attended context at clock ``now`` of sequences holding ``offset_sum + sequences x now``
        tokens in all."""
        total = self.full_share * (offset_sum + sequences * now)
        for index, window in enumerate(self.sizes):
            held = self.below_offset[index] + self.below[index] * now + window * self.above[index]
            total += self.shares[index] * held
        return total

    def growth(self, sequences: int) -> float:
        """What the attended context grows by when every sequence gains a token (until a crossing)."""
        total = self.full_share * sequences
        for index, share in enumerate(self.shares):
            total += share * self.below[index]
        return total
