"""One replica's side of disaggregated serving's KV hand-off (``sim/cluster/disaggregated.py`` is the
other side, behind :class:`sim.engine.transfer.KVTransferHooks`).

A prefill replica holds a finished prompt's blocks until the cluster says its KV has crossed the link
(:meth:`KVHandOff.hold`, then :meth:`released`); a decode replica allocates blocks for a prompt
computed elsewhere and waits for its KV (:meth:`receive`, then :meth:`landed`). The notices of sends
that finished and of prompts that landed wait for the next iteration start (vLLM's
``_update_from_kv_xfer_finished`` and ``_update_waiting_for_remote_kv``, at the scheduler's step):
:meth:`take_notices` frees the sent blocks and puts the landed prompts at the queue's front.

The engine core keeps its books (the batch, the records); this object keeps only who waits for what.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.engine.decoding import RequestState
    from sim.engine.transfer import KVTransferHooks
    from sim.kv.coordinator import KVCoordinator


class KVHandOff:
    def __init__(self, hooks: KVTransferHooks | None, prefill_only: bool):
        self.hooks = hooks
        # A prefill replica: every request hands its blocks off after its prompt (no decode here).
        self.prefill_only = prefill_only
        # Requests whose prompt is done and whose blocks wait to be sent (prefill replica), and those
        # whose blocks are allocated and whose KV is on its way (decode replica; a router counts them).
        self.held: dict[int, RequestState] = {}
        self.receiving: dict[int, RequestState] = {}
        self._landed: list[RequestState] = []
        self._released: list[RequestState] = []

    @property
    def disaggregated(self) -> bool:
        """Whether this replica is part of a disaggregated cluster (a notice can come any time)."""
        return self.hooks is not None

    @property
    def notices_waiting(self) -> bool:
        """A send finished or a prompt landed since the last iteration start."""
        return bool(self._landed or self._released)

    @property
    def pending(self) -> bool:
        """Blocks held for a transfer (sent or received): memory will change without a completion."""
        return bool(self.held or self.receiving or self._landed or self._released)

    def landed(self, state: RequestState) -> None:
        self._landed.append(state)

    def released(self, state: RequestState) -> None:
        self._released.append(state)

    def take_notices(self, kv: KVCoordinator, waiting: deque[RequestState]) -> None:
        """Finished sends free their blocks (cached, as any finished request's); landed prompts go to
        the queue's front in the order they landed, ready to run."""
        for state in self._released:
            del self.held[state.request.request_id]
            for seq_id in state.seq_ids:
                kv.free(seq_id)
            state.seq_ids = []
        self._released = []
        for state in reversed(self._landed):
            del self.receiving[state.request.request_id]
            state.remote_kv = False
            state.kv_landed = True
            waiting.appendleft(state)
        self._landed = []

    def receive(self, state: RequestState, cached_tokens: int) -> None:
        """(Decode replica) ``state``'s blocks are allocated, ``cached_tokens`` of its prompt from the
        local prefix cache: the cluster sends the rest."""
        self.receiving[state.request.request_id] = state
        assert self.hooks is not None
        self.hooks.kv_allocated(state, cached_tokens)

    def hold(self, state: RequestState) -> None:
        """(Prefill replica) ``state``'s prompt is done: its blocks stay until the send ends."""
        self.held[state.request.request_id] = state
        assert self.hooks is not None
        self.hooks.prefilled(state)

    def dropped(self, state: RequestState) -> None:
        """``state`` reached an outcome here; a remote prompt's prefill blocks can go."""
        if state.remote_kv:
            assert self.hooks is not None
            self.hooks.remote_dropped(state)
