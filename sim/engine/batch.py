"""The requests inside one engine and the counts its limits read: the queue, the running batch in
admission order, the running requests whose prompt is in progress, the sequences ``max_num_seqs``
counts (samples and beams each count; a request's samples count from its admission, before they are
forked), and the host swap space preempted requests occupy. Every part of the engine reads and
changes these books through this one object."""

from __future__ import annotations

from collections import deque

from sim.engine.decoding import RequestState


class Batch:
    waiting: deque[RequestState]
    running: list[RequestState]
    # The running requests whose prompt is in progress, in running order: every iteration schedules
    # their chunks, so they are kept apart rather than found among the running.
    prefilling: list[RequestState]
    running_seqs: int  # sequences in the batch
    unforked_seqs: int  # samples/beams of admitted requests still in prefill (not forked yet)
    swap_tokens_used: int  # host swap space held by preempted (swapped-out) requests, in tokens

    def __init__(self, max_num_seqs: int, swap_space_tokens: int):
        self.max_num_seqs = max_num_seqs
        self.swap_space_tokens = swap_space_tokens
        self.waiting = deque()
        self.running = []
        self.prefilling = []
        self.running_seqs = self.unforked_seqs = self.swap_tokens_used = 0
        self._admissions = 0
        self._next_seq_id = 0

    def has_room(self, width: int) -> bool:
        """Whether ``width`` more sequences stay within ``max_num_seqs``."""
        return self.running_seqs + self.unforked_seqs + width <= self.max_num_seqs

    def new_seq_id(self) -> int:
        self._next_seq_id += 1
        return self._next_seq_id

    def join(self, state: RequestState) -> None:
        """The queue's head (its blocks allocated) joins the batch, newest in the preemption order."""
        self.running.append(state)
        self._admissions += 1
        state.admission = self._admissions
        state.is_running = True
        self.running_seqs += 1
        state.unforked = state.width - 1
        self.unforked_seqs += state.unforked

    def leave(self, state: RequestState) -> None:
        self.running.remove(state)
        if not state.decoding and state in self.prefilling:
            self.prefilling.remove(state)
        state.is_running = False
        self.running_seqs -= len(state.seq_ids)
        self.release_unforked(state)

    def release_unforked(self, state: RequestState) -> None:
        self.unforked_seqs -= state.unforked
        state.unforked = 0

    def swap_room(self) -> int:
        """Host swap space left, in tokens."""
        return self.swap_space_tokens - self.swap_tokens_used

    def swap_out(self, state: RequestState, tokens: int) -> None:
        state.swapped_tokens = tokens
        self.swap_tokens_used += tokens

    def release_swap(self, state: RequestState) -> None:
        """``state``'s swapped-out tokens leave the host (swapped back in, or the request ended)."""
        self.swap_tokens_used -= state.swapped_tokens
        state.swapped_tokens = 0
