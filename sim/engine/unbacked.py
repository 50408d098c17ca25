"""Decode growth a token-granular pool does not back: SGLang's pages of one token (``radix``, and
``sglang-hybrid``'s full-attention and SWA token pools, with or without its SWA radix cache) leave no
sequence room past its next token,
so deferring growth to held slots (``decoding.py``) would still tell the pool of every decoded
token, and each iteration would cost as many policy calls as sequences.

Instead, while the pool has room, its decoding sequences are told of their tokens only when they
leave or change shape, as with block pools; the pool counts the clock's pending tokens out of its
free slots and, whenever it is asked anything, first evicts what they needed
(``KVCachePolicy.defer_unbacked``). The pool must never be short of them: a jump stops before the
iteration whose tokens the free and evictable slots could not hold, and at a wake-up whose tokens
they cannot, every sequence is told of its tokens up to the previous iteration and growth goes back
to being told token by token (where the reference's out-of-memory handling runs), until the pool
has room again for :data:`ROOM_ITERATIONS` iterations. Inside a jump the evictions the pending tokens
make are placed at the iterations single steps would have made them, each observed then, and before
the flushes of the same iteration (a decode step's allocation evicts before the step; a flush may
free slots a later iteration's tokens then take without evicting). A sequence's own events stay
flushes: the SWA pool's bulk frees (every window) fall due as before, and they always fit (the pool
holds every pending token, this iteration's included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from sim.engine.batch import Batch
from sim.engine.decoding import DecodeClock, RequestState
from sim.kv.coordinator import KVCoordinator

ROOM_ITERATIONS: Final = 4
"""Iterations of every decoding sequence's tokens the pool must hold before growth is deferred again:
going from one way to the other costs a call per sequence, about one iteration told token by token."""


class UnbackedGrowth:
    def __init__(self, kv: KVCoordinator, clock: DecodeClock, batch: Batch):
        self.kv = kv
        self.clock = clock
        self.batch = batch
        self.active = False  # growth deferred past held slots now
        self.switches = 0  # diagnostics: times growth went from one way to the other

    def at_iteration_start(self) -> None:
        """A wake-up's iteration has begun (its tokens are pending): defer growth while the pool holds
        them, else tell it of every token from this iteration on."""
        available = self.kv.available_slots()
        if self.active:
            if available < 0:
                self._tell_every_token()
        elif available - self.clock.pending_tokens() >= ROOM_ITERATIONS * self.clock.sequences:
            self._defer()

    def jump_limit(self, limit: int) -> int:
        """Iterations after the current one a jump may run: none whose tokens the pool could not hold."""
        sequences = self.clock.sequences
        if not self.active or not sequences:
            return limit
        covered = self.kv.available_slots() // sequences
        return limit if limit < covered else covered

    def evict_inside(self, first_clock: int, last_clock: int, observe: Callable[[int], None]) -> None:
        """A jump from iteration ``first_clock`` (the decode clock's now) ran to ``last_clock``: make
        the evictions its tokens made, each at the iteration it fell in, observed then."""
        sequences = self.clock.sequences
        if not sequences:
            return
        free = self.kv.evict_for_unbacked(0)
        while (due := first_clock + free // sequences + 1) <= last_clock:
            ahead = (due - first_clock) * sequences
            free = self.kv.evict_for_unbacked(ahead)
            assert free >= ahead, "a jump ran past the slots its tokens could take"
            observe(due)

    def _defer(self) -> None:
        self.kv.defer_unbacked(self.clock.pending_tokens)
        self.active = True
        self.switches += 1
        self._reschedule_flushes()

    def _tell_every_token(self) -> None:
        """This iteration's tokens are what the pool cannot hold: every sequence takes its tokens up
        to the previous iteration first (they fit: that iteration was covered), as single steps
        did, and this iteration's go token by token, where running out preempts."""
        clock = self.clock
        self.kv.defer_unbacked(self._pending_before_this_iteration)
        for state in self._decoding():
            clock.sync(state, clock.now - 1)
        self.kv.defer_unbacked(None)
        self.active = False
        self.switches += 1
        self._reschedule_flushes()

    def _pending_before_this_iteration(self) -> int:
        return self.clock.pending_tokens() - self.clock.sequences

    def _reschedule_flushes(self) -> None:
        for state in self._decoding():
            self.clock.reschedule_flush(state)

    def _decoding(self) -> list[RequestState]:
        return [state for state in self.batch.running if state.decoding]
